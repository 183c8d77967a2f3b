"""Overhead of an evaluation through the sidecar over a direct `harbor run` of the same cases.

    python benchmarks/overhead.py [--task tasks/minimal] [--partition NAME] [--repeats 3]
                                  [--poll-interval-sec 2.0] [--json results.json]

Both paths run the same cases of one agent-accessible partition of a compiled example, for a
candidate with the same files (the baseline), on the local Docker engine:

- **direct**: the `harbor run` argv that `HarborBackend` builds for that evaluation (same cases dir,
  agent, `--ak`, timeout multiplier, environment), started as one process and timed until it exits.
- **sidecar**: the compiled sidecar config served by the real app (`create_app`, the real
  `HarborBackend`) under uvicorn in a separate process, driven with the agent's own client
  (`SidecarClient.evaluate` then `wait`, which long-polls like `vero harbor eval --wait`), timed from
  the request to the poll that sees the job complete. Every sidecar run evaluates a new commit
  with the baseline's tree (as an agent evaluates new commits), so admission includes a real
  candidate import.

Docker's build cache and both processes' imports are warmed by one untimed run of each path first;
then the two paths alternate (direct first on odd rounds, sidecar first on even ones). The script
prints per-run times, the medians and their ratio (sidecar / direct), the sidecar's time split into
phases read from its trusted records (`GET /admin/export`) and the nested run's trusted log, and the
machine. Phases:

  admission      POST /evaluations -> 202: policy, candidate import (git fetch), ledger reservation
                 and job record (durable writes)
  queue          job created -> started (a slot of `max_concurrent_evaluations`)
  checkout       job started -> backend started: `running` record, detached checkout of the commit
  backend        HarborBackend around the `harbor` process: case checks, job dir, trusted log,
                 collation of the job dir
  harbor         the nested `harbor run` process itself (the part the direct path also pays; the
                 trusted log rounds it to 0.1 s, so `backend` may read a few hundredths below zero)
  completion     backend done -> job recorded complete (`full` tier: trial artifacts copied to the
                 context dir first)
  poll lag       job complete -> the client sees it (the long poll answers at completion: about an
                 HTTP round trip)

A second table splits Harbor's own trials (both paths) into environment setup, the agent, the gap
before the verifier, the verifier and the rest (teardown), to show where a nested run's time goes.

Budgets of the compiled config are raised for the benchmark (it runs more evaluations than an
example allows); nothing else of the served config changes. Nested runs execute as this process's
user (the compiled sidecar image runs them as `vero-runner`).

What to expect (2 shared cores, Docker 20.10; docs/benchmarks.md): the sidecar adds about 0.2 s
per evaluation (admission with a candidate import about 0.05 s, checkout 0.02 s, the rest bookkeeping
and HTTP round trips), a ratio of about 1.02-1.04. Both paths pass the `--extra-docker-compose` file
`build_command` writes, which gives each case's `main` an init process, so stopping a trial's
containers does not wait out Docker's 10 s stop timeout (Harbor's `sleep infinity` as PID 1 ignores
SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for `benchmarks._serving` (also in the spawned server process)

from benchmarks._serving import serve_and_report

TASKS = ROOT / "tasks"

os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

GIT_ENV = {
    "GIT_AUTHOR_NAME": "agent",
    "GIT_AUTHOR_EMAIL": "agent@example.invalid",
    "GIT_COMMITTER_NAME": "agent",
    "GIT_COMMITTER_EMAIL": "agent@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}
PHASES = ("admission", "queue", "checkout", "backend", "harbor", "completion", "poll lag")
EVALUATION_TIMEOUT_SEC = 1800.0


@dataclass
class Run:
    """One timed run of one path."""

    path: str  # "direct" | "sidecar"
    round: int
    seconds: float
    scores: dict[str, float]
    harbor_job_sec: float
    """Harbor's own job time (its `result.json`), inside the process time."""
    trial_phases: dict[str, float]
    """`_trial_phases` of the nested job."""
    phases: dict[str, float] | None = None


# -- the sidecar process ------------------------------------------------------------------------


def _serve(config_json: str, dirs: dict[str, str], conn) -> None:
    """Child process: serve the compiled sidecar config with the real backend until SIGTERM."""
    import logging

    from vero.harbor import HarborBackend
    from vero.sidecar.app import create_app
    from vero.spec.compiled import SidecarConfig

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = SidecarConfig.model_validate_json(config_json)
    app = create_app(config, backend=HarborBackend(), run_as=None, **{k: Path(v) for k, v in dirs.items()})
    serve_and_report(app, conn)


# -- helpers ------------------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], env={**os.environ, **GIT_ENV}, check=True, capture_output=True, text=True
    ).stdout.strip()


def _seconds(start: datetime | None, end: datetime | None) -> float:
    return (end - start).total_seconds() if start is not None and end is not None else float("nan")


def _harbor_process_sec(log: Path) -> float:
    """`duration_sec` of the nested `harbor` process, from the backend's trusted log."""
    for line in log.read_text().splitlines():
        if line.startswith("duration_sec:"):
            return float(line.split(":", 1)[1])
    return float("nan")


def _harbor_job_sec(job_dir: Path) -> float:
    """Harbor's own job time (`started_at` -> `finished_at` of the job's `result.json`): the nested
    run without the `harbor` process's start-up (imports, config) and exit."""
    result = json.loads((job_dir / "result.json").read_text())
    return _seconds(datetime.fromisoformat(result["started_at"]), datetime.fromisoformat(result["finished_at"]))


TRIAL_PHASES = ("environment setup", "agent", "agent -> verifier", "verifier", "rest of trial")


def _trial_phases(job_dir: Path) -> dict[str, float]:
    """Harbor's trial phases, in seconds summed over the job's trials (from each trial's `result.json`):
    environment setup (image build, compose up), agent (the install agent's setup and run: the
    candidate upload), the gap between the agent's end and the verifier's start (Harbor's own
    bookkeeping: agent log download, tests upload), verifier (the case's tests), and the rest of the
    trial (mostly stopping the environment: `docker compose down`)."""

    def ts(value: dict | None, key: str) -> datetime | None:
        return datetime.fromisoformat(value[key]) if value and value.get(key) else None

    def span(value: dict | None) -> float:
        start, end = ts(value, "started_at"), ts(value, "finished_at")
        return _seconds(start, end) if start is not None and end is not None else 0.0

    totals = dict.fromkeys(TRIAL_PHASES, 0.0)
    for path in job_dir.glob("*/result.json"):
        trial = json.loads(path.read_text())
        agent_end, verifier_start = (
            ts(trial.get("agent_execution"), "finished_at"),
            ts(trial.get("verifier"), "started_at"),
        )
        parts = {
            "environment setup": span(trial.get("environment_setup")),
            "agent": span(trial.get("agent_setup")) + span(trial.get("agent_execution")),
            "agent -> verifier": _seconds(agent_end, verifier_start)
            if agent_end is not None and verifier_start is not None
            else 0.0,
            "verifier": span(trial.get("verifier")),
        }
        for name, value in parts.items():
            totals[name] += value
        totals["rest of trial"] += span(trial) - sum(parts.values())
    return totals


def _machine() -> dict[str, object]:
    def cmd(*argv: str) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
        except OSError:
            return "?"

    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from importlib.metadata import version

    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "docker": cmd("docker", "version", "--format", "{{.Server.Version}}"),
        "compose": cmd("docker", "compose", "version", "--short"),
        "harbor": version("harbor"),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# -- the benchmark ------------------------------------------------------------------------------


class Bench:
    """A compiled example, its sidecar process and a direct-run workspace under `root`."""

    def __init__(self, task: Path, partition: str | None, root: Path, repeats: int, poll_interval_sec: float):
        from vero.compiler import compile_task
        from vero.core.baseline import commit_baseline
        from vero.spec.compiled import SidecarConfig, load_config

        self.root = root
        self.poll_interval_sec = poll_interval_sec
        self.compiled = compile_task(task / "build.yaml", root / "task")
        layout = self.compiled.layout
        config = load_config(layout.sidecar.config_path, SidecarConfig)
        if partition is None:
            # The most cases; on a tie the `full` tier (it also copies trial artifacts), then the name.
            partition = min(
                config.partitions,
                key=lambda p: (-len(config.partitions[p]), config.agent_access[p].disclosure != "full", p),
            )
        if partition not in config.partitions:
            raise SystemExit(
                f"partition {partition!r} is not agent-accessible; choose one of {sorted(config.partitions)}"
            )
        self.partition = partition
        self.cases = tuple(config.partitions[partition])
        n_runs = repeats + 2
        access = {
            name: a.model_copy(update={"total_runs": n_runs, "total_cases": n_runs * len(config.partitions[name])})
            for name, a in config.agent_access.items()
        }
        self.config = config.model_copy(update={"agent_access": access})
        self.cases_dir = layout.sidecar.cases_dir

        self.agent_repo = root / "app"
        shutil.copytree(layout.sidecar.baseline_dir, self.agent_repo)
        if commit_baseline(self.agent_repo) != self.compiled.baseline_commit:
            raise SystemExit("the compiled baseline files do not rebuild the compiled baseline commit")
        # The direct path's candidate: the baseline files, readable like the sidecar's checkouts.
        self.candidate_dir = root / "direct" / "candidate"
        shutil.copytree(layout.sidecar.baseline_dir, self.candidate_dir)
        self.direct_jobs = root / "direct" / "jobs"
        self.dirs = {
            "state_dir": root / "state",
            "agent_repo": self.agent_repo,
            "context_dir": root / "context",
            "cases_dir": self.cases_dir,
            "baseline_dir": layout.sidecar.baseline_dir,
            "work_dir": root / "work",
        }
        self._n_commits = 0

    # direct ---------------------------------------------------------------------------------

    def direct(self, round_: int) -> Run:
        from vero.core.run import NestedRun
        from vero.harbor import build_command, collate_job
        from vero.harbor.command import declared_agent_timeouts, find_harbor_executable, plan_agent_timeout

        run = NestedRun(
            evaluation_id=f"direct-{round_}",
            partition=self.partition,
            candidate=self.compiled.baseline_commit,
            candidate_dir=self.candidate_dir,
            cases_dir=self.cases_dir,
            case_names=self.cases,
            jobs_dir=self.direct_jobs,
            runtime=self.config.runtime,
            harbor=self.config.harbor,
            scoring=self.config.scoring,
        )
        plan = plan_agent_timeout(run.harbor.case_timeout_sec, declared_agent_timeouts(self.cases_dir, self.cases))
        command = build_command(
            run,
            job_name=run.evaluation_id,
            case_names=self.cases,
            timeout_plan=plan,
            harbor_executable=find_harbor_executable(),
        )
        self.direct_jobs.mkdir(parents=True, exist_ok=True)
        for path, text in command.files():
            path.write_text(text)
        with open(self.direct_jobs / f"{run.evaluation_id}.log", "wb") as log:
            started = time.perf_counter()
            done = subprocess.run(
                command.argv,
                env=command.env,
                cwd=command.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                timeout=EVALUATION_TIMEOUT_SEC,
                check=False,
            )
            seconds = time.perf_counter() - started
        if done.returncode != 0:
            tail = (self.direct_jobs / f"{run.evaluation_id}.log").read_text(errors="replace")[-3000:]
            raise SystemExit(f"the direct harbor run exited {done.returncode}; its output ends:\n{tail}")
        collation = collate_job(command.job_dir, run.scoring.reward_key)
        scores = {t.case: t.reward for t in collation.trials}
        if set(scores) != set(self.cases) or any(v is None for v in scores.values()):
            raise SystemExit(f"the direct run did not score every case: {scores}")
        return Run("direct", round_, seconds, scores, _harbor_job_sec(command.job_dir), _trial_phases(command.job_dir))

    # sidecar --------------------------------------------------------------------------------

    def new_version(self) -> str:
        """A new commit with the baseline's tree (admission then imports a commit it has not seen)."""
        self._n_commits += 1
        _git(self.agent_repo, "commit", "-q", "--allow-empty", "-m", f"benchmark run {self._n_commits}")
        return _git(self.agent_repo, "rev-parse", "HEAD")

    def sidecar(self, round_: int, url: str, admin_token: str) -> Run:
        import httpx

        from vero.sidecar.client import SidecarClient

        version = self.new_version()
        with SidecarClient(url, timeout_sec=120) as client:
            started_wall, started = time.time(), time.perf_counter()
            view = client.evaluate(self.partition, version)
            admitted = time.perf_counter()
            final = client.wait(view.id, poll_interval_sec=self.poll_interval_sec, timeout_sec=EVALUATION_TIMEOUT_SEC)
            seconds = time.perf_counter() - started
            seen_wall = started_wall + seconds
        if final.state != "complete":
            raise SystemExit(f"the sidecar evaluation ended {final.state} ({final.error})")
        export = httpx.get(
            f"{url}/admin/export", headers={"authorization": f"Bearer {admin_token}"}, timeout=60, trust_env=False
        ).json()
        job = next(j for j in export["jobs"] if j["id"] == view.id)
        result = job["result"]
        t = {
            k: datetime.fromisoformat(v) if v else None
            for k, v in (
                ("created", job["created_at"]),
                ("started", job["started_at"]),
                ("finished", job["finished_at"]),
                ("backend_started", result["started_at"]),
                ("backend_finished", result["finished_at"]),
            )
        }
        harbor_sec = _harbor_process_sec(Path(self.dirs["work_dir"]) / "jobs" / f"{view.id}.harbor.log")
        backend_sec = _seconds(t["backend_started"], t["backend_finished"])
        phases = {
            "admission": admitted - started,
            "queue": _seconds(t["created"], t["started"]),
            "checkout": _seconds(t["started"], t["backend_started"]),
            "backend": backend_sec - harbor_sec,
            "harbor": harbor_sec,
            "completion": _seconds(t["backend_finished"], t["finished"]),
            "poll lag": seen_wall - t["finished"].timestamp(),
        }
        scores = {c["case"]: c["score"] for c in result["cases"]}
        job_dir = Path(self.dirs["work_dir"]) / "jobs" / view.id
        return Run("sidecar", round_, seconds, scores, _harbor_job_sec(job_dir), _trial_phases(job_dir), phases)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Wall time of one evaluation through the sidecar versus a direct `harbor run` of the "
        "same cases (real Harbor on the local Docker engine); prints per-run times, medians, their ratio, "
        "the sidecar's phases and the machine."
    )
    parser.add_argument(
        "--task",
        type=Path,
        default=TASKS / "minimal",
        help="An example directory with build.yaml (default: tasks/minimal).",
    )
    parser.add_argument(
        "--partition", help="Agent-accessible partition to evaluate (default: the one with the most cases)."
    )
    parser.add_argument("--repeats", type=int, default=3, help="Timed runs of each path (default 3).")
    parser.add_argument(
        "--poll-interval-sec",
        type=float,
        default=2.0,
        help="Pause between polls when a long poll comes back early (default 2.0, as `vero harbor eval --wait`).",
    )
    parser.add_argument("--json", type=Path, help="Also write the results as JSON to this file.")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    import multiprocessing

    from rich.console import Console
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=200)
    wall_started = time.monotonic()
    machine = _machine()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="vero-bench-overhead-") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)
        bench = Bench(args.task.resolve(), args.partition, root, args.repeats, args.poll_interval_sec)
        console.print(
            f"{args.task.name}: partition {bench.partition!r}, {len(bench.cases)} case(s) "
            f"{', '.join(bench.cases)}; n_concurrent {bench.config.harbor.n_concurrent}"
        )
        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe()
        server = context.Process(
            target=_serve,
            name="vero-bench-sidecar",
            args=(bench.config.model_dump_json(), {k: str(v) for k, v in bench.dirs.items()}, child_end),
        )
        server.start()
        try:
            if not parent_end.poll(120) or (port := parent_end.recv()) is None:
                raise SystemExit("the sidecar did not start")
            url = f"http://127.0.0.1:{port}"
            token = (bench.dirs["state_dir"] / "admin-token").read_text().strip()
            console.print("warm-up (untimed): one run of each path ...")
            warm = [bench.direct(0), bench.sidecar(0, url, token)]
            console.print(f"  direct {warm[0].seconds:.1f} s, sidecar {warm[1].seconds:.1f} s")
            for i in range(1, args.repeats + 1):
                order = ("direct", "sidecar") if i % 2 else ("sidecar", "direct")
                for path in order:
                    run = bench.direct(i) if path == "direct" else bench.sidecar(i, url, token)
                    runs.append(run)
                    console.print(f"  round {i} {path}: {run.seconds:.2f} s")
        finally:
            server.terminate()  # SIGTERM: uvicorn shuts down gracefully
            server.join(60)

    direct = [r for r in runs if r.path == "direct"]
    sidecar = [r for r in runs if r.path == "sidecar"]

    table = Table(title=f"one evaluation of {len(bench.cases)} case(s): direct `harbor run` vs the sidecar (s)")
    columns = ("round", "direct", "sidecar", "ratio", "job direct", "job sidecar", *PHASES)
    for column in columns:
        table.add_column(column, justify="right")
    for d, s in zip(direct, sidecar, strict=True):
        assert s.phases is not None
        table.add_row(
            str(d.round),
            f"{d.seconds:.2f}",
            f"{s.seconds:.2f}",
            f"{s.seconds / d.seconds:.2f}",
            f"{d.harbor_job_sec:.2f}",
            f"{s.harbor_job_sec:.2f}",
            *(f"{s.phases[p]:.2f}" for p in PHASES),
        )
    med_direct = statistics.median(r.seconds for r in direct)
    med_sidecar = statistics.median(r.seconds for r in sidecar)
    med_job = {
        path: statistics.median(r.harbor_job_sec for r in runs_)
        for path, runs_ in (("direct", direct), ("sidecar", sidecar))
    }
    med_phases = {p: statistics.median(r.phases[p] for r in sidecar) for p in PHASES}  # type: ignore[index]
    table.add_row(
        "median",
        f"{med_direct:.2f}",
        f"{med_sidecar:.2f}",
        f"{med_sidecar / med_direct:.2f}",
        f"{med_job['direct']:.2f}",
        f"{med_job['sidecar']:.2f}",
        *(f"{med_phases[p]:.2f}" for p in PHASES),
    )
    console.print(table)
    console.print(
        "direct/sidecar: wall time of the path; job direct/sidecar: Harbor's own job time (its "
        "result.json) inside it; the other columns split the sidecar's time (see the module docstring)"
    )
    overhead = med_sidecar - med_direct
    no_poll = med_sidecar - med_phases["poll lag"]
    console.print(
        f"ratio sidecar / direct (medians): {med_sidecar / med_direct:.3f} ({overhead:+.2f} s); "
        f"without the poll lag {no_poll / med_direct:.3f} ({no_poll - med_direct:+.2f} s)"
    )
    others = {p: v for p, v in med_phases.items() if p != "harbor"}
    top = sorted(others.items(), key=lambda kv: kv[1], reverse=True)
    console.print(
        "sidecar time outside the nested harbor process (medians): "
        + ", ".join(f"{p} {v:.2f} s" for p, v in top)
        + f"; the harbor process {med_phases['harbor']:.2f} s in the sidecar vs {med_direct:.2f} s direct "
        f"(Harbor's job inside it: {med_job['sidecar']:.2f} s vs {med_job['direct']:.2f} s)"
    )
    trials = Table(title="Harbor's trial phases inside the nested job (s, summed over the trials, medians)")
    for column in ("path", *TRIAL_PHASES):
        trials.add_column(column, justify="right")
    for path, runs_ in (("direct", direct), ("sidecar", sidecar)):
        trials.add_row(path, *(f"{statistics.median(r.trial_phases[p] for r in runs_):.2f}" for p in TRIAL_PHASES))
    console.print(trials)
    diffs = [abs(d.scores[c] - s.scores[c]) for d, s in zip(direct, sidecar, strict=True) for c in bench.cases]
    console.print(
        "scores: "
        + (
            "identical on both paths in every round"
            if not any(diffs)
            else f"largest per-case difference between the paths {max(diffs):.4g} "
            "(cases that time the candidate vary from run to run)"
        )
    )
    load = os.getloadavg()
    console.print(
        f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (other work on the machine "
        "shows up as noise in both paths)"
    )
    console.print(
        f"machine: {machine['cpu_count']} CPUs ({machine['usable_cpus']} usable) {machine['cpu_model']}, "
        f"Docker {machine['docker']}, Compose {machine['compose']}, Harbor {machine['harbor']}, "
        f"Python {machine['python']}, {machine['platform']}"
    )
    console.print(f"wall time: {time.monotonic() - wall_started:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine,
                    "task": args.task.name,
                    "partition": bench.partition,
                    "cases": list(bench.cases),
                    "poll_interval_sec": args.poll_interval_sec,
                    "runs": [asdict(r) for r in runs],
                    "warmup": [asdict(r) for r in warm],
                    "median_sec": {"direct": med_direct, "sidecar": med_sidecar},
                    "median_harbor_job_sec": med_job,
                    "median_phases_sec": med_phases,
                    "ratio": med_sidecar / med_direct,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
