"""The commands of `test_reaper.py`, each run under `run_reaped` in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from vero.core.reaper import run_reaped

REAPER = os.getpid()


def ppid_and_state(pid: int) -> tuple[int, str] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0]


def orphans(n: int) -> int:
    pids, adopted = [], set()
    for _ in range(n):
        # The shell exits at once; its background sleep is an orphan, re-parented to the reaper.
        out = subprocess.run(
            ["sh", "-c", "sleep 2 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
        )
        pid = int(out.stdout)
        pids.append(pid)
        if (seen := ppid_and_state(pid)) is not None:
            adopted.add(seen[0])
    deadline = time.monotonic() + 30
    while any((ps := ppid_and_state(pid)) is not None and ps[1] != "Z" for pid in pids):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)  # until every sleep has exited
    time.sleep(0.5)  # the reaper's wait() runs on SIGCHLD
    zombies = [pid for pid in pids if (ps := ppid_and_state(pid)) is not None and ps[1] == "Z"]
    print(json.dumps({"reaper": REAPER, "adopted_by": sorted(adopted), "n_orphans": n, "zombies_left": zombies}))
    return 7


def wait() -> int:
    print(json.dumps({"reaper": REAPER, "command": os.getpid()}), flush=True)
    time.sleep(60)
    return 0


def main() -> int | None:
    what = sys.argv[1]
    if what == "orphans":
        return orphans(int(sys.argv[2]))
    if what == "exit":
        raise SystemExit(int(sys.argv[2]))
    if what == "raise":
        raise RuntimeError("boom")
    return wait()


if os.environ.get("REAPER_SLOW_PARENT"):
    # The parent is held inside os.fork(), before it knows its child's pid, as a loaded machine may
    # leave it while the child already runs and says it is ready.
    os.register_at_fork(after_in_parent=lambda: time.sleep(float(os.environ["REAPER_SLOW_PARENT"])))
sys.exit(run_reaped(main))
