"""Ladder mode over the real HTTP surface: only improvements beyond the margin are disclosed, rounded;
the answer is durable across a restart; two evaluations finishing at once are judged one after the
other; failures and dead attempts disclose nothing the Ladder withholds; operators keep the trusted
full measurements."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vero.spec.models import LadderSpec, PartitionAccess, ScoringSpec

from ._server import StubBackend, make_harness, wait_for_state

pytestmark = pytest.mark.timeout(120)

VERO = str(Path(sys.executable).with_name("vero"))

CASES = ["h1", "h2", "h3", "h4", "h5", "h6"]
BLOCKS = [["h1", "h2", "h3"], ["h4", "h5", "h6"]]


def ladder_harness(tmp_path, *, direction="maximize", margin=0.05, precision=0.01, backend=None):
    access = {
        "holdout": PartitionAccess(
            disclosure="aggregate",
            min_aggregate_cases=3,
            blocks=BLOCKS,
            ladder=LadderSpec(margin=margin, precision=precision),
            total_runs=20,
            total_cases=120,
        )
    }
    scoring = ScoringSpec(direction=direction, failure_value=100.0 if direction == "minimize" else None)
    return make_harness(
        tmp_path, partitions={"holdout": CASES}, access=access, scoring=scoring, backend=backend or StubBackend()
    )


def evaluate(harness, client, score: float | None, **selection) -> dict:
    """One evaluation in which every selected case scores `score` (None: a dead attempt)."""
    harness.backend.scores = dict.fromkeys(CASES, score)
    started = client.post("/evaluations", json={"partition": "holdout", **selection})
    assert started.status_code == 202, started.text
    return wait_for_state(client, started.json()["id"], {"complete", "failed", "cancelled"})


def answer(job: dict) -> tuple[float | None, bool | None]:
    return job["result"]["score"], job["result"]["improved"]


def test_a_sequence_discloses_only_rounded_improvements_and_survives_a_restart(tmp_path):
    harness = ladder_harness(tmp_path)
    with harness.serve() as (_, client):
        holdout = client.get("/status").json()["partitions"][0]
        assert holdout["ladder"] == {"margin": 0.05, "precision": 0.01} and holdout["blocks"] == BLOCKS
        first = evaluate(harness, client, 0.5037)
        assert first["result"] == {
            "disclosure": "aggregate",
            "score": 0.5,
            "improved": True,
            "n_cases": 6,
            "n_attempts": None,
            "n_dead": None,
            "cases": None,
            "artifacts_path": None,
            "inference": None,
            "inference_usd": None,
        }
        assert answer(evaluate(harness, client, 0.52)) == (0.5, False)  # +0.0163: the previous best again
        assert answer(evaluate(harness, client, 0.5612)) == (0.56, True)
        assert answer(evaluate(harness, client, 0.41)) == (0.56, False)  # worse: never disclosed
        # A block is another case set: its own ladder, and it does not move the partition's.
        assert answer(evaluate(harness, client, 0.9, blocks=[0])) == (0.9, True)
        assert answer(evaluate(harness, client, 0.6)) == (0.56, False)
        # Dead attempts score the failure value and disclose no count beside the Ladder's answer.
        dead = evaluate(harness, client, None)
        assert answer(dead) == (0.56, False) and dead["result"]["n_dead"] is None
        # The status lists the same answers (newest first); operators see the trusted measurements.
        listed = [job["result"] for job in reversed(client.get("/status").json()["jobs"])]
        assert [(r["score"], r["improved"]) for r in listed] == [
            (0.5, True),
            (0.5, False),
            (0.56, True),
            (0.56, False),
            (0.9, True),
            (0.56, False),
            (0.56, False),
        ]
        records = client.get("/admin/export", headers=harness.admin_headers()).json()["jobs"]
        assert [job["result"]["score"] for job in records] == pytest.approx([0.5037, 0.52, 0.5612, 0.41, 0.9, 0.6, 0.0])
        assert [job["ladder"]["improved"] for job in records] == [True, False, True, False, True, False, False]

    # A restart must not reset the best: 0.6 is still within the margin of the 0.56 disclosed before.
    with harness.serve() as (server, client):
        again = evaluate(harness, client, 0.6)
        assert answer(again) == (0.56, False)
        shown = subprocess.run(
            [VERO, "harbor", "result", again["id"], "--text"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "VERO_SIDECAR_URL": server.url},
        )
        assert shown.returncode == 0, shown.stderr
        assert "score 0.56 over 6 cases, not improved" in shown.stdout and "0.6 " not in shown.stdout
        assert answer(evaluate(harness, client, 0.93, blocks=[0])) == (0.9, False)
        assert answer(evaluate(harness, client, 0.6149)) == (0.61, True)


def test_minimize_and_infrastructure_failures(tmp_path):
    harness = ladder_harness(tmp_path, direction="minimize", margin=1.0, precision=0.5)
    with harness.serve() as (_, client):
        assert answer(evaluate(harness, client, 10.2)) == (10.0, True)
        assert answer(evaluate(harness, client, 9.6)) == (10.0, False)
        # A failed evaluation discloses that it failed (and is refunded), no score, and moves nothing.
        harness.backend.fail_with_infrastructure = True
        failed = evaluate(harness, client, 1.0)
        assert failed["code"] == "infrastructure" and "score" not in failed
        harness.backend.fail_with_infrastructure = False
        assert answer(evaluate(harness, client, 8.9)) == (9.0, True)
        assert answer(evaluate(harness, client, 11.0)) == (9.0, False)
        # A result that left a case out covers no union of blocks: not judged, no score, best unmoved.
        harness.backend.unmeasured = {"h6"}
        partial = evaluate(harness, client, 1.0)
        assert partial["state"] == "complete" and partial["result"] == {
            "disclosure": "aggregate",
            "score": None,
            "improved": None,
            "n_cases": 6,
            "n_attempts": None,
            "n_dead": None,
            "cases": None,
            "artifacts_path": None,
            "inference": None,
            "inference_usd": None,
        }
        harness.backend.unmeasured = set()
        assert answer(evaluate(harness, client, 8.5)) == (9.0, False)


def test_two_evaluations_finishing_at_once_are_judged_one_after_the_other(tmp_path):
    """Both measure 0.8 against a best of 0.5: only the first judged may disclose it. The first
    job's durable transaction is held until the second job has reached its completion step too. With the
    lock, the second is judged after the first is recorded (0.8 is then within the margin of the
    new best); without it, both would be judged against the stale 0.5 and both disclosed."""
    release = threading.Event()
    harness = ladder_harness(tmp_path)
    with harness.serve() as (server, client):
        assert answer(evaluate(harness, client, 0.5)) == (0.5, True)
        service = server.app.state.service
        both_completing = threading.Event()
        completing: list[str] = []
        complete, finish = service.runner._complete, service.jobs.finish

        async def counted_complete(job, result, **options):
            completing.append(job.id)
            if len(completing) == 2:
                both_completing.set()
            await complete(job, result, **options)

        async def held_finish(job_id, state, **changes):
            if "ladder" in changes:
                for _ in range(3000):  # a safety bound of 30 s; the event comes within milliseconds
                    if both_completing.is_set():
                        break
                    await asyncio.sleep(0.01)
            return await finish(job_id, state, **changes)

        service.runner._complete, service.jobs.finish = counted_complete, held_finish
        harness.backend.block = release
        harness.backend.scores = dict.fromkeys(CASES, 0.8)
        while harness.backend.started.acquire(blocking=False):
            pass  # the first evaluation's start
        ids = [client.post("/evaluations", json={"partition": "holdout"}).json()["id"] for _ in range(2)]
        for _ in ids:
            assert harness.backend.started.acquire(timeout=30)
        release.set()
        answers = sorted(answer(wait_for_state(client, job_id, {"complete"})) for job_id in ids)
        assert both_completing.is_set()
        assert answers == [(0.8, False), (0.8, True)]
