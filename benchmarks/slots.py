"""Each evaluation slot's first evaluation on a 50,000-file target, before and after the slots' warm-up.

Run from the repository root: `uv run python benchmarks/slots.py --baseline DIR` (DIR: another
checkout with its own `.venv`, e.g. main's worktree; a few minutes here). Issue 28's goal: every
slot's first evaluation takes at most 1 s once the first-ever checkout is done.

The target (`FILES` files in 100 directories) is built once, and its baseline imported once by a
first start; each measured sidecar then starts on a copy of that state with an empty work dir, i.e.
with every slot cold, as a new session's sidecar does. It runs in a child process of the measured
checkout's own Python (its vero, its test harness), in process (`SidecarService`, real git and
state store; a stub backend that holds each evaluation until released), with `--slots` slots:

1. the start (`SidecarService.start`: state, recovery, the baseline found in the store), then the
   warm-up if the checkout has one (`JobRunner.warmed`), wall and CPU (the process and its git
   children);
2. the first evaluation of each slot: one after another, each of a new one-file change; each job
   keeps its slot (the stub holds it) so the next takes another. Timed from `start_evaluation` until
   the stub receives the run (admission, the slot's checkout, the lease), with the checkout alone
   and the CPU over that time;
3. the same again once every job has ended: each slot's second evaluation, the warm reference.

Checkouts are measured alternately (`--rounds` rounds of baseline, this checkout) in one run. No
assertion: docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = 50_000
SLOTS = 4
ROUNDS = 2


def _cpu_sec() -> float:
    """CPU seconds (user + system) of this process and its waited-for children so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


# -- the template, built once in this process -----------------------------------------------------


def _template(root: Path, files: int) -> Path:
    """The target's harness with its baseline imported (a first start); returns its spec file."""
    from tests.sidecar._server import make_harness
    from vero.spec.models import CandidateLimits, PartitionAccess

    tree = {f"pkg{i * 100 // files:03d}/mod{i:05d}.py": f"VALUE = {i}\n" for i in range(files)}
    access = {"train": PartitionAccess(disclosure="full", min_aggregate_cases=1, total_runs=1000, total_cases=1000)}
    harness = make_harness(
        root / "template",
        baseline_files=tree,
        partitions={"train": ["t1"]},
        access=access,
        candidate_limits=CandidateLimits(max_files=2 * files),
    )

    async def import_baseline() -> None:
        service = harness.service()
        await service.start()
        await service.stop()

    asyncio.run(import_baseline())
    shutil.rmtree(harness.work_dir, ignore_errors=True)
    shutil.rmtree(harness.state_dir / "checkouts", ignore_errors=True)  # no slot's index: all cold
    return harness.write_spec(root / "template.json")


def _measured_run(checkout: Path, spec: Path, root: Path, name: str, slots: int) -> dict:
    """Copy the template's state, run `_child` in `checkout`'s Python, return its figures."""
    description = json.loads(spec.read_text())
    state = root / f"state-{name}"
    shutil.copytree(description["dirs"]["state_dir"], state)
    description["dirs"] |= {"state_dir": str(state), "work_dir": str(root / f"work-{name}")}
    description["dirs"]["context_dir"] = str(root / f"context-{name}")
    run_spec = root / f"{name}.json"
    run_spec.write_text(json.dumps(description))
    python = checkout / ".venv" / "bin" / "python"
    child = subprocess.run(
        [str(python), str(Path(__file__).resolve()), "--child", str(run_spec), str(checkout), name, str(slots)],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if child.returncode != 0:
        raise SystemExit(f"the run of {checkout} failed:\n{child.stderr[-4000:]}")
    shutil.rmtree(state)
    shutil.rmtree(root / f"work-{name}", ignore_errors=True)
    shutil.rmtree(root / f"context-{name}", ignore_errors=True)
    return json.loads(child.stdout.splitlines()[-1])


# -- one measured sidecar, in the child -----------------------------------------------------------


def _child(spec_path: Path, checkout: Path, name: str, slots: int) -> dict:
    sys.path.insert(0, str(checkout))  # that checkout's test harness
    from tests.sidecar._server import SidecarHarness, StubBackend, commit_file
    from vero.sidecar.models import EvaluationRequest
    from vero.spec.compiled import SidecarConfig

    spec = json.loads(spec_path.read_text())
    backend = StubBackend(block=threading.Event())
    harness = SidecarHarness(
        root=spec_path.parent,
        config=SidecarConfig.model_validate(spec["config"]),
        backend=backend,
        max_concurrent_evaluations=slots,
        **{key: Path(value) for key, value in spec["dirs"].items()},
    )

    async def run() -> dict:
        service = harness.service()
        checkouts: list[float] = []
        original = service.runner._checkout

        def timed_checkout(candidate: str, slot: int, **options):
            started = time.perf_counter()
            try:
                return original(candidate, slot, **options)
            finally:
                checkouts.append(time.perf_counter() - started)

        started, cpu = time.perf_counter(), _cpu_sec()
        await service.start()
        figures: dict = {"start_sec": time.perf_counter() - started, "start_cpu_sec": _cpu_sec() - cpu}
        started, cpu = time.perf_counter(), _cpu_sec()
        warmed = getattr(service.runner, "warmed", None)
        if warmed is not None:
            await warmed()
        figures |= {"warm_up_sec": time.perf_counter() - started, "warm_up_cpu_sec": _cpu_sec() - cpu}
        service.runner._checkout = timed_checkout  # the jobs' checkouts only, not the warm-up's

        async def evaluations(phase: str) -> list[dict]:
            rows, jobs = [], []
            for k in range(slots):
                version = commit_file(
                    harness.agent_repo, f"pkg000/mod{k:05d}.py", f"VALUE = '{name} {phase} {k}'\n", f"{phase} {k}"
                )
                started, cpu = time.perf_counter(), _cpu_sec()
                view = await service.start_evaluation("agent", EvaluationRequest(partition="train", version=version))
                jobs.append(view.id)
                if not await asyncio.to_thread(backend.started.acquire, True, 600):
                    raise SystemExit("the evaluation did not start in 600 s")
                rows.append(
                    {
                        "sec": time.perf_counter() - started,
                        "cpu_sec": _cpu_sec() - cpu,
                        "checkout_sec": checkouts[-1],
                        "slot": backend.runs[-1].candidate_dir.name,
                    }
                )
            backend.block.set()
            await asyncio.gather(*(task for task in map(service.runner.task, jobs) if task is not None))
            backend.block = threading.Event()
            return rows

        figures["first"] = await evaluations("first")
        figures["second"] = await evaluations("second")
        await service.stop()
        return figures

    return asyncio.run(run())


# -- report ---------------------------------------------------------------------------------------


def _summary(runs: list[dict], phase: str, key: str) -> tuple[float, float]:
    values = [row[key] for run in runs for row in run[phase]]
    return statistics.median(values), max(values)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, spec, checkout, name, slots = sys.argv
        print(json.dumps(_child(Path(spec), Path(checkout), name, int(slots))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", metavar="DIR", type=Path, help="Another checkout (its .venv), measured alike.")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--slots", type=int, default=SLOTS)
    parser.add_argument("--files", type=int, default=FILES)
    parser.add_argument("--json", type=Path, default=None, help="Also write every figure to this JSON file.")
    args = parser.parse_args()
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    checkouts = {"after": ROOT} | ({"before": args.baseline.resolve()} if args.baseline else {})
    results: dict[str, list[dict]] = {label: [] for label in checkouts}
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vero-slots-") as tmp:
        root = Path(tmp)
        print(f"building the {args.files:,}-file target ...", file=sys.stderr, flush=True)
        spec = _template(root, args.files)
        for round_ in range(args.rounds):
            order = sorted(checkouts, reverse=round_ % 2 == 0)  # before first in even rounds
            for label in order:
                print(f"round {round_ + 1}: {label} ...", file=sys.stderr, flush=True)
                figures = _measured_run(checkouts[label], spec, root, f"{label}-{round_}", args.slots)
                results[label].append(figures)
    print(
        f"{args.files:,}-file target, {args.slots} slots, {args.rounds} round(s) each, alternating; "
        "per slot: from start_evaluation until the stub has the run (median / max over slots and rounds)"
    )
    header = f"{'':8} {'start s':>8} {'warm-up s (CPU)':>16} {'first eval s':>13} {'its checkout s':>15}"
    header += f" {'its CPU s':>10} {'warm eval s':>12} {'first / warm':>13}"
    print(header)
    for label in ("before", "after"):
        runs = results.get(label)
        if not runs:
            continue
        first, first_max = _summary(runs, "first", "sec")
        checkout, _ = _summary(runs, "first", "checkout_sec")
        cpu, _ = _summary(runs, "first", "cpu_sec")
        warm, warm_max = _summary(runs, "second", "sec")
        start = statistics.median(run["start_sec"] for run in runs)
        warm_up = statistics.median(run["warm_up_sec"] for run in runs)
        warm_up_cpu = statistics.median(run["warm_up_cpu_sec"] for run in runs)
        print(
            f"{label:8} {start:8.2f} {warm_up:8.1f} ({warm_up_cpu:5.1f}) {first:6.2f} / {first_max:4.2f} "
            f"{checkout:15.2f} {cpu:10.2f} {warm:5.2f} / {warm_max:4.2f} {first / warm:13.1f}"
        )
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, load average {load[0]:.1f}; "
        f"wall time {time.monotonic() - began:.0f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
