"""The inference gateway against a fake provider on loopback: real HTTP on both sides.

The gateway runs as it does in the sidecar (`GatewayServer` on this event loop); the fake provider
(`fake_upstream.py`) runs in a thread. Calls go through httpx and through OpenAI's own SDK.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import time

import httpx
import pytest

from vero.inference.gateway import MAX_WAITING_CALLS, GatewayServer, InferenceGateway
from vero.inference.pricing import PriceUnknown, price_of, to_micro_usd
from vero.spec.models import InferenceModel, InferenceSpec

from .fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS, FakeUpstream, leak_split_text
from .key_leak import assert_no_key_in_stream, leak_request

pytestmark = pytest.mark.timeout(120)

KEY_OPENAI = "sk-test-openai-0123456789abcdef"
KEY_ANTHROPIC = "sk-ant-test-fedcba9876543210"
PRICE_IN, PRICE_OUT = 1e-6, 2e-6  # USD per token
CALL_USD = INPUT_TOKENS * PRICE_IN + OUTPUT_TOKENS * PRICE_OUT


def spec_for(url: str, **overrides) -> InferenceSpec:
    priced = dict(input_cost_per_token=PRICE_IN, output_cost_per_token=PRICE_OUT, max_output_tokens=100)
    models = {
        name: InferenceModel(provider="oai", upstream_model=f"up/{name}", **priced)
        for name in (
            "fake-ok",
            "fake-500",
            "fake-401",
            "fake-400",
            "fake-slow",
            "fake-nousage",
            "fake-stall",
            "fake-trickle",
            "fake-delay",
            "fake-leak",
        )
    }
    models["claude-fake"] = InferenceModel(provider="ant", upstream_model="fake-ok", **priced)
    models["claude-fake-500"] = InferenceModel(provider="ant", upstream_model="fake-500", **priced)
    models["claude-fake-stall"] = InferenceModel(provider="ant", upstream_model="fake-stall", **priced)
    models["claude-fake-leak"] = InferenceModel(provider="ant", upstream_model="fake-leak", **priced)
    return InferenceSpec.model_validate(
        {
            "providers": {
                "oai": {"api": "openai", "base_url": f"{url}/v1", "api_key_secret": "OPENAI_KEY"},
                "ant": {"api": "anthropic", "base_url": url, "api_key_secret": "ANTHROPIC_KEY"},
            },
            "models": {k: v.model_dump() for k, v in models.items()},
            "timeout_sec": 2.0,
            **overrides,
        }
    )


@pytest.fixture
def upstream():
    with FakeUpstream() as fake:
        yield fake


def run(coro):
    return asyncio.run(coro)


async def with_gateway(url: str, body, **spec_overrides):
    gateway = InferenceGateway(
        spec_for(url, **spec_overrides), {"OPENAI_KEY": KEY_OPENAI, "ANTHROPIC_KEY": KEY_ANTHROPIC}
    )
    async with GatewayServer(gateway):
        async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as client:
            return await body(gateway, client)


def test_a_gateway_that_cannot_bind_fails_alone_and_the_event_loop_goes_on(upstream):
    """uvicorn calls `sys.exit` when it cannot bind; a per-evaluation listener (the case route's) on
    an address this host does not have raises `RuntimeError` to its opener, and the loop it runs
    on (the sidecar's) goes on serving: the first listener still answers."""
    gateway = InferenceGateway(spec_for(upstream.url), {"OPENAI_KEY": KEY_OPENAI, "ANTHROPIC_KEY": KEY_ANTHROPIC})

    async def scenario() -> int:
        async with GatewayServer(gateway):
            with pytest.raises(RuntimeError, match=r"could not listen on 192\.0\.2\.123"):
                await GatewayServer(gateway, host="192.0.2.123", evaluation_id="ev-x").__aenter__()
            async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as client:
                return (await client.get("/v1/models")).status_code

    assert run(scenario()) in (200, 401, 404)  # answered: the loop survived the failed listener


def test_the_gateway_leaves_the_process_signal_handlers_alone(upstream):
    # It serves inside the sidecar's or the verifier's process, whose own SIGTERM/SIGINT handling must stay.
    def mark(signum, frame):
        raise AssertionError("not called")

    previous = {sig: signal.signal(sig, mark) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:

        async def body(gateway, client):
            return {sig: signal.getsignal(sig) for sig in previous}

        assert run(with_gateway(upstream.url, body)) == {signal.SIGTERM: mark, signal.SIGINT: mark}
        assert signal.getsignal(signal.SIGTERM) is mark
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def chat(model: str, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], **extra}


def hold_of(gateway, body: dict, api: str = "openai", path: str = "/chat/completions") -> int:
    """What the gateway holds for `body` (micro-USD): its bound, computed as the gateway does."""
    return gateway.bound_of(json.loads(json.dumps(body)), api, path).micro_usd


def test_metered_calls_in_every_format_streaming_and_not(upstream):
    async def body(gateway, client):
        token, grant = gateway.grant("ev-1", "train", limit_micro_usd=to_micro_usd(1.0))
        gateway.bind_host(token, os.getuid())  # the caller is this test's process
        auth = {"authorization": f"Bearer {token}"}
        answers = [
            await client.post("/openai/v1/chat/completions", json=chat("fake-ok"), headers=auth),
            await client.post("/openai/v1/chat/completions", json=chat("fake-ok", stream=True), headers=auth),
            await client.post("/openai/v1/responses", json={"model": "fake-ok", "input": "hi"}, headers=auth),
            await client.post(
                "/openai/v1/responses", json={"model": "fake-ok", "input": "hi", "stream": True}, headers=auth
            ),
            await client.post(
                "/anthropic/v1/messages", json=chat("claude-fake", max_tokens=50), headers={"x-api-key": token}
            ),
            await client.post(
                "/anthropic/v1/messages",
                json=chat("claude-fake", max_tokens=50, stream=True),
                headers={"x-api-key": token, "anthropic-version": "2023-06-01"},
            ),
        ]
        texts = [a.text for a in answers]
        usage = await gateway.revoke(token)
        return answers, texts, usage, grant

    answers, texts, usage, grant = run(with_gateway(upstream.url, body))
    assert [a.status_code for a in answers] == [200] * 6
    assert json.loads(texts[0])["choices"][0]["message"]["content"] == "hi"
    assert "data: [DONE]" in texts[1] and "response.completed" in texts[3] and "message_stop" in texts[5]
    assert usage.calls == 6 and usage.failed_calls == 0 and usage.unmetered_calls == 0
    assert usage.input_tokens == 6 * INPUT_TOKENS and usage.output_tokens == 6 * OUTPUT_TOKENS
    assert usage.cost_usd == pytest.approx(6 * CALL_USD)
    assert usage.charged_micro_usd == 6 * to_micro_usd(CALL_USD)
    assert usage.by_model["fake-ok"].calls == 4 and usage.by_model["claude-fake"].calls == 2
    # Upstream got the real model id and the gateway's key, never the candidate's token.
    sent = upstream.requests
    assert {r["body"]["model"] for r in sent} == {"up/fake-ok", "fake-ok"}
    assert sent[1]["body"]["stream_options"] == {"include_usage": True}
    # A call naming no output limit is sent with the model's, so that its cost is bounded.
    assert sent[0]["body"]["max_completion_tokens"] == 100 and sent[2]["body"]["max_output_tokens"] == 100
    assert all(r["headers"].get("authorization") == f"Bearer {KEY_OPENAI}" for r in sent[:4])
    assert all(r["headers"].get("x-api-key") == KEY_ANTHROPIC for r in sent[4:])
    assert not any("vero-ev-" in json.dumps(r["headers"]) for r in sent)
    # Holds are all released: the pool was charged exactly the metered cost.
    (pool,) = grant.pools
    assert pool.held == 0 and pool.spent == usage.charged_micro_usd


def test_openai_sdk_streams_through_the_gateway(upstream):
    from openai import AsyncOpenAI

    async def body(gateway, client):
        token, _ = gateway.grant("ev-sdk", "train", limit_micro_usd=to_micro_usd(1.0))
        gateway.bind_host(token, os.getuid())  # the caller is this test's process
        env = gateway.environment(token)
        sdk = AsyncOpenAI(base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], max_retries=0)
        stream = await sdk.chat.completions.create(
            model="fake-ok", messages=[{"role": "user", "content": "x"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        listed = [m.id async for m in sdk.models.list()]
        await sdk.close()
        return text, listed, await gateway.revoke(token)

    text, listed, usage = run(with_gateway(upstream.url, body))
    assert text == "hi" and "fake-ok" in listed and "claude-fake" not in listed
    assert usage.calls == 1 and usage.output_tokens == OUTPUT_TOKENS


CALL_AS_UID = """
import json, sys, urllib.error, urllib.request
base, token = sys.argv[1], sys.argv[2]
request = urllib.request.Request(base + "/openai/v1/chat/completions", method="POST",
    data=json.dumps({"model": "fake-ok", "messages": [{"role": "user", "content": "x"}]}).encode(),
    headers={"authorization": "Bearer " + token, "content-type": "application/json"})
try:
    print(urllib.request.urlopen(request, timeout=30).status)
except urllib.error.HTTPError as error:
    print(error.code)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="callers of other uids need root")
def test_a_token_works_only_for_its_own_evaluations_candidate_hosts(upstream, caplog, portable_toolchain):
    """Two evaluations running at once, each with a candidate host of its own uid (real processes,
    real loopback connections): each token works for its host; a's token from b's host (or from
    any other local uid) is refused with 401, logged, and counted on b; neither budget moves."""
    python = str(portable_toolchain[1])  # runnable by any uid
    uid_a, uid_b, stranger = 52991, 52992, 52993

    def call_as(uid: int, base: str, token: str) -> int:
        done = subprocess.run(
            [python, "-I", "-c", CALL_AS_UID, base, token],
            user=uid,
            group=uid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        return int(done.stdout.strip() or 0)

    async def body(gateway, client):
        token_a, _ = gateway.grant("ev-a", "train", limit_micro_usd=to_micro_usd(1.0))
        token_b, _ = gateway.grant("ev-b", "secret", limit_micro_usd=to_micro_usd(1.0))
        gateway.bind_host(token_a, uid_a)
        gateway.bind_host(token_b, uid_b)
        base = gateway.base_url
        codes = {
            "a_own": await asyncio.to_thread(call_as, uid_a, base, token_a),
            "b_own": await asyncio.to_thread(call_as, uid_b, base, token_b),
            "b_with_a": await asyncio.to_thread(call_as, uid_b, base, token_a),
            "a_with_b": await asyncio.to_thread(call_as, uid_a, base, token_b),
            "stranger_with_a": await asyncio.to_thread(call_as, stranger, base, token_a),
            "this_process_with_a": (
                await client.post(
                    "/openai/v1/chat/completions", json=chat("fake-ok"), headers={"authorization": f"Bearer {token_a}"}
                )
            ).status_code,
        }
        gateway.release_host(token_a, uid_a)
        codes["a_after_its_host_ended"] = await asyncio.to_thread(call_as, uid_a, base, token_a)
        return codes, await gateway.revoke(token_a), await gateway.revoke(token_b)

    caplog.set_level(logging.WARNING)
    codes, usage_a, usage_b = run(with_gateway(upstream.url, body))
    assert codes == {
        "a_own": 200,
        "b_own": 200,
        "b_with_a": 401,
        "a_with_b": 401,
        "stranger_with_a": 401,
        "this_process_with_a": 401,
        "a_after_its_host_ended": 401,
    }
    assert usage_a.calls == 1 and usage_b.calls == 1
    # Each misuse is counted on the evaluation whose candidate tried, never on the token's own.
    assert usage_a.refused_calls == {"foreign_token": 1} and usage_b.refused_calls == {"foreign_token": 1}
    assert "evaluation ev-a: its gateway token was used by local uid 52992" in caplog.text
    assert "(a candidate of evaluation ev-b)" in caplog.text


def test_refusals_allow_list_tokens_and_budget(upstream):
    async def body(gateway, client):
        hold = hold_of(gateway, chat("fake-nousage", max_tokens=7))
        token, grant_ = gateway.grant("ev-2", "train", limit_micro_usd=2 * hold + hold // 2)
        partition = grant_.pools[0]
        gateway.bind_host(token, os.getuid())  # the caller is this test's process
        auth = {"authorization": f"Bearer {token}"}
        out = {
            "no_token": await client.post("/openai/v1/chat/completions", json=chat("fake-ok")),
            "bad_token": await client.post(
                "/openai/v1/chat/completions", json=chat("fake-ok"), headers={"authorization": "Bearer vero-ev-guess"}
            ),
            "off_list": await client.post("/openai/v1/chat/completions", json=chat("gpt-4o"), headers=auth),
            "wrong_family": await client.post("/openai/v1/chat/completions", json=chat("claude-fake"), headers=auth),
            "not_json": await client.post("/openai/v1/chat/completions", content=b"{", headers=auth),
        }
        # A call without usage is charged its whole hold: with 2.5 holds' money, two calls are
        # answered; the third's bound is more than is left, so it is refused before the provider.
        spent = [
            await client.post("/openai/v1/chat/completions", json=chat("fake-nousage", max_tokens=7), headers=auth)
            for _ in range(3)
        ]
        partition.spent = partition.total  # spent to the last micro-dollar: exhausted
        spent.append(await client.post("/openai/v1/chat/completions", json=chat("fake-ok", max_tokens=1), headers=auth))
        usage = await gateway.revoke(token)
        out["after_revoke"] = await client.post("/openai/v1/chat/completions", json=chat("fake-ok"), headers=auth)
        return out, spent, usage, partition, hold

    out, spent, usage, partition, hold = run(with_gateway(upstream.url, body))
    assert {k: v.status_code for k, v in out.items()} == {
        "no_token": 401,
        "bad_token": 401,
        "off_list": 403,
        "wrong_family": 403,
        "not_json": 400,
        "after_revoke": 401,
    }
    assert out["off_list"].json()["error"]["type"] == "model_not_allowed"
    assert [r.status_code for r in spent] == [200, 200, 402, 402]
    assert {r.json()["error"]["code"] for r in spent[2:]} == {"budget_exhausted"}
    assert "could cost up to" in spent[2].json()["error"]["message"]
    assert "exhausted" in spent[3].json()["error"]["message"]
    assert partition.held == 0 and usage.charged_micro_usd == 2 * hold
    assert usage.refused_calls == {"model_not_allowed": 2, "bad_request": 1, "over_budget": 1, "budget_exhausted": 1}
    # Refused calls never reached the provider.
    assert [r["body"]["model"] for r in upstream.requests] == ["up/fake-nousage"] * 2


def test_upstream_failures_are_not_charged_and_never_leak_the_key(upstream, caplog):
    caplog.set_level(logging.DEBUG)

    async def body(gateway, client):
        token, grant_ = gateway.grant("ev-3", "train", limit_micro_usd=to_micro_usd(1.0))
        partition = grant_.pools[0]
        gateway.bind_host(token, os.getuid())  # the caller is this test's process
        auth = {"authorization": f"Bearer {token}"}
        answers = {
            "5xx": await client.post("/openai/v1/chat/completions", json=chat("fake-500"), headers=auth),
            "5xx_anthropic": await client.post(
                "/anthropic/v1/messages", json=chat("claude-fake-500", max_tokens=5), headers={"x-api-key": token}
            ),
            "timeout": await client.post("/openai/v1/chat/completions", json=chat("fake-slow"), headers=auth),
            "401": await client.post("/openai/v1/chat/completions", json=chat("fake-401"), headers=auth),
            "400": await client.post("/openai/v1/chat/completions", json=chat("fake-400"), headers=auth),
            "nousage": await client.post(
                "/openai/v1/chat/completions", json=chat("fake-nousage", max_tokens=10), headers=auth
            ),
        }
        holds = hold_of(gateway, chat("fake-nousage", max_tokens=10)) + hold_of(gateway, chat("fake-slow"))
        return answers, await gateway.revoke(token), partition, holds

    answers, usage, partition, holds = run(with_gateway(upstream.url, body))
    assert {k: v.status_code for k, v in answers.items()} == {
        "5xx": 502,
        "5xx_anthropic": 502,
        "timeout": 504,
        "401": 502,
        "400": 400,
        "nousage": 200,
    }
    assert answers["5xx_anthropic"].json()["type"] == "error"
    assert usage.failed_calls == 4 and usage.unreachable_calls == 0  # the provider answered, badly
    assert usage.unreachable_failure() is None
    # 5xx, the provider's 401 and its 400 cost nothing; the usage-less answer and the call the
    # provider took but never answered (it may bill it) are charged their holds.
    assert usage.unmetered_calls == 2 and usage.calls == 2
    assert usage.charged_micro_usd == partition.spent == holds
    everything = "".join(a.text for a in answers.values()) + caplog.text + usage.model_dump_json()
    assert KEY_OPENAI not in everything and KEY_ANTHROPIC not in everything
    assert "sk-test" not in answers["401"].text


LEAK_FORMATS = {
    # name -> (route, model, the key the provider was sent, extra words of the request)
    "chat": ("/openai/v1/chat/completions", "fake-leak", KEY_OPENAI, ""),
    "chat tool call": ("/openai/v1/chat/completions", "fake-leak", KEY_OPENAI, " tool"),
    "responses": ("/openai/v1/responses", "fake-leak", KEY_OPENAI, ""),
    "anthropic": ("/anthropic/v1/messages", "claude-fake-leak", KEY_ANTHROPIC, ""),
    "anthropic tool input": ("/anthropic/v1/messages", "claude-fake-leak", KEY_ANTHROPIC, " tool"),
}


@pytest.mark.parametrize("name", sorted(LEAK_FORMATS))
def test_a_key_the_provider_streams_split_across_events_never_reaches_the_caller(upstream, name):
    """The provider streams its own key as `before <key> after`, split between two events at every
    offset, then one character per event: the caller joins `before *** after` every time (the
    scrub follows the text across events), and every call is still metered."""
    route, model, key, extra = LEAK_FORMATS[name]
    headers = (lambda token: {"x-api-key": token}) if route.startswith("/anthropic") else None
    messages = [f"cut {offset}{extra}" for offset in range(len(key) + 1)] + [f"each{extra}"]

    async def body(gateway, client):
        token, _ = gateway.grant("ev-leak", "train", limit_micro_usd=to_micro_usd(1.0))
        gateway.bind_host(token, os.getuid())
        auth = headers(token) if headers else {"authorization": f"Bearer {token}"}
        streams = []
        for message in messages:
            answer = await client.post(route, json=leak_request(route, model, message), headers=auth)
            assert answer.status_code == 200
            streams.append(answer.text)
        whole = await client.post(route, json=leak_request(route, model, "cut 5", stream=False), headers=auth)
        return streams, whole, await gateway.revoke(token)

    streams, whole, usage = run(with_gateway(upstream.url, body))
    assert len(leak_split_text(messages[-1], key)) == len(key) + 2  # one event per character
    for message, stream in zip(messages, streams, strict=True):
        assert_no_key_in_stream(stream, key, message)
    assert "message_stop" in streams[0] or "[DONE]" in streams[0] or "response.completed" in streams[0]
    # The whole answer writes the key with JSON escapes (`\u0073k-...`): the decoded text is scrubbed.
    assert "\\u00" not in whole.text and whole.json()["content"][0]["text"] == "before *** after"
    assert usage.calls == len(messages) + 1 and usage.unmetered_calls == 0


def test_streams_that_fail_are_refunded_and_callers_that_leave_pay_their_hold(upstream):
    """A stream the provider refuses (5xx) costs nothing. A stream that stops feeding is ended after
    `stream_idle_timeout_sec` with an error event in its format and charged its hold (the provider
    took the request), or what its usage says when that had arrived; a stream that never stalls
    but runs past `timeout_sec` is ended the same way. A caller that goes away mid-stream is
    charged its hold, settled when it leaves (not at revocation)."""
    idle_sec, limit_sec = 1.0, 3.0

    async def failing(gateway, client):
        token, grant_ = gateway.grant("ev-5", "train", limit_micro_usd=to_micro_usd(1.0))
        partition = grant_.pools[0]
        gateway.bind_host(token, os.getuid())  # the caller is this test's process
        auth = {"authorization": f"Bearer {token}"}
        refused = await client.post("/openai/v1/chat/completions", json=chat("fake-500", stream=True), headers=auth)
        took = {}
        started = time.monotonic()
        async with client.stream(
            "POST", "/openai/v1/chat/completions", json=chat("fake-stall", stream=True, max_tokens=40), headers=auth
        ) as stalled:
            received = b"".join([chunk async for chunk in stalled.aiter_bytes()])
        took["stalled"] = time.monotonic() - started
        # Anthropic's stream reports its input tokens first: a stream cut after that is metered.
        async with client.stream(
            "POST",
            "/anthropic/v1/messages",
            headers={"x-api-key": token},
            json=chat("claude-fake-stall", max_tokens=5, stream=True),
        ) as cut:
            received_anthropic = b"".join([chunk async for chunk in cut.aiter_bytes()])
        started = time.monotonic()
        async with client.stream(
            "POST", "/openai/v1/chat/completions", json=chat("fake-trickle", stream=True, max_tokens=40), headers=auth
        ) as trickled:
            received_trickle = b"".join([chunk async for chunk in trickled.aiter_bytes()])
        took["trickle"] = time.monotonic() - started
        usage = await gateway.revoke(token)
        took["holds"] = hold_of(gateway, chat("fake-stall", stream=True, max_tokens=40)) + hold_of(
            gateway, chat("fake-trickle", stream=True, max_tokens=40)
        )
        return refused, stalled.status_code, received, received_anthropic, received_trickle, took, usage, partition

    refused, status, received, received_anthropic, trickle, took, usage, partition = run(
        with_gateway(upstream.url, failing, timeout_sec=limit_sec, stream_idle_timeout_sec=idle_sec)
    )
    assert refused.status_code == 502 and refused.json()["error"]["code"] == "upstream_error"
    # The caller got what the provider sent before it stalled, then an error event in its format,
    # not before the idle limit.
    assert status == 200 and b'"content": "h"' in received
    assert b'"code": "upstream_timeout"' in received.rstrip().splitlines()[-1]
    assert took["stalled"] >= idle_sec
    assert b"message_start" in received_anthropic
    assert received_anthropic.rstrip().splitlines()[-2:] == [
        b"event: error",
        b'data: {"type": "error", "error": {"type": "api_error", "message": '
        b'"the model provider stopped answering in time"}}',
    ]
    # Kept alive by comments, it never stalled: ended at the call's limit all the same.
    assert b"keep-alive" in trickle and b'"code": "upstream_timeout"' in trickle.rstrip().splitlines()[-1]
    assert took["trickle"] >= limit_sec
    assert usage.failed_calls == 1 and usage.calls == 3 and usage.unmetered_calls == 2
    assert usage.input_tokens == INPUT_TOKENS
    assert usage.by_model["claude-fake-stall"].calls == 1 and usage.by_model["fake-stall"].calls == 1
    # The stalled and the trickling OpenAI streams pay their holds; the Anthropic one what its
    # usage said (input tokens and the one output token counted).
    assert (
        usage.charged_micro_usd == partition.spent == took["holds"] + to_micro_usd(INPUT_TOKENS * PRICE_IN + PRICE_OUT)
    )
    assert partition.held == 0

    async def leaving(gateway, client):
        token, grant = gateway.grant("ev-6", "train", limit_micro_usd=to_micro_usd(1.0))
        partition = grant.pools[0]
        gateway.bind_host(token, os.getuid())  # the caller is this test's process
        request = chat("fake-stall", stream=True, max_tokens=50)
        async with client.stream(
            "POST", "/openai/v1/chat/completions", json=request, headers={"authorization": f"Bearer {token}"}
        ) as answer:
            first = await anext(answer.aiter_bytes())
        assert partition.held > 0 and grant.open_calls  # nothing settled while the stream is open
        await grant.idle.wait()  # settled when the caller left (the pytest timeout guards a hang)
        return first, await gateway.revoke(token), partition, hold_of(gateway, request)

    first, usage, partition, hold = run(with_gateway(upstream.url, leaving, timeout_sec=600.0))
    assert first.startswith(b"data: ")
    assert usage.calls == 1 and usage.unmetered_calls == 1 and usage.failed_calls == 0
    # Its hold (its bound), not what it read.
    assert usage.charged_micro_usd == partition.spent == hold > to_micro_usd(CALL_USD)
    assert partition.held == 0


def test_evaluation_limit_caps_one_evaluation(upstream):
    async def body(gateway, client):
        hold = hold_of(gateway, chat("fake-nousage", max_tokens=7))
        token, _ = gateway.grant("ev-4", "hidden", limit_micro_usd=int(1.5 * hold))
        gateway.bind_host(token, os.getuid())  # the caller is this test's process
        auth = {"authorization": f"Bearer {token}"}
        codes = [
            (
                await client.post("/openai/v1/chat/completions", json=chat("fake-nousage", max_tokens=7), headers=auth)
            ).status_code
            for _ in range(3)
        ]
        return codes, await gateway.revoke(token), hold

    codes, usage, hold = run(with_gateway(upstream.url, body))
    assert codes == [200, 402, 402]
    assert usage.charged_micro_usd == hold and usage.refused_calls == {"over_budget": 2}


async def _started(upstream, n: int) -> None:
    """Wait until the provider has received `n` requests (the first call holds its money by then)."""
    while len(upstream.requests) < n:
        await asyncio.sleep(0.01)


def test_a_budget_held_by_a_call_in_flight_is_busy_not_exhausted(upstream):
    # One call's bound and 1.5 calls' cost: the first call holds most of it. A second call made
    # meanwhile waits for the first to settle and then fits; a call made when what is left is less
    # than its bound is refused. Whether a call is refused never depends on timing.
    async def body(gateway, client):
        limit = hold_of(gateway, chat("fake-delay", max_tokens=7)) + 1.5 * to_micro_usd(CALL_USD)
        token, _ = gateway.grant("ev-5", "train", limit_micro_usd=int(limit))
        gateway.bind_host(token, os.getuid())  # the caller is this test's process
        auth = {"authorization": f"Bearer {token}"}
        first = asyncio.create_task(
            client.post("/openai/v1/chat/completions", json=chat("fake-delay", max_tokens=7), headers=auth)
        )
        await _started(upstream, 1)
        second = await client.post("/openai/v1/chat/completions", json=chat("fake-ok", max_tokens=7), headers=auth)
        first_done_before_second_sent = len(upstream.requests) == 2 and first.done()
        third = await client.post("/openai/v1/chat/completions", json=chat("fake-delay", max_tokens=7), headers=auth)
        return (await first), second, third, first_done_before_second_sent, await gateway.revoke(token)

    first, second, third, ordered, usage = run(with_gateway(upstream.url, body))
    assert (first.status_code, second.status_code, third.status_code) == (200, 200, 402), second.text
    assert ordered
    assert usage.calls == 2 and usage.refused_calls == {"over_budget": 1}
    assert usage.charged_micro_usd == 2 * to_micro_usd(CALL_USD)


def test_calls_waiting_for_money_are_bounded_per_evaluation(upstream):
    # A candidate must not park unbounded connections on the gateway for free: past
    # MAX_WAITING_CALLS waiting calls, further ones are answered 429 at once.
    async def body(gateway, client):
        limit = hold_of(gateway, chat("fake-slow", max_tokens=7)) + hold_of(gateway, chat("fake-ok", max_tokens=7)) // 2
        token, grant = gateway.grant("ev-7", "train", limit_micro_usd=int(limit))
        gateway.bind_host(token, os.getuid())  # the caller is this test's process
        auth = {"authorization": f"Bearer {token}"}
        first = asyncio.create_task(
            client.post("/openai/v1/chat/completions", json=chat("fake-slow", max_tokens=7), headers=auth)
        )
        await _started(upstream, 1)
        waiting = [
            asyncio.create_task(
                client.post("/openai/v1/chat/completions", json=chat("fake-ok", max_tokens=7), headers=auth)
            )
            for _ in range(MAX_WAITING_CALLS)
        ]
        while grant.waiting_calls < MAX_WAITING_CALLS:
            await asyncio.sleep(0.01)
        extra = [
            await client.post("/openai/v1/chat/completions", json=chat("fake-ok", max_tokens=7), headers=auth)
            for _ in range(2)
        ]
        usage = await gateway.revoke(token)
        first.cancel()  # the provider never answers it in time; the gateway charged its hold
        return extra, [await w for w in waiting], usage

    extra, waited, usage = run(with_gateway(upstream.url, body, timeout_sec=60.0))
    assert [r.status_code for r in extra] == [429, 429]
    assert extra[0].json()["error"]["code"] == "rate_limit_exceeded"
    assert {r.status_code for r in waited} == {401}  # woken by the revocation, never forwarded
    assert usage.refused_calls["too_many_waiting"] == 2
    assert {r["body"]["model"] for r in upstream.requests} == {"up/fake-slow"}


def test_a_call_waiting_for_money_is_refused_when_its_token_closes(upstream):
    async def body(gateway, client):
        limit = (
            hold_of(gateway, chat("fake-delay", max_tokens=7)) + hold_of(gateway, chat("fake-ok", max_tokens=7)) // 2
        )
        token, _ = gateway.grant("ev-6", "train", limit_micro_usd=int(limit))
        gateway.bind_host(token, os.getuid())  # the caller is this test's process
        auth = {"authorization": f"Bearer {token}"}
        first = asyncio.create_task(
            client.post("/openai/v1/chat/completions", json=chat("fake-delay", max_tokens=7), headers=auth)
        )
        await _started(upstream, 1)
        waiting = asyncio.create_task(
            client.post("/openai/v1/chat/completions", json=chat("fake-ok", max_tokens=7), headers=auth)
        )
        await asyncio.sleep(0.2)
        usage = await gateway.revoke(token)
        return await first, await waiting, usage

    first, waiting, usage = run(with_gateway(upstream.url, body))
    assert first.status_code == 200 and waiting.status_code == 401
    assert usage.calls == 1 and len(upstream.requests) == 1


def test_prices_come_from_litellms_cost_map_or_the_spec():
    price = price_of("gpt-4o-mini", InferenceModel(provider="oai"))
    assert price.input_usd_per_token == pytest.approx(1.5e-07) and price.output_usd_per_token == pytest.approx(6e-07)
    assert price_of("openai/gpt-4o-mini", InferenceModel(provider="oai")).input_usd_per_token == pytest.approx(1.5e-07)
    with pytest.raises(PriceUnknown):
        price_of("my-local-model", InferenceModel(provider="oai"))
    own = price_of("my-local-model", InferenceModel(provider="oai", input_cost_per_token=0, output_cost_per_token=1e-6))
    assert own.output_usd_per_token == 1e-6


def test_a_provider_nobody_can_connect_to_is_counted_unreachable_and_logged(caplog):
    """Connection failures are told apart from the provider's own failures (5xx, timeouts: see
    above, never unreachable): an evaluation with an unreachable call is an infrastructure failure
    (`InferenceUsage.unreachable_failure`), and the log names the error without the URL or key."""
    import socket

    caplog.set_level(logging.WARNING, logger="vero.inference")
    closed = socket.socket()  # bound, never listening: connections are refused
    closed.bind(("127.0.0.1", 0))
    try:

        async def body(gateway, client):
            token, _ = gateway.grant("ev-9", "train", limit_micro_usd=to_micro_usd(1.0))
            gateway.bind_host(token, os.getuid())  # the caller is this test's process
            answer = await client.post(
                "/openai/v1/chat/completions", json=chat("fake-ok"), headers={"authorization": f"Bearer {token}"}
            )
            return answer, await gateway.revoke(token)

        answer, usage = run(with_gateway(f"http://127.0.0.1:{closed.getsockname()[1]}", body))
    finally:
        closed.close()
    assert answer.status_code == 502 and answer.json()["error"]["code"] == "upstream_error"
    assert usage.failed_calls == usage.unreachable_calls == 1 and usage.charged_micro_usd == 0
    assert usage.unreachable_failure() is not None
    assert "ConnectError: ECONNREFUSED" in caplog.text
    assert KEY_OPENAI not in caplog.text and "127.0.0.1" not in caplog.text


class _Journal:
    """A `CallJournal` recording what the gateway tells it; `fail` makes `opened` raise."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.events: list[tuple[str, str, int]] = []

    async def opened(self, call_id: str, held_micro_usd: int) -> None:
        if self.fail:
            raise OSError("disk full")
        self.events.append(("opened", call_id, held_micro_usd))

    def closed(self, call_id: str, charged_micro_usd: int, overrun_micro_usd: int = 0) -> None:
        self.events.append(("closed", call_id, charged_micro_usd, overrun_micro_usd))


def test_the_agent_scope_is_its_own_listener_models_and_pool_and_journals_each_call(upstream):
    import hashlib

    from vero.inference.gateway import create_gateway_app

    agent_token = "vero-ag-unit-test-token"
    journal = _Journal()

    async def body(gateway, client):
        with pytest.raises(ValueError, match="64 hex digits"):
            gateway.grant_agent("not-a-digest", ["fake-ok"], limit_micro_usd=1)
        with pytest.raises(ValueError, match="not allow-listed: nope"):
            gateway.grant_agent("0" * 64, ["nope"], limit_micro_usd=1)
        # Room for one call and not quite a second: what is left after it is short of its bound by 1.
        limit = (
            hold_of(gateway, chat("claude-fake", max_tokens=10), "anthropic", "/messages") + to_micro_usd(CALL_USD) - 1
        )
        agent = gateway.grant_agent(
            hashlib.sha256(agent_token.encode()).hexdigest(), ["claude-fake"], limit_micro_usd=limit, journal=journal
        )
        eval_token, eval_grant = gateway.grant("ev-1", "train", limit_micro_usd=to_micro_usd(1.0))
        gateway.bind_host(eval_token, os.getuid())
        transport = httpx.ASGITransport(app=create_gateway_app(gateway, scope="agent"))
        async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as agent_client:
            mine = {"x-api-key": agent_token}
            ok = await agent_client.post(
                "/anthropic/v1/messages", json=chat("claude-fake", max_tokens=10), headers=mine
            )
            # Off the agent's list (though on the allow-list): 403 before the provider.
            off = await agent_client.post("/openai/v1/chat/completions", json=chat("fake-ok"), headers=mine)
            # The evaluation's token on the agent's listener: 401, counted on that evaluation.
            crossed = await agent_client.post(
                "/anthropic/v1/messages", json=chat("claude-fake"), headers={"x-api-key": eval_token}
            )
            spent = await agent_client.post(
                "/anthropic/v1/messages", json=chat("claude-fake", max_tokens=10), headers=mine
            )
        # The agent's token on the candidates' listener (even from a bound host's uid): 401.
        on_candidates = await client.post("/anthropic/v1/messages", json=chat("claude-fake"), headers=mine)
        return ok, off, crossed, spent, on_candidates, agent, eval_grant

    ok, off, crossed, spent, on_candidates, agent, eval_grant = run(with_gateway(upstream.url, body))
    assert ok.status_code == 200 and off.status_code == 403 and crossed.status_code == 401
    assert on_candidates.status_code == 401
    assert eval_grant.usage.refused_calls == {"foreign_token": 1}
    assert spent.status_code == 402 and spent.json()["type"] == "error"
    assert "coding agent's inference budget" in spent.json()["error"]["message"]
    assert agent.usage.calls == 1 and agent.usage.refused_calls == {"model_not_allowed": 1, "over_budget": 1}
    (opened, closed) = journal.events
    assert opened[0] == "opened" and closed[:2] == ("closed", opened[1])
    assert opened[2] > closed[2] == to_micro_usd(CALL_USD)  # held the bound, charged the usage
    assert closed[3] == 0
    assert len(upstream.requests) == 1


def test_a_call_the_journal_cannot_record_is_not_forwarded(upstream):
    import hashlib

    from vero.inference.gateway import create_gateway_app

    async def body(gateway, client):
        grant = gateway.grant_agent(
            hashlib.sha256(b"vero-ag-x").hexdigest(), ["fake-ok"], limit_micro_usd=10**6, journal=_Journal(fail=True)
        )
        transport = httpx.ASGITransport(app=create_gateway_app(gateway, scope="agent"))
        async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as agent_client:
            answer = await agent_client.post(
                "/openai/v1/chat/completions", json=chat("fake-ok"), headers={"authorization": "Bearer vero-ag-x"}
            )
        return answer, grant

    answer, grant = run(with_gateway(upstream.url, body))
    assert answer.status_code == 503 and upstream.requests == []
    assert grant.pools[0].held == 0 and grant.pools[0].spent == 0 and not grant.open_calls
