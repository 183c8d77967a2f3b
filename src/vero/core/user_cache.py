"""The per-user cache directory: `$XDG_CACHE_HOME/vero`, else `~/.cache/vero`.

What is kept there is derived from inputs by their digest (the case kit's static build, the
compiled task's vero wheel and tarball), so an entry is never stale, only unused. It is per user on
purpose: nothing another user could have written there is taken.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["user_cache_dir"]


def user_cache_dir(env: Mapping[str, str]) -> Path:
    """`$XDG_CACHE_HOME/vero`, else `$HOME/.cache/vero` (the directory may not exist yet)."""
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "vero"
