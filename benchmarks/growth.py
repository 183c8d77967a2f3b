"""Does the 1,000th evaluation cost what the 1st did? Growth of the sidecar's costs with its history.

Run from the repository root: `uv run python benchmarks/growth.py` (about 10 minutes here;
`--long` goes on to 10,000 evaluations). Everything is measured in one run and printed with ratios:

1. **Growth through the real app**: a sidecar under uvicorn in a child process (the test harness's
   `create_app`, stub evaluation backend, real git repositories and state store). Evaluations one
   after another, each of a new commit (a one-file change) of the agent's repository. At 1, 10,
   100, 1,000 (and 10,000) evaluations it reports: admission (`POST /evaluations` until 202:
   candidate import, policy, reservation + job record), completion (from the 202 until a long poll
   sees the job complete: slot checkout, stub run, result + settle), `GET /status` latency with 1
   and 16 concurrent clients, the `/status` body size, the state dir's size and the server's RSS.
   Latencies at a checkpoint are medians of `PAIRED_EVALUATIONS` evaluations made there, each
   followed by the same on a *reference* sidecar whose history stays short: the machine is shared,
   so the ratio of the two, measured side by side, is the figure that isolates the growth.
2. **A 50,000-file target**, in process: the first sidecar start (rebuilds and imports the
   baseline), a restart, and per evaluation of a one-file change the admission
   (`SidecarService.start_evaluation`) and the slot checkout (`CandidateStore.update_worktree`),
   against a full files-only checkout into a fresh directory.
3. **Sidecar start with 10,000 finished jobs** in the state store (filled in bulk), in process;
   then `vero harbor serve` exec'd on that state, timed until `/health` answers 200 (wall and the
   child's CPU; `--start-baseline DIR` times another checkout's the same way, alternating;
   `--start-only` runs just this).
4. **Agent CLI start-up**, as the agent pays it in `main`: vero installed there's way (a venv, the
   client's pins, the wheel through pip and its console script), then CPU and wall time of
   `vero harbor status` against the running sidecar, of `vero harbor status --help` and `vero harbor
   eval --help`, of `vero --help` (the typer application) and of `python -c pass`, alternating,
   medians of `CLI_RUNS` rounds; `--cli-baseline REV` adds the agent CLI of a git revision to the
   same rounds (before/after). `--cli-only` measures just this.

No assertion: docs/benchmarks.md records the figures, the issue's goals are ratios to read off the output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for `tests.sidecar._server` (also in the spawned server process)

import httpx

from benchmarks._serving import serve_and_report

PRINCIPAL = "agent"
BIG_TARGET_FILES = 50_000
BIG_TARGET_EVALUATIONS = 5
BULK_JOBS = 10_000
CLI_RUNS = 21
SERVED_RUNS = 5
"""Execs of `vero harbor serve` timed until `/health` answers, with `BULK_JOBS` jobs in its state."""
PAIRED_EVALUATIONS = 7
"""Evaluations measured at each checkpoint, alternating with the reference sidecar."""


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


# -- 1. growth through the real app -------------------------------------------------------------


def _serve(root: str, conn) -> None:
    """Child process: a sidecar over real repos and a fresh state dir, served until SIGTERM."""
    import logging

    from tests.sidecar._server import StubBackend, make_harness
    from vero.spec.models import PartitionAccess

    logging.getLogger("vero").setLevel(logging.WARNING)
    access = {
        "train": PartitionAccess(
            disclosure="full", min_aggregate_cases=1, total_runs=10_000_000, total_cases=100_000_000
        )
    }
    harness = make_harness(
        Path(root), backend=StubBackend(write_job_dir=False), partitions={"train": ["t1", "t2", "t3"]}, access=access
    )
    app = harness.create_app()
    serve_and_report(app, conn, lambda port: (port, str(harness.agent_repo), str(harness.state_dir)))


def _status_latency(url: str, clients: int, per_client: int) -> float:
    """p50 of `GET /status`, in ms, with `clients` concurrent keep-alive clients."""

    async def run() -> list[float]:
        latencies: list[float] = []
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)

        async def worker() -> None:
            async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120, trust_env=False) as client:
                await client.get("/health")
                for _ in range(per_client):
                    started = time.perf_counter()
                    response = await client.get("/status")
                    latencies.append(time.perf_counter() - started)
                    response.raise_for_status()

        await asyncio.gather(*(worker() for _ in range(clients)))
        return latencies

    return _median_ms(asyncio.run(run()))


def _commit(repo: Path, i: int) -> str:
    from tests.sidecar._server import commit_file

    return commit_file(repo, "solve.py", f"print({i})\n", f"version {i}")


class _Sidecar:
    """A sidecar child process and a client of it, for one evaluation at a time."""

    def __init__(self, root: Path, name: str) -> None:
        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe()
        self.process = context.Process(target=_serve, args=(str(root / name), child_end), name=f"vero-growth-{name}")
        self.process.start()
        if not parent_end.poll(180):
            raise SystemExit("the sidecar did not start in 180 s")
        ready = parent_end.recv()
        if ready is None:
            raise SystemExit("the sidecar failed to start")
        port, agent_repo, state_dir = ready
        self.url = f"http://127.0.0.1:{port}"
        self.agent_repo, self.state_dir = Path(agent_repo), Path(state_dir)
        self.client = httpx.Client(base_url=self.url, timeout=120, trust_env=False)
        self.n = 0

    def evaluate(self) -> tuple[float, float]:
        """One evaluation of a new commit: (admission, completion) in seconds."""
        self.n += 1
        version = _commit(self.agent_repo, self.n)
        started = time.perf_counter()
        response = self.client.post("/evaluations", json={"partition": "train", "version": version})
        admitted = time.perf_counter()
        response.raise_for_status()
        job_id = response.json()["id"]
        while True:
            answer = self.client.get(f"/evaluations/{job_id}", params={"wait_sec": 30})
            answer.raise_for_status()
            if answer.json()["state"] not in ("queued", "running"):
                break
        if answer.json()["state"] != "complete":
            raise SystemExit(f"evaluation {self.n} ended {answer.json()['state']}")
        return admitted - started, time.perf_counter() - admitted

    def close(self) -> None:
        self.client.close()
        self.process.terminate()  # SIGTERM: uvicorn shuts down gracefully
        self.process.join(60)


def _growth(root: Path, checkpoints: list[int], cli_baseline: str | None) -> tuple[list[dict], dict]:
    """Grow one sidecar's history; at each checkpoint measure it side by side with a reference
    sidecar that keeps a short history (alternating requests, so both see the same machine load)."""
    grown = _Sidecar(root, "grown")
    reference = _Sidecar(root, "reference")
    rows: list[dict] = []
    try:
        for checkpoint in checkpoints:
            while grown.n < checkpoint - 1:
                grown.evaluate()
            pairs = [(grown.evaluate(), reference.evaluate()) for _ in range(PAIRED_EVALUATIONS)]
            status_grown, status_reference = [], []
            for _ in range(5):
                status_grown.append(_status_latency(grown.url, 1, 20))
                status_reference.append(_status_latency(reference.url, 1, 20))
            status16 = [(_status_latency(grown.url, 16, 10), _status_latency(reference.url, 16, 10)) for _ in range(3)]
            status16_grown = statistics.median(g for g, _ in status16)
            status16_reference = statistics.median(r for _, r in status16)
            rows.append(
                {
                    "n": checkpoint,
                    "admission_ms": _median_ms([g[0] for g, _ in pairs]),
                    "admission_ref_ms": _median_ms([r[0] for _, r in pairs]),
                    "completion_ms": _median_ms([g[1] for g, _ in pairs]),
                    "completion_ref_ms": _median_ms([r[1] for _, r in pairs]),
                    "status_1_ms": statistics.median(status_grown),
                    "status_1_ref_ms": statistics.median(status_reference),
                    "status_16_ms": status16_grown,
                    "status_16_ref_ms": status16_reference,
                    "status_bytes": len(grown.client.get("/status").content),
                    "state_bytes": _tree_bytes(grown.state_dir),
                    "rss_bytes": _rss_bytes(grown.process.pid),
                    "evaluations": grown.n,
                }
            )
            print(
                f"  {checkpoint} evaluations: admission {rows[-1]['admission_ms']:.0f} ms "
                f"(reference {rows[-1]['admission_ref_ms']:.0f}), status {rows[-1]['status_1_ms']:.1f} ms, "
                f"{rows[-1]['status_bytes']} bytes",
                file=sys.stderr,
                flush=True,
            )
        cli = _cli_startup(grown.url, cli_baseline)
    finally:
        grown.close()
        reference.close()
    return rows, cli


# -- 2. a 50,000-file target --------------------------------------------------------------------


def _service(harness):
    """A `SidecarService` over the harness's dirs (as `create_app` builds it), in this process."""
    return harness.service()


def _big_target(root: Path) -> dict:
    from tests.sidecar._server import StubBackend, commit_file, make_harness
    from vero.sidecar.models import EvaluationRequest
    from vero.spec.models import CandidateLimits, PartitionAccess

    files = {f"pkg{i // 500:03d}/mod{i % 500:03d}.py": f"VALUE = {i}\n" for i in range(BIG_TARGET_FILES)}
    access = {"train": PartitionAccess(disclosure="full", min_aggregate_cases=1, total_runs=1000, total_cases=1000)}
    # A backend that never finishes: the jobs' own checkouts stay out of the timed calls.
    harness = make_harness(
        root / "big",
        baseline_files=files,
        backend=StubBackend(block=threading.Event()),
        partitions={"train": ["t1"]},
        access=access,
        candidate_limits=CandidateLimits(max_files=2 * BIG_TARGET_FILES),
    )

    async def run() -> dict:
        first = _service(harness)
        started = time.perf_counter()
        await first.start()
        first_start = time.perf_counter() - started
        await first.stop()
        again = _service(harness)
        started = time.perf_counter()
        await again.start()
        restart = time.perf_counter() - started
        admissions, checkouts, full = [], [], []
        index = root / "big-slot.index"
        work = root / "big-slot"
        await asyncio.to_thread(_sealed_update, again.candidates, harness.config.baseline_commit, work, index)
        for i in range(BIG_TARGET_EVALUATIONS):
            version = commit_file(harness.agent_repo, f"pkg{i:03d}/mod000.py", f"VALUE = 'changed {i}'\n", f"c{i}")
            started = time.perf_counter()
            view = await again.start_evaluation(PRINCIPAL, EvaluationRequest(partition="train", version=version))
            admissions.append(time.perf_counter() - started)
            started = time.perf_counter()
            update = await asyncio.to_thread(_sealed_update, again.candidates, view.candidate, work, index)
            checkouts.append(time.perf_counter() - started)
            assert update.changed is not None and len(update.changed) == 1
            if i < 2:
                dest = root / f"big-full-{i}"
                started = time.perf_counter()
                await asyncio.to_thread(again.candidates.checkout, view.candidate, dest)
                full.append(time.perf_counter() - started)
                shutil.rmtree(dest)
        await again.stop()
        return {
            "files": BIG_TARGET_FILES,
            "first_start_sec": first_start,
            "restart_sec": restart,
            "admission_ms": _median_ms(admissions),
            "slot_checkout_ms": _median_ms(checkouts),
            "full_checkout_ms": _median_ms(full),
        }

    return asyncio.run(run())


def _sealed_update(store, candidate: str, work: Path, index: Path):
    """The slot's update as the runner makes it (`JobRunner._checkout`): sealed once over, or its
    next update writes it whole."""
    update = store.update_worktree(candidate, work, index)
    assert store.seal_worktree(update)
    return update


# -- 3. start with 10,000 jobs ------------------------------------------------------------------


def _start_with_jobs(root: Path, n_jobs: int, baseline: Path | None = None) -> dict:

    from tests.sidecar._server import StubBackend, make_harness
    from vero.core.state import STATE_FILE
    from vero.spec.models import PartitionAccess

    access = {
        "train": PartitionAccess(
            disclosure="full", min_aggregate_cases=1, total_runs=10 * n_jobs, total_cases=100 * n_jobs
        )
    }
    harness = make_harness(
        root / "many", backend=StubBackend(), partitions={"train": ["t1", "t2", "t3"]}, access=access
    )

    async def run() -> dict:
        empty = _service(harness)
        started = time.perf_counter()
        await empty.start()
        empty_start = time.perf_counter() - started
        await empty.stop()
        await _fill_state(harness.state_dir / STATE_FILE, n_jobs, harness.config.baseline_commit)
        full = _service(harness)
        started = time.perf_counter()
        await full.start()
        full_start = time.perf_counter() - started
        status_started = time.perf_counter()
        status = await full.status(PRINCIPAL)
        status_ms = (time.perf_counter() - status_started) * 1e3
        await full.stop()
        served = _served_start(harness, SERVED_RUNS, baseline, n_jobs)
        return {
            **served,
            "jobs": n_jobs,
            "start_empty_sec": empty_start,
            "start_sec": full_start,
            "status_ms": status_ms,
            "status_bytes": len(status.model_dump_json()),
            "state_bytes": _tree_bytes(harness.state_dir),
        }

    return asyncio.run(run())


async def _fill_state(state_path: Path, n_jobs: int, candidate: str) -> None:
    """Open (create) the state store at `state_path` and add `n_jobs` finished jobs of `candidate`
    in bulk (500 a transaction), through the stores' own writes (`--fill-state`: the same with
    another checkout's vero, for its own schema)."""
    from datetime import UTC, datetime

    from vero.core.jobs import EvaluationJob, JobStore
    from vero.core.ledger import BudgetLedger, BudgetTotals, Cost
    from vero.core.state import StateStore

    state = StateStore.open(state_path)
    ledger = BudgetLedger.open(state, {("train", PRINCIPAL): BudgetTotals(runs=10 * n_jobs, cases=100 * n_jobs)})
    jobs = JobStore(ledger)
    template = EvaluationJob(
        id="ev-0000000000000000",
        principal=PRINCIPAL,
        partition="train",
        cases=["t1", "t2", "t3"],
        full_partition=True,
        version="HEAD",
        candidate=candidate,
        disclosure="full",
        reservation_id="ev-0000000000000000",
        created_at=datetime.now(UTC),
    )
    result = await asyncio.to_thread(_stub_result, candidate)
    batch = 500
    for first in range(0, n_jobs, batch):

        def fill(conn, first=first) -> None:
            for _ in range(first, min(first + batch, n_jobs)):
                job_id = JobStore.new_id()
                job = template.model_copy(update={"id": job_id, "reservation_id": job_id})
                ledger.reserve_in(conn, "train", PRINCIPAL, Cost.of_evaluation(3), job_id)
                jobs._insert(conn, job)
                jobs.finish_in(conn, job_id, "complete", result=result)

        await state.commit(fill)
    state.close()


def _baseline_state(harness, baseline: Path, n_jobs: int) -> Path:
    """A copy of the harness's state dir (its candidate store) whose state store the `baseline`
    checkout's vero fills itself (`--fill-state`): each side starts on a state of its own schema."""
    from vero.core.state import STATE_FILE

    copy = harness.root / "baseline-state"
    shutil.copytree(harness.state_dir, copy, ignore=shutil.ignore_patterns(f"{STATE_FILE}*"))
    subprocess.run(
        [
            str(baseline / ".venv" / "bin" / "python"),
            str(Path(__file__).resolve()),
            "--fill-state",
            str(copy / STATE_FILE),
            str(n_jobs),
            harness.config.baseline_commit,
        ],
        check=True,
    )
    return copy


def _served_start(harness, runs: int, baseline: Path | None = None, n_jobs: int = 0) -> dict:
    """Exec `vero harbor serve` on the harness's dirs (its state as it is) and time each start
    from the exec until `/health` answers 200, `runs` times after a warm-up (page cache); medians
    of the wall time and of the child's CPU time until then. The real command and app: typer, the
    config, the state store's open, recovery, the baseline, uvicorn (no network fence, local calls
    allowed: outside a container; as root, nested runs would run as `nobody`). `baseline`: another
    checkout whose `.venv/bin/vero` is timed the same way, alternating (`baseline_served_*`), on a
    copy of the state filled with `n_jobs` jobs by its own vero (`_baseline_state`)."""
    config = harness.root / "served-config.json"
    config.write_text(harness.config.model_dump_json())
    options = [
        "harbor",
        "serve",
        f"--config={config}",
        f"--state-dir={harness.state_dir}",
        f"--agent-repo={harness.agent_repo}",
        f"--context-dir={harness.context_dir}",
        f"--cases-dir={harness.cases_dir}",
        f"--baseline-dir={harness.baseline_dir}",
        f"--work-dir={harness.work_dir}",
        "--host=127.0.0.1",
        "--allow-local-agent-calls",
        "--unfenced-candidates",
        *(["--runner-user=nobody"] if os.geteuid() == 0 else []),
    ]
    commands = {"served": [str(Path(sys.executable).parent / "vero"), *options]}
    if baseline is not None:
        own_state = f"--state-dir={_baseline_state(harness, baseline, n_jobs)}"
        commands["baseline_served"] = [
            str(baseline / ".venv" / "bin" / "vero"),
            *(own_state if option.startswith("--state-dir=") else option for option in options),
        ]
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in commands}
    for round_ in range(runs + 1):
        for name, argv in commands.items():
            sample = _time_to_health(argv, harness.root / "served.log")
            if round_:
                samples[name].append(sample)
    figures = {}
    for name, runs_ in samples.items():
        figures[f"{name}_health_sec"] = statistics.median(wall for wall, _, _ in runs_)
        figures[f"{name}_cpu_sec"] = statistics.median(cpu for _, cpu, _ in runs_)
        figures[f"{name}_children_cpu_sec"] = statistics.median(children for _, _, children in runs_)
    return figures


def _time_to_health(argv: list[str], log_path: Path) -> tuple[float, float, float]:
    """Wall seconds from exec until `GET /health` answers 200, the child's CPU seconds by then and
    those of its children that ended by then (git)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    request = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()
    started = time.perf_counter()
    with log_path.open("wb") as log:
        # Bytecode is cached as in the sidecar's image (pip compiles the wheel it installs; this
        # shell may say not to write it): the warm-up start writes it, the timed ones read it.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        child = subprocess.Popen([*argv, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        while True:
            if child.poll() is not None:
                raise SystemExit(
                    f"`vero harbor serve` exited {child.returncode} before answering /health: "
                    + log_path.read_text(errors="replace")[-2000:]
                )
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                    conn.sendall(request)
                    if conn.recv(64).startswith(b"HTTP/1.1 200"):
                        break
            except OSError:
                time.sleep(0.005)
        wall = time.perf_counter() - started
        with open(f"/proc/{child.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        # Its own CPU, and its waited-for children's (the start's git processes) apart.
        return wall, (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick
    finally:
        child.terminate()
        child.wait(timeout=60)


def _stub_result(candidate: str):
    from datetime import UTC, datetime

    from vero.core.evaluation import AttemptResult, CaseResult, EvaluationResult

    now = datetime.now(UTC)
    return EvaluationResult.from_cases(
        partition="train",
        candidate=candidate,
        reward_key="reward",
        cases=[
            CaseResult.from_attempts(c, [AttemptResult(trial_name=f"{c}__x", reward=0.5)], 0.0)
            for c in ("t1", "t2", "t3")
        ],
        started_at=now,
        finished_at=now,
    )


# -- 4. agent CLI start-up ----------------------------------------------------------------------


def _install_like_main(root: Path, source: Path | None = None) -> Path:
    """vero installed the way the compiled task's `main` image installs it
    (`compiler/_tooling.Dockerfile.j2`): a `python3 -m venv` of the base interpreter, the client's
    pinned requirements (`vero.compiler.wheel.client_requirements`), then vero's own wheel
    (`build_wheel`) with pip, which byte-compiles it and writes the `vero` console script the
    agent runs. The requirements come through `uv pip` (its cache: offline here); what lands in
    site-packages, `.pth` files included, is the same. `source`: a checkout whose `src/vero` the
    wheel is built from (default: this one). Returns the venv's `bin` directory."""
    from vero.compiler.wheel import client_requirements

    root.mkdir(parents=True, exist_ok=True)
    venv = root / "main-venv"
    base_python = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([str(base_python), "-m", "venv", str(venv)], check=True, timeout=300)
    requirements = root / "requirements.txt"
    requirements.write_text("".join(f"{r}\n" for r in client_requirements()))
    subprocess.run(
        ["uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "-r", str(requirements)],
        check=True,
        timeout=600,
    )
    build = (
        "import sys; sys.path.insert(0, sys.argv[1]) if sys.argv[1] else None; "
        "from vero.compiler.wheel import build_wheel; w = build_wheel(); "
        "open(sys.argv[2] + '/' + w.filename, 'wb').write(w.data); print(w.filename)"
    )
    src = str(source / "src") if source is not None else ""
    built = subprocess.run(
        [sys.executable, "-c", build, src, str(root)], check=True, capture_output=True, text=True, timeout=300
    )
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    wheel = root / built.stdout.strip()
    subprocess.run([*pip, "--no-cache-dir", "--no-deps", str(wheel)], check=True, timeout=300)
    return venv / "bin"


def _cpu_ms(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user + system) milliseconds of one run of `argv`, output discarded; exits
    if `argv` fails.

    The child is reaped with `os.wait4`, which gives its own resource usage at once: `subprocess`'s
    wait with a timeout polls with growing sleeps (0.5, 1, 2, ... ms), which rounds wall times up
    to 16, 32 or 64 ms. A child still running after 120 s is killed.
    """
    started = time.perf_counter()
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killer = threading.Timer(120, child.kill)
    killer.start()
    try:
        _, status, usage = os.wait4(child.pid, 0)
    finally:
        killer.cancel()
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {child.returncode}: its time would not be the call's")
    return wall * 1e3, (usage.ru_utime + usage.ru_stime) * 1e3


def _cli_startup(url: str, baseline: str | None = None) -> dict:
    """What the agent pays per CLI call in `main`: vero installed as there (`_install_like_main`),
    `vero harbor status` run through its console script (start-up and the call to the sidecar at
    `url`), against `python -c pass` of the same interpreter. The commands alternate, `CLI_RUNS`
    rounds after a warm-up, so all see the same load; medians. `vero --help` (the typer
    application every other command loads) is measured the same way. `baseline`: a git revision
    whose agent CLI is installed beside and measured in the same rounds (`baseline_status_*`)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV")}
    env["VERO_SIDECAR_URL"] = url
    with tempfile.TemporaryDirectory(prefix="vero-growth-main-") as tmp:
        bin_dir = _install_like_main(Path(tmp) / "current")
        commands = {
            "python_pass": [str(bin_dir / "python"), "-c", "pass"],
            "status": [str(bin_dir / "vero"), "harbor", "status"],
            "status_help": [str(bin_dir / "vero"), "harbor", "status", "--help"],
            "eval_help": [str(bin_dir / "vero"), "harbor", "eval", "--help"],
            "typer_help": [str(bin_dir / "vero"), "--help"],
        }
        if baseline is not None:
            source = Path(tmp) / "baseline-source"
            source.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", "--format=tar", baseline], check=True, capture_output=True
            )
            subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
            baseline_vero = str(_install_like_main(Path(tmp) / "baseline", source) / "vero")
            commands["baseline_status"] = [baseline_vero, "harbor", "status"]
            commands["baseline_status_help"] = [baseline_vero, "harbor", "status", "--help"]
        samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in commands}
        for argv in commands.values():
            _cpu_ms(argv, env)  # warm-up: page cache
        for _ in range(CLI_RUNS):
            for name, argv in commands.items():
                samples[name].append(_cpu_ms(argv, env))
    figures = {}
    for name, runs in samples.items():
        figures[f"{name}_ms"] = statistics.median(wall for wall, _ in runs)
        figures[f"{name}_cpu_ms"] = statistics.median(cpu for _, cpu in runs)
    return figures


def _cli_line(cli: dict) -> str:
    line = (
        f"agent CLI in main: `vero harbor status` (start-up and the call) {cli['status_ms']:.0f} ms wall, "
        f"{cli['status_cpu_ms']:.0f} ms CPU, against `python -c pass` {cli['python_pass_ms']:.0f} ms wall, "
        f"{cli['python_pass_cpu_ms']:.0f} ms CPU ({cli['status_ms'] / cli['python_pass_ms']:.1f}x wall, "
        f"{cli['status_cpu_ms'] / cli['python_pass_cpu_ms']:.1f}x CPU); `vero harbor status --help` "
        f"{cli['status_help_cpu_ms']:.0f} ms CPU ({cli['status_help_cpu_ms'] / cli['python_pass_cpu_ms']:.2f}x), "
        f"`vero harbor eval --help` {cli['eval_help_cpu_ms']:.0f} ms CPU "
        f"({cli['eval_help_cpu_ms'] / cli['python_pass_cpu_ms']:.2f}x); the typer application "
        f"(`vero --help`) {cli['typer_help_ms']:.0f} ms wall, {cli['typer_help_cpu_ms']:.0f} ms CPU"
    )
    if "baseline_status_ms" in cli:
        line += (
            f"; the baseline's `vero harbor status` {cli['baseline_status_ms']:.0f} ms wall, "
            f"{cli['baseline_status_cpu_ms']:.0f} ms CPU "
            f"({cli['baseline_status_cpu_ms'] / cli['python_pass_cpu_ms']:.1f}x CPU), its `status --help` "
            f"{cli['baseline_status_help_cpu_ms']:.0f} ms CPU "
            f"({cli['baseline_status_help_cpu_ms'] / cli['python_pass_cpu_ms']:.2f}x)"
        )
    return line


def _start_line(many: dict) -> str:
    return (
        f"sidecar start: {many['start_sec']:.2f} s with {many['jobs']:,} jobs "
        f"({many['start_empty_sec']:.2f} s with none; {many['start_sec'] / many['start_empty_sec']:.2f}x); "
        f"/status then {many['status_ms']:.1f} ms, {many['status_bytes'] / 1024:.1f} KB; state "
        f"{many['state_bytes'] / 1024 / 1024:.1f} MB; `vero harbor serve` exec to `/health` 200: "
        f"{many['served_health_sec']:.2f} s wall, {many['served_cpu_sec']:.2f} s CPU "
        f"(+ {many['served_children_cpu_sec']:.2f} s in git; goal: <= 2 s)"
        + (
            f"; the baseline's {many['baseline_served_health_sec']:.2f} s wall, "
            f"{many['baseline_served_cpu_sec']:.2f} s CPU (+ {many['baseline_served_children_cpu_sec']:.2f} s), "
            f"CPU ratio {many['served_cpu_sec'] / many['baseline_served_cpu_sec']:.2f}x"
            if "baseline_served_health_sec" in many
            else ""
        )
    )


# -- report -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", action="store_true", help="Go on to 10,000 evaluations (about an hour).")
    parser.add_argument("--json", type=Path, default=None, help="Also write every figure to this JSON file.")
    parser.add_argument("--cli-only", action="store_true", help="Measure only the agent CLI's start-up.")
    parser.add_argument(
        "--start-baseline",
        metavar="DIR",
        type=Path,
        default=None,
        help="Also time `vero harbor serve` of this checkout (its .venv), alternating (3.).",
    )
    parser.add_argument(
        "--start-only", action="store_true", help="Measure only the sidecar's start with BULK_JOBS jobs (3.)."
    )
    parser.add_argument(
        "--cli-baseline",
        metavar="REV",
        default=None,
        help="Also measure the agent CLI of this git revision, in the same rounds (e.g. main).",
    )
    parser.add_argument(
        "--fill-state",
        nargs=3,
        metavar=("STATE_DB", "JOBS", "CANDIDATE"),
        default=None,
        help=argparse.SUPPRESS,  # `_baseline_state`: run by another checkout's Python
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="A quick run of the script itself (10 evaluations, small target): not the figures.",
    )
    args = parser.parse_args()
    if args.fill_state:
        state_db, n_jobs, candidate = args.fill_state
        asyncio.run(_fill_state(Path(state_db), int(n_jobs), candidate))
        return
    checkpoints = [1, 10, 100, 1000] + ([10_000] if args.long else [])
    global BIG_TARGET_FILES, BULK_JOBS, CLI_RUNS
    if args.smoke:
        checkpoints, BIG_TARGET_FILES, BULK_JOBS, CLI_RUNS = [1, 10], 2_000, 500, 3

    from rich.console import Console
    from rich.table import Table

    console = Console()
    began = time.monotonic()
    if args.cli_only:
        with tempfile.TemporaryDirectory(prefix="vero-growth-") as tmp:
            sidecar = _Sidecar(Path(tmp), "cli")
            try:
                cli = _cli_startup(sidecar.url, args.cli_baseline)
            finally:
                sidecar.close()
        console.print(_cli_line(cli))
        if args.json:
            args.json.write_text(json.dumps({"cli": cli}, indent=2))
        return
    if args.start_only:
        with tempfile.TemporaryDirectory(prefix="vero-growth-") as tmp:
            many = _start_with_jobs(Path(tmp), BULK_JOBS, args.start_baseline)
        console.print(_start_line(many))
        if args.json:
            args.json.write_text(json.dumps({"start_with_jobs": many}, indent=2))
        return
    with tempfile.TemporaryDirectory(prefix="vero-growth-") as tmp:
        root = Path(tmp)
        console.print(f"1. {checkpoints[-1]} evaluations through the app ...", style="dim")
        rows, cli = _growth(root, checkpoints, args.cli_baseline)
        console.print("2. a 50,000-file target ...", style="dim")
        big = _big_target(root)
        console.print(f"3. sidecar start with {BULK_JOBS:,} jobs ...", style="dim")
        many = _start_with_jobs(root, BULK_JOBS, args.start_baseline)

    table = Table(title="growth with the number of evaluations (uvicorn, loopback, stub backend)")
    table.add_column("measure")
    for row in rows:
        table.add_column(f"{row['n']:,}", justify="right")
    table.add_column("last / first", justify="right")
    for key, label, scale, unit in (
        ("admission_ms", "admission p50", 1, "ms"),
        ("completion_ms", "completion p50", 1, "ms"),
        ("status_1_ms", "GET /status p50, 1 client", 1, "ms"),
        ("status_16_ms", "GET /status p50, 16 clients", 1, "ms"),
        ("status_bytes", "GET /status body", 1024, "KB"),
        ("state_bytes", "state dir", 1024 * 1024, "MB"),
        ("rss_bytes", "server RSS", 1024 * 1024, "MB"),
    ):
        values = [row[key] / scale for row in rows]
        table.add_row(f"{label} ({unit})", *(f"{v:.1f}" for v in values), f"{values[-1] / values[0]:.2f}")
    for key, label in (
        ("admission", "admission"),
        ("completion", "completion"),
        ("status_1", "GET /status, 1 client"),
        ("status_16", "GET /status, 16 clients"),
    ):
        values = [row[f"{key}_ms"] / row[f"{key}_ref_ms"] for row in rows]
        table.add_row(f"{label}: grown / reference", *(f"{v:.2f}" for v in values), "")
    console.print(table)
    console.print(
        f"{BIG_TARGET_FILES:,}-file target: first start {big['first_start_sec']:.1f} s (rebuilds and imports "
        f"the baseline), restart {big['restart_sec']:.2f} s; per one-file evaluation: admission "
        f"{big['admission_ms']:.0f} ms, slot checkout {big['slot_checkout_ms']:.0f} ms (a full files-only "
        f"checkout: {big['full_checkout_ms']:.0f} ms, "
        f"{big['full_checkout_ms'] / big['slot_checkout_ms']:.0f}x)"
    )
    console.print(_start_line(many))
    console.print(_cli_line(cli))
    load = os.getloadavg()
    console.print(
        f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
        f"{load[0]:.1f}; wall time {time.monotonic() - began:.0f} s"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"growth": rows, "big_target": big, "start_with_jobs": many, "cli": cli}, indent=2)
        )


if __name__ == "__main__":
    main()
