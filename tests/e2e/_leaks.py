"""Finding a secret's value in what a run left on disk (for the e2e tests' "no key anywhere" checks)."""

from __future__ import annotations

import tarfile
from pathlib import Path

__all__ = ["files_containing"]


def files_containing(root: Path, needle: bytes) -> list[Path]:
    """Files under `root` holding `needle`, looking inside gzipped tar archives too (the sealed
    session is one: a byte search of the compressed file would never see a leaked value)."""
    found = []
    for path in root.rglob("*"):
        try:
            if not path.is_file() or path.is_symlink():
                continue
            if needle in path.read_bytes() or (path.name.endswith((".tar.gz", ".tgz")) and _in_archive(path, needle)):
                found.append(path)
        except OSError:
            continue
    return found


def _in_archive(path: Path, needle: bytes) -> bool:
    with tarfile.open(path, "r:gz") as tar:
        for member in tar:
            handle = tar.extractfile(member) if member.isfile() else None
            if handle is not None and needle in handle.read():
                return True
    return False
