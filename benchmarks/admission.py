"""Admission's candidate import at the 1st and the 1,000th candidate: CPU, git processes, loose refs.

Run from the repository root: `uv run python benchmarks/admission.py` (a few minutes here). An agent
repository whose history grows by one commit (one changed file) per candidate, each imported into
one `CandidateStore` with `import_version_sync`, as admission does (the real store, real git, a
real state store). Per checkpoint (1, 10, 100, 1,000 imports) it prints, medians of the
`--sample` imports that end there:

- CPU time per import, this process and its waited-for git children (`getrusage`), and wall time;
- git processes started per import (every process `IsolatedGit` starts; a `git fetch`'s own
  children, `upload-pack`, `pack-objects`, `index-pack` and `rev-list`, which checkouts before the
  fetch was replaced ran, not counted);
- the same import into a reference store that holds only the commit's parent, measured right
  after it (the ratio shows what the store's history adds, whatever the machine's load does);
- loose refs in the store (`refs/` files; packed refs are one file).

`--source DIR` imports vero from another checkout's `src` (e.g. `/work/main/src`) instead: run both
in one session to compare a change side by side. No assertion: docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKPOINTS = (1, 10, 100, 1000)


def _git(repo: Path, *args: str) -> str:
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(repo),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "a",
        "GIT_AUTHOR_EMAIL": "a@x",
        "GIT_COMMITTER_NAME": "a",
        "GIT_COMMITTER_EMAIL": "a@x",
    }
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True).stdout


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _loose_refs(git_dir: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(git_dir / "refs"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=None, help="import vero from this src directory")
    parser.add_argument("--imports", type=int, default=CHECKPOINTS[-1])
    parser.add_argument("--sample", type=int, default=7, help="imports measured per checkpoint")
    parser.add_argument("--files", type=int, default=200, help="files of the target")
    args = parser.parse_args()
    if args.source is not None:
        sys.path.insert(0, str(args.source.resolve()))
    import vero.core.isolated_git as isolated_git
    from vero.core.candidates import CandidateStore
    from vero.core.state import StateStore
    from vero.spec.models import CandidateLimits

    count = [0]
    # Every process `IsolatedGit` starts goes through `popen` (a pipe's two included); a checkout
    # from before it ran each command through `execute`.
    counted = "popen" if hasattr(isolated_git.IsolatedGit, "popen") else "execute"
    original = getattr(isolated_git.IsolatedGit, counted)

    def counting(self, *a, **k):
        count[0] += 1
        return original(self, *a, **k)

    setattr(isolated_git.IsolatedGit, counted, counting)

    with tempfile.TemporaryDirectory(prefix="vero-admission-") as tmp:
        root = Path(tmp)
        agent = root / "agent"
        agent.mkdir()
        _git(agent, "init", "-q", "-b", "main")
        for i in range(args.files):
            directory = agent / f"d{i // 500}"
            directory.mkdir(exist_ok=True)
            (directory / f"f{i}.txt").write_text(f"file {i}\n")
        _git(agent, "add", "-A")
        _git(agent, "commit", "-q", "-m", "baseline")
        state = StateStore.open(root / "state.db")
        limits = CandidateLimits(max_files=max(20_000, 2 * args.files))
        store = CandidateStore.open(root / "store", state, limits=limits)
        store.import_version_sync(agent, "HEAD")
        samples: dict[int, list[tuple[float, float, int, float]]] = {c: [] for c in CHECKPOINTS if c <= args.imports}

        def measure(target: CandidateStore) -> tuple[float, float, int]:
            before_cpu, before_wall, before_count = _cpu(), time.perf_counter(), count[0]
            target.import_version_sync(agent, "HEAD")
            return _cpu() - before_cpu, time.perf_counter() - before_wall, count[0] - before_count

        for n in range(1, args.imports + 1):
            k = n % args.files
            (agent / f"d{k // 500}" / f"f{k}.txt").write_text(f"version {n}\n")
            _git(agent, "commit", "-q", "-a", "-m", f"v{n}")
            sampled = [c for c in samples if c - args.sample < n <= c or (c < args.sample and n <= c)]
            if not sampled:
                store.import_version_sync(agent, "HEAD")
                continue
            # side by side: the same commit into a reference store that holds only its parent
            reference_state = StateStore.open(root / f"reference-{n}" / "state.db")
            reference = CandidateStore.open(root / f"reference-{n}", reference_state, limits=limits)
            reference.import_version_sync(agent, "HEAD~1")
            grown = measure(store)
            fresh = measure(reference)
            reference_state.close()
            shutil.rmtree(root / f"reference-{n}", ignore_errors=True)
            for checkpoint in sampled:
                samples[checkpoint].append((*grown, fresh[0]))
        loose = _loose_refs(store.git_dir)
        state.close()
    first = statistics.median(s[0] for s in samples[min(samples)])
    print(f"vero from {args.source or 'this checkout'}; load average {os.getloadavg()[0]:.1f}")
    for checkpoint, rows in samples.items():
        cpu = statistics.median(r[0] for r in rows)
        side = statistics.median(r[0] / r[3] for r in rows)
        print(
            f"  import {checkpoint:>5}: CPU {cpu * 1e3:6.1f} ms ({cpu / first:.2f} x the 1st; {side:.2f} x the same "
            f"import into a store with one candidate, side by side), wall "
            f"{statistics.median(r[1] for r in rows) * 1e3:6.1f} ms, git processes "
            f"{statistics.median(r[2] for r in rows):.0f}"
        )
    print(f"  loose refs in the store after {args.imports} imports: {loose}")


if __name__ == "__main__":
    main()
