"""Latency of the sidecar's agent API and throughput of the budget ledger.

    python benchmarks/sidecar_api.py [--json results.json]

Measures, in one run of about a minute on two cores:

1. p50/p99 latency and throughput of `GET /status` and of admission by `POST /evaluations` under 1,
   16 and 64 concurrent clients (`httpx.AsyncClient`), against the real app under uvicorn on
   loopback in a separate process. The evaluation backend is a stub that answers at once (the real
   one runs nested Harbor jobs in Docker), budgets are large enough never to refuse, and the
   admissions cycle over a few commits of a real agent repository (each admission resolves its
   version and imports the commit into the candidate store; only the first of each is fetched).
2. Ledger reservations per second: `BudgetLedger.reserve` in a loop, each one SQLite transaction
   of the state store (WAL, synchronous=FULL: fsynced) included.
3. Where admission time goes: the same steps as one admission, timed in this process, one at a time
   (candidate import of a new and of an already stored commit, ledger reservation, reservation and
   job record together).
4. `GET /status` against a trivial FastAPI app (one constant answer) served by the same uvicorn
   configuration in another process, alternating rounds at 1, 16 and 64 clients: the ratio of the
   time per request (`--status-only` for this alone).

Admitted jobs keep running in the background of the server process (candidate checkout, stub
evaluation, result and ledger writes) while later admissions are measured: that is the sidecar's
real working condition, and it shares the machine's cores with the load generator.

The sidecar under test is built with the test harness `tests/sidecar/_server.py` (the same
`create_app` arguments the tests use), so run this from the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for `tests.sidecar._server` (also in the spawned server process)

import httpx

from benchmarks._serving import serve_and_report

LEVELS = (1, 16, 64)
"""Concurrent clients."""
STATUS_REQUESTS = {1: 200, 16: 480, 64: 640}
"""`GET /status` requests per level."""
STATUS_WITH_JOBS_REQUESTS = 96
"""`GET /status` requests (16 clients) once every admitted job has finished."""
ADMISSIONS = {1: 24, 16: 64, 64: 128}
"""`POST /evaluations` requests per level."""
N_VERSIONS = 4
"""Commits the admissions cycle over."""
LEDGER_RESERVATIONS = 400
LEDGER_TIME_CAP_SEC = 15.0
PRINCIPAL = "agent"


@dataclass
class Measurement:
    what: str
    clients: int
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    per_sec: float


# -- the server process -----------------------------------------------------------------------


def _serve(root: str, conn) -> None:
    """Child process: build a sidecar over real repos and state dirs and serve it until SIGTERM."""
    import logging

    from tests.sidecar._server import DEFAULT_PARTITIONS, StubBackend, commit_file, make_harness
    from vero.spec.models import PartitionAccess

    logging.getLogger("vero").setLevel(logging.WARNING)
    access = {
        "train": PartitionAccess(
            disclosure="full", min_aggregate_cases=1, total_runs=1_000_000, total_cases=100_000_000
        )
    }
    harness = make_harness(
        Path(root),
        backend=StubBackend(write_job_dir=False),
        partitions={"train": DEFAULT_PARTITIONS["train"]},
        access=access,
    )
    versions = [commit_file(harness.agent_repo, "solve.py", f"print({i})\n", f"version {i}") for i in range(N_VERSIONS)]
    app = harness.create_app()
    serve_and_report(app, conn, lambda port: (port, versions))


def _serve_trivial(conn) -> None:
    """Child process: a trivial FastAPI app (`GET /status` answers a constant) on the uvicorn
    configuration `_serve` uses: the floor a request to the sidecar's stack costs."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/status")
    async def status() -> dict[str, str]:
        return {"status": "ok"}

    serve_and_report(app, conn)


# -- load generation --------------------------------------------------------------------------


async def _load(url: str, clients: int, total: int, make_request) -> tuple[list[float], int, float]:
    """Send `total` requests from `clients` concurrent clients; latencies in seconds.

    Each client is its own `httpx.AsyncClient` with one keep-alive connection, as separate agents
    would be (one shared pool of 64 connections measures httpcore's pool more than the sidecar).
    """
    latencies: list[float] = []
    errors = 0
    counter = iter(range(total))
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        for i in counter:
            started = time.perf_counter()
            response = await make_request(client, i)
            latencies.append(time.perf_counter() - started)
            if not response.is_success:
                errors += 1

    async with contextlib.AsyncExitStack() as stack:
        pool = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, limits=limits, timeout=120, trust_env=False)
            )
            for _ in range(clients)
        ]
        await asyncio.gather(*(client.get("/health") for client in pool))  # connect outside the clock
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for client in pool))
        elapsed = time.perf_counter() - started
    return latencies, errors, elapsed


def _measure(what: str, url: str, clients: int, total: int, make_request) -> Measurement:
    latencies, errors, elapsed = asyncio.run(_load(url, clients, total, make_request))
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return Measurement(
        what=what,
        clients=clients,
        requests=total,
        errors=errors,
        p50_ms=cuts[49] * 1e3,
        p99_ms=cuts[98] * 1e3,
        per_sec=total / elapsed,
    )


def _api(url: str, versions: list[str]) -> tuple[list[Measurement], float | None]:
    async def status(client: httpx.AsyncClient, _i: int) -> httpx.Response:
        return await client.get("/status")

    async def admit(client: httpx.AsyncClient, i: int) -> httpx.Response:
        return await client.post("/evaluations", json={"partition": "train", "version": versions[i % len(versions)]})

    results = []
    _measure("warm-up", url, 4, 40, status)
    for clients in LEVELS:
        results.append(_measure("GET /status (0 jobs)", url, clients, STATUS_REQUESTS[clients], status))
    _measure("warm-up", url, 1, N_VERSIONS, admit)  # first import of every version
    for clients in LEVELS:
        results.append(_measure("POST /evaluations", url, clients, ADMISSIONS[clients], admit))
    n_jobs = N_VERSIONS + sum(ADMISSIONS.values())
    drain_sec = _drain(url)
    results.append(_measure(f"GET /status ({n_jobs} jobs)", url, 16, STATUS_WITH_JOBS_REQUESTS, status))
    return results, drain_sec


STATUS_ROUNDS = 5
"""Alternating rounds of `GET /status` on the sidecar and on the trivial app, per level."""


def _cpu_sec(pid: int) -> float:
    """User + system CPU seconds the process `pid` has used so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_against_trivial(servers: dict[str, tuple[str, int]]) -> list[dict]:
    """`GET /status` on the sidecar and on the trivial app (`_serve_trivial`): `servers` maps
    `sidecar` and `trivial` to (url, server pid). Alternating rounds of `STATUS_REQUESTS[clients]`
    requests at each level; per level the medians over the rounds of the server process's CPU time
    per request (what the request costs the server, whatever else the machine runs), of the wall
    time per request (elapsed / requests) and of p50, and the ratios sidecar / trivial."""

    async def status(client: httpx.AsyncClient, _i: int) -> httpx.Response:
        return await client.get("/status")

    rows = []
    for url, _ in servers.values():
        _measure("warm-up", url, 4, 40, status)
    for clients in LEVELS:
        total = STATUS_REQUESTS[clients]
        rounds: dict[str, list[tuple[Measurement, float]]] = {name: [] for name in servers}
        for _ in range(STATUS_ROUNDS):
            for name, (url, pid) in servers.items():
                before = _cpu_sec(pid)
                measured = _measure("GET /status", url, clients, total, status)
                rounds[name].append((measured, (_cpu_sec(pid) - before) * 1e3 / total))
        row: dict = {"clients": clients}
        for name, runs in rounds.items():
            row[f"{name}_cpu_ms_per_request"] = statistics.median(cpu for _, cpu in runs)
            row[f"{name}_ms_per_request"] = statistics.median(1e3 / m.per_sec for m, _ in runs)
            row[f"{name}_p50_ms"] = statistics.median(m.p50_ms for m, _ in runs)
        for figure in ("cpu_ms_per_request", "ms_per_request", "p50_ms"):
            row[f"ratio_{figure}"] = row[f"sidecar_{figure}"] / row[f"trivial_{figure}"]
        rows.append(row)
    return rows


def _status_table(rows: list[dict]):
    from rich.table import Table

    table = Table(title="GET /status, the sidecar / a trivial app on the same uvicorn stack (goal <= 1.2x)")
    table.add_column("clients", justify="right")
    for _figure, label in (
        ("cpu_ms_per_request", "server CPU ms/request"),
        ("ms_per_request", "wall ms/request"),
        ("p50_ms", "p50 ms"),
    ):
        table.add_column(f"{label}: sidecar / trivial = ratio", justify="right")
    for row in rows:
        table.add_row(
            str(row["clients"]),
            *(
                f"{row[f'sidecar_{figure}']:.2f} / {row[f'trivial_{figure}']:.2f} = {row[f'ratio_{figure}']:.2f}"
                for figure in ("cpu_ms_per_request", "ms_per_request", "p50_ms")
            ),
        )
    return table


def _drain(url: str, cap_sec: float = 90.0) -> float | None:
    """Seconds until every admitted job has finished (the background backlog), None past `cap_sec`;
    so that the last `GET /status` row measures a listing of finished jobs, not a busy server."""
    started = time.perf_counter()
    with httpx.Client(base_url=url, timeout=120, trust_env=False) as client:
        while time.perf_counter() - started < cap_sec:
            counts = client.get("/status").json()["job_counts"]
            if not any(state in ("queued", "running") for states in counts.values() for state in states):
                return time.perf_counter() - started
            time.sleep(0.25)
    return None


# -- in-process measurements ------------------------------------------------------------------


def _ledger(root: Path) -> dict:
    from vero.core.ledger import BudgetLedger, BudgetTotals, Cost

    ledger = BudgetLedger.open(root / "state.db", {("train", PRINCIPAL): BudgetTotals(runs=10**7, cases=10**9)})
    cost = Cost.of_evaluation(6)

    async def run() -> list[float]:
        stamps = [time.perf_counter()]
        deadline = stamps[0] + LEDGER_TIME_CAP_SEC
        for _ in range(LEDGER_RESERVATIONS):
            await ledger.reserve("train", PRINCIPAL, cost)
            stamps.append(time.perf_counter())
            if stamps[-1] > deadline:
                break
        return stamps

    stamps = asyncio.run(run())
    n = len(stamps) - 1
    tenth = max(1, n // 10)
    return {
        "reservations": n,
        "per_sec": n / (stamps[-1] - stamps[0]),
        "first_tenth_per_sec": tenth / (stamps[tenth] - stamps[0]),
        "last_tenth_per_sec": tenth / (stamps[-1] - stamps[-1 - tenth]),
        "file_bytes": sum(p.stat().st_size for p in root.glob("state.db*")),
    }


def _admission_steps(root: Path) -> dict[str, float]:
    """Mean milliseconds of each admission step, sequential, no concurrent load."""
    from datetime import UTC, datetime

    from tests.sidecar._server import commit_file, make_harness
    from vero.core.candidates import CandidateStore
    from vero.core.jobs import EvaluationJob, JobStore
    from vero.core.ledger import BudgetLedger, BudgetTotals, Cost
    from vero.core.state import StateStore

    harness = make_harness(root / "steps")
    versions = [commit_file(harness.agent_repo, "solve.py", f"print({i})\n", f"v{i}") for i in range(N_VERSIONS)]
    state = StateStore.open(root / "steps" / "state" / "state.db")
    store = CandidateStore.open(root / "steps" / "state", state)
    ledger = BudgetLedger.open(state, {("train", PRINCIPAL): BudgetTotals(runs=10**6, cases=10**8)})
    jobs = JobStore(ledger)

    def mean_ms(samples: list[float]) -> float:
        return statistics.fmean(samples) * 1e3

    async def run() -> dict[str, float]:
        fresh, repeat, reserve, create = [], [], [], []
        for version in versions:
            t = time.perf_counter()
            await store.import_version(harness.agent_repo, version)
            fresh.append(time.perf_counter() - t)
        for i in range(40):
            version = versions[i % len(versions)]
            t = time.perf_counter()
            record = await store.import_version(harness.agent_repo, version)
            repeat.append(time.perf_counter() - t)
            job_id = JobStore.new_id()
            t = time.perf_counter()
            await ledger.reserve("train", PRINCIPAL, Cost.of_evaluation(6), reservation_id=job_id)
            reserve.append(time.perf_counter() - t)
            job = EvaluationJob(
                id=JobStore.new_id(),
                principal=PRINCIPAL,
                partition="train",
                cases=[f"t{k}" for k in range(1, 7)],
                full_partition=True,
                version=version,
                candidate=record.id,
                disclosure="full",
                reservation_id="",
                created_at=datetime.now(UTC),
            )
            job = job.model_copy(update={"reservation_id": job.id})
            t = time.perf_counter()
            await jobs.admit(job, Cost.of_evaluation(6))
            create.append(time.perf_counter() - t)
        return {
            "candidate import, new commit (fetch + checks)": mean_ms(fresh),
            "candidate import, stored commit (resolve + lookup)": mean_ms(repeat),
            "ledger reservation (one transaction)": mean_ms(reserve),
            "reservation + job record (one transaction, as admitted)": mean_ms(create),
        }

    return asyncio.run(run())


# -- report -----------------------------------------------------------------------------------


def _machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="Also write the results as JSON to this file.")
    parser.add_argument("--status-only", action="store_true", help="Only `GET /status` against the trivial app (4.).")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console()
    started = time.monotonic()
    machine = _machine()
    with tempfile.TemporaryDirectory(prefix="vero-bench-") as tmp:
        root = Path(tmp)
        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe()
        server = context.Process(target=_serve, args=(str(root / "server"), child_end), name="vero-bench-sidecar")
        server.start()
        try:
            if not parent_end.poll(120):
                raise SystemExit("the sidecar did not start in 120 s")
            ready = parent_end.recv()
            if ready is None:
                raise SystemExit("the sidecar failed to start")
            port, versions = ready
            trivial_end, trivial_child_end = context.Pipe()
            trivial = context.Process(target=_serve_trivial, args=(trivial_child_end,), name="vero-bench-trivial")
            trivial.start()
            try:
                if not trivial_end.poll(120) or (trivial_port := trivial_end.recv()) is None:
                    raise SystemExit("the trivial app did not start")
                against = _status_against_trivial(
                    {
                        "sidecar": (f"http://127.0.0.1:{port}", server.pid),
                        "trivial": (f"http://127.0.0.1:{trivial_port}", trivial.pid),
                    }
                )
            finally:
                trivial.terminate()
                trivial.join(60)
            if args.status_only:
                console.print(_status_table(against))
                if args.json:
                    args.json.write_text(json.dumps({"machine": machine, "status_against_trivial": against}, indent=2))
                return
            api, drain_sec = _api(f"http://127.0.0.1:{port}", versions)
        finally:
            server.terminate()  # SIGTERM: uvicorn shuts down gracefully
            server.join(60)
        ledger = _ledger(root)
        steps = _admission_steps(root)

    table = Table(title="sidecar agent API (uvicorn, loopback, stub backend)")
    for column in ("request", "clients", "requests", "errors", "p50 ms", "p99 ms", "req/s"):
        table.add_column(column, justify="left" if column == "request" else "right")
    for m in api:
        table.add_row(
            m.what,
            str(m.clients),
            str(m.requests),
            str(m.errors),
            f"{m.p50_ms:.1f}",
            f"{m.p99_ms:.1f}",
            f"{m.per_sec:.0f}",
        )
    console.print(table)
    n_jobs = N_VERSIONS + sum(ADMISSIONS.values())
    console.print(
        f"background: the {n_jobs} admitted jobs (checkout, stub run, result and ledger writes; "
        f"2 at a time) finished "
        + (
            f"{drain_sec:.1f} s after the last admission"
            if drain_sec is not None
            else "later than 90 s after the last admission"
        )
    )
    console.print(
        f"ledger: {ledger['reservations']} reservations, {ledger['per_sec']:.0f}/s "
        f"(first tenth {ledger['first_tenth_per_sec']:.0f}/s, last tenth "
        f"{ledger['last_tenth_per_sec']:.0f}/s; one fsynced transaction each, "
        f"{ledger['file_bytes']} bytes of database at the end)"
    )
    steps_table = Table(title="one admission, step by step (in-process, sequential, mean)")
    steps_table.add_column("step")
    steps_table.add_column("ms", justify="right")
    for step, ms in steps.items():
        steps_table.add_row(step, f"{ms:.1f}")
    console.print(steps_table)
    console.print(_status_table(against))
    git_ms = steps["candidate import, stored commit (resolve + lookup)"]
    durable_ms = steps["reservation + job record (one transaction, as admitted)"]
    console.print(
        f"admission of a stored commit: git {git_ms:.1f} ms (subprocesses, run in threads, in "
        f"parallel) + one transaction {durable_ms:.1f} ms (fsync; transactions are serialized, so "
        f"they bound admissions at about {1e3 / durable_ms:.0f}/s under load)"
    )
    console.print(
        f"machine: {machine['cpu_count']} CPUs ({machine['usable_cpus']} usable) {machine['cpu_model']}, "
        f"Python {machine['python']}, {machine['platform']}"
    )
    console.print(f"wall time: {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine,
                    "api": [asdict(m) for m in api],
                    "background_drain_sec": drain_sec,
                    "ledger": ledger,
                    "admission_steps_ms": steps,
                    "status_against_trivial": against,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
