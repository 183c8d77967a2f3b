"""Run a compiled task's verifier image the way Harbor runs a separate verifier (for the e2e tests).

`tests/` of the compiled task is built as an image and run as a container with the sealed session
at `/export/vero` (read-only), the engine socket as `tests/docker-compose.yaml` mounts it, and a host
dir at `/logs/verifier`, executing `/tests/test.sh` with its output in `test-stdout.txt`. The image
and the container are removed afterwards (found by their unique name only).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml

from vero.compiler import TaskLayout
from vero.spec.compiled import CONTAINER_PATHS

from ._examples import build_image, harbor_env

__all__ = ["VerifierRun", "run_verifier_image"]


@dataclass(frozen=True)
class VerifierRun:
    """What one verifier container left in its `/logs/verifier`.

    Attributes:
        returncode: the container's exit status (`vero harbor verify` exits 0 only when every target
            was measured).
        logs: the host dir mounted at `/logs/verifier`.
        diagnostics: docker's output and `test-stdout.txt`, for assertion messages.
    """

    returncode: int
    logs: Path
    diagnostics: str

    @property
    def reward(self) -> dict:
        return json.loads((self.logs / "reward.json").read_text())

    @property
    def finalization(self) -> dict:
        return json.loads((self.logs / "artifacts" / "finalization.json").read_text())


def _docker(*args: str, timeout_sec: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout_sec, stdin=subprocess.DEVNULL, check=False
    )


def run_verifier_image(
    layout: TaskLayout, export_dir: Path, logs: Path, *, name: str, timeout_sec: float = 1200
) -> VerifierRun:
    """Build `layout.tests_dir` (BuildKit, cached), run `/tests/test.sh` in it, remove the container and the tag.

    Args:
        layout: the compiled task.
        export_dir: host dir holding `session.tar.gz` (+ `.sha256`), mounted at `/export/vero`.
        logs: an empty host dir mounted at `/logs/verifier`.
        name: prefix of the image tag and container name (a random suffix is added).

    Raises:
        AssertionError: the image does not build, or the compose file mounts more than the socket.
    """
    compose = yaml.safe_load(layout.verifier_compose_path.read_text())
    mounts = compose["services"]["main"]["volumes"]
    assert mounts == ["/run/docker.sock:/var/run/docker.sock:ro"], mounts
    tag = container = f"{name}-{uuid.uuid4().hex[:12]}"
    try:
        # BuildKit keeps the verifier image's layers cached after the tag is removed below, so the
        # next run rebuilds only what changed (the legacy builder's cache went with `image rm`).
        build_image(layout.tests_dir, tag, harbor_env(), timeout_sec)
        run = _docker(
            "run",
            "--name",
            container,
            "-v",
            f"{export_dir}:{CONTAINER_PATHS.export}:ro",
            *(arg for mount in mounts for arg in ("-v", mount)),
            "-v",
            f"{logs}:/logs/verifier",
            tag,
            "bash",
            "-c",
            "(/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1",
            timeout_sec=timeout_sec,
        )
        stdout_path = logs / "test-stdout.txt"
        diagnostics = run.stdout + run.stderr + (stdout_path.read_text() if stdout_path.is_file() else "")
        return VerifierRun(run.returncode, logs, diagnostics)
    finally:
        _docker("rm", "-f", container, timeout_sec=120)
        _docker("image", "rm", "-f", tag, timeout_sec=120)
