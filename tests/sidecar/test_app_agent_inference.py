"""The coding agent's producer scope (`inference.agent`), over real HTTP: the sidecar's API serves
the gateway at `/inference` for the agent's token (known to the sidecar by its SHA-256 only), in
front of a fake provider on loopback. Metered, capped in the ledger (402 in the API's own error
shape), durable across a restart, shown in `/status`; an agent token does not work as an evaluation
token and an evaluation token does not work on the agent's route.
"""

from __future__ import annotations

import asyncio
import hashlib
import json

import httpx
import pytest
from inference.fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS, FakeUpstream
from inference.key_leak import assert_no_key_in_stream, leak_request

from vero.core.ledger import AGENT_INFERENCE_PARTITION, BudgetLedger
from vero.core.state import STATE_FILE, StateStore
from vero.inference.bounds import bound_call
from vero.inference.pricing import price_of, to_micro_usd
from vero.sidecar.agent_inference import AGENT_TOKEN_DIGEST_ENV, LedgerCallJournal
from vero.spec.compiled import AGENT_PRINCIPAL
from vero.spec.models import InferenceModel, InferenceSpec, PartitionAccess

from ._server import make_harness

pytestmark = pytest.mark.timeout(180)

KEY_NAME = "VERO_TEST_AGENT_GATEWAY_KEY"
KEY = "sk-agent-scope-test-key-31415926"
TOKEN = "vero-ag-test-token-of-the-coding-agent-0001"
PRICE_IN, PRICE_OUT = 1e-6, 2e-6
MODEL = InferenceModel(provider="fake", input_cost_per_token=PRICE_IN, output_cost_per_token=PRICE_OUT)
OPENAI_BODY = {"model": "gpt-agent", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC_BODY = {"model": "claude-agent", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
CALL_MICRO_USD = to_micro_usd(INPUT_TOKENS * PRICE_IN + OUTPUT_TOKENS * PRICE_OUT)
HOLD_MICRO_USD = bound_call(dict(OPENAI_BODY), "openai", "/chat/completions", price_of("gpt-agent", MODEL)).micro_usd
TOTAL_MICRO_USD = HOLD_MICRO_USD + 2 * CALL_MICRO_USD
"""Room for three calls: after them less than one call's bound is left."""
AGENT_MODELS = ("gpt-agent", "claude-agent")
GREEDY_CEILING_USD = 0.001


def inference_spec(
    url: str,
    *,
    agent: bool = True,
    agent_models: tuple[str, ...] = AGENT_MODELS,
    total_usd: float = TOTAL_MICRO_USD / 1e6,
) -> InferenceSpec:
    model = {"provider": "fake", "upstream_model": "fake-ok", "input_cost_per_token": PRICE_IN}
    model["output_cost_per_token"] = PRICE_OUT
    return InferenceSpec.model_validate(
        {
            "providers": {
                "fake": {"api": "openai", "base_url": f"{url}/v1", "api_key_secret": KEY_NAME},
                "fake-anthropic": {"api": "anthropic", "base_url": url, "api_key_secret": KEY_NAME},
            },
            "models": {
                "gpt-agent": model,
                "claude-agent": {**model, "provider": "fake-anthropic"},
                "gpt-candidates-only": model,
                "gpt-leak": {**model, "upstream_model": "fake-leak"},
                "claude-leak": {**model, "provider": "fake-anthropic", "upstream_model": "fake-leak"},
                # Takes provider-held input under its own per-call ceiling: the fake bills a
                # million held input tokens, far above the call's bound.
                "gpt-greedy": {**model, "upstream_model": "fake-greedy", "unbounded_call_usd": GREEDY_CEILING_USD},
            },
            **({"agent": {"models": agent_models, "total_usd": total_usd}} if agent else {}),
        }
    )


@pytest.fixture
def upstream(monkeypatch):
    monkeypatch.setenv(KEY_NAME, KEY)
    monkeypatch.setenv(AGENT_TOKEN_DIGEST_ENV, hashlib.sha256(TOKEN.encode()).hexdigest())
    with FakeUpstream() as fake:
        yield fake


def harness(tmp_path, upstream, *, agent: bool = True, **agent_scope):
    return make_harness(
        tmp_path / "h",
        secrets=[KEY_NAME],
        inference=inference_spec(upstream.url, agent=agent, **agent_scope),
        access={"train": PartitionAccess(disclosure="full", total_runs=5, total_cases=10, total_inference_usd=1.0)},
        partitions={"train": ["t1"]},
    )


def agent_headers(token: str = TOKEN) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_the_agent_calls_through_the_sidecar_metered_and_capped_and_it_survives_a_restart(tmp_path, upstream):
    h = harness(tmp_path, upstream)
    with h.serve() as (_, client):
        first = client.post("/inference/openai/v1/chat/completions", headers=agent_headers(), json=OPENAI_BODY)
        assert first.status_code == 200, first.text
        # Streaming works on the agent's route (claude-code and codex stream).
        with client.stream(
            "POST",
            "/inference/anthropic/v1/messages",
            headers={"x-api-key": TOKEN},
            json={**ANTHROPIC_BODY, "stream": True},
        ) as stream:
            assert stream.status_code == 200 and "text/event-stream" in stream.headers["content-type"]
            events = stream.read().decode()
        assert "event: message_stop" in events, events
        listed = client.get("/inference/openai/v1/models", headers=agent_headers()).json()
        assert [m["id"] for m in listed["data"]] == ["gpt-agent"]  # its own allow-list, OpenAI models
        # A model on the candidates' allow-list but not the agent's is refused before the provider.
        refused = client.post(
            "/inference/openai/v1/chat/completions",
            headers=agent_headers(),
            json={**OPENAI_BODY, "model": "gpt-candidates-only"},
        )
        assert refused.status_code == 403
        third = client.post("/inference/openai/v1/chat/completions", headers=agent_headers(), json=OPENAI_BODY)
        assert third.status_code == 200
        # Less than one call's bound is left: refused with 402 before the provider, in each API's shape.
        over = client.post("/inference/openai/v1/chat/completions", headers=agent_headers(), json=OPENAI_BODY)
        assert over.status_code == 402
        error = over.json()["error"]
        assert error["type"] == "budget_exhausted" and "coding agent's inference budget" in error["message"]
        over_anthropic = client.post(
            "/inference/anthropic/v1/messages", headers={"x-api-key": TOKEN}, json=ANTHROPIC_BODY
        )
        assert over_anthropic.status_code == 402
        assert over_anthropic.json()["type"] == "error" and over_anthropic.json()["error"]["type"] == "budget_exhausted"
        status = client.get("/status").json()["agent_inference"]
        assert status["calls"] == 3 and status["total_usd"] == pytest.approx(TOTAL_MICRO_USD / 1e6)
        assert status["spent_usd"] == pytest.approx(3 * CALL_MICRO_USD / 1e6)
        assert status["remaining_usd"] == pytest.approx((TOTAL_MICRO_USD - 3 * CALL_MICRO_USD) / 1e6)
        export = client.get("/admin/export", headers=h.admin_headers()).json()
    assert len(upstream.requests) == 3
    assert all(
        r["headers"].get("authorization", r["headers"].get("x-api-key")) in (f"Bearer {KEY}", KEY)
        for r in upstream.requests
    )
    assert all(TOKEN not in json.dumps(r["headers"]) for r in upstream.requests)  # the agent's token stays here
    assert KEY not in json.dumps(export)
    # Spent stays spent across a restart: the ledger has it, and the cap holds.
    with h.serve() as (_, client):
        assert client.get("/status").json()["agent_inference"]["spent_usd"] == pytest.approx(3 * CALL_MICRO_USD / 1e6)
        again = client.post("/inference/openai/v1/chat/completions", headers=agent_headers(), json=OPENAI_BODY)
        assert again.status_code == 402
    assert len(upstream.requests) == 3


def test_a_key_the_provider_streams_split_across_events_never_reaches_the_agent(tmp_path, upstream):
    """The provider streams its own key split between two events, at every offset, in Anthropic's
    format (text, and tool input) and OpenAI's responses and chat formats: `main` joins
    `before *** after` every time."""
    h = harness(tmp_path, upstream, agent_models=("gpt-leak", "claude-leak"), total_usd=1.0)
    cases = [
        ("/inference/anthropic/v1/messages", "claude-leak", ""),
        ("/inference/anthropic/v1/messages", "claude-leak", " tool"),
        ("/inference/openai/v1/responses", "gpt-leak", ""),
        ("/inference/openai/v1/chat/completions", "gpt-leak", ""),
    ]
    with h.serve() as (_, client):
        for route, model, extra in cases:
            for offset in range(len(KEY) + 1):
                message = f"cut {offset}{extra}"
                answer = client.post(route, headers=agent_headers(), json=leak_request(route, model, message))
                assert answer.status_code == 200, answer.text
                assert_no_key_in_stream(answer.text, KEY, message)
        route, model, _ = cases[0]
        whole = client.post(route, headers=agent_headers(), json=leak_request(route, model, "x", stream=False))
        assert whole.json()["content"][0]["text"] == "before *** after"
        status = client.get("/status").json()["agent_inference"]
    assert status["calls"] == len(cases) * (len(KEY) + 1) + 1 == len(upstream.requests)


def test_what_a_provider_bills_above_a_calls_bound_is_recorded_and_shown(tmp_path, upstream):
    """A call billed far above its bound (provider-held input under the model's ceiling) is
    charged its bound in the ledger and the rest kept with the call as overrun: `/status` shows
    both across a restart, and so does what `finalization.json` reads from the sealed state."""
    from vero.core.session import SessionState
    from vero.verifier.artifacts import agent_inference_spend

    h = harness(tmp_path, upstream, agent_models=("gpt-greedy",), total_usd=0.01)
    request = {"model": "gpt-greedy", "input": "hi", "previous_response_id": "resp_1", "max_output_tokens": 10}
    with h.serve() as (server, client):
        gateway = server.app.state.service.runner.gateway
        bound = gateway.bound_of(json.loads(json.dumps(request)), "openai", "/responses").micro_usd
        answer = client.post("/inference/openai/v1/responses", headers=agent_headers(), json=request)
        assert answer.status_code == 200, answer.text
        shown = client.get("/status").json()["agent_inference"]
    (billed,) = [r["billed"] for r in upstream.requests]
    cost = to_micro_usd(billed["input"] * PRICE_IN + billed["output"] * PRICE_OUT)
    assert cost > 100 * bound  # a million held input tokens
    assert shown["spent_usd"] == pytest.approx(bound / 1e6)
    assert shown["overrun_usd"] == pytest.approx((cost - bound) / 1e6)
    assert shown["remaining_usd"] == pytest.approx(0.01 - bound / 1e6)
    with h.serve() as (_, client):
        assert client.get("/status").json()["agent_inference"] == shown
    with StateStore.open(h.state_dir / STATE_FILE) as store:
        spend = agent_inference_spend(SessionState.model_validate(store.export()))
    assert spend is not None and spend.calls == 1
    assert spend.spent_usd == pytest.approx(bound / 1e6)
    assert spend.overrun_usd == pytest.approx((cost - bound) / 1e6)


def test_a_call_left_open_by_a_crash_stays_charged_its_bound(tmp_path, upstream):
    h = harness(tmp_path, upstream)
    with h.serve() as (_, client):
        assert (
            client.post("/inference/openai/v1/chat/completions", headers=agent_headers(), json=OPENAI_BODY).status_code
            == 200
        )
    # As a killed sidecar leaves it: the call's bound reserved before forwarding, never settled.
    store = StateStore.open(h.state_dir / STATE_FILE)
    ledger = BudgetLedger(store, [])
    asyncio.run(LedgerCallJournal(ledger, AGENT_PRINCIPAL).opened("ic-crashed", HOLD_MICRO_USD))
    store.close()
    with h.serve() as (_, client):
        status = client.get("/status").json()["agent_inference"]
        assert status["spent_usd"] == pytest.approx((CALL_MICRO_USD + HOLD_MICRO_USD) / 1e6)
        export = client.get("/admin/export", headers=h.admin_headers()).json()
    crashed = next(r for r in export["reservations"] if r["id"] == "ic-crashed")
    assert crashed["state"] == "settled" and crashed["reason"] == "interrupted"
    assert crashed["partition"] == AGENT_INFERENCE_PARTITION


def test_agent_and_evaluation_tokens_work_only_in_their_own_scope(tmp_path, upstream):
    h = harness(tmp_path, upstream)
    with h.serve() as (server, client):
        service = server.app.state.service
        gateway = service.runner.gateway
        evaluation_token, grant = gateway.grant("ev-0000000000000001", "train", limit_micro_usd=10**6)
        # An evaluation's token on the agent's route: refused, and counted on that evaluation.
        crossed = client.post(
            "/inference/openai/v1/chat/completions", headers=agent_headers(evaluation_token), json=OPENAI_BODY
        )
        assert crossed.status_code == 401
        assert grant.usage.refused_calls == {"foreign_token": 1}
        # The agent's token on the candidates' gateway: refused.
        on_candidates = httpx.post(
            f"{gateway.base_url}/openai/v1/chat/completions", headers=agent_headers(), json=OPENAI_BODY, trust_env=False
        )
        assert on_candidates.status_code == 401
        unknown = client.post(
            "/inference/openai/v1/chat/completions", headers=agent_headers("vero-ag-guess"), json=OPENAI_BODY
        )
        assert unknown.status_code == 401
    assert upstream.requests == []


def test_without_the_digest_or_the_agent_section_there_is_no_agent_gateway(tmp_path, upstream, monkeypatch):
    monkeypatch.delenv(AGENT_TOKEN_DIGEST_ENV)
    with harness(tmp_path / "a", upstream).serve() as (_, client):
        answer = client.post("/inference/openai/v1/chat/completions", headers=agent_headers(), json=OPENAI_BODY)
        assert answer.status_code == 404
        assert client.get("/status").json()["agent_inference"]["spent_usd"] == 0
    monkeypatch.setenv(AGENT_TOKEN_DIGEST_ENV, hashlib.sha256(TOKEN.encode()).hexdigest())
    with harness(tmp_path / "b", upstream, agent=False).serve() as (_, client):
        answer = client.post("/inference/openai/v1/chat/completions", headers=agent_headers(), json=OPENAI_BODY)
        assert answer.status_code == 404
        assert client.get("/status").json()["agent_inference"] is None
    assert upstream.requests == []
