"""Atomic durable writes: the async variants finish their write whatever happens to the caller."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from vero.core.storage import awrite_bytes


@pytest.mark.timeout(30)
async def test_async_write_completes_before_a_repeatedly_cancelled_caller_resumes(tmp_path, monkeypatch):
    real_fsync = os.fsync
    writing = threading.Event()

    def slow_fsync(fd: int) -> None:
        writing.set()
        time.sleep(0.3)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    target = tmp_path / "record.json"
    task = asyncio.create_task(awrite_bytes(target, b"new"))
    while not writing.is_set():
        await asyncio.sleep(0.005)
    task.cancel()
    for _ in range(3):
        await asyncio.sleep(0)
    task.cancel()  # a second cancellation must not cut the wait for the write short
    with pytest.raises(asyncio.CancelledError):
        await task
    assert target.read_bytes() == b"new"
    assert not list(tmp_path.glob(".*.tmp"))


def _deep_tree(root, depth: int) -> None:
    """`depth` nested dirs under `root`, made with dir descriptors (no path gets near PATH_MAX)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.symlink(str(root.parent / "outside"), "link", dir_fd=fd)
    finally:
        os.close(fd)


@pytest.mark.timeout(60)
def test_remove_tree_removes_a_tree_deeper_than_the_recursion_limit_and_follows_no_link(tmp_path):
    """Candidate code can make a tree this deep in any dir it writes; shutil.rmtree raises
    RecursionError on it (Python 3.12), which would fail an evaluation as unexpected (refunded)."""
    import shutil
    import sys

    from vero.core.storage import remove_tree

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    depth = sys.getrecursionlimit() + 200
    for name in ("tried", "deep"):
        (tmp_path / name).mkdir()
        _deep_tree(tmp_path / name, depth)
    if sys.version_info < (3, 13):  # the premise (3.13's rmtree no longer recurses)
        with pytest.raises(RecursionError):
            shutil.rmtree(tmp_path / "tried", ignore_errors=True)
    for name in ("deep", "tried"):  # from the top, and after rmtree gave up halfway
        assert remove_tree(tmp_path / name) and not (tmp_path / name).exists()
    assert (outside / "keep.txt").read_text() == "keep"
    assert remove_tree(tmp_path / "missing")
