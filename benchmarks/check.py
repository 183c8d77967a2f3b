"""`vero harbor check` of a spec, this checkout against another one, side by side in one run.

Run from the repository root with Docker: `uv run python benchmarks/check.py --baseline-src
/work/main/src` (a few minutes for `tasks/minimal`). In alternating rounds it runs `vero harbor
check --config SPEC --probe --json` as a fresh process of this venv's interpreter, with vero
imported from this checkout and, with `--baseline-src DIR`, from that checkout's `src`
(`PYTHONPATH`, which the nested `harbor run`s inherit, so they run that vero too).

It prints, per side, the medians of wall seconds and CPU seconds (user + system of the check and
every process it waited for: the nested Harbor runs, the install agent's and the case kit's
helpers; the containers run under Docker's daemon and are not counted), how many nested Harbor jobs
the check started, and whether the reports agree (ok, every case's rewards and probe verdicts);
then the ratios. No assertion: docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_SEC = 1800
"""A check still running after this is killed (the round then fails)."""


def _check(argv: list[str], env: dict[str, str], work: Path) -> tuple[float, float, dict, int]:
    """Wall and CPU seconds of one check, its report and how many Harbor jobs it started."""
    started = time.perf_counter()
    with open(work.with_suffix(".json"), "wb") as out:
        child = subprocess.Popen([*argv, "--work-dir", str(work)], env=env, stdout=out, stderr=subprocess.DEVNULL)
        try:
            child.wait(timeout=LIMIT_SEC)
        except subprocess.TimeoutExpired:
            child.kill()
            raise SystemExit(f"{' '.join(argv)} ran over {LIMIT_SEC} s") from None
    wall = time.perf_counter() - started
    if child.returncode not in (0, 18):  # 18: the check found problems; still a finished check
        raise SystemExit(f"{' '.join(argv)} exited {child.returncode}")
    usage = _children_cpu()
    report = json.loads(work.with_suffix(".json").read_text())
    jobs = sum(1 for p in (work / "jobs").glob("*/*") if p.is_dir())
    return wall, usage, report, jobs


_last_cpu = 0.0


def _children_cpu() -> float:
    """CPU seconds of the children waited for since the last call (`RUSAGE_CHILDREN` grows by each
    reaped child and everything it reaped)."""
    global _last_cpu
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = usage.ru_utime + usage.ru_stime
    spent, _last_cpu = total - _last_cpu, total
    return spent


def _summary(report: dict) -> tuple:
    """What must agree between the two sides: ok, and per case the rewards and the probe's verdict."""
    rows = tuple(
        (
            row["case"],
            (row["baseline"] or {}).get("reward"),
            (row["reference"] or {}).get("reward"),
            (row["probe"] or {}).get("verdict"),
            tuple(p["code"] for p in row["problems"]),
        )
        for row in report["cases"]
    )
    return report["ok"], rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "tasks" / "minimal" / "build.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--baseline-src", type=Path, default=None, help="also check with vero from this src")
    args = parser.parse_args()
    env = {**os.environ, "HARBOR_TELEMETRY": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    sides = {"this checkout": env}
    if args.baseline_src is not None:
        sides["baseline"] = {**env, "PYTHONPATH": str(args.baseline_src.resolve())}
    argv = [sys.executable, "-m", "vero._entry", "harbor", "check", "--config", str(args.spec.resolve())]
    argv += ["--probe", "--json", "--concurrency", str(args.concurrency)]
    samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in sides}
    summaries: dict[str, set] = {name: set() for name in sides}
    _children_cpu()
    with tempfile.TemporaryDirectory(prefix="vero-check-bench-") as tmp:
        for round_number in range(args.rounds):
            for index, (name, side_env) in enumerate(sides.items()):
                wall, cpu, report, jobs = _check(argv, side_env, Path(tmp) / f"r{round_number}-{index}")
                samples[name].append((wall, cpu, jobs))
                summaries[name].add(_summary(report))
                print(f"round {round_number + 1} {name}: {wall:.1f} s wall, {cpu:.1f} s CPU, {jobs} Harbor job(s)")
    print(f"{args.spec}: medians of {args.rounds} alternating rounds (load average {os.getloadavg()[0]:.1f})")
    medians = {}
    for name, rows in samples.items():
        medians[name] = (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows))
        print(
            f"  {name:<14} wall {medians[name][0]:6.1f} s, CPU {medians[name][1]:6.1f} s, "
            f"{rows[0][2]} Harbor job(s), reports {'agree' if len(summaries[name]) == 1 else 'differ'} across rounds"
        )
    if "baseline" in medians:
        (wall, cpu), (base_wall, base_cpu) = medians["this checkout"], medians["baseline"]
        same = summaries["this checkout"] == summaries["baseline"]
        print(f"  this / baseline: wall {wall / base_wall:.2f}, CPU {cpu / base_cpu:.2f}; same reports: {same}")


if __name__ == "__main__":
    main()
