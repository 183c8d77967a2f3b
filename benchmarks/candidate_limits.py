"""What an oversized candidate costs the sidecar, with and without size limits.

Run from the repository root: `uv run python benchmarks/candidate_limits.py` (about a minute).

For each oversized candidate the issue measured (a 2 GiB sparse file, a 300 MB random file,
100,000 files), one run imports it into a real candidate store twice, each time into a fresh
store holding the same one-file baseline: with the default `target.limits` (refused, before
anything is fetched) and with limits raised out of the way (the previous behaviour: fetched,
checked and recorded). It prints both wall times, their ratio and how much the store grew.

No assertion: docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from vero.core.candidates import CandidateStore
from vero.core.state import StateStore
from vero.errors import CandidateTooLarge
from vero.spec.models import CandidateLimits

UNLIMITED = CandidateLimits(max_files=10**9, max_total_bytes=2**62, max_file_bytes=2**62)
GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "agent",
    "GIT_AUTHOR_EMAIL": "agent@example.com",
    "GIT_COMMITTER_NAME": "agent",
    "GIT_COMMITTER_EMAIL": "agent@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def git(repo: Path, *args: str) -> str:
    # gc.auto=0: no detached `git gc` of this repository still writing when it is removed.
    return (
        subprocess.run(["git", "-c", "gc.auto=0", "-C", str(repo), *args], check=True, capture_output=True, env=GIT_ENV)
        .stdout.decode()
        .strip()
    )


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def import_once(root: Path, repo: Path, limits: CandidateLimits) -> tuple[float, str, int]:
    """(seconds, outcome, bytes the store grew) of importing HEAD into a fresh store."""
    shutil.rmtree(root, ignore_errors=True)
    store = CandidateStore.open(root, StateStore.open(root / "state.db"), limits=limits)
    store.import_version_sync(repo, "HEAD~1")
    before = du(store.git_dir)
    start = time.perf_counter()
    try:
        store.import_version_sync(repo, "HEAD")
        outcome = "accepted"
    except CandidateTooLarge as exc:
        outcome = f"refused ({exc.limit})"
    return time.perf_counter() - start, outcome, du(store.git_dir) - before


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="vero-limits-bench-") as scratch:
        base = Path(scratch)
        repo = base / "repo"
        repo.mkdir()
        git(repo, "init", "-q")
        (repo / "solve.py").write_text("print('baseline')\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "baseline")

        def sparse() -> None:
            with open(repo / "big.bin", "wb") as f:
                f.truncate(2 << 30)

        def random_file() -> None:
            (repo / "rand.bin").write_bytes(os.urandom(300 << 20))

        def many_files() -> None:
            (repo / "many").mkdir()
            for i in range(100_000):
                (repo / "many" / str(i)).write_text(str(i))

        print(f"{'candidate':<22} {'limited':>16} {'unlimited':>18} {'ratio':>8} {'store growth':>24}")
        for label, make in (
            ("2 GiB sparse file", sparse),
            ("300 MB random file", random_file),
            ("100,000 files", many_files),
        ):
            make()
            git(repo, "add", "-A")
            git(repo, "commit", "-qm", label)
            limited = import_once(base / "limited", repo, CandidateLimits())
            unlimited = import_once(base / "unlimited", repo, UNLIMITED)
            print(
                f"{label:<22} {limited[0]:>7.2f} s {limited[1]:<9} {unlimited[0]:>7.2f} s {unlimited[1]:<9} "
                f"{unlimited[0] / limited[0]:>7.0f}x {limited[2] / 2**20:>8.1f} MiB "
                f"vs {unlimited[2] / 2**20:>7.1f} MiB"
            )
            git(repo, "reset", "-q", "--hard", "HEAD~1")
            subprocess.run(["git", "-C", str(repo), "clean", "-qfdx"], check=True)


if __name__ == "__main__":
    main()
