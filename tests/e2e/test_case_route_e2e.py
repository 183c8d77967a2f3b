"""`inference.route_case_services` in the Docker deployment: a compiled task run by `vero harbor run`
(Harbor's `oracle`: reference change, `vero harbor eval --wait` on train, submit), whose cases'
own model-backed services reach the inference gateway from the sidecar's evaluation and from the
verifier's hidden scoring, both inside their containers.

Each case (`case_route/case`, tasks/minimal's program) has a user simulator service that calls a
model, and a grader (`tests/route_probe.py`, in `main`) that calls one too, both with the
variables the nested run's environment gives the case's templates; the "model" is a fake
OpenAI-compatible provider on the host's Docker bridge that answers `ROUTED`. The case's reward is
half the candidate's word count and half the route: both calls answered, a call without the token
refused, and nothing listening on the sidecar API's port at the gateway's address. What must hold:

1. the reward (hidden case, verifier) is 1.0, and the sidecar's train evaluation scored 1.0: the
   route works in both roles and opens nothing of the sidecar's API;
2. every call is metered on its evaluation (the job in the sealed session, each verifier
   measurement in `finalization.json`), two per case, none failed, and the provider got exactly
   those calls, each with the key only the gateway holds;
3. the key is in no file of the job (trial files, logs, artifacts, the sealed session);
4. no gateway network of these evaluations is left on the engine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from inference.fake_upstream import FakeUpstream  # tests/ is on sys.path

from vero.core.session import read_session
from vero.harbor.case_route import network_gateway_address
from vero.harbor.leftovers import LABEL_GATEWAY, LABEL_JOB

from ._examples import TASKS_DIR, start_run, wait_run
from ._leaks import files_containing

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]

FIXTURE = Path(__file__).resolve().parent / "case_route"
KEY = "sk-route-provider-key-that-never-leaks-2718"
CASES = {"ask-train": ("one  two   three    four", "4"), "ask-hidden": ("a  b c   d  e", "5")}


def bridge_address() -> str:
    """The host's address on Docker's default bridge: containers on any bridge network reach it."""
    done = subprocess.run(
        ["docker", "network", "inspect", "bridge"], capture_output=True, text=True, timeout=60, check=True
    )
    address = network_gateway_address(json.loads(done.stdout)[0])
    assert address, f"the default bridge has no IPv4 address: {done.stdout}"
    return address


def write_spec(root: Path) -> Path:
    root.mkdir(parents=True)
    shutil.copy(FIXTURE / "build.yaml", root / "build.yaml")
    shutil.copytree(TASKS_DIR / "minimal" / "target", root / "target")
    shutil.copytree(TASKS_DIR / "minimal" / "reference", root / "reference")
    for name, (text, expected) in CASES.items():
        case = root / "cases" / name
        shutil.copytree(FIXTURE / "case", case)
        (case / "tests" / "input.txt").write_text(text)
        (case / "tests" / "expected.txt").write_text(expected + "\n")
    return root / "build.yaml"


def gateway_networks_of(jobs: set[str]) -> list[str]:
    listed = subprocess.run(
        ["docker", "network", "ls", "-q", "--filter", f"label={LABEL_GATEWAY}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    if not listed:
        return []
    inspected = subprocess.run(
        ["docker", "network", "inspect", *listed], capture_output=True, text=True, timeout=60, check=False
    )
    networks = json.loads(inspected.stdout or "[]")
    return [n["Name"] for n in networks if (n.get("Labels") or {}).get(LABEL_JOB) in jobs]


def test_case_services_reach_the_gateway_from_the_sidecar_and_the_verifier(tmp_path):
    spec = write_spec(tmp_path / "spec")
    host = bridge_address()
    with FakeUpstream(responder=lambda body: "ROUTED", host=host) as fake:
        started = start_run(
            "case-route",
            "oracle",
            tmp_path / "run",
            extra_env={"E2E_ROUTE_KEY": KEY, "E2E_ROUTE_UPSTREAM_URL": f"http://{host}:{fake.port}"},
            spec=spec,
        )
        run = wait_run(started)
        requests = list(fake.requests)
    print(f"\n[e2e] case-route: {run.phases()}")

    # 1. Routed in both roles: the hidden case's reward (verifier) and the train job (sidecar).
    assert run.returncode == 0, run.diagnostics()
    assert run.finalization["status"] == "scored", run.diagnostics()
    assert run.reward == 1.0, run.diagnostics()
    config = run.verifier_config
    session = read_session(
        run.session_archive,
        tmp_path / "session",
        spec_digest=config.spec_digest,
        baseline_commit=config.baseline_commit,
    )
    jobs = [job for job in session.jobs if job.partition == "train"]
    assert len(jobs) == 1 and jobs[0].state == "complete", [j.model_dump(mode="json") for j in session.jobs]
    job = jobs[0]
    assert job.result is not None and job.result.score == 1.0, job.result

    # 2. Metered on each evaluation: the user simulator's call and the grader's, per case.
    assert job.result.inference is not None
    assert job.result.inference.calls == 2 and job.result.inference.failed_calls == 0
    assert job.result.inference.charged_micro_usd > 0
    measured = [m for m in run.finalization["measurements"] if m.get("inference")]
    assert measured, run.finalization["measurements"]
    # The baseline's arm of the hidden target ran as its own job beside the candidate's, with its own
    # token and route, so that each arm's case services are metered on their own evaluation.
    target = [m for m in measured if m["partition"] == "hidden"]
    assert [m["purpose"] for m in target] == ["target", "target-baseline"], target
    assert target[1]["evaluation_id"] == target[0]["evaluation_id"] + ".baseline"
    for measurement in measured:
        assert measurement["inference"]["calls"] == 2 * measurement["n_cases"], measurement
        assert measurement["inference"]["failed_calls"] == 0, measurement
    verifier_calls = sum(m["inference"]["calls"] for m in measured)
    assert run.finalization["inference"]["calls"] == verifier_calls
    assert len(requests) == job.result.inference.calls + verifier_calls
    assert {r["headers"].get("authorization") for r in requests} == {f"Bearer {KEY}"}

    # 3. The key is nowhere in what the run left.
    assert files_containing(run.job_dir, KEY.encode()) == []

    # 4. Each evaluation's network went with it.
    ours = {job.id for job in session.jobs} | {m["evaluation_id"] for m in run.finalization["measurements"]}
    assert gateway_networks_of(ours) == []
