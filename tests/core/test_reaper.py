"""`vero.core.reaper.run_reaped`: orphans of the command are adopted and reaped, exit codes and
signals pass through. Each case runs in a fresh interpreter (`reaper_child.py`), as the verifier's
`vero harbor verify --subreaper` does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers are Linux's"),
]

CHILD = Path(__file__).with_name("reaper_child.py")


def run_child(*args: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, str(CHILD), *args], capture_output=True, text=True, timeout=60, check=False)
    lines = done.stdout.strip().splitlines()
    return done.returncode, json.loads(lines[-1]) if lines else {"stderr": done.stderr}


def test_orphans_of_the_command_are_adopted_and_reaped():
    code, report = run_child("orphans", "20")
    # While they ran, the orphans' parent was the reaper, not PID 1 ...
    assert report["adopted_by"] == [report["reaper"]] and report["n_orphans"] == 20, report
    # ... and once they exited, none stayed a zombie.
    assert report["zombies_left"] == [], report
    assert code == 7  # main's return value is the exit code


def test_exceptions_and_exits_become_exit_codes():
    assert run_child("exit", "3")[0] == 3
    assert run_child("raise")[0] == 1


@pytest.mark.parametrize("slow_parent", [False, True], ids=["plain", "before-the-parent-knows-its-child"])
def test_a_signal_to_the_reaper_reaches_the_command(slow_parent: bool):
    # slow_parent: the signal arrives while the parent is still inside os.fork() (the child already
    # runs); a handler run there forwarded nothing, and the command slept on.
    env = {**os.environ, "REAPER_SLOW_PARENT": "3"} if slow_parent else None
    process = subprocess.Popen(
        [sys.executable, str(CHILD), "wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline())  # the command runs (in the reaper's child)
        assert ready["reaper"] == process.pid and ready["command"] != process.pid
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while Path(f"/proc/{ready['command']}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{ready['command']}").exists()
    finally:
        process.kill()
        process.wait()


def test_a_killed_reaper_takes_the_command_with_it():
    process = subprocess.Popen([sys.executable, str(CHILD), "wait"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline())
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _alive(ready["command"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(ready["command"])
    finally:
        process.kill()
        process.wait()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
