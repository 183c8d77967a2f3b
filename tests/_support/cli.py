"""The real `vero` console script, run as a user runs it, and what a compiled tree holds."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["VERO", "all_files", "run_vero"]

VERO = str(Path(sys.executable).with_name("vero"))
"""The installed console script (the venv's `bin/vero`)."""


def run_vero(
    *args: str,
    env: Mapping[str, str] | None = None,
    umask: int | None = None,
    cwd: Path | None = None,
    timeout_sec: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run the real `vero` console script; `env` entries are added to this process's environment."""
    full_env = {**os.environ, "HARBOR_TELEMETRY": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True", **(env or {})}
    preexec = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run(
        [VERO, *args],
        env=full_env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_sec,
        preexec_fn=preexec,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def all_files(root: Path) -> list[Path]:
    """Every regular file below `root` (links not followed)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
