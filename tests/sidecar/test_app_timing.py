"""No timing channel on `none`, and no two partitions' candidate hosts alive at once (real sidecar
over HTTP; the nested runs are stand-ins whose duration the test chooses, as a candidate chooses
its own).

On a `none` partition a candidate that sleeps 1 s and one that sleeps 20 s must look the same to
the agent in every answer: the job's view, `/status`, the list, the timestamps and the long poll,
which answers when the job is shown finished, at `created_at + quantum`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from vero.core.run import NestedRun
from vero.spec.models import CandidateRuntime, HarborSpec, PartitionAccess

from ._server import StubBackend, commit_file, make_harness, wait_for_state

pytestmark = pytest.mark.timeout(180)

ADMITTED_ONLY = {"id", "version", "candidate", "created_at", "finished_at"}
"""What differs between two jobs whatever they did: their names, and the admission time the agent
chose (finished_at is checked against it separately)."""


@dataclass
class TimedBackend(StubBackend):
    """Each run lasts what `seconds` says for its candidate (what a candidate that sleeps does to
    its evaluation), or fails for infrastructure reasons when its candidate is in `fail`."""

    seconds: dict[str, float] = field(default_factory=dict)
    fail: set[str] = field(default_factory=set)

    async def evaluate(self, run: NestedRun) -> object:
        started_at = datetime.now(UTC)
        await asyncio.sleep(self.seconds.get(run.candidate, 0.0))
        if run.candidate in self.fail:
            from vero.errors import InfrastructureFailure

            raise InfrastructureFailure("the engine went away")
        result = await super().evaluate(run)
        return result.model_copy(update={"started_at": started_at})


def harness_for(tmp_path, backend, *, quantum: float | None, runtime: CandidateRuntime | None = None, **extra):
    access = {
        "blind": PartitionAccess(
            disclosure="none", min_aggregate_cases=1, total_runs=10, total_cases=10, timing_quantum_sec=quantum
        ),
        "train": PartitionAccess(disclosure="full", min_aggregate_cases=1, total_runs=10, total_cases=10),
        **extra,
    }
    return make_harness(
        tmp_path / "h",
        backend=backend,
        access=access,
        partitions={"blind": ["b1"], "train": ["t1"], "other": ["o1"]},
        harbor=HarborSpec(drain_timeout_sec=5, infra_retries=0, evaluation_timeout_sec=600),
        runtime=runtime,
    )


def _admitted_view(view: dict) -> dict:
    return {k: v for k, v in view.items() if k not in ADMITTED_ONLY}


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_none_candidates_sleeping_1_and_20_seconds_look_identical(tmp_path):
    backend = TimedBackend()
    harness = harness_for(tmp_path, backend, quantum=25.0)
    quick = commit_file(harness.agent_repo, "solve.py", "print('quick')\n", "sleeps 1 s")
    slow = commit_file(harness.agent_repo, "solve.py", "print('slow')\n", "sleeps 20 s")
    backend.seconds = {quick: 1.0, slow: 20.0}  # a candidate is its commit
    polls: dict[str, tuple[float, dict]] = {}

    def long_poll(client, job_id: str) -> None:
        answer = client.get(f"/evaluations/{job_id}", params={"wait_sec": 60})
        polls[job_id] = (time.time(), answer.json())

    with harness.serve() as (_, client):
        views = []
        for version in (quick, slow):
            answer = client.post("/evaluations", json={"partition": "blind", "version": version})
            assert answer.status_code == 202, answer.text
            views.append(answer.json())
        ids = [v["id"] for v in views]
        pollers = [threading.Thread(target=long_poll, args=(client, job_id)) for job_id in ids]
        for poller in pollers:
            poller.start()
        # The quick candidate's run ended long ago; the slow one's just did: both still look running.
        time.sleep(21)
        middle = [client.get(f"/evaluations/{job_id}").json() for job_id in ids]
        status = client.get("/status").json()
        listed = client.get("/evaluations", params={"partition": "blind"}).json()["jobs"]
        short_polls = [client.get(f"/evaluations/{job_id}", params={"wait_sec": 1}).json() for job_id in ids]
        for poller in pollers:
            poller.join(timeout=60)
        final = [client.get(f"/evaluations/{job_id}").json() for job_id in ids]
        final_status = client.get("/status").json()
        final_list = client.get("/evaluations", params={"partition": "blind"}).json()["jobs"]
        export = {j["id"]: j for j in client.get("/admin/export", headers=harness.admin_headers()).json()["jobs"]}

    # The two candidates really did differ: the trusted records keep their real durations.
    durations = [_ts(export[i]["result"]["finished_at"]) - _ts(export[i]["result"]["started_at"]) for i in ids]
    assert durations[0] < 5 and durations[1] >= 20, durations
    # ... and the agent saw the same thing of both, at every step.
    for step in (views, middle, short_polls, final, [polls[i][1] for i in ids]):
        assert _admitted_view(step[0]) == _admitted_view(step[1]), step
    assert [v["state"] for v in middle] == ["running", "running"]
    assert [v["state"] for v in short_polls] == ["running", "running"]
    assert [v["state"] for v in final] == ["complete", "complete"]
    assert final[0]["result"] == {"disclosure": "none"} | {k: None for k in final[0]["result"] if k != "disclosure"}
    # Shown finished exactly one quantum after admission, and never answered before that time.
    for view in final:
        assert _ts(view["finished_at"]) - _ts(view["created_at"]) == pytest.approx(25.0, abs=1e-6)
    for job_id in ids:
        returned_at, body = polls[job_id]
        assert body["state"] == "complete" and returned_at >= _ts(body["finished_at"]), (returned_at, body)
    for answers in ((status, listed), (final_status, final_list)):
        summaries = {j["id"]: j for j in answers[0]["jobs"]}
        assert _admitted_view(summaries[ids[0]]) == _admitted_view(summaries[ids[1]])
        assert _admitted_view(answers[1][0]) == _admitted_view(answers[1][1])
    assert status["job_counts"] == {"blind": {"running": 2}}
    assert final_status["job_counts"] == {"blind": {"complete": 2}}
    blind = next(p for p in final_status["partitions"] if p["name"] == "blind")
    assert blind["budget"]["remaining_runs"] == 8


def test_a_longer_run_or_a_failure_is_shown_at_a_multiple_of_the_quantum(tmp_path):
    backend = TimedBackend()
    harness = harness_for(tmp_path, backend, quantum=3.0)
    quick = commit_file(harness.agent_repo, "solve.py", "print('quick')\n", "quick")
    long = commit_file(harness.agent_repo, "solve.py", "print('long')\n", "runs past one quantum")
    broken = commit_file(harness.agent_repo, "solve.py", "print('broken')\n", "meets an engine failure")
    backend.seconds = {quick: 0.1, long: 4.0, broken: 0.1}
    backend.fail = {broken}
    with harness.serve(max_concurrent_evaluations=3) as (_, client):
        ids = [
            client.post("/evaluations", json={"partition": "blind", "version": v}).json()["id"]
            for v in (quick, long, broken)
        ]
        done = [wait_for_state(client, i, {"complete", "failed"}, timeout_sec=30) for i in ids[:2]]
        failed = client.get(f"/evaluations/{ids[2]}")
        export = {j["id"]: j for j in client.get("/admin/export", headers=harness.admin_headers()).json()["jobs"]}
        full = client.post("/evaluations", json={"partition": "train", "version": quick}).json()
        full = wait_for_state(client, full["id"], {"complete"})
    assert [_ts(j["finished_at"]) - _ts(j["created_at"]) for j in done] == [pytest.approx(3.0), pytest.approx(6.0)]
    assert failed.status_code == 502  # refunded, and only said so at its time
    failure = export[ids[2]]
    assert failure["state"] == "failed" and _ts(failure["finished_at"]) - _ts(failure["created_at"]) == pytest.approx(
        3.0
    )
    # Other tiers are shown when they end.
    assert _ts(full["finished_at"]) - _ts(full["created_at"]) < 3.0


@dataclass
class GatedBackend(StubBackend):
    """Runs last until the test releases their candidate; records which runs overlapped."""

    release: dict[str, threading.Event] = field(default_factory=dict)
    alive: list[str] = field(default_factory=list)
    overlaps: list[tuple[str, ...]] = field(default_factory=list)
    order: list[str] = field(default_factory=list)

    async def evaluate(self, run: NestedRun) -> object:
        self.order.append(run.partition)
        self.alive.append(run.partition)
        self.overlaps.append(tuple(sorted(self.alive)))
        try:
            event = self.release.setdefault(run.candidate, threading.Event())
            while not event.is_set():
                await asyncio.sleep(0.02)
            return await super().evaluate(run)
        finally:
            self.alive.remove(run.partition)


@pytest.mark.parametrize("kind", ["agent", "program"])
def test_agent_candidates_of_two_partitions_never_run_at_once(tmp_path, kind):
    """`kind: agent`: candidate hosts share the sidecar's container, so a job waits until no other
    partition's job runs, first come first served; `kind: program` jobs overlap freely."""
    backend = GatedBackend()
    runtime = (
        CandidateRuntime(kind="agent", agent_import_path="pkg.agent:Agent")
        if kind == "agent"
        else CandidateRuntime(kind="program", install_path="/opt/candidate")
    )
    extra = {"other": PartitionAccess(disclosure="full", min_aggregate_cases=1, total_runs=10, total_cases=10)}
    harness = harness_for(tmp_path, backend, quantum=None, runtime=runtime, **extra)
    versions = [commit_file(harness.agent_repo, "solve.py", f"print({i})\n", f"v{i}") for i in range(3)]
    with harness.serve(max_concurrent_evaluations=3) as (_, client):
        jobs = [
            client.post("/evaluations", json={"partition": partition, "version": version}).json()
            for partition, version in zip(("train", "other", "train"), versions, strict=True)
        ]
        records = {j["id"]: j for j in client.get("/admin/export", headers=harness.admin_headers()).json()["jobs"]}
        candidates = [records[j["id"]]["candidate"] for j in jobs]
        deadline = time.monotonic() + 10
        expected_first = 1 if kind == "agent" else 3
        while len(backend.order) < expected_first and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        first = list(backend.order)
        for candidate in candidates:
            backend.release.setdefault(candidate, threading.Event()).set()
        for job in jobs:
            wait_for_state(client, job["id"], {"complete"})
    if kind == "agent":
        # train's second job waited behind other's, although train held the gate: no starvation.
        assert first == ["train"] and backend.order == ["train", "other", "train"]
        assert all(len(set(alive)) == 1 for alive in backend.overlaps), backend.overlaps
    else:
        assert sorted(first) == ["other", "train", "train"]


def test_a_held_none_job_cancelled_by_the_seal_keeps_its_measurement(tmp_path):
    """The seal's drain ends before the job is shown finished: it was measured, so it is recorded
    complete and stays charged, never cancelled and refunded (a free run)."""
    backend = TimedBackend()
    harness = make_harness(
        tmp_path / "h",
        backend=backend,
        access={
            "blind": PartitionAccess(
                disclosure="none", min_aggregate_cases=1, total_runs=3, total_cases=3, timing_quantum_sec=120.0
            )
        },
        partitions={"blind": ["b1"]},
        harbor=HarborSpec(drain_timeout_sec=1.0, infra_retries=0, evaluation_timeout_sec=600),
    )
    with harness.serve() as (_, client):
        job = client.post("/evaluations", json={"partition": "blind"}).json()
        time.sleep(1.0)  # measured (the stand-in answers at once), held for 120 s
        assert client.get(f"/evaluations/{job['id']}").json()["state"] == "running"
        sealed = client.post(
            "/admin/seal", json={"output_dir": str(tmp_path / "export")}, headers=harness.admin_headers()
        )
        assert sealed.status_code == 200 and sealed.json()["n_cancelled"] == 1, sealed.text
        export = client.get("/admin/export", headers=harness.admin_headers()).json()
    (record,) = export["jobs"]
    assert record["state"] == "complete" and len(record["result"]["cases"]) == 1, record
    (balance,) = export["balances"]
    assert (balance["settled_runs"], balance["reserved_runs"]) == (1, 0)


def test_a_none_job_that_waited_for_its_slot_counts_its_quantum_from_its_turn(tmp_path):
    """Counted from admission, a wait for the slot would add to the run: k would tell whether the
    run took longer than (quantum - wait), a threshold the agent sets by when it asks. Counted from
    its turn (the end of the job it waited for, which the agent sees), it tells nothing."""
    backend = TimedBackend()
    harness = harness_for(tmp_path, backend, quantum=3.0)
    ahead = commit_file(harness.agent_repo, "solve.py", "print('ahead')\n", "a full job ahead of it")
    behind = commit_file(harness.agent_repo, "solve.py", "print('behind')\n", "runs 1.5 s")
    backend.seconds = {ahead: 4.0, behind: 1.5}
    with harness.serve(max_concurrent_evaluations=1) as (_, client):
        first = client.post("/evaluations", json={"partition": "train", "version": ahead}).json()
        second = client.post("/evaluations", json={"partition": "blind", "version": behind}).json()
        first = wait_for_state(client, first["id"], {"complete"})
        second = wait_for_state(client, second["id"], {"complete"}, timeout_sec=30)
    waited = _ts(first["finished_at"]) - _ts(second["created_at"])
    # The 4 s ahead leave room for a slow second POST (the load of a busy CI machine) while the wait
    # still exceeds 1.5 s: that much wait plus the 1.5 s of its own would make k = 2 from admission.
    assert waited > 1.5
    assert _ts(second["finished_at"]) - _ts(first["finished_at"]) == pytest.approx(3.0, abs=0.5)
