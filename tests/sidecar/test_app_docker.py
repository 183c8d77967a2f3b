"""The sidecar with the real `HarborBackend`: nested `harbor run -e docker` over real Harbor task
dirs, driven over HTTP, for a `kind: program` and a `kind: agent` target; and an unreachable
engine giving a refunded infrastructure failure (never a zero score).

Nested runs execute as this process (root) here: the project interpreter lives under `/root`
(0700) on this machine, so an unprivileged runner cannot exec it without a copied toolchain;
`tests/harbor` covers `run_as` for nested runs, and `test_app.py` the sidecar's identity plumbing
(runner-owned jobs dir, readable checkout)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import tenacity
from _support.cases import write_case as write_task_dir

from vero.core.state import StateStore
from vero.harbor import HarborBackend
from vero.harbor.leftovers import LABEL_JOB, LABEL_SESSION
from vero.spec.models import CandidateRuntime, HarborSpec, PartitionAccess

from ._server import commit_file, make_harness, wait_for_state

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_case(root: Path, name: str, test_sh: str) -> None:
    """A case of these tests: bash `test_sh`, timeouts long enough for image builds under load."""
    write_task_dir(
        root,
        name,
        test_sh="#!/bin/bash\n" + test_sh,
        agent_timeout_sec=120,
        verifier_timeout_sec=120,
        build_timeout_sec=600,
    )


def reward_if(condition: str) -> str:
    return (
        f"if {condition}; then r=1.0; else r=0.0; fi\n"
        'echo "{\\"reward\\": $r}" > /logs/verifier/reward.json\necho "checked: $r"\n'
    )


@pytest.fixture
def shared_root():
    # Readable by the unprivileged runner (pytest's tmp_path is 0700 root).
    root = Path(tempfile.mkdtemp(prefix="vero-sidecar-docker-"))
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def backend(python: Path | None = None) -> HarborBackend:
    # `kind: agent` candidate hosts run as throw-away uids: they need an interpreter any uid can run.
    return HarborBackend(infra_wait=tenacity.wait_none(), python_executable=python)


def budget(client, partition: str) -> dict:
    return next(p for p in client.get("/status").json()["partitions"] if p["name"] == partition)["budget"]


def test_program_candidate_evaluated_with_nested_harbor_on_docker(shared_root):
    harness = make_harness(
        shared_root / "h",
        backend=backend(),
        baseline_files={"answer.txt": "0\n"},
        runtime=CandidateRuntime(kind="program", install_path="/opt/candidate"),
        partitions={"train": ["answer-42", "answer-file"]},
        access={"train": PartitionAccess(disclosure="full", min_aggregate_cases=1, total_runs=3, total_cases=6)},
        harbor=HarborSpec(n_concurrent=2, infra_retries=0, evaluation_timeout_sec=600, drain_timeout_sec=30),
    )
    write_case(harness.cases_dir, "answer-42", reward_if('[ "$(cat /opt/candidate/answer.txt)" = "42" ]'))
    write_case(harness.cases_dir, "answer-file", reward_if("[ -f /opt/candidate/answer.txt ]"))
    commit = commit_file(harness.agent_repo, "answer.txt", "42\n", "the answer")
    with harness.serve(run_as=None) as (_, client):
        response = client.post("/evaluations", json={"partition": "train", "version": commit})
        assert response.status_code == 202, response.text
        job = wait_for_state(client, response.json()["id"], {"complete", "failed"}, timeout_sec=800)
        assert job["state"] == "complete", job
        result = job["result"]
        assert result["score"] == 1.0 and result["n_cases"] == 2 and result["n_dead"] == 0
        assert {c["case"]: c["score"] for c in result["cases"]} == {"answer-42": 1.0, "answer-file": 1.0}
        assert budget(client, "train")["remaining_runs"] == 2

        # the baseline scores lower and is charged too (a real measurement)
        base = client.post(
            "/evaluations",
            json={"partition": "train", "cases": ["answer-42"], "version": harness.config.baseline_commit},
        )
        base_job = wait_for_state(client, base.json()["id"], {"complete", "failed"}, timeout_sec=800)
        assert base_job["state"] == "complete" and base_job["result"]["score"] == 0.0
        assert budget(client, "train") == {
            "total_runs": 3,
            "total_cases": 6,
            "remaining_runs": 1,
            "remaining_cases": 3,
            "total_inference_usd": None,
            "remaining_inference_usd": None,
        }

    artifacts = harness.context_dir / job["id"]
    disclosed = json.loads((artifacts / "result.json").read_text())
    (trial,) = disclosed["trials"]["answer-42"]
    stdout = artifacts / "trials" / trial / "verifier" / "test-stdout.txt"
    assert "checked: 1.0" in stdout.read_text()
    assert result["artifacts_path"] == f"/vero/context/{job['id']}"
    assert str(harness.work_dir) not in json.dumps(job)


def test_agent_candidate_evaluated_with_nested_harbor_on_docker(shared_root, portable_toolchain):
    agent_source = """
from harbor.agents.base import BaseAgent

GREETING = "{greeting}"


class EchoAgent(BaseAgent):
    @staticmethod
    def name() -> str:
        return "echo-candidate"

    def version(self) -> str:
        return "0.0.1"

    async def setup(self, environment) -> None:
        return

    async def run(self, instruction, environment, context) -> None:
        await environment.exec(f"echo {{GREETING}} > /app/out.txt")
"""
    harness = make_harness(
        shared_root / "h",
        backend=backend(portable_toolchain[1]),
        baseline_files={"echo_agent.py": agent_source.format(greeting="hi")},
        runtime=CandidateRuntime(kind="agent", agent_import_path="echo_agent:EchoAgent"),
        partitions={"train": ["greet"]},
        access={"train": PartitionAccess(disclosure="aggregate", min_aggregate_cases=1, total_runs=2, total_cases=2)},
        harbor=HarborSpec(n_concurrent=1, infra_retries=0, evaluation_timeout_sec=600),
    )
    write_case(harness.cases_dir, "greet", reward_if('[ "$(cat /app/out.txt)" = "hello" ]'))
    commit = commit_file(harness.agent_repo, "echo_agent.py", agent_source.format(greeting="hello"))
    with harness.serve(run_as=None) as (_, client):
        response = client.post("/evaluations", json={"partition": "train", "version": commit})
        assert response.status_code == 202, response.text
        job = wait_for_state(client, response.json()["id"], {"complete", "failed"}, timeout_sec=800)
        assert job["state"] == "complete", job
        assert job["result"] == {
            "disclosure": "aggregate",
            "score": 1.0,
            "n_cases": 1,
            "n_attempts": 1,
            "n_dead": 0,
            "improved": None,
            "cases": None,
            "artifacts_path": None,
            "inference": None,
            "inference_usd": None,
        }
        assert budget(client, "train")["remaining_runs"] == 1
    assert not (harness.context_dir / job["id"]).exists()


def test_unreachable_engine_is_a_refunded_infrastructure_failure(shared_root):
    harness = make_harness(
        shared_root / "h",
        backend=backend(),
        baseline_files={"answer.txt": "42\n"},
        partitions={"train": ["answer-42"]},
        access={"train": PartitionAccess(disclosure="full", min_aggregate_cases=1, total_runs=2, total_cases=2)},
        harbor=HarborSpec(n_concurrent=1, infra_retries=1, evaluation_timeout_sec=300),
    )
    harness.nested_env = {"DOCKER_HOST": "unix:///nonexistent.sock"}
    write_case(harness.cases_dir, "answer-42", reward_if('[ "$(cat /opt/candidate/answer.txt)" = "42" ]'))
    with harness.serve(run_as=None) as (_, client):
        before = budget(client, "train")
        response = client.post("/evaluations", json={"partition": "train"})
        assert response.status_code == 202
        job_id = response.json()["id"]
        problem = wait_for_state(client, job_id, {"complete", "failed"}, timeout_sec=600)
        assert problem["status"] == 502 and problem["code"] == "infrastructure", problem
        answer = client.get(f"/evaluations/{job_id}")
        assert answer.status_code == 502
        assert "nonexistent" not in answer.text and "docker" not in answer.text.lower()
        listed = next(j for j in client.get("/status").json()["jobs"] if j["id"] == job_id)
        assert listed["state"] == "failed" and listed["error"] == "infrastructure" and listed["result"] is None
        assert budget(client, "train") == before
        export = client.get("/admin/export", headers=harness.admin_headers()).json()
        (reservation,) = export["reservations"]
        assert reservation["state"] == "refunded" and reservation["reason"] == "infrastructure"


def labelled(label: str) -> list[str]:
    """Containers and networks carrying `label` (`key=value`), as `kind name (status)`."""
    import docker

    client = docker.from_env()
    try:
        containers = [
            f"container {c.name} ({c.status})"
            for c in client.containers.list(all=True, filters={"label": label}, ignore_removed=True)
        ]
        return containers + [f"network {n.name}" for n in client.networks.list(filters={"label": label})]
    finally:
        client.close()


def verifier_started(label: str, marker: str) -> bool:
    """Whether a running container labelled `label` has `marker` (its case's test is running)."""
    import docker

    client = docker.from_env()
    try:
        for container in client.containers.list(filters={"label": label, "status": "running"}):
            try:
                if container.exec_run(["test", "-e", marker]).exit_code == 0:
                    return True
            except docker.errors.APIError:
                continue  # stopped or removed between listing and exec
        return False
    finally:
        client.close()


def descendants(pid: int) -> set[int]:
    """`pid` and every process below it (from /proc), whatever its process group or session."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        todo += children.get(current, [])
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and all it started, as a container kill does: every process group at once
    (the nested `harbor` runs in a session of its own)."""
    groups = set()
    for member in descendants(pid):
        try:
            groups.add(os.getpgid(member))
        except ProcessLookupError:
            pass
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_killed_sidecar_leaves_labelled_environments_that_its_restart_removes(shared_root):
    """The sidecar and its nested `harbor` are killed (SIGKILL, as a container kill) while a case's
    container runs: the container and its network stay up, labelled with the session and job. The
    restarted sidecar fails the job `interrupted`, refunds it, and removes them (in the background
    of its first requests, before any admission): listing by label then finds nothing."""
    harness = make_harness(
        shared_root / "h",
        baseline_files={"answer.txt": "42\n"},
        runtime=CandidateRuntime(kind="program", install_path="/opt/candidate"),
        partitions={"train": ["slow"]},
        access={"train": PartitionAccess(disclosure="full", min_aggregate_cases=1, total_runs=2, total_cases=2)},
        harbor=HarborSpec(n_concurrent=1, infra_retries=0, evaluation_timeout_sec=600),
    )
    started = "/logs/verifier/started"
    write_case(harness.cases_dir, "slow", f"touch {started}\nsleep 300\n" + reward_if("true"))
    spec = harness.write_spec(
        shared_root / "harness.json", harbor_executable=str(Path(sys.executable).parent / "harbor")
    )
    port_file = shared_root / "port"
    log = shared_root / "sidecar.log"
    with log.open("wb") as sink:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.sidecar._server", str(spec), str(port_file)],
            cwd=REPO_ROOT,
            start_new_session=True,
            stderr=sink,
        )
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists() or not port_file.read_text():
            assert child.poll() is None, f"the child sidecar exited: {log.read_text(errors='replace')}"
            assert time.monotonic() < deadline, "the child sidecar did not start"
            time.sleep(0.1)
        with httpx.Client(base_url=f"http://127.0.0.1:{port_file.read_text()}", timeout=60, trust_env=False) as client:
            job = client.post("/evaluations", json={"partition": "train"}).json()
        deadline = time.monotonic() + 600
        while not verifier_started(f"{LABEL_JOB}={job['id']}", started):
            assert child.poll() is None, "the child sidecar exited"
            assert time.monotonic() < deadline, "the nested run's verifier never started"
            time.sleep(0.5)
    finally:
        kill_tree(child.pid)
        child.wait(30)

    with StateStore.open(harness.state_dir / "state.db") as state:
        session = state.session_id
    left = labelled(f"{LABEL_SESSION}={session}")
    assert any(entry.startswith("container") and "(running)" in entry for entry in left), left
    assert any(entry.startswith("network") for entry in left), left
    assert left == labelled(f"{LABEL_JOB}={job['id']}")

    harness.backend = backend()
    with harness.serve(run_as=None) as (_, client):
        # The sweep goes on beside the first requests (every admission waits for its end).
        deadline = time.monotonic() + 120
        while labelled(f"{LABEL_SESSION}={session}"):
            assert time.monotonic() < deadline, "the restarted sidecar did not remove the leftovers"
            time.sleep(0.5)
        assert labelled(f"{LABEL_JOB}={job['id']}") == []
        after = client.get(f"/evaluations/{job['id']}").json()
        assert (after["state"], after["error"]) == ("failed", "interrupted")
        train = budget(client, "train")
        assert (train["remaining_runs"], train["remaining_cases"]) == (2, 2)
