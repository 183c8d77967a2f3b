"""A sidecar killed mid-evaluation (SIGKILL) leaves a running job and an open reservation; the next
start fails the job as `interrupted` and refunds it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from vero.core.ledger import BudgetLedger

from ._server import make_harness, wait_for_state

pytestmark = pytest.mark.timeout(180)

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_killed_sidecar_leaves_an_interrupted_job_that_restart_fails_and_refunds(tmp_path):
    harness = make_harness(tmp_path)
    spec = harness.write_spec(tmp_path / "harness.json")
    port_file = tmp_path / "port"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.sidecar._server", str(spec), str(port_file)],
        cwd=REPO_ROOT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text():
            assert child.poll() is None, "the child sidecar exited"
            assert time.monotonic() < deadline, "the child sidecar did not start"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port_file.read_text()}"
        with httpx.Client(base_url=url, timeout=30, trust_env=False) as client:
            job = client.post("/evaluations", json={"partition": "train", "cases": ["t1", "t2"]}).json()
            wait_for_state(client, job["id"], {"running"})
            train = next(p for p in client.get("/status").json()["partitions"] if p["name"] == "train")
            assert train["budget"]["remaining_runs"] == 4
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)

    with BudgetLedger.open(harness.state_dir / "state.db", {}).state as state:
        assert [r.id for r in BudgetLedger.open(state, {}).open_reservations()] == [job["id"]]
    with harness.serve() as (_, client):
        after = client.get(f"/evaluations/{job['id']}").json()
        assert after["state"] == "failed" and after["error"] == "interrupted" and after["result"] is None
        train = next(p for p in client.get("/status").json()["partitions"] if p["name"] == "train")
        assert train["budget"] == {
            "total_runs": 5,
            "total_cases": 30,
            "remaining_runs": 5,
            "remaining_cases": 30,
            "total_inference_usd": None,
            "remaining_inference_usd": None,
        }
        # and the sidecar works on: a new evaluation runs to completion
        new = client.post("/evaluations", json={"partition": "train", "cases": ["t1"]}).json()
        assert wait_for_state(client, new["id"], {"complete"})["state"] == "complete"
    # the restarted sidecar keeps only its slot work trees (the job's, and the other slot's if its
    # warm-up began before the stop)
    assert {p.name for p in (harness.work_dir / "checkouts").iterdir()} <= {"slot-0", "slot-1"}
