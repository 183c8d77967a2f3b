"""Job store: durable records, index reconciliation after crashes, restart recovery with refunds."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from vero.core.evaluation import CaseResult, EvaluationResult
from vero.core.jobs import EvaluationJob, JobStore, recover_interrupted
from vero.core.ledger import BudgetLedger, BudgetTotals, Cost
from vero.core.storage import atomic_write_json, atomic_write_model
from vero.errors import Conflict, LedgerCorrupt, UnknownJob


def index_ids(root) -> list[str]:
    return json.loads((root / "jobs" / "index.json").read_text())["ids"]


# create / update / get / list -----------------------------------------------------------------------

async def test_create_get_list_update(tmp_path, make_job):
    store = JobStore.open(tmp_path)
    assert store.list() == [] and index_ids(tmp_path) == []
    first = await store.create(make_job("rs-1"))
    second = await store.create(make_job("rs-2", principal="operator"))
    third = await store.create(make_job("rs-3"))
    assert store.get(first.id) == first
    assert [j.id for j in store.list()] == [first.id, second.id, third.id]
    assert [j.id for j in store.list("agent")] == [first.id, third.id]
    assert [j.id for j in store.list("nobody")] == []
    assert index_ids(tmp_path) == [first.id, second.id, third.id]

    started = datetime.now(UTC)
    running = await store.update(first.id, state="running", started_at=started)
    assert running.state == "running" and running.started_at == started
    assert [j.id for j in store.unfinished()] == [first.id, second.id, third.id]
    await store.update(second.id, state="cancelled", error="cancelled")
    assert [j.id for j in store.unfinished()] == [first.id, third.id]

    on_disk = EvaluationJob.model_validate_json((tmp_path / "jobs" / f"{first.id}.json").read_bytes())
    assert on_disk == store.get(first.id)
    assert oct((tmp_path / "jobs" / f"{first.id}.json").stat().st_mode & 0o777) == "0o600"


def test_new_ids_are_well_formed_and_distinct():
    ids = {JobStore.new_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"ev-[0-9a-f]{16}", i) for i in ids)


async def test_a_result_round_trips(tmp_path, make_job):
    store = JobStore.open(tmp_path)
    job = await store.create(make_job("rs-1"))
    now = datetime.now(UTC)
    result = EvaluationResult.from_cases(partition="train", candidate="a" * 40, reward_key="reward",
                                         cases=[CaseResult.from_attempts("c1", [], 0.0)],
                                         started_at=now, finished_at=now + timedelta(seconds=3))
    await store.update(job.id, state="running")
    done = await store.update(job.id, state="complete", result=result, finished_at=now)
    assert done.result == result
    assert JobStore.open(tmp_path).get(job.id).result == result


async def test_errors(tmp_path, make_job):
    store = JobStore.open(tmp_path)
    job = await store.create(make_job("rs-1"))
    with pytest.raises(ValueError):
        await store.create(make_job("rs-other", job_id=job.id))
    with pytest.raises(UnknownJob):
        store.get("ev-0000000000000000")
    with pytest.raises(UnknownJob):
        await store.update("ev-0000000000000000", state="running")
    with pytest.raises(ValueError):
        await store.update(job.id, colour="blue")
    with pytest.raises(ValueError):
        await store.update(job.id, state="exploded")
    with pytest.raises(ValueError):
        await store.update(job.id, id="ev-1111111111111111")
    with pytest.raises(ValueError):
        await store.create(make_job("rs-x", job_id="not-an-id"))
    assert store.get(job.id) == job  # nothing changed by the refused updates
    assert EvaluationJob.model_validate_json((tmp_path / "jobs" / f"{job.id}.json").read_bytes()) == job


async def test_terminal_states_never_change(tmp_path, make_job):
    store = JobStore.open(tmp_path)
    job = await store.create(make_job("rs-1"))
    await store.update(job.id, state="running")
    with pytest.raises(Conflict):
        await store.update(job.id, state="queued")
    await store.update(job.id, state="cancelled", error="sealed")
    for state in ("complete", "running", "queued", "failed"):
        with pytest.raises(Conflict):
            await store.update(job.id, state=state)
    # Other fields of a terminal job may still be recorded.
    await store.update(job.id, finished_at=datetime.now(UTC))
    assert store.get(job.id).state == "cancelled"


async def test_returned_jobs_are_immutable_snapshots(tmp_path, make_job):
    store = JobStore.open(tmp_path)
    job = await store.create(make_job("rs-1"))
    with pytest.raises(ValidationError):
        job.state = "complete"
    with pytest.raises(ValidationError):
        store.list()[0].state = "failed"
    updated = await store.update(job.id, state="running")
    assert job.state == "queued" and updated.state == "running" and store.get(job.id).state == "running"


async def test_concurrent_creates_and_updates_are_all_recorded(tmp_path, make_job):
    store = JobStore.open(tmp_path)
    jobs = await asyncio.gather(*(store.create(make_job(f"rs-{i}")) for i in range(50)))
    await asyncio.gather(*(store.update(j.id, state="running") for j in jobs))
    reopened = JobStore.open(tmp_path)
    assert [j.id for j in reopened.list()] == [j.id for j in store.list()]
    assert {j.state for j in reopened.list()} == {"running"}
    assert sorted(index_ids(tmp_path)) == sorted(j.id for j in jobs)


def test_usable_from_several_event_loops(tmp_path, make_job):
    store = JobStore.open(tmp_path)

    async def burst() -> None:
        await asyncio.gather(*(store.create(make_job("rs")) for _ in range(3)))

    for _ in range(3):
        asyncio.run(burst())
    assert len(JobStore.open(tmp_path).list()) == 9


# restart and reconciliation ---------------------------------------------------------------------------

async def test_jobs_survive_reopen_in_creation_order(tmp_path, make_job):
    store = JobStore.open(tmp_path)
    created = [await store.create(make_job(f"rs-{i}")) for i in range(5)]
    await store.update(created[2].id, state="running")
    reopened = JobStore.open(tmp_path)
    assert reopened.list() == store.list()
    assert [j.id for j in reopened.unfinished()] == [j.id for j in created]


async def test_crash_after_record_before_index_is_reconciled(tmp_path, make_job):
    """Order 1 (the store's own order): the record landed, the index write did not."""
    store = JobStore.open(tmp_path)
    first = await store.create(make_job("rs-1"))
    index_before = (tmp_path / "jobs" / "index.json").read_bytes()
    orphan = make_job("rs-2", state="running")
    atomic_write_model(tmp_path / "jobs" / f"{orphan.id}.json", orphan)  # the record, then "crash"
    assert (tmp_path / "jobs" / "index.json").read_bytes() == index_before

    reopened = JobStore.open(tmp_path)
    assert [j.id for j in reopened.list()] == [first.id, orphan.id]
    assert reopened.get(orphan.id) == orphan
    assert index_ids(tmp_path) == [first.id, orphan.id]  # the index is repaired on disk
    assert [j.id for j in reopened.unfinished()] == [first.id, orphan.id]


async def test_index_entry_without_record_is_dropped(tmp_path, make_job):
    """Order 2: the index lists a job whose record never landed (or was lost)."""
    store = JobStore.open(tmp_path)
    first = await store.create(make_job("rs-1"))
    second = await store.create(make_job("rs-2"))
    ghost = JobStore.new_id()
    atomic_write_json(tmp_path / "jobs" / "index.json", {"schema_version": 1, "ids": [first.id, ghost, second.id]})

    reopened = JobStore.open(tmp_path)
    assert [j.id for j in reopened.list()] == [first.id, second.id]
    assert index_ids(tmp_path) == [first.id, second.id]
    with pytest.raises(UnknownJob):
        reopened.get(ghost)


async def test_missing_index_is_rebuilt_in_creation_order(tmp_path, make_job):
    store = JobStore.open(tmp_path)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    # ids sort differently from creation times
    jobs = [make_job(f"rs-{i}").model_copy(update={"created_at": base + timedelta(minutes=10 - i)})
            for i in range(4)]
    for job in jobs:
        await store.create(job)
    (tmp_path / "jobs" / "index.json").unlink()
    reopened = JobStore.open(tmp_path)
    assert [j.id for j in reopened.list()] == [j.id for j in reversed(jobs)]
    assert index_ids(tmp_path) == [j.id for j in reversed(jobs)]


def test_reconciled_store_is_not_rewritten_when_consistent(tmp_path):
    JobStore.open(tmp_path)
    index = tmp_path / "jobs" / "index.json"
    before = (index.stat().st_ino, index.stat().st_mtime_ns)
    JobStore.open(tmp_path)
    assert (index.stat().st_ino, index.stat().st_mtime_ns) == before


def test_open_removes_temp_files_of_interrupted_writes(tmp_path):
    (tmp_path / "jobs").mkdir()
    stale = tmp_path / "jobs" / ".ev-0123456789abcdef.json.k2j3h4.tmp"
    stale.write_bytes(b'{"id": "ev-01')
    assert JobStore.open(tmp_path).list() == []
    assert not stale.exists()


@pytest.mark.parametrize("content", [b"", b"\x00garbage", b"[]", b'{"schema_version": 2, "ids": []}',
                                     b'{"ids": ["x"], "extra": 1}'])
def test_corrupt_index_refuses_to_open(tmp_path, content):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "index.json").write_bytes(content)
    with pytest.raises(LedgerCorrupt) as info:
        JobStore.open(tmp_path)
    assert "index.json" in str(info.value)
    assert (tmp_path / "jobs" / "index.json").read_bytes() == content


async def test_corrupt_or_misnamed_record_refuses_to_open(tmp_path, make_job):
    store = JobStore.open(tmp_path)
    job = await store.create(make_job("rs-1"))
    record = tmp_path / "jobs" / f"{job.id}.json"
    record.write_bytes(b'{"id": "' + job.id.encode() + b'", "state": "runn')
    with pytest.raises(LedgerCorrupt) as info:
        JobStore.open(tmp_path)
    assert job.id in str(info.value)

    record.unlink()
    other = make_job("rs-2")
    atomic_write_model(tmp_path / "jobs" / "ev-ffffffffffffffff.json", other)
    with pytest.raises(LedgerCorrupt, match="different id"):
        JobStore.open(tmp_path)


# recovery after restart -----------------------------------------------------------------------------

async def _session(tmp_path, make_job):
    """A store and a ledger as a sidecar would leave them when killed mid-session."""
    ledger = BudgetLedger.open(tmp_path / "ledger.json", {("train", "agent"): BudgetTotals(runs=10, cases=100)})
    store = JobStore.open(tmp_path)
    jobs = {}
    for name, state in [("queued", "queued"), ("running", "running"), ("complete", "complete"),
                        ("infra", "failed")]:
        job = make_job("")
        await ledger.reserve("train", "agent", Cost.of_evaluation(2), reservation_id=job.id)
        jobs[name] = await store.create(job.model_copy(update={"reservation_id": job.id}))
        if state != "queued":
            await store.update(job.id, state="running")
        if state in ("complete", "failed"):
            await store.update(job.id, state=state, error="infrastructure" if state == "failed" else None)
    await ledger.settle(jobs["complete"].id)
    await ledger.refund(jobs["infra"].id, "infrastructure")
    return ledger, store, jobs


async def test_recover_interrupted_fails_unfinished_jobs_and_refunds_once(tmp_path, make_job):
    ledger, store, jobs = await _session(tmp_path, make_job)
    before = ledger.balance("train", "agent")
    assert (before.reserved_runs, before.settled_runs) == (2, 1)

    # A restart: both stores are reopened from disk.
    ledger = BudgetLedger.open(tmp_path / "ledger.json", {("train", "agent"): BudgetTotals(runs=10, cases=100)})
    store = JobStore.open(tmp_path)
    recovered = await recover_interrupted(store, ledger)
    assert [j.id for j in recovered] == [jobs["queued"].id, jobs["running"].id]
    for job in recovered:
        assert (job.state, job.error) == ("failed", "interrupted") and job.finished_at is not None
        assert ledger.reservation(job.reservation_id).state == "refunded"
        assert ledger.reservation(job.reservation_id).reason == "interrupted"
    assert store.unfinished() == []
    after = ledger.balance("train", "agent")
    assert (after.reserved_runs, after.reserved_cases, after.settled_runs, after.settled_cases) == (0, 0, 1, 2)
    assert after.remaining_runs == 9
    assert ledger.reservation(jobs["complete"].id).state == "settled"  # measured stays charged
    assert store.get(jobs["complete"].id).state == "complete"

    ledger_bytes = ledger.path.read_bytes()
    assert await recover_interrupted(store, ledger) == []  # idempotent
    assert ledger.path.read_bytes() == ledger_bytes
    reopened = BudgetLedger.open(ledger.path, {("train", "agent"): BudgetTotals(runs=10, cases=100)})
    assert reopened.balance("train", "agent") == after
    assert [j.state for j in JobStore.open(tmp_path).list()] == ["failed", "failed", "complete", "failed"]


async def test_recover_tolerates_closed_or_unknown_reservations(tmp_path, make_job):
    ledger = BudgetLedger.open(tmp_path / "ledger.json", {("train", "agent"): BudgetTotals(runs=10, cases=100)})
    store = JobStore.open(tmp_path)
    refunded = await store.create(make_job("rs-refunded", state="running"))
    settled = await store.create(make_job("rs-settled", state="running"))
    unknown = await store.create(make_job("rs-never-reserved", state="queued"))
    await ledger.reserve("train", "agent", Cost.of_evaluation(1), reservation_id="rs-refunded")
    await ledger.reserve("train", "agent", Cost.of_evaluation(1), reservation_id="rs-settled")
    await ledger.refund("rs-refunded", "cancelled")
    await ledger.settle("rs-settled")

    recovered = await recover_interrupted(store, ledger)
    assert {j.id for j in recovered} == {refunded.id, settled.id, unknown.id}
    assert ledger.reservation("rs-refunded").reason == "cancelled"  # untouched
    assert ledger.reservation("rs-settled").state == "settled"  # never refunded after settling
    balance = ledger.balance("train", "agent")
    assert (balance.settled_runs, balance.reserved_runs, balance.remaining_runs) == (1, 0, 9)


async def test_recover_repairs_a_crash_between_refund_and_job_update(tmp_path, make_job):
    ledger = BudgetLedger.open(tmp_path / "ledger.json", {("train", "agent"): BudgetTotals(runs=10, cases=100)})
    store = JobStore.open(tmp_path)
    job = await store.create(make_job("rs-1", state="running"))
    await ledger.reserve("train", "agent", Cost.of_evaluation(3), reservation_id="rs-1")
    await ledger.refund("rs-1", "interrupted")  # the first recovery got this far, then died

    recovered = await recover_interrupted(store, ledger)
    assert [j.id for j in recovered] == [job.id]
    assert store.get(job.id).state == "failed"
    assert ledger.balance("train", "agent").remaining_runs == 10


async def test_recover_reconciles_reservations_without_a_matching_job_state(tmp_path, make_job):
    ledger = BudgetLedger.open(tmp_path / "ledger.json", {("train", "agent"): BudgetTotals(runs=10, cases=100)})
    store = JobStore.open(tmp_path)
    # Crash between reserve and JobStore.create: nobody owns the reservation.
    await ledger.reserve("train", "agent", Cost.of_evaluation(2), reservation_id="rs-orphan")
    # Crash between the job's final update and settle/refund.
    done = await store.create(make_job("rs-done", state="running"))
    await store.update(done.id, state="complete")
    await ledger.reserve("train", "agent", Cost.of_evaluation(4), reservation_id="rs-done")
    cancelled = await store.create(make_job("rs-cancelled"))
    await store.update(cancelled.id, state="cancelled", error="sealed")
    await ledger.reserve("train", "agent", Cost.of_evaluation(1), reservation_id="rs-cancelled")

    assert await recover_interrupted(store, ledger) == []
    assert ledger.reservation("rs-orphan").state == "refunded"
    assert ledger.reservation("rs-orphan").reason == "interrupted"
    assert ledger.reservation("rs-done").state == "settled"
    assert ledger.reservation("rs-cancelled").reason == "sealed"
    balance = ledger.balance("train", "agent")
    assert (balance.settled_runs, balance.settled_cases, balance.reserved_runs) == (1, 4, 0)

    # Without reconciliation only unfinished jobs and their reservations are touched.
    await ledger.reserve("train", "agent", Cost.of_evaluation(1), reservation_id="rs-later")
    running = await store.create(make_job("rs-running", state="running"))
    await ledger.reserve("train", "agent", Cost.of_evaluation(5), reservation_id="rs-running")
    recovered = await recover_interrupted(store, ledger, reconcile_reservations=False)
    assert [j.id for j in recovered] == [running.id]
    assert ledger.reservation("rs-running").state == "refunded"
    assert ledger.reservation("rs-later").state == "reserved"
