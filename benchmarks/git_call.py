"""What one git command costs vero's process: `IsolatedGit.execute` of `git rev-parse --git-dir`.

Run from the repository root: `uv run python benchmarks/git_call.py --source DIR` (DIR: another
checkout's `src`, e.g. main's), about 20 s. Each side runs in its own child process (vero imported
from this checkout or from DIR), alternately, `--rounds` rounds of `--calls` commands; printed:
the medians of the calling process's CPU per command (user + system, the git child's excluded)
and of the wall per command, and their ratios. An admission of a new commit starts about 10 such
commands, a slot update 4. No assertion: docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_CHILD = """
import json, resource, subprocess, sys, tempfile, time
from pathlib import Path
from vero.core.isolated_git import IsolatedGit, private_git_env
calls = int(sys.argv[1])
root = Path(tempfile.mkdtemp(prefix="vero-git-call-"))
subprocess.run(["git", "init", "-q", str(root)], check=True)
with private_git_env(safe_directories=[root]) as (env, _):
    runner = IsolatedGit(root, env=env, git_dir=root / ".git", timeout_sec=60)
    for _ in range(20):
        runner.execute(["git", "rev-parse", "--git-dir"])
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(calls):
        runner.execute(["git", "rev-parse", "--git-dir"])
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
print(json.dumps({"cpu_ms": cpu / calls * 1e3, "wall_ms": wall / calls * 1e3}))
"""


def _round(source: Path | None, calls: int) -> dict[str, float]:
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)  # before the installed (editable) vero
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(calls)], env=env, capture_output=True, text=True, timeout=600, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=None, help="also measure vero from this src directory")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    sides: list[Path | None] = [None] if args.source is None else [args.source.resolve(), None]
    figures: dict[Path | None, list[dict[str, float]]] = {side: [] for side in sides}
    for _ in range(args.rounds):
        for side in sides:
            figures[side].append(_round(side, args.calls))
    medians = {
        side: {key: statistics.median(f[key] for f in figures[side]) for key in ("cpu_ms", "wall_ms")} for side in sides
    }
    load = os.getloadavg()[0]
    print(f"git rev-parse through IsolatedGit, {args.calls} calls x {args.rounds} rounds (load {load:.1f}):")
    for side in sides:
        m = medians[side]
        print(f"  {side or 'this checkout'}: CPU {m['cpu_ms']:.3f} ms, wall {m['wall_ms']:.3f} ms per command")
    if args.source is not None:
        before, now = medians[sides[0]], medians[None]
        cpu, wall = now["cpu_ms"] / before["cpu_ms"], now["wall_ms"] / before["wall_ms"]
        print(f"  now / {args.source}: CPU {cpu:.2f}, wall {wall:.2f}")


if __name__ == "__main__":
    main()
