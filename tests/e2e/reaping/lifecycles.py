"""Run inside the compiled sidecar image by `test_sidecar_reaping.py`: N candidate-host lifecycles
through the real `CandidateLauncher`, each host in its own namespaces as the sidecar starts them
(`HostNamespaces`, with the capabilities an agent target's compose file gives), each leaving
what a candidate leaves (a daemon of the host's uid outside its session), then report what is left
in the container as JSON on stdout: processes, zombies, and mounts the container's mount table did
not have before."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from vero.harbor.boundary.launcher import CANDIDATE_UID_RANGE, CandidateLauncher
from vero.harbor.boundary.namespaces import HIDDEN_FROM_HOSTS, HostNamespaces

LIFECYCLES = int(sys.argv[1])
AT_ONCE = 8


async def lifecycle(launcher: CandidateLauncher) -> None:
    host = await launcher.spawn()
    # What candidate code does: a daemon in a session of its own, whose parent (the shell) exits
    # at once, so it is re-parented to PID 1 while it runs and after `finish` kills it.
    await asyncio.to_thread(
        subprocess.run,
        ["setsid", "sh", "-c", "sleep 600 >/dev/null 2>&1 &"],
        user=host.uid,
        group=host.uid,
        extra_groups=[],
        cwd="/",
        check=True,
    )
    await host.finish()


def leftovers() -> dict[str, list]:
    me = os.getpid()
    zombies, candidates, others = [], [], []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (1, me):
            continue
        try:
            stat = (entry / "stat").read_text()
            uid = entry.stat().st_uid
        except OSError:
            continue  # gone meanwhile
        state = stat.rsplit(")", 1)[1].split()[0]
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        record = {"pid": int(entry.name), "state": state, "name": name, "uid": uid}
        if state == "Z":
            zombies.append(record)
        elif uid in CANDIDATE_UID_RANGE:
            candidates.append(record)
        else:
            others.append(record)
    return {"zombies": zombies, "candidate_processes": candidates, "other_processes": others}


def mounts() -> set[str]:
    return {" ".join(line.split()[3:5]) for line in Path("/proc/self/mountinfo").read_text().splitlines()}


async def main() -> None:
    before = mounts()
    started = time.monotonic()
    namespaces = HostNamespaces.for_hosts({}, [], HIDDEN_FROM_HOSTS)
    async with CandidateLauncher(Path(sys.executable)).confine(namespaces) as launcher:
        assert launcher.isolated, "the sidecar runs as root: hosts get throw-away uids"
        done = 0
        while done < LIFECYCLES:
            batch = min(AT_ONCE, LIFECYCLES - done)
            await asyncio.gather(*(lifecycle(launcher) for _ in range(batch)))
            done += batch
    await asyncio.sleep(1)  # PID 1 reaps asynchronously (SIGCHLD)
    seconds = round(time.monotonic() - started, 1)
    print(json.dumps({"lifecycles": done, "seconds": seconds, "mounts": sorted(mounts() - before), **leftovers()}))


asyncio.run(main())
