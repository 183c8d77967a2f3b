"""Child process of `test_candidates.py`: imports versions into a candidate store as a child
subreaper, and after each import lists the processes it is the parent of.

A git process that outlived its command (a detached `gc` or `maintenance`, a daemon) is re-parented
to this process when its own parent exits, so any process listed here, running or a zombie,
outlived the call that started it. Usage: `python import_reaper_child.py ROOT REPO VERSION...`;
prints one JSON object: {"leftovers": [[version, [command names]]...], "imports": n}.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

from vero.core.candidates import CandidateStore
from vero.core.state import StateStore

PR_SET_CHILD_SUBREAPER = 36


def children(kept: list[int]) -> list[str]:
    """Names of this process's children but the store's kept `cat-file` readers (`kept`), which live
    as long as the store by design (`vero.core.object_reader`)."""
    names = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if int(fields.get("PPid", "0")) == os.getpid() and int(entry) not in kept:
            names.append(fields.get("Name", "?").strip())
    return names


def main() -> None:
    root, repo, versions = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit(f"prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}")
    store = CandidateStore.open(root, StateStore.open(root / "state.db"))
    leftovers = []
    for version in versions:
        store.import_version_sync(repo, version)
        if names := children(store.reader_pids()):
            leftovers.append([version, names])
    store.close()
    if names := children([]):
        leftovers.append(["after close", names])
    print(json.dumps({"leftovers": leftovers, "imports": len(versions)}))


if __name__ == "__main__":
    main()
