"""Process-group handling of nested runs, on real processes (no Docker needed)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from vero.core.run import RunAs
from vero.harbor.process import finish_uncancellable, run_process_group

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, timeout_sec: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_sec
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(60)
def test_timeout_kills_the_whole_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pidfile}; wait"
    outcome = asyncio.run(
        run_process_group(["sh", "-c", script], env=ENV, cwd=tmp_path, timeout_sec=1.0, kill_grace_sec=1.0)
    )
    assert outcome.timed_out
    assert outcome.returncode is not None and outcome.returncode < 0
    assert wait_gone(int(pidfile.read_text()))


@pytest.mark.timeout(60)
def test_sigterm_ignoring_leader_gets_sigkill(tmp_path):
    started = time.monotonic()
    outcome = asyncio.run(
        run_process_group(
            ["sh", "-c", "trap '' TERM; sleep 300 & wait; sleep 300"],
            env=ENV,
            cwd=tmp_path,
            timeout_sec=0.5,
            kill_grace_sec=1.0,
        )
    )
    assert outcome.timed_out
    assert outcome.returncode == -9
    assert time.monotonic() - started < 20


@pytest.mark.timeout(60)
def test_cancellation_kills_the_group_and_propagates(tmp_path):
    pidfile = tmp_path / "child.pid"

    async def scenario():
        task = asyncio.create_task(
            run_process_group(
                ["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], env=ENV, cwd=tmp_path, kill_grace_sec=1.0
            )
        )
        while not pidfile.exists() or not pidfile.read_text().strip():
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert wait_gone(int(pidfile.read_text()))


def _running_with(token: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line holds `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


@pytest.mark.timeout(120)
def test_cancellation_during_the_start_kills_the_group_too(tmp_path):
    """Cancelled after 0, 1, ... turns of the loop: inside `create_subprocess_exec` (which kills
    the leader only) and between it and the wait, the group was left running (at 1, 3 and 4 turns
    here before the fix). Whenever the cancel lands, nothing of the group outlives the call."""
    token = f"{os.getpid()}{time.monotonic_ns() % 10**6}"

    async def cancel_after(turns: int) -> None:
        task = asyncio.create_task(
            run_process_group(
                ["sh", "-c", f"sleep 300.{token}{turns} & wait"], env=ENV, cwd=tmp_path, kill_grace_sec=1.0
            )
        )
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    left = {}
    try:
        for turns in range(12):
            asyncio.run(cancel_after(turns))
            left[turns] = [pid for pid in _running_with(f"{token}{turns}") if not wait_gone(pid, 10)]
        assert all(not pids for pids in left.values()), left
    finally:
        for pid in _running_with(token):
            os.kill(pid, 9)


@pytest.mark.timeout(60)
def test_a_hurried_kill_does_not_wait_for_the_grace(tmp_path):
    """Once `hurry` says the caller is stopping, a group that ignores SIGTERM is SIGKILLed at once:
    with a 600 s grace this test would otherwise hit its own timeout."""
    pidfile = tmp_path / "child.pid"
    stopping = []

    async def scenario():
        task = asyncio.create_task(
            run_process_group(
                ["sh", "-c", f"trap '' TERM; sleep 300 & echo $! > {pidfile}; wait; sleep 300"],
                env=ENV,
                cwd=tmp_path,
                kill_grace_sec=600.0,
                hurry=lambda: bool(stopping),
            )
        )
        while not pidfile.exists() or not pidfile.read_text().strip():
            await asyncio.sleep(0.05)
        stopping.append(True)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert wait_gone(int(pidfile.read_text()))


@pytest.mark.timeout(60)
def test_children_do_not_outlive_a_normal_exit(tmp_path):
    pidfile = tmp_path / "child.pid"
    started = time.monotonic()
    outcome = asyncio.run(
        run_process_group(
            ["sh", "-c", f"sleep 300 & echo $! > {pidfile}; exit 3"], env=ENV, cwd=tmp_path, timeout_sec=60
        )
    )
    assert outcome.returncode == 3 and not outcome.timed_out
    assert time.monotonic() - started < 20
    assert wait_gone(int(pidfile.read_text()))


@pytest.mark.timeout(60)
def test_output_tail_is_bounded_and_scrubbed(tmp_path):
    secret = "hunter2-very-secret"
    script = f"head -c 20000 /dev/zero | tr '\\0' 'x'; echo; echo token={secret}; echo done >&2"
    outcome = asyncio.run(
        run_process_group(["sh", "-c", script], env=ENV, cwd=tmp_path, tail_bytes=100, secrets=[secret])
    )
    assert outcome.returncode == 0
    assert len(outcome.output_tail.encode()) <= 100
    assert secret not in outcome.output_tail
    assert "token=***" in outcome.output_tail
    assert outcome.output_tail.rstrip().endswith("done")


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_run_as_switches_uid_gid_and_groups(tmp_path):
    run_as = RunAs(uid=1001, gid=1002, extra_groups=(1003, 1004), home=Path("/tmp"))
    outcome = asyncio.run(run_process_group(["sh", "-c", "id -u; id -g; id -G"], env=ENV, cwd=Path("/"), run_as=run_as))
    uid, gid, groups = outcome.output_tail.split("\n")[:3]
    assert (uid, gid) == ("1001", "1002")
    assert set(groups.split()) == {"1002", "1003", "1004"}


@pytest.mark.timeout(30)
def test_finish_uncancellable_completes_cleanup_then_reraises():
    done = []

    async def cleanup():
        await asyncio.sleep(0.3)
        done.append(True)

    async def scenario():
        task = asyncio.create_task(finish_uncancellable(cleanup()))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert done == [True]


@pytest.mark.timeout(60)
def test_a_grandchild_that_escaped_the_group_does_not_hang_the_run(tmp_path):
    """It holds the output pipe open; the leader's exit must still be seen (Python 3.12 `wait()`)."""
    pidfile = tmp_path / "escaped.pid"
    started = time.monotonic()
    try:
        outcome = asyncio.run(
            run_process_group(
                ["sh", "-c", f"setsid sleep 40 & echo $! > {pidfile}; echo bye"], env=ENV, cwd=tmp_path, timeout_sec=30
            )
        )
        assert outcome.returncode == 0 and not outcome.timed_out
        assert "bye" in outcome.output_tail
        assert time.monotonic() - started < 15
    finally:
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), 9)
            except ProcessLookupError:
                pass
