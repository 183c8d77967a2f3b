"""Holds that are upper bounds (issue 25), against the real gateway and a fake provider that bills
what it is asked (`fake-greedy` in `fake_upstream.py`), and prices as LiteLLM's map says.

Each finding of the issue has its test: `n` and provider-held input multiplied what was billed past
the limit, a 20 MiB prompt and `max_tokens: 1e9` reached the provider, and the long-context,
service-tier and one-hour cache-write rates were not charged.
"""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest

from vero.inference.bounds import CALL_OVERHEAD_TOKENS, Unbounded, bound_call
from vero.inference.gateway import GatewayServer, InferenceGateway
from vero.inference.pricing import CacheTokens, price_of, to_micro_usd
from vero.spec.models import InferenceModel, InferenceSpec

from .fake_upstream import FakeUpstream

pytestmark = pytest.mark.timeout(120)

KEY = "sk-test-bounds-0123456789abcdef"
PRICE_IN, PRICE_OUT = 1e-6, 2e-6


def spec_for(url: str, **greedy_extra) -> InferenceSpec:
    priced = {"input_cost_per_token": PRICE_IN, "output_cost_per_token": PRICE_OUT, "max_output_tokens": 1000}
    return InferenceSpec.model_validate(
        {
            "providers": {
                "oai": {"api": "openai", "base_url": f"{url}/v1", "api_key_secret": "KEY"},
                "ant": {"api": "anthropic", "base_url": url, "api_key_secret": "KEY"},
            },
            "models": {
                "fake-greedy": {"provider": "oai", **priced},
                "claude-greedy": {"provider": "ant", "upstream_model": "fake-greedy", **priced},
                "fake-held": {"provider": "oai", "upstream_model": "fake-greedy", **priced, **greedy_extra},
                "fake-slow": {"provider": "oai", **priced},
            },
            "timeout_sec": 3.0,
            "stream_idle_timeout_sec": 1.0,
        }
    )


@pytest.fixture
def upstream():
    with FakeUpstream() as fake:
        yield fake


def billed_micro_usd(upstream: FakeUpstream) -> int:
    """What the fake provider billed, at the models' prices."""
    return sum(
        to_micro_usd(r["billed"]["input"] * PRICE_IN + r["billed"]["output"] * PRICE_OUT)
        for r in upstream.requests
        if "billed" in r
    )


def run_gateway(url: str, body, **greedy_extra):
    async def main():
        gateway = InferenceGateway(spec_for(url, **greedy_extra), {"KEY": KEY})
        async with GatewayServer(gateway):
            async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as client:
                return await body(gateway, client)

    return asyncio.run(main())


def grant(gateway, limit_usd: float | None):
    token, _ = gateway.grant("ev", "train", limit_micro_usd=None if limit_usd is None else to_micro_usd(limit_usd))
    gateway.bind_host(token, os.getuid())  # the caller is this test's process
    return token, {"authorization": f"Bearer {token}"}


def chat(model: str = "fake-greedy", **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], **extra}


def test_n_choices_are_held_so_concurrent_calls_never_bill_past_the_limit(upstream):
    """Finding 1: ten concurrent calls with `n=20` billed 2x the limit. The hold multiplies the
    output limit by `n`: what the provider bills stays within the limit, and the calls that do not
    fit are refused with 402 before they reach it."""
    limit = 0.2

    async def body(gateway, client):
        token, auth = grant(gateway, limit)
        request = chat(n=20, max_tokens=1000)
        answers = await asyncio.gather(
            *(client.post("/openai/v1/chat/completions", json=request, headers=auth) for _ in range(10))
        )
        return (
            answers,
            await gateway.revoke(token),
            gateway.bound_of(json.loads(json.dumps(request)), "openai", "/chat/completions"),
        )

    answers, usage, bound = run_gateway(upstream.url, body)
    assert bound.output_tokens == 20 * 1000
    codes = sorted(a.status_code for a in answers)
    assert codes.count(200) == int(to_micro_usd(limit) // bound.micro_usd) >= 1 and set(codes) == {200, 402}
    assert billed_micro_usd(upstream) <= usage.charged_micro_usd <= to_micro_usd(limit)
    assert usage.overrun_usd == 0


@pytest.mark.parametrize(
    ("path", "request_body", "field"),
    [
        (
            "/openai/v1/responses",
            {"model": "fake-greedy", "input": "hi", "previous_response_id": "resp_1"},
            "previous_response_id",
        ),
        ("/openai/v1/responses", {"model": "fake-greedy", "input": "hi", "conversation": "conv_1"}, "conversation"),
        (
            "/openai/v1/responses",
            {"model": "fake-greedy", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f1"}]}]},
            "input[0].content[0]",
        ),
        (
            "/openai/v1/chat/completions",
            chat(
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]}]
            ),
            "messages[0].content[0]",
        ),
        (
            "/openai/v1/responses",
            {"model": "fake-greedy", "input": "hi", "tools": [{"type": "web_search"}]},
            "tools[0].type",
        ),
        ("/openai/v1/responses", {"model": "fake-greedy", "input": "hi", "background": True}, "background"),
        (
            "/anthropic/v1/messages",
            {
                "model": "claude-greedy",
                "max_tokens": 10,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}],
                    }
                ],
            },
            "messages[0].content[0]",
        ),
        (
            "/anthropic/v1/messages",
            {**chat("claude-greedy", max_tokens=10), "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools[0].type",
        ),
        (
            "/anthropic/v1/messages",
            {**chat("claude-greedy", max_tokens=10), "mcp_servers": [{"url": "https://m"}]},
            "mcp_servers",
        ),
        ("/openai/v1/chat/completions", chat(max_tokens=10**9), "max_tokens"),
        ("/openai/v1/chat/completions", chat(max_tokens=1e9), "max_tokens"),
        ("/openai/v1/chat/completions", chat(max_tokens=10, n=0), "n"),
        ("/openai/v1/chat/completions", chat(max_tokens=10, service_tier="priority"), "service_tier"),
    ],
)
def test_requests_the_body_cannot_bound_are_refused_naming_the_field(upstream, path, request_body, field):
    """Findings 1 and 2: provider-held input, remote inputs, provider-run tools and output limits
    over the model's are refused with 400 naming the field, and never reach the provider."""

    async def body(gateway, client):
        token, auth = grant(gateway, 1.0)
        answer = await client.post(path, json=request_body, headers={**auth, "x-api-key": token})
        return answer, await gateway.revoke(token)

    answer, usage = run_gateway(upstream.url, body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["message"].startswith(f"the gateway cannot bound this call's cost: {field}: ")
    assert usage.refused_calls == {"unbounded_request": 1} and usage.charged_micro_usd == 0
    assert upstream.requests == []


def test_a_model_entry_may_allow_provider_held_input_with_its_own_ceiling(upstream):
    """The exception: `unbounded_call_usd` accepts such a request, holding that much on top of its
    bound (the operator's statement); a call billing past its hold is charged what is free and
    the rest recorded as overrun, never past the limit."""

    async def body(gateway, client):
        token, auth = grant(gateway, 0.5)
        request = {"model": "fake-held", "input": "hi", "previous_response_id": "resp_1", "max_output_tokens": 10}
        bound = gateway.bound_of(json.loads(json.dumps(request)), "openai", "/responses")
        answer = await client.post("/openai/v1/responses", json=request, headers=auth)
        return answer, bound, await gateway.revoke(token)

    answer, bound, usage = run_gateway(upstream.url, body, unbounded_call_usd=0.3)
    assert answer.status_code == 200 and bound.unbounded_field == "previous_response_id"
    plain = to_micro_usd((len(bound.body) + CALL_OVERHEAD_TOKENS) * PRICE_IN + 10 * PRICE_OUT)
    assert bound.micro_usd == plain + to_micro_usd(0.3)
    # The fake billed a million held input tokens (over $1): the charge stops at the limit.
    assert usage.cost_usd > 1.0 and usage.charged_micro_usd == to_micro_usd(0.5)
    assert usage.overrun_usd == pytest.approx(usage.cost_usd - 0.5)


def test_a_huge_prompt_and_a_missing_output_limit_are_bounded_before_the_call(upstream):
    """Finding 2: a 20 MiB prompt (about $20 here, against $0.5) is refused with 402 before the
    provider is called; a call naming no output limit is sent with the model's, and held for it."""

    async def body(gateway, client):
        token, auth = grant(gateway, 0.5)
        huge = chat(messages=[{"role": "user", "content": "x" * (20 * 1024 * 1024)}], max_tokens=10)
        refused = await client.post("/openai/v1/chat/completions", json=huge, headers=auth)
        unlimited = await client.post("/openai/v1/chat/completions", json=chat(), headers=auth)
        return refused, unlimited, await gateway.revoke(token)

    refused, unlimited, usage = run_gateway(upstream.url, body)
    assert refused.status_code == 402 and "could cost up to" in refused.json()["error"]["message"]
    assert unlimited.status_code == 200
    assert [r["body"]["max_completion_tokens"] for r in upstream.requests] == [1000]
    assert billed_micro_usd(upstream) == usage.charged_micro_usd <= to_micro_usd(0.5)
    assert usage.refused_calls == {"over_budget": 1}


def test_an_endless_stream_and_a_call_timing_out_pay_their_hold_and_no_more(upstream):
    """A stream that never ends is cut at `timeout_sec` and charged its hold; so is a call the
    provider took and never answered (the provider may bill it): both within the partition's
    budget, which is spent to its end and then refuses."""

    async def body(gateway, client):
        request = chat(stream=True, max_tokens=1000)
        hold = gateway.bound_of(json.loads(json.dumps(request)), "openai", "/chat/completions").micro_usd
        token, auth = grant(gateway, 2 * hold / 1e6)
        partition = next(iter(gateway._grants.values())).pools[0]
        async with client.stream("POST", "/openai/v1/chat/completions", json=request, headers=auth) as endless:
            tail = b"".join([c async for c in endless.aiter_bytes()]).rstrip().splitlines()[-1]
        anthropic = await client.post(
            "/anthropic/v1/messages", json={**chat("claude-greedy", max_tokens=1000), "stream": True}, headers=auth
        )
        return tail, anthropic, await gateway.revoke(token), partition, hold

    tail, anthropic, usage, partition, hold = run_gateway(upstream.url, body)
    assert b"upstream_timeout" in tail and anthropic.status_code == 200
    assert usage.unmetered_calls == 2 and usage.charged_micro_usd == partition.spent
    assert hold <= partition.spent <= partition.total


def test_a_call_the_provider_took_and_never_answered_is_charged_its_hold(upstream):
    """Decided: the provider may bill a call it took, so one timing out is charged its hold (a
    connection that could not be made costs nothing: test_gateway's unreachable provider)."""

    async def body(gateway, client):
        token, auth = grant(gateway, 1.0)
        request = chat("fake-slow", max_tokens=5)
        hold = gateway.bound_of(json.loads(json.dumps(request)), "openai", "/chat/completions").micro_usd
        answer = await client.post("/openai/v1/chat/completions", json=request, headers=auth)
        return answer, await gateway.revoke(token), hold

    answer, usage, hold = run_gateway(upstream.url, body)
    assert answer.status_code == 504
    assert usage.failed_calls == 1 and usage.charged_micro_usd == hold


# -- prices as the provider bills them (LiteLLM's map) ------------------------------------------


def test_long_context_tiers_price_the_whole_call():
    """Finding 3: 300k tokens in on gpt-5.4 cost $1.545 by the map (all tokens at the above-272k
    rates), not $0.78; Gemini 2.5 Pro the same above 200k."""
    gpt = price_of("gpt-5.4", InferenceModel(provider="oai"))
    assert gpt.cost_usd(300_000, 2_000) == pytest.approx(300_000 * 5e-06 + 2_000 * 2.25e-05) == pytest.approx(1.545)
    assert gpt.cost_usd(200_000, 2_000) == pytest.approx(200_000 * 2.5e-06 + 2_000 * 1.5e-05)
    gemini = price_of("gemini-2.5-pro", InferenceModel(provider="g"))
    assert gemini.cost_usd(250_000, 1_000) == pytest.approx(250_000 * 2.5e-06 + 1_000 * 1.5e-05)
    # The bound of a call whose input may reach the tier is at the tier's rates.
    assert gpt.bound_usd(300_000, 0) == pytest.approx(300_000 * 5e-06)


def test_service_tiers_are_priced_or_refused():
    """Finding 3: `service_tier: priority` is charged the map's priority rates; a tier the map
    does not price is refused (400 naming `service_tier`)."""
    gpt = price_of("gpt-5.4", InferenceModel(provider="oai"))
    assert gpt.cost_usd(1_000, 1_000, service_tier="priority") == pytest.approx(1_000 * 5e-06 + 1_000 * 3e-05)
    assert gpt.cost_usd(1_000, 1_000, service_tier="flex") == pytest.approx(1_000 * 1.25e-06 + 1_000 * 7.5e-06)
    payload = {"model": "gpt-5.4", "input": "hi", "max_output_tokens": 10, "service_tier": "priority"}
    assert bound_call(payload, "openai", "/responses", gpt).service_tier == "priority"
    with pytest.raises(Unbounded, match="service_tier"):
        bound_call({**payload, "service_tier": "scale"}, "openai", "/responses", gpt)
    claude = price_of("claude-sonnet-4-5", InferenceModel(provider="ant"))
    with pytest.raises(Unbounded, match="service_tier"):
        bound_call(
            {**chat("claude-sonnet-4-5"), "max_tokens": 5, "service_tier": "priority"}, "anthropic", "/messages", claude
        )


def test_one_hour_cache_writes_are_charged_the_one_hour_rate():
    """Finding 3: Anthropic's `ttl: "1h"` writes cost the map's `..._above_1hr` rate (2x input for
    Sonnet 4.5), five-minute writes 1.25x; a request asking for one-hour writes is held at it."""
    claude = price_of("claude-sonnet-4-5", InferenceModel(provider="ant"))
    assert claude.cost_usd(0, 0, CacheTokens(write=1_000)) == pytest.approx(1_000 * 3.75e-06)
    assert claude.cost_usd(0, 0, CacheTokens(write_1h=1_000)) == pytest.approx(1_000 * 6e-06)
    assert claude.cost_usd(0, 0, CacheTokens(read=1_000)) == pytest.approx(1_000 * 3e-07)
    cached = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 10,
        "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    bound = bound_call(cached, "anthropic", "/messages", claude)
    assert bound.cache_write_1h
    assert bound.micro_usd == to_micro_usd(bound.input_tokens * 6e-06 + 10 * 1.5e-05)


def test_usage_is_priced_at_the_reported_tier_and_cache_durations():
    """What the provider reports decides the price: Anthropic's one-hour and five-minute writes
    each at their rate; OpenAI's `service_tier` in the answer (a call sent as `auto` that the
    provider served at priority is charged priority)."""
    from vero.inference.gateway import _Count

    claude = price_of("claude-sonnet-4-5", InferenceModel(provider="ant"))
    count = _Count()
    usage = {
        "input_tokens": 10,
        "output_tokens": 1,
        "cache_creation_input_tokens": 1_000,
        "cache_creation": {"ephemeral_5m_input_tokens": 400, "ephemeral_1h_input_tokens": 600},
    }
    count.absorb_event({"type": "message_start", "message": {"usage": usage}}, "anthropic")
    assert count.cost_usd(claude, None) == pytest.approx(10 * 3e-06 + 400 * 3.75e-06 + 600 * 6e-06 + 1.5e-05)
    gpt = price_of("gpt-5.4", InferenceModel(provider="oai"))
    count = _Count()
    count.absorb_event({"service_tier": "priority", "usage": {"prompt_tokens": 100, "completion_tokens": 10}}, "openai")
    assert count.cost_usd(gpt, None) == pytest.approx(100 * 5e-06 + 10 * 3e-05)
