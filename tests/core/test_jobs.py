"""Job store in the state store: admission and finishing in one transaction with the ledger, pages,
restart recovery, tampering, and a hammer of concurrent completions and failures."""

from __future__ import annotations

import asyncio
import random
import re
import sqlite3
import threading
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from vero.core.evaluation import CaseResult, EvaluationResult
from vero.core.jobs import EvaluationJob, JobStore, recover_interrupted
from vero.core.ledger import BudgetLedger, BudgetTotals, Cost
from vero.core.state import StateStore
from vero.errors import BudgetExhausted, Conflict, LedgerCorrupt, UnknownJob

from .test_ledger import assert_consistent, tamper

TOTALS = {
    ("train", "agent"): BudgetTotals(runs=100, cases=400),
    ("val", "agent"): BudgetTotals(runs=3, cases=6),
    ("train", "operator"): BudgetTotals(runs=10, cases=40),
}


@pytest.fixture
def jobs(tmp_path) -> JobStore:
    return JobStore(BudgetLedger.open(tmp_path / "state.db", TOTALS))


def new_job(make_job, **options) -> EvaluationJob:
    job_id = JobStore.new_id()
    return make_job(job_id, job_id=job_id, **options)


def result_for(job: EvaluationJob, score: float = 0.5) -> EvaluationResult:
    now = datetime.now(UTC)
    return EvaluationResult.from_cases(
        partition=job.partition,
        candidate=job.candidate,
        reward_key="reward",
        cases=[CaseResult.from_attempts(c, [], score) for c in job.cases],
        started_at=now,
        finished_at=now + timedelta(seconds=1),
    )


def reopen(store: JobStore) -> JobStore:
    return JobStore(BudgetLedger.open(StateStore.open(store.state.path), {}))


# admit / update / finish / get / list -------------------------------------------------------------------


async def test_admit_get_list_update_finish(jobs, make_job):
    assert jobs.list() == []
    first, reservation = await jobs.admit(new_job(make_job), Cost.of_evaluation(2))
    assert reservation.id == first.id and reservation.state == "reserved" and reservation.cost.cases == 2
    second, _ = await jobs.admit(new_job(make_job, principal="operator"), Cost.of_evaluation(2))
    third, _ = await jobs.admit(new_job(make_job), Cost.of_evaluation(2))
    assert jobs.get(first.id) == first
    assert [j.id for j in jobs.list()] == [first.id, second.id, third.id]
    assert [j.id for j in jobs.list("agent")] == [first.id, third.id]
    assert jobs.list("nobody") == []
    assert jobs.ledger.balance("train", "agent").reserved_runs == 2

    started = datetime.now(UTC)
    running = await jobs.update(first.id, state="running", started_at=started)
    assert running.state == "running" and running.started_at == started
    assert [j.id for j in jobs.unfinished()] == [first.id, second.id, third.id]
    cancelled = await jobs.finish(second.id, "cancelled", error="cancelled")
    assert cancelled.finished_at is not None
    assert jobs.ledger.reservation(second.id).state == "refunded"
    assert jobs.ledger.reservation(second.id).reason == "cancelled"
    done = await jobs.finish(first.id, "complete", result=result_for(first))
    assert done.result.score == 0.5 and jobs.ledger.reservation(first.id).state == "settled"
    assert [j.id for j in jobs.unfinished()] == [third.id]
    b = jobs.ledger.balance("train", "agent")
    assert (b.settled_runs, b.settled_cases, b.reserved_runs) == (1, 2, 1)
    assert_consistent(jobs.ledger)


def test_new_ids_are_well_formed_and_distinct():
    ids = {JobStore.new_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"ev-[0-9a-f]{16}", i) for i in ids)


async def test_a_result_round_trips(jobs, make_job):
    job, _ = await jobs.admit(new_job(make_job), Cost.of_evaluation(2))
    result = result_for(job, 0.0)
    await jobs.update(job.id, state="running")
    done = await jobs.finish(job.id, "complete", result=result)
    assert done.result == result
    assert reopen(jobs).get(job.id).result == result


async def test_refused_admissions_record_nothing(jobs, make_job):
    before = jobs.state.export_bytes()
    with pytest.raises(BudgetExhausted):
        await jobs.admit(new_job(make_job, partition="val"), Cost.of_evaluation(7))
    job, _ = await jobs.admit(new_job(make_job), Cost.of_evaluation(1))
    after = jobs.state.export_bytes()
    assert after != before
    with pytest.raises(ValueError):  # the job id exists: the reservation is rolled back with it
        await jobs.admit(make_job("rs-other", job_id=job.id), Cost.of_evaluation(1))
    with pytest.raises(ValueError):
        await jobs.admit(new_job(make_job, state="complete"), Cost.of_evaluation(1))
    with pytest.raises(ValidationError):
        await jobs.admit(make_job("rs-x", job_id="not-an-id"), Cost.of_evaluation(1))
    assert jobs.state.export_bytes() == after


async def test_errors(jobs, make_job):
    job, _ = await jobs.admit(new_job(make_job), Cost.of_evaluation(1))
    with pytest.raises(ValueError):
        await jobs.create(new_job(make_job))  # no open reservation of its own
    await jobs.ledger.reserve("train", "agent", Cost.of_evaluation(1), reservation_id="rs-free")
    with pytest.raises(ValueError):
        await jobs.create(make_job("rs-free", partition="val"))  # a reservation of another budget
    with pytest.raises(ValueError):
        await jobs.create(make_job(job.id))  # a reservation another job owns
    with pytest.raises(UnknownJob):
        jobs.get("ev-0000000000000000")
    with pytest.raises(UnknownJob):
        await jobs.update("ev-0000000000000000", state="running")
    with pytest.raises(UnknownJob):
        await jobs.finish("ev-0000000000000000", "failed")
    with pytest.raises(ValueError):
        await jobs.update(job.id, colour="blue")
    with pytest.raises(ValueError):
        await jobs.update(job.id, state="exploded")
    with pytest.raises(ValueError):
        await jobs.update(job.id, id="ev-1111111111111111")
    with pytest.raises(ValueError):
        await jobs.update(job.id, state="complete")  # terminal only through finish
    with pytest.raises(ValueError):
        await jobs.finish(job.id, "running")
    with pytest.raises(ValueError):
        await jobs.ledger.refund(job.id, "cancelled")  # the job has not finished
    assert jobs.get(job.id) == job  # nothing changed by the refused changes
    created = await jobs.create(make_job("rs-free"))
    assert jobs.get(created.id).reservation_id == "rs-free"


async def test_terminal_states_never_change(jobs, make_job):
    job, _ = await jobs.admit(new_job(make_job), Cost.of_evaluation(1))
    await jobs.update(job.id, state="running")
    with pytest.raises(Conflict):
        await jobs.update(job.id, state="queued")
    await jobs.finish(job.id, "cancelled", error="sealed")
    for state in ("running", "queued"):
        with pytest.raises(Conflict):
            await jobs.update(job.id, state=state)
    for state in ("complete", "failed", "cancelled"):
        with pytest.raises(Conflict):
            await jobs.finish(job.id, state)
    # Other fields of a terminal job may still be recorded.
    await jobs.update(job.id, started_at=datetime.now(UTC))
    assert jobs.get(job.id).state == "cancelled"
    assert jobs.ledger.reservation(job.id).reason == "sealed"


async def test_returned_jobs_are_immutable_snapshots_shared_while_unchanged(jobs, make_job):
    job, _ = await jobs.admit(new_job(make_job), Cost.of_evaluation(1))
    with pytest.raises(ValidationError):
        job.state = "complete"
    assert jobs.get(job.id) is jobs.get(job.id) is jobs.list()[0]
    updated = await jobs.update(job.id, state="running")
    assert job.state == "queued" and updated.state == "running" and jobs.get(job.id).state == "running"


async def test_concurrent_admissions_updates_and_finishes_are_all_recorded(jobs, make_job):
    admitted = await asyncio.gather(*(jobs.admit(new_job(make_job), Cost.of_evaluation(1)) for _ in range(50)))
    await asyncio.gather(*(jobs.update(j.id, state="running") for j, _ in admitted))
    await asyncio.gather(
        *(
            jobs.finish(j.id, "failed" if i % 2 else "complete", error="infrastructure" if i % 2 else None)
            for i, (j, _) in enumerate(admitted)
        )
    )
    again = reopen(jobs)
    assert [j.id for j in again.list()] == [j.id for j in jobs.list()]
    assert sorted(j.state for j in again.list()) == ["complete"] * 25 + ["failed"] * 25
    b = again.ledger.balance("train", "agent")
    assert (b.settled_runs, b.reserved_runs, b.remaining_runs) == (25, 0, 75)
    assert_consistent(jobs.ledger)


def test_usable_from_several_event_loops(jobs, make_job):
    async def burst() -> None:
        await asyncio.gather(*(jobs.admit(new_job(make_job), Cost.of_evaluation(1)) for _ in range(3)))

    for _ in range(3):
        asyncio.run(burst())
    assert len(reopen(jobs).list()) == 9


# pages and counts ----------------------------------------------------------------------------------------


async def test_pages_are_newest_first_with_a_cursor_and_filters(jobs, make_job):
    created = []
    for i in range(7):
        job, _ = await jobs.admit(new_job(make_job, partition="val" if i == 3 else "train"), Cost.of_evaluation(1))
        created.append(job)
    await jobs.admit(new_job(make_job, principal="operator"), Cost.of_evaluation(1))
    await jobs.finish(created[1].id, "failed", error="infrastructure")
    newest_first = [j.id for j in reversed(created)]

    pages, cursor = [], None
    while True:
        page = jobs.page("agent", limit=3, before=cursor)
        pages.append([j.id for j in page.jobs])
        cursor = page.next_cursor
        if cursor is None:
            break
    assert pages == [newest_first[:3], newest_first[3:6], newest_first[6:]]
    assert [j.id for j in jobs.page("agent", limit=7).jobs] == newest_first
    assert jobs.page("agent", limit=7).next_cursor is None
    assert [j.id for j in jobs.page("agent", limit=10, partition="val").jobs] == [created[3].id]
    assert [j.id for j in jobs.page("agent", limit=10, state="failed").jobs] == [created[1].id]
    assert jobs.counts("agent") == {"train": {"queued": 5, "failed": 1}, "val": {"queued": 1}}
    with pytest.raises(UnknownJob):  # another principal's job is no cursor
        jobs.page("operator", limit=1, before=created[0].id)
    with pytest.raises(ValueError):
        jobs.page("agent", limit=0)


# restart and recovery ----------------------------------------------------------------------------------


async def test_jobs_survive_reopen_in_creation_order(jobs, make_job):
    created = [(await jobs.admit(new_job(make_job), Cost.of_evaluation(1)))[0] for _ in range(5)]
    await jobs.update(created[2].id, state="running")
    again = reopen(jobs)
    assert again.list() == jobs.list()
    assert [j.id for j in again.unfinished()] == [j.id for j in created]


async def test_recover_interrupted_fails_unfinished_jobs_and_refunds_once(jobs, make_job):
    queued, _ = await jobs.admit(new_job(make_job), Cost.of_evaluation(2))
    running, _ = await jobs.admit(new_job(make_job), Cost.of_evaluation(2))
    await jobs.update(running.id, state="running")
    complete, _ = await jobs.admit(new_job(make_job), Cost.of_evaluation(2))
    await jobs.finish(complete.id, "complete", result=result_for(complete))
    await jobs.ledger.reserve("train", "agent", Cost.of_evaluation(1), reservation_id="rs-orphan")

    jobs = reopen(jobs)  # a restart
    recovered = await recover_interrupted(jobs)
    assert [j.id for j in recovered] == [queued.id, running.id]
    for job in recovered:
        assert (job.state, job.error) == ("failed", "interrupted") and job.finished_at is not None
        assert jobs.ledger.reservation(job.id).state == "refunded"
        assert jobs.ledger.reservation(job.id).reason == "interrupted"
    assert jobs.ledger.reservation("rs-orphan").state == "refunded"
    assert jobs.unfinished() == []
    after = jobs.ledger.balance("train", "agent")
    assert (after.reserved_runs, after.settled_runs, after.settled_cases, after.remaining_runs) == (0, 1, 2, 99)
    assert jobs.ledger.reservation(complete.id).state == "settled"  # measured stays charged

    exported = jobs.state.export_bytes()
    assert await recover_interrupted(jobs) == []  # idempotent
    assert jobs.state.export_bytes() == exported
    assert_consistent(jobs.ledger)


async def test_recover_without_reconciliation_leaves_orphan_reservations(jobs, make_job):
    await jobs.ledger.reserve("train", "agent", Cost.of_evaluation(1), reservation_id="rs-later")
    running, _ = await jobs.admit(new_job(make_job), Cost.of_evaluation(5))
    recovered = await recover_interrupted(jobs, reconcile_reservations=False)
    assert [j.id for j in recovered] == [running.id]
    assert jobs.ledger.reservation(running.id).state == "refunded"
    assert jobs.ledger.reservation("rs-later").state == "reserved"


# tampering ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "statements",
    [
        ["UPDATE jobs SET state = 'complete', record = json_set(record, '$.state', 'complete')"],  # reservation open
        ["UPDATE reservations SET state = 'refunded', closed_at = created_at"],  # job still queued
        ["UPDATE jobs SET record = json_set(record, '$.principal', 'operator')"],  # record and row disagree
        ["UPDATE jobs SET record = json_set(record, '$.cases', 7)"],  # the record is no EvaluationJob
        ["UPDATE jobs SET reservation_id = 'rs-none', record = json_set(record, '$.reservation_id', 'rs-none')"],
        ["DELETE FROM jobs"],  # its reservation stays; the count of jobs says one is missing
    ],
    ids=[
        "terminal-with-open-reservation",
        "closed-reservation-of-queued-job",
        "record-disagrees",
        "bad-record",
        "missing-reservation",
        "job-deleted",
    ],
)
async def test_a_tampered_job_table_refuses_to_open(jobs, make_job, statements):
    await jobs.admit(new_job(make_job), Cost.of_evaluation(1))
    path = jobs.state.path
    jobs.state.close()
    tamper(path, *statements)
    with pytest.raises(LedgerCorrupt, match=r"refusing to start|job record in the state store is invalid"):
        again = JobStore(BudgetLedger.open(path, {}))
        again.list()  # a record that only fails model validation is refused when read


# the race the store removes ----------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_concurrent_finishes_are_never_seen_half_done(jobs, make_job):
    """Complete and fail jobs concurrently from several event loops while readers on other threads
    look: a terminal job never has an open reservation, a closed reservation never an unfinished
    job, in one snapshot or across two reads in either order."""
    admitted = asyncio.run(_admit_many(jobs, make_job, 80))
    violations: list[str] = []
    done = threading.Event()
    looks = [0]

    def observe() -> None:
        rng = random.Random(threading.get_ident())
        while not done.is_set():
            job_id = rng.choice(admitted)

            def snapshot(conn: sqlite3.Connection, job_id: str = job_id) -> tuple[str, str]:
                return (jobs.get(job_id).state, jobs.ledger.reservation(job_id).state)

            job_state, reservation_state = jobs.state.read(snapshot)
            if (job_state in ("complete", "failed")) != (reservation_state != "reserved"):
                violations.append(f"snapshot: {job_state} / {reservation_state}")
            if jobs.get(job_id).state in ("complete", "failed") and jobs.ledger.reservation(job_id).state == "reserved":
                violations.append("terminal job seen before its settle or refund")
            if jobs.ledger.reservation(job_id).state != "reserved" and jobs.get(job_id).state == "queued":
                violations.append("closed reservation seen before its job finished")
            looks[0] += 1

    async def finish_half(ids: list[str]) -> None:
        await asyncio.gather(
            *(
                jobs.finish(job_id, "complete" if i % 2 else "failed", error=None if i % 2 else "infrastructure")
                for i, job_id in enumerate(ids)
            )
        )

    observers = [threading.Thread(target=observe) for _ in range(3)]
    for thread in observers:
        thread.start()
    try:
        finishers = [
            threading.Thread(target=lambda part=part: asyncio.run(finish_half(part)))
            for part in (admitted[0::2], admitted[1::2])
        ]
        for thread in finishers:
            thread.start()
        for thread in finishers:
            thread.join(60)
    finally:
        done.set()
        for thread in observers:
            thread.join(60)
    assert violations == []
    assert looks[0] > 0
    assert jobs.unfinished() == [] and jobs.ledger.open_reservations() == []
    assert_consistent(jobs.ledger)


async def _admit_many(jobs: JobStore, make_job, n: int) -> list[str]:
    admitted = await asyncio.gather(
        *(jobs.admit(new_job(make_job, cases=["c1"]), Cost.of_evaluation(1)) for _ in range(n))
    )
    return [job.id for job, _ in admitted]


def test_the_job_state_literal_is_the_one_list_of_states():
    from typing import get_args

    from vero.core.job_states import JOB_STATES, TERMINAL_JOB_STATES
    from vero.core.jobs import JobState

    assert get_args(JobState) == JOB_STATES
    assert set(TERMINAL_JOB_STATES) < set(JOB_STATES)


async def test_inference_money_follows_each_jobs_end(tmp_path, make_job):
    """The ledger's `inference_micro_usd`: each job reserves up to its ask (what is left, if less);
    a complete job is charged what its result's calls were charged, a cancelled one what its record
    says stays charged, an infrastructure failure nothing, and a job a restart finds running all of
    its reservation (what its calls cost died with the process); a queued one nothing."""
    from vero.core.usage import InferenceUsage

    totals = {("train", "agent"): BudgetTotals(runs=100, cases=1_000, inference_micro_usd=1_000_000)}
    jobs = JobStore(BudgetLedger.open(tmp_path / "state.db", totals))
    ask = Cost.of_evaluation(1, inference_micro_usd=300_000)
    admitted = [(await jobs.admit(new_job(make_job), ask))[0] for _ in range(5)]
    assert [jobs.ledger.reservation(j.id).cost.inference_micro_usd for j in admitted] == [300_000] * 3 + [100_000, 0]
    complete, cancelled, failed, running, queued = admitted
    result = result_for(complete).model_copy(update={"inference": InferenceUsage(calls=2, charged_micro_usd=120_000)})
    await jobs.finish(complete.id, "complete", result=result)
    await jobs.finish(cancelled.id, "cancelled", error="cancelled", inference_charged_micro_usd=50_000)
    await jobs.finish(failed.id, "failed", error="infrastructure")
    await jobs.update(running.id, state="running")
    jobs = reopen(jobs)  # a restart
    await recover_interrupted(jobs)
    charged = {j.id: jobs.ledger.reservation(j.id).charged.get("inference_micro_usd") for j in admitted}
    assert charged == {complete.id: 120_000, cancelled.id: 50_000, failed.id: 0, running.id: 100_000, queued.id: 0}
    balance = jobs.ledger.balance("train", "agent")
    assert balance.settled_inference_micro_usd == 270_000 and balance.reserved_inference_micro_usd == 0
    assert balance.remaining_inference_micro_usd == 730_000
    assert_consistent(jobs.ledger)
