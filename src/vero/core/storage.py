"""Atomic, durable file writes: the one place where vero's persistence recipe lives.

Recipe (the same as inspect-ai's `_util/atomic_write.py`): write to a temporary file in the target's
directory, `fsync` it, `os.replace` it over the target, then `fsync` the directory so the rename
itself survives a power loss. Readers therefore see either the old or the new content, never a
torn file. The async variants run the write in a worker thread (off the event loop) with
`vero.core.offloop.run_to_completion`, so a cancelled caller never leaves a write half done: the
write completes (however often the caller is cancelled meanwhile), then the cancellation propagates.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel

from vero.core.offloop import run_to_completion
from vero.errors import LedgerCorrupt, StorageFull

__all__ = [
    "atomic_copy",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_model",
    "awrite_bytes",
    "fsync_dir",
    "is_out_of_space",
    "read_model",
    "remove_tree",
]

_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE_TEXT = ("No space left on device", "Disk quota exceeded")
"""strerror(ENOSPC) and strerror(EDQUOT) as git prints them (git runs with `LC_ALL=C`: `vero.core.isolated_git`)."""


def is_out_of_space(exc: BaseException) -> bool:
    """Whether a failed write failed because its file system is full.

    True for `StorageFull`, an `OSError` with errno ENOSPC or EDQUOT, and a failed git command
    (anything with a `stderr`, e.g. `vero.errors.GitFailed`) whose error output names either.
    """
    if isinstance(exc, StorageFull):
        return True
    if isinstance(exc, OSError):
        return exc.errno in _NO_SPACE_ERRNOS
    stderr = getattr(exc, "stderr", None)
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    return isinstance(stderr, str) and any(text in stderr for text in _NO_SPACE_TEXT)


def fsync_dir(path: Path) -> None:
    """Flush a directory entry table to disk (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, write: Callable[[BinaryIO], object], mode: int) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            # On the descriptor, not the path: in a directory another user can write, the name may
            # have been swapped for a link by the time a path-based chmod runs.
            os.fchmod(handle.fileno(), mode)
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes, mode: int = 0o600) -> None:
    """Replace `path` with `data` atomically and durably.

    A symlink planted at `path` is replaced, never written through (`os.replace` renames over it).

    Args:
        path: destination file; its directory must exist.
        data: the complete new content.
        mode: permission bits of the new file (default owner read/write only).

    Raises:
        OSError: the directory is missing or not writable, or the disk is full; the previous content
            of `path` is then unchanged.
    """
    _atomic_write(Path(path), lambda handle: handle.write(data), mode)


def atomic_copy(src: str | Path, dest: str | Path, mode: int = 0o644) -> None:
    """Copy the file `src` to `dest` atomically and durably, streaming (for large archives).

    Raises:
        OSError: `src` cannot be read or `dest` written; `dest` is then unchanged.
    """
    with Path(src).open("rb") as source:
        _atomic_write(Path(dest), lambda handle: shutil.copyfileobj(source, handle, 1 << 20), mode)


def atomic_write_json(path: str | Path, value: Any, mode: int = 0o600) -> None:
    """`atomic_write_bytes` of `value` as indented, key-sorted JSON with a trailing newline."""
    data = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False).encode() + b"\n"
    atomic_write_bytes(path, data, mode)


def atomic_write_model(path: str | Path, model: BaseModel, mode: int = 0o600) -> None:
    """`atomic_write_json` of a pydantic model in JSON mode."""
    atomic_write_json(path, model.model_dump(mode="json"), mode)


def read_model[M: BaseModel](path: Path, model: type[M], what: str) -> M | None:
    """The record `atomic_write_model` wrote at `path`, as `model`; None when there is none.

    Raises:
        LedgerCorrupt: the file exists but cannot be read or validated ("`what` is unreadable"):
            durable state that cannot be read is never taken as absent.
    """
    try:
        return model.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
        raise LedgerCorrupt(f"{what} is unreadable") from None


async def awrite_bytes(path: str | Path, data: bytes, mode: int = 0o600) -> None:
    """`atomic_write_bytes` off the event loop; completes even if the caller is cancelled."""
    await run_to_completion(functools.partial(atomic_write_bytes, path, data, mode))


def remove_tree(path: str | os.PathLike[str]) -> bool:
    """Remove `path` and everything under it, never following a symlink, whatever its depth.

    `shutil.rmtree` recurses once per directory level (Python 3.12), so a tree deeper than the
    interpreter's recursion limit raises `RecursionError`, even with `ignore_errors`. Candidate code
    can make such a tree in any dir it writes (its scratch dir, a checkout of its own commit), and an
    unexpected error while cleaning up would fail its evaluation as unexpected, i.e. refunded. Then
    `rm -rf` (fts: no depth limit, links removed, never followed) finishes the job.

    Returns:
        Whether nothing is left at `path` (errors are not raised: callers that need the path gone
        check this).
    """
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        subprocess.run(
            ["rm", "-rf", "--", os.fspath(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    return not os.path.lexists(path)
