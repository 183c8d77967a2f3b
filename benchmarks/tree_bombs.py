"""What a tree of few objects naming many paths costs admission: time and peak memory.

Run from the repository root: `uv run python benchmarks/tree_bombs.py --source DIR` (a minute or
two; `DIR` is another checkout's `src`, e.g. a worktree of the commit before a change, measured in
the same run). Each candidate is imported into a fresh candidate store (default `target.limits`)
in a fresh process (`python -c`, vero imported from this checkout's or `DIR`'s `src`), which prints
its wall time, its peak resident memory (`ru_maxrss`) and the outcome:

- `orphan doubling tree`: a commit with no checked ancestor whose tree holds one subtree twice per
  level, 22 levels (23 tree objects, 4,194,304 files): measured whole (`ls-tree -r`);
- `child doubling subtree`: the same shape, 24 levels, under a checked parent: measured from the
  difference of the two trees (`object_reader.diff_tree_raw`);
- `50,000 submodule entries`: a child whose tree adds 50,000 gitlinks (no content, but a checkout
  makes a directory for each).

No assertion: docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, os, resource, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from vero.core.candidates import CandidateStore
from vero.core.state import StateStore
root, shape = Path(sys.argv[2]), sys.argv[3]
env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
       "GIT_COMMITTER_EMAIL": "a@b", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
repo = root / "repo"
def git(*args, data=None):
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", str(repo), *args], input=data, env=env,
                          check=True, capture_output=True).stdout.decode().strip()
repo.mkdir()
git("init", "-q")
(repo / "README.md").write_text("baseline\n")
git("add", "-A")
git("commit", "-qm", "baseline")
subprocess.run(["chown", "-R", "1001:1001", str(repo)], check=True)
store = CandidateStore.open(root / "state", StateStore.open(root / "state.db"))
store.import_version_sync(repo, "HEAD")
def mktree(lines):
    return git("mktree", data="".join(lines).encode())
def doubling(levels):
    tree = mktree([f"100644 blob {git('hash-object', '-w', '--stdin', data=b'x')}\tf\n"])
    for _ in range(levels):
        tree = mktree([f"040000 tree {tree}\ta\n", f"040000 tree {tree}\tb\n"])
    return tree
readme = f"100644 blob {git('rev-parse', 'HEAD:README.md')}\tREADME.md\n"
if shape == "orphan":
    commit = git("commit-tree", doubling(22), "-m", "bomb")
elif shape == "child":
    commit = git("commit-tree", mktree([f"040000 tree {doubling(24)}\tbomb\n", readme]), "-p", "HEAD", "-m", "bomb")
else:
    head = git("rev-parse", "HEAD")
    links = [f"160000 commit {head}\tm{i:05}\n" for i in range(50_000)]
    commit = git("commit-tree", mktree([*links, readme]), "-p", "HEAD", "-m", "links")
subprocess.run(["chown", "-R", "1001:1001", str(repo)], check=True)
started = time.perf_counter()
try:
    store.import_version_sync(repo, commit)
    outcome = "accepted"
except Exception as exc:
    outcome = f"{type(exc).__name__} ({getattr(exc, 'limit', None) or 'no limit named'})"
print(json.dumps({"sec": time.perf_counter() - started, "outcome": outcome,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

SHAPES = {"orphan": "orphan doubling tree", "child": "child doubling subtree", "links": "50,000 submodule entries"}


def measure(src: Path, shape: str) -> dict:
    """One import in a fresh process with vero from `src`: seconds, outcome, peak MiB."""
    with tempfile.TemporaryDirectory(prefix="vero-tree-bomb-") as scratch:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(src), scratch, shape],
            check=True,
            capture_output=True,
            timeout=900,
        ).stdout
    return json.loads(out.decode().strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=None, help="also measure vero from this src directory")
    args = parser.parse_args()
    sources = [ROOT / "src"] + ([args.source.resolve()] if args.source else [])
    for shape, label in SHAPES.items():
        results = [measure(src, shape) for src in sources]
        cells = "; ".join(
            f"{'this checkout' if src == ROOT / 'src' else src}: "
            f"{r['sec']:.2f} s, {r['rss_mib']:.0f} MiB, {r['outcome']}"
            for src, r in zip(sources, results, strict=True)
        )
        print(f"{label}: {cells}", flush=True)
        if len(results) == 2:
            now, before = results
            ratios = f"time {before['sec'] / now['sec']:.0f}x, memory {before['rss_mib'] / now['rss_mib']:.1f}x"
            print(f"  before / now: {ratios}")


if __name__ == "__main__":
    main()
