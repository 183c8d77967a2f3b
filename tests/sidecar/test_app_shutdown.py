"""SIGTERM while an evaluation runs and a long poll is held: the long poll is answered at once with
the job failed `interrupted`, the nested run's process group is killed without waiting for its
grace period, the job is refunded, and the process exits.

The sidecar runs as `vero harbor serve` does (`SidecarServer`, in a child process) with the real
`HarborBackend`; its `harbor` is a stand-in that never finishes and ignores SIGTERM (as does the
child it starts), so only a SIGKILL of the whole group ends them. The backend's kill grace is
600 s: were the group not killed at once on stop, the child would outlive this test's timeout.
No Docker is needed (the nested environment is not `docker`); the Docker side of an interruption
is `test_app_docker.py`'s kill-and-restart test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from _support.cases import write_case

from vero.core.jobs import JobStore
from vero.core.ledger import BudgetLedger
from vero.core.state import StateStore
from vero.spec.models import HarborSpec, PartitionAccess

from ._server import make_harness

pytestmark = pytest.mark.timeout(240)

REPO_ROOT = Path(__file__).resolve().parents[2]

STUBBORN_HARBOR = """#!/bin/bash
# Stands in for `harbor run`: never finishes, ignores SIGTERM, leaves a child that ignores it too.
trap '' TERM
sleep 600 &
echo "$$ $!" > "$PWD/stubborn-harbor.pids"
wait
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state  # a zombie has ended; only its parent has not reaped it


def test_sigterm_answers_long_polls_kills_the_nested_run_and_refunds(tmp_path):
    harness = make_harness(
        tmp_path / "h",
        partitions={"train": ["c1"]},
        access={"train": PartitionAccess(disclosure="full", min_aggregate_cases=1, total_runs=3, total_cases=3)},
        harbor=HarborSpec(environment="stand-in", infra_retries=0, evaluation_timeout_sec=3600),
    )
    write_case(harness.cases_dir, "c1")
    harbor = tmp_path / "stubborn-harbor"
    harbor.write_text(STUBBORN_HARBOR)
    harbor.chmod(0o755)
    spec = harness.write_spec(
        tmp_path / "harness.json", harbor_executable=str(harbor), kill_grace_sec=600.0, debug_log=True
    )
    port_file = tmp_path / "port"
    log = tmp_path / "sidecar.log"
    with log.open("wb") as sink:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.sidecar._server", str(spec), str(port_file)],
            cwd=REPO_ROOT,
            start_new_session=True,
            stderr=sink,
        )
    pids_file = harness.work_dir / "jobs" / "stubborn-harbor.pids"
    try:
        deadline = time.monotonic() + 90
        while not port_file.exists() or not port_file.read_text():
            assert child.poll() is None, "the child sidecar exited"
            assert time.monotonic() < deadline, "the child sidecar did not start"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port_file.read_text()}"
        with httpx.Client(base_url=url, timeout=120, trust_env=False) as client:
            job = client.post("/evaluations", json={"partition": "train"}).json()
            while not pids_file.exists() or len(pids_file.read_text().split()) < 2:
                assert time.monotonic() < deadline + 60, "the nested run never started"
                time.sleep(0.05)
            nested = [int(pid) for pid in pids_file.read_text().split()]
            assert all(alive(pid) for pid in nested)

            answers: list[httpx.Response] = []
            poll = threading.Thread(
                target=lambda: answers.append(client.get(f"/evaluations/{job['id']}", params={"wait_sec": 60}))
            )
            poll.start()
            while f"job {job['id']}: long poll" not in log.read_text(errors="replace"):
                assert poll.is_alive() and time.monotonic() < deadline + 120, "the long poll never arrived"
                time.sleep(0.05)
            stopped_at = time.monotonic()
            child.send_signal(signal.SIGTERM)
            poll.join(120)
            child.wait(120)
            elapsed = time.monotonic() - stopped_at
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(30)
        if pids_file.exists():
            for pid in (int(p) for p in pids_file.read_text().split()):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)

    print(f"SIGTERM to exit: {elapsed:.1f} s")
    (answer,) = answers
    # Answered by the stop, not by the end of its 60 s wait: the job is already failed and refunded.
    assert answer.status_code == 200, answer.text
    assert (answer.json()["state"], answer.json()["error"]) == ("failed", "interrupted")
    assert child.returncode in (0, -signal.SIGTERM)
    assert not any(alive(pid) for pid in nested), "the nested run's process group survived the stop"
    with StateStore.open(harness.state_dir / "state.db") as state:
        ledger = BudgetLedger.open(state, {})
        stored = JobStore(ledger).get(job["id"])
        assert (stored.state, stored.error) == ("failed", "interrupted")
        assert ledger.open_reservations() == []
        assert ledger.balance("train", "agent").remaining_runs == 3
