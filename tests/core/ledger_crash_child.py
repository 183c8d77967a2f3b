"""Child process of the ledger crash test: reserve, settle and refund in a loop until killed.

Usage: python ledger_crash_child.py <state database path> <seed>

Prints `ready` once the ledger is open, then `B <id>` before each operation and one line *after* it
returned (so after its transaction was durable): `R <id>` reserved, `S <id>` settled, `F <id>`
refunded. The parent kills the process with SIGKILL at random moments and checks that the database
agrees with every acknowledged line (a trailing `B` means the kill hit a transaction in flight).

Two workers call the ledger directly; a third goes through the job store, as the sidecar does: it
admits a job (`R`: reservation and job in one transaction, with up to `INFERENCE_ASK` of inference
money, which the small entry often cannot give in full) and finishes it complete (`S <id> <spent>`:
settled, its result's model calls charged `spent`) or cancelled (`F <id> <spent>`: refunded, `spent`
staying charged), so the parent can also check that no kill separates a job's end from its settle
or refund, nor from what it charges of the inference money. When the jobs entry's money runs low
it first cancels a job an earlier child left queued (`end_a_job_left_open`), so the money keeps
moving through all the kills.
"""

from __future__ import annotations

import asyncio
import random
import sys
from datetime import UTC, datetime

from vero.core.evaluation import EvaluationResult
from vero.core.jobs import EvaluationJob, JobStore
from vero.core.ledger import BudgetLedger, BudgetTotals, Cost
from vero.core.usage import InferenceUsage
from vero.errors import BudgetExhausted

TOTALS = {
    ("train", "agent"): BudgetTotals(runs=1_000_000, cases=5_000_000),
    # Small enough to run out, so exhaustion and refunds interleave with the crashes.
    ("val", "agent"): BudgetTotals(runs=4, cases=12),
    ("jobs", "agent"): BudgetTotals(runs=1_000_000, cases=5_000_000, inference_micro_usd=3_000_000),
}
INFERENCE_ASK = 400_000
"""Micro-dollars each job asks to reserve; the jobs entry's 3 USD run out, so reservations are cut
to what is left and spending, settling and refunding interleave with the crashes."""


async def worker(ledger: BudgetLedger, rng: random.Random, prefix: str, in_flight: set[str]) -> None:
    counter = 0
    while True:
        counter += 1
        partition = "val" if rng.random() < 0.3 else "train"
        rid = f"rs-{prefix}-{counter}"
        in_flight.add(rid)
        print(f"B {rid}", flush=True)
        try:
            await ledger.reserve(partition, "agent", Cost.of_evaluation(rng.randint(0, 4)), reservation_id=rid)
        except BudgetExhausted:
            in_flight.discard(rid)
            # Release a reservation left open (here or by an earlier, killed child) that no worker
            # of this process is about to close, so the small entry keeps moving.
            open_ids = [r.id for r in ledger.open_reservations() if r.partition == partition and r.id not in in_flight]
            if open_ids:
                victim = rng.choice(open_ids)
                in_flight.add(victim)
                print(f"B {victim}", flush=True)
                await ledger.refund(victim, "cancelled")
                in_flight.discard(victim)
                print(f"F {victim}", flush=True)
            continue
        print(f"R {rid}", flush=True)
        roll = rng.random()
        if roll < 0.9:
            print(f"B {rid}", flush=True)
        if roll < 0.45:
            await ledger.settle(rid)
            print(f"S {rid}", flush=True)
        elif roll < 0.9:
            await ledger.refund(rid, "infrastructure")
            print(f"F {rid}", flush=True)
        # else: left open, as an evaluation in flight would be
        in_flight.discard(rid)


async def end_a_job_left_open(jobs: JobStore, rng: random.Random) -> None:
    """When the jobs entry cannot give a job its whole ask: cancel a job an earlier, killed child
    left queued (its reservation open), charging part of its money, as a restart's recovery ends
    the jobs a stopped sidecar left. Without it every kill that lands mid-job keeps up to
    `INFERENCE_ASK` reserved for good, the 3 USD run out after a few kills (how many depends on
    where the kills land, i.e. on the machine's load), and later jobs charge nothing."""
    if jobs.ledger.balance("jobs", "agent").remaining_inference_micro_usd >= INFERENCE_ASK:
        return
    left = [job for job in jobs.unfinished() if job.partition == "jobs"]
    if not left:
        return
    victim = rng.choice(left)
    spent = rng.randint(0, jobs.ledger.reservation(victim.reservation_id).cost.inference_micro_usd)
    print(f"B {victim.reservation_id}", flush=True)
    await jobs.finish(victim.id, "cancelled", error="cancelled", inference_charged_micro_usd=spent)
    print(f"F {victim.reservation_id} {spent}", flush=True)


async def job_worker(jobs: JobStore, rng: random.Random, prefix: str) -> None:
    counter = 0
    while True:
        counter += 1
        await end_a_job_left_open(jobs, rng)
        rid = f"rs-{prefix}-{counter}"
        job = EvaluationJob(
            id=JobStore.new_id(),
            principal="agent",
            partition="jobs",
            cases=["c1"],
            full_partition=True,
            version="HEAD",
            candidate="a" * 40,
            disclosure="full",
            reservation_id=rid,
            state="queued",
            created_at=datetime.now(UTC),
        )
        print(f"B {rid}", flush=True)
        _, reservation = await jobs.admit(job, Cost.of_evaluation(1, inference_micro_usd=INFERENCE_ASK))
        print(f"R {rid}", flush=True)
        spent = rng.randint(0, reservation.cost.inference_micro_usd)  # what its model calls were charged
        roll = rng.random()
        if roll < 0.9:
            print(f"B {rid}", flush=True)
        if roll < 0.3:
            now = datetime.now(UTC)
            result = EvaluationResult(
                partition="jobs",
                candidate="a" * 40,
                reward_key="reward",
                cases=[],
                score=0.0,
                started_at=now,
                finished_at=now,
                inference=InferenceUsage(calls=1, charged_micro_usd=spent),
            )
            await jobs.finish(job.id, "complete", result=result)
            print(f"S {rid} {spent}", flush=True)
        elif roll < 0.6:
            await jobs.finish(job.id, "cancelled", error="cancelled", inference_charged_micro_usd=spent)
            print(f"F {rid} {spent}", flush=True)
        elif roll < 0.9:
            await jobs.finish(job.id, "failed", error="infrastructure")
            print(f"F {rid} 0", flush=True)
        # else: left queued, as an evaluation in flight would be


async def main(path: str, seed: int) -> None:
    ledger = BudgetLedger.open(path, TOTALS)
    print("ready", flush=True)
    rng = random.Random(seed)
    in_flight: set[str] = set()
    await asyncio.gather(
        *(worker(ledger, random.Random(rng.random()), f"{seed}-{w}", in_flight) for w in range(2)),
        job_worker(JobStore(ledger), random.Random(rng.random()), f"{seed}-j"),
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
