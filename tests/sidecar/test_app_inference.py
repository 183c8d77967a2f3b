"""The sidecar's inference gateway, over real HTTP, with a stand-in backend that calls it.

`CallingBackend` does what a candidate agent does inside a nested run: it calls the gateway named
in `NestedRun.candidate_env` with the evaluation's token (the calls reach a fake provider on
loopback), then answers like `StubBackend`. No Docker: the nested run is the stub's; the gateway,
the budgets, the disclosure and the persistence are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from dataclasses import dataclass, field

import httpx
import pytest
from inference.fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS, FakeUpstream

from vero.core.run import NestedRun
from vero.inference.bounds import bound_call
from vero.inference.pricing import price_of, to_micro_usd
from vero.spec.models import InferenceModel, InferenceSpec, PartitionAccess

from ._server import StubBackend, make_harness, wait_for_state

pytestmark = pytest.mark.timeout(180)

KEY_NAME = "VERO_TEST_GATEWAY_KEY"
KEY = "sk-sidecar-test-key-000111222"
PRICE_IN, PRICE_OUT = 1e-6, 2e-6
CALL_MICRO_USD = to_micro_usd(INPUT_TOKENS * PRICE_IN + OUTPUT_TOKENS * PRICE_OUT)
CALL_BODY = {"model": "fake-ok", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
HOLD_MICRO_USD = bound_call(
    dict(CALL_BODY),
    "openai",
    "/chat/completions",
    price_of(
        "gpt-test", InferenceModel(provider="fake", input_cost_per_token=PRICE_IN, output_cost_per_token=PRICE_OUT)
    ),
).micro_usd
"""What the gateway holds for one of `CallingBackend`'s calls (its bound): a budget must have this
much left for the call to be forwarded."""
TOTAL_MICRO_USD = HOLD_MICRO_USD + 10 * CALL_MICRO_USD


@dataclass
class CallingBackend(StubBackend):
    """Calls the gateway as a candidate agent does (`candidate_env`), or with `as_case_service` as
    a case's service does (the nested run's own environment, which the cases' templates read)."""

    calls_per_run: int = 2
    model: str = "gpt-test"
    as_case_service: bool = False
    networks_seen: list[str] = field(default_factory=list)
    binding: object | None = None

    def bind_hosts_to(self, binding) -> None:
        self.binding = binding  # as HarborBackend: the sidecar hands it its gateway

    async def evaluate(self, run: NestedRun) -> object:
        env = run.env if self.as_case_service else run.candidate_env
        token = run.candidate_env.get("VERO_INFERENCE_TOKEN")
        if token and self.binding is not None:
            self.binding.bind_host(token, os.getuid())  # this process stands in for the candidate (or case)
        assert KEY_NAME not in run.env and KEY not in json.dumps(run.env)  # provider keys never reach runs
        if run.case_network is not None:
            inspected = await asyncio.to_thread(
                subprocess.run, ["docker", "network", "inspect", run.case_network], capture_output=True, timeout=60
            )
            if inspected.returncode == 0:
                self.networks_seen.append(run.case_network)
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            for _ in range(self.calls_per_run):
                await client.post(
                    f"{env['OPENAI_BASE_URL']}/chat/completions",
                    headers={"authorization": f"Bearer {env['OPENAI_API_KEY']}"},
                    json={**CALL_BODY, "model": self.model},
                )
        if token and self.binding is not None:
            self.binding.release_host(token, os.getuid())
        return await super().evaluate(run)


def inference_spec(url: str) -> InferenceSpec:
    return InferenceSpec.model_validate(
        {
            "providers": {"fake": {"api": "openai", "base_url": f"{url}/v1", "api_key_secret": KEY_NAME}},
            "models": {
                "gpt-test": {
                    "provider": "fake",
                    "upstream_model": "fake-ok",
                    "input_cost_per_token": PRICE_IN,
                    "output_cost_per_token": PRICE_OUT,
                }
            },
        }
    )


@pytest.fixture
def upstream(monkeypatch):
    monkeypatch.setenv(KEY_NAME, KEY)
    with FakeUpstream() as fake:
        yield fake


def harness_with(tmp_path, upstream, backend, *, route: bool = False, **access):
    budget = dict(min_aggregate_cases=1, total_runs=10, total_cases=60, total_inference_usd=TOTAL_MICRO_USD / 1e6)
    budget.update(access)
    return make_harness(
        tmp_path / "h",
        backend=backend,
        secrets=[KEY_NAME],
        inference=inference_spec(upstream.url).model_copy(update={"route_case_services": route}),
        access={
            "train": PartitionAccess(disclosure="full", **budget),
            "val": PartitionAccess(disclosure="aggregate", **budget),
            "blind": PartitionAccess(disclosure="none", timing_quantum_sec=0.2, **budget),
            "ladder": PartitionAccess(disclosure="aggregate", ladder={"margin": 0.1}, **budget),
        },
        partitions={"train": ["t1", "t2"], "val": ["v1", "v2"], "blind": ["b1"], "ladder": ["l1", "l2"]},
    )


def run_job(client, partition: str, cases=None) -> dict:
    body = {"partition": partition} | ({"cases": cases} if cases else {})
    response = client.post("/evaluations", json=body)
    assert response.status_code == 202, response.text
    return wait_for_state(client, response.json()["id"], {"complete", "failed", "cancelled"})


def inference_budget(client, partition: str) -> dict:
    partitions = client.get("/status").json()["partitions"]
    budget = next(p for p in partitions if p["name"] == partition)["budget"]
    return {k: budget[k] for k in ("total_inference_usd", "remaining_inference_usd")}


def test_usage_is_metered_disclosed_by_tier_and_survives_a_restart(tmp_path, upstream):
    harness = harness_with(tmp_path, upstream, CallingBackend())
    with harness.serve() as (_, client):
        full = run_job(client, "train", ["t1"])
        aggregate = run_job(client, "val")
        assert full["state"] == aggregate["state"] == "complete"
        usage = full["result"]["inference"]
        assert usage["calls"] == 2 and usage["input_tokens"] == 2 * INPUT_TOKENS
        assert usage["charged_micro_usd"] == 2 * CALL_MICRO_USD and usage["by_model"]["gpt-test"]["calls"] == 2
        # aggregate: the money only, no count of calls (a candidate's free calls could carry a case).
        assert aggregate["result"]["inference"] is None
        assert aggregate["result"]["inference_usd"] == pytest.approx(2 * CALL_MICRO_USD / 1e6)
        assert full["result"]["inference_usd"] == pytest.approx(2 * CALL_MICRO_USD / 1e6)
        budget = inference_budget(client, "train")
        assert budget["remaining_inference_usd"] == pytest.approx((TOTAL_MICRO_USD - 2 * CALL_MICRO_USD) / 1e6)
        # `none`: neither the job nor what is left of the budget says what its candidate spent
        # (its spending could carry what the tier withholds).
        blind = run_job(client, "blind")
        assert blind["state"] == "complete" and blind["result"] == {"disclosure": "none"} | {
            k: None for k in blind["result"] if k != "disclosure"
        }
        for withheld in ("blind", "ladder"):  # the Ladder's answers would be bypassed by it too
            assert inference_budget(client, withheld) == {
                "total_inference_usd": pytest.approx(TOTAL_MICRO_USD / 1e6),
                "remaining_inference_usd": None,
            }
        export = client.get("/admin/export", headers=harness.admin_headers()).json()
        assert all(job["result"]["inference"]["calls"] == 2 for job in export["jobs"])  # blind's too
    # What complete jobs spent stays spent across a restart.
    with harness.serve() as (_, client):
        assert inference_budget(client, "train")["remaining_inference_usd"] == pytest.approx(
            (TOTAL_MICRO_USD - 2 * CALL_MICRO_USD) / 1e6
        )
    assert KEY not in json.dumps(export)
    assert all(r["headers"]["authorization"] == f"Bearer {KEY}" for r in upstream.requests)


def test_budget_exhaustion_is_refused_at_the_gateway_and_infrastructure_failures_refund(tmp_path, upstream):
    backend = CallingBackend(calls_per_run=4)
    total = HOLD_MICRO_USD + 4 * CALL_MICRO_USD + CALL_MICRO_USD // 2
    harness = harness_with(tmp_path, upstream, backend, total_inference_usd=total / 1e6)
    with harness.serve() as (_, client):
        first = run_job(client, "train", ["t1"])
        assert first["result"]["inference"]["calls"] == 4
        # One call's bound and half a call's cost left: one call fits, the rest are refused (402)
        # before the provider, since what is left is less than their bound.
        second = run_job(client, "train", ["t1"])
        usage = second["result"]["inference"]
        assert usage["refused_calls"] == {"over_budget": 3} and usage["calls"] == 1, usage
        remaining = inference_budget(client, "train")["remaining_inference_usd"]
        assert remaining == pytest.approx((total - 5 * CALL_MICRO_USD) / 1e6) and remaining < HOLD_MICRO_USD / 1e6
    harness = harness_with(tmp_path / "again", upstream, CallingBackend(calls_per_run=3, fail_with_infrastructure=True))
    with harness.serve() as (_, client):
        before = inference_budget(client, "train")
        response = client.post("/evaluations", json={"partition": "train", "cases": ["t1"]})
        problem = wait_for_state(client, response.json()["id"], {"complete", "failed"})
        assert problem["status"] == 502
        # Its model calls were made and charged while it ran; the failure gave them back.
        assert inference_budget(client, "train") == before
        assert len(upstream.requests) >= 3


def test_off_list_models_and_stale_tokens_are_refused(tmp_path, upstream):
    backend = CallingBackend(model="gpt-4o")
    harness = harness_with(tmp_path, upstream, backend)
    with harness.serve() as (_, client):
        job = run_job(client, "train", ["t1"])
        usage = job["result"]["inference"]
        assert usage["calls"] == 0 and usage["refused_calls"] == {"model_not_allowed": 2}
        stale = backend.runs[0].candidate_env
        answer = httpx.post(
            f"{stale['OPENAI_BASE_URL']}/chat/completions",
            trust_env=False,
            headers={"authorization": f"Bearer {stale['OPENAI_API_KEY']}"},
            json={"model": "gpt-test", "messages": []},
        )
        assert answer.status_code == 401  # the token died with its evaluation
    assert upstream.requests == []


def test_no_gateway_without_an_inference_section(tmp_path):
    harness = make_harness(tmp_path / "h", backend=StubBackend())
    with harness.serve() as (_, client):
        run_job(client, "train", ["t1"])
        assert harness.backend.runs[0].candidate_env == {}
        assert inference_budget(client, "train") == {"total_inference_usd": None, "remaining_inference_usd": None}


@pytest.mark.docker
def test_route_case_services_open_a_network_per_evaluation_and_meter_its_calls(tmp_path, upstream):
    """With the switch (and Docker), each evaluation's nested run gets a network to the gateway
    (`NestedRun.case_network`) and, for the cases' templates, the gateway's address on it and the
    evaluation's token, never a provider key; the calls a case service makes there are metered on
    the job; the network exists while the run does and is gone after it. Without the switch: none
    of it. (This sidecar runs on the host: its address on the network is the bridge's; inside a
    container, `tests/e2e/test_case_route_e2e.py`.)"""
    backend = CallingBackend(calls_per_run=1, as_case_service=True)
    harness = harness_with(tmp_path / "routed", upstream, backend, route=True)
    plain = harness_with(tmp_path / "plain", upstream, CallingBackend(calls_per_run=0))
    with harness.serve() as (_, client):
        job = run_job(client, "train", ["t1"])
    with plain.serve() as (_, client):
        run_job(client, "train", ["t1"])
    routed, not_routed = harness.backend.runs[0], plain.backend.runs[0]
    assert job["state"] == "complete" and job["result"]["inference"]["calls"] == 1
    assert routed.case_network is not None and routed.case_network.startswith("vero-gw-")
    assert backend.networks_seen == [routed.case_network]
    gone = subprocess.run(["docker", "network", "inspect", routed.case_network], capture_output=True, timeout=60)
    assert gone.returncode != 0
    token = routed.env["OPENAI_API_KEY"]
    assert token.startswith("vero-ev-") and token == routed.candidate_env["OPENAI_API_KEY"]
    case_url = routed.candidate_env["VERO_INFERENCE_CASE_OPENAI_BASE_URL"]
    assert routed.env["OPENAI_BASE_URL"] == case_url != routed.candidate_env["OPENAI_BASE_URL"]
    assert routed.env["ANTHROPIC_BASE_URL"] == routed.candidate_env["VERO_INFERENCE_CASE_ANTHROPIC_BASE_URL"]
    assert "OPENAI_API_KEY" not in not_routed.env and not_routed.case_network is None
    assert "VERO_INFERENCE_CASE_OPENAI_BASE_URL" not in not_routed.candidate_env
    assert KEY_NAME not in routed.env and KEY_NAME not in not_routed.env


def test_an_evaluation_whose_model_calls_cannot_reach_the_provider_is_charged_not_refunded(
    tmp_path, monkeypatch, caplog
):
    """A provider nobody can connect to (a wrong `base_url`, a provider down) fails every call the
    candidate makes. Whether it calls is its choice, so a refund here would be a result-or-refund the
    candidate picks by what it read in a hidden case: the job completes, charged as measured, the
    agent sees `unreachable_calls` on `full`, and the operator gets the cause in the log."""
    import socket

    monkeypatch.setenv(KEY_NAME, KEY)
    closed = socket.socket()  # bound, never listening: connections are refused (ECONNREFUSED)
    closed.bind(("127.0.0.1", 0))
    try:
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        harness = harness_with(tmp_path, type("Nowhere", (), {"url": url})(), CallingBackend(calls_per_run=2))
        with harness.serve() as (_, client):
            before = next(p for p in client.get("/status").json()["partitions"] if p["name"] == "train")["budget"]
            job = run_job(client, "train", ["t1"])
            after = next(p for p in client.get("/status").json()["partitions"] if p["name"] == "train")["budget"]
    finally:
        closed.close()
    assert job["state"] == "complete", job  # never 502 `infrastructure`
    assert job["result"]["inference"]["unreachable_calls"] == 2, job
    assert job["result"]["inference_usd"] == 0.0  # the failed calls cost nothing
    assert after["remaining_runs"] == before["remaining_runs"] - 1  # charged
    assert after["remaining_cases"] == before["remaining_cases"] - 1
    assert "could not reach the provider" in caplog.text and "charged as measured" in caplog.text
