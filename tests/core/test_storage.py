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
