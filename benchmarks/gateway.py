"""Added latency of the inference gateway per call, against calling the fake provider directly.

Starts the fake OpenAI/Anthropic-compatible provider of the tests (`tests/inference/fake_upstream.py`)
and a real gateway (`vero.inference.gateway.GatewayServer`) on loopback, then times the same
calls both ways in alternating rounds: chat completions (plain and streaming) and Anthropic
messages, sequentially and with 16 concurrent clients. Prints medians, p95 and the ratio
gateway / direct from one run. No network beyond 127.0.0.1.

    uv run python benchmarks/gateway.py [--calls 300]

With `--adversarial`, it measures money instead of time: evaluations sharing one partition's
budget attack the gateway at once against a fake provider that bills what it is asked
(`fake-greedy`: the body's bytes in, the request's output limit times `n` out, a million more
input tokens for input it holds, streams without end): concurrent calls with `n > 1`, 20 MiB
prompts, `max_tokens` 1e9, provider-held input (`previous_response_id`, file ids, remote images),
endless streams, then plain calls until refused. It prints what each attack got and, last,
`billed/limit: E (evaluation), P (partition)`: the most any evaluation was billed over its
`evaluation_limit_usd`, and what all were billed over the partition's `total_inference_usd`. As in
the sidecar, each evaluation is admitted with a reservation of the smaller of its limit and what
is left of the partition's money (the ledger's `inference_micro_usd`) and its calls spend only that.

    uv run python benchmarks/gateway.py --adversarial
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from inference.fake_upstream import FakeUpstream

from vero.inference.gateway import GatewayServer, InferenceGateway
from vero.spec.models import InferenceSpec

KEY = "sk-bench-0123456789"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(client: httpx.AsyncClient, url: str, body: dict, headers: dict, stream: bool) -> float:
    start = time.perf_counter()
    if stream:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            async for _ in response.aiter_bytes():
                pass
            assert response.status_code == 200, response.status_code
    else:
        response = await client.post(url, json=body, headers=headers)
        assert response.status_code == 200, response.text
    return (time.perf_counter() - start) * 1000


async def measure(client, url, body, headers, stream, calls, concurrency) -> list[float]:
    results: list[float] = []
    queue = iter(range(calls))

    async def worker():
        for _ in queue:
            results.append(await timed(client, url, body, headers, stream))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def main(calls: int) -> None:
    with FakeUpstream() as fake:
        spec = InferenceSpec.model_validate(
            {
                "providers": {
                    "oai": {"api": "openai", "base_url": f"{fake.url}/v1", "api_key_secret": "K"},
                    "ant": {"api": "anthropic", "base_url": fake.url, "api_key_secret": "K"},
                },
                "models": {
                    "fake-ok": {"provider": "oai", "input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6},
                    "claude-fake": {
                        "provider": "ant",
                        "upstream_model": "fake-ok",
                        "input_cost_per_token": 1e-6,
                        "output_cost_per_token": 2e-6,
                    },
                },
            }
        )
        gateway = InferenceGateway(spec, {"K": KEY})
        async with GatewayServer(gateway):
            token, _ = gateway.grant("bench", "train", limit_micro_usd=None)
            # A token works only from a candidate host bound to it, as the sidecar's launcher binds
            # each host's uid (`bind_host`): this process is the host here.
            gateway.bind_host(token, os.getuid())
            chat = {"model": "fake-ok", "messages": [{"role": "user", "content": "hello " * 50}], "max_tokens": 64}
            message = {**chat, "model": "claude-fake"}
            cases = [
                ("chat completions", "/openai/v1/chat/completions", "/v1/chat/completions", chat, False),
                (
                    "chat completions, streaming",
                    "/openai/v1/chat/completions",
                    "/v1/chat/completions",
                    {**chat, "stream": True},
                    True,
                ),
                ("anthropic messages", "/anthropic/v1/messages", "/v1/messages", message, False),
            ]
            # Idle connections expire here before uvicorn's 5 s keep-alive closes them: one the
            # server is closing as it is reused fails the request (16 clients got a ReadError when a
            # round on the other side ran past 5 s; benchmarks/fan_out.py met the same).
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64, keepalive_expiry=1.0)
            async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as client:
                print(
                    f"{'call':34} {'clients':>7} {'direct p50/p95 ms':>18} {'gateway p50/p95 ms':>19} "
                    f"{'added p50 ms':>12} {'ratio p50':>9}"
                )
                for name, gateway_path, direct_path, body, stream in cases:
                    for concurrency in (1, 16):
                        direct: list[float] = []
                        through: list[float] = []
                        # warm-up, then alternating rounds so drift hits both sides alike
                        await measure(
                            client,
                            fake.url + direct_path,
                            body,
                            {"authorization": f"Bearer {KEY}"},
                            stream,
                            20,
                            concurrency,
                        )
                        await measure(
                            client,
                            gateway.base_url + gateway_path,
                            body,
                            {"authorization": f"Bearer {token}"},
                            stream,
                            20,
                            concurrency,
                        )
                        for _ in range(3):
                            direct += await measure(
                                client,
                                fake.url + direct_path,
                                body,
                                {"authorization": f"Bearer {KEY}"},
                                stream,
                                calls // 3,
                                concurrency,
                            )
                            through += await measure(
                                client,
                                gateway.base_url + gateway_path,
                                body,
                                {"authorization": f"Bearer {token}"},
                                stream,
                                calls // 3,
                                concurrency,
                            )
                        d50, g50 = statistics.median(direct), statistics.median(through)
                        print(
                            f"{name:34} {concurrency:>7} {d50:>8.2f} / {percentile(direct, 0.95):<7.2f} "
                            f"{g50:>9.2f} / {percentile(through, 0.95):<7.2f} {g50 - d50:>12.2f} "
                            f"{g50 / d50:>9.2f}"
                        )
            usage = await gateway.revoke(token)
            print(f"metered: {usage.calls} calls, {usage.input_tokens} in / {usage.output_tokens} out tokens")


PRICE_IN, PRICE_OUT = 1e-6, 4e-6
EVALUATION_LIMIT_USD, PARTITION_USD, EVALUATIONS = 0.2, 0.5, 4


def _attacks(marker: str) -> list[tuple[str, str, dict]]:
    """(attack, path, body) of one evaluation; `marker` tells its calls apart at the provider."""
    text = [{"role": "user", "content": marker}]
    chat = {"model": "greedy", "messages": text}
    held = {"model": "greedy", "input": marker, "max_output_tokens": 100}
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    return [
        *[("n=8, concurrent", "/openai/v1/chat/completions", {**chat, "n": 8, "max_tokens": 1000})] * 10,
        (
            "20 MiB prompt",
            "/openai/v1/chat/completions",
            {**chat, "messages": [{"role": "user", "content": marker + "x" * (20 << 20)}], "max_tokens": 10},
        ),
        ("max_tokens 1e9", "/openai/v1/chat/completions", {**chat, "max_tokens": 10**9}),
        ("no output limit", "/openai/v1/chat/completions", chat),
        ("previous_response_id", "/openai/v1/responses", {**held, "previous_response_id": "resp_1"}),
        (
            "file id",
            "/openai/v1/responses",
            {
                **held,
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": marker},
                            {"type": "input_file", "file_id": "file_1"},
                        ],
                    }
                ],
            },
        ),
        (
            "remote image",
            "/openai/v1/chat/completions",
            {**chat, "messages": [{"role": "user", "content": [{"type": "text", "text": marker}, image]}]},
        ),
        *[("endless stream", "/openai/v1/chat/completions", {**chat, "stream": True, "max_tokens": 4096})] * 4,
        *[
            (
                "endless stream, anthropic",
                "/anthropic/v1/messages",
                {**chat, "model": "claude-greedy", "stream": True, "max_tokens": 4096},
            )
        ]
        * 2,
    ]


async def _drain(client: httpx.AsyncClient, headers: dict, marker: str) -> list[int]:
    """Plain calls until one is refused: what is left of the budgets gets spent."""
    codes: list[int] = []
    while not codes or codes[-1] == 200:
        body = {"model": "greedy", "messages": [{"role": "user", "content": marker}], "max_tokens": 2048}
        codes.append((await client.post("/openai/v1/chat/completions", json=body, headers=headers)).status_code)
    return codes


async def adversarial() -> None:
    """The money benchmark (module docstring)."""
    with FakeUpstream() as fake:
        priced = {"input_cost_per_token": PRICE_IN, "output_cost_per_token": PRICE_OUT, "max_output_tokens": 16384}
        spec = InferenceSpec.model_validate(
            {
                "providers": {
                    "oai": {"api": "openai", "base_url": f"{fake.url}/v1", "api_key_secret": "K"},
                    "ant": {"api": "anthropic", "base_url": fake.url, "api_key_secret": "K"},
                },
                "models": {
                    "greedy": {"provider": "oai", "upstream_model": "fake-greedy", **priced},
                    "claude-greedy": {"provider": "ant", "upstream_model": "fake-greedy", **priced},
                },
                "timeout_sec": 10.0,
                "stream_idle_timeout_sec": 5.0,
            }
        )
        gateway = InferenceGateway(spec, {"K": KEY})
        # What the sidecar's ledger does at admission: each evaluation reserves the smaller of its
        # limit and what is left of the partition's inference money, and spends only that.
        left = [round(PARTITION_USD * 1e6)]
        outcomes: dict[str, dict[int, int]] = {}
        async with GatewayServer(gateway):
            limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
            async with httpx.AsyncClient(base_url=gateway.base_url, timeout=120, limits=limits) as client:

                async def evaluation(i: int) -> None:
                    reserved = min(round(EVALUATION_LIMIT_USD * 1e6), left[0])
                    left[0] -= reserved
                    token, _ = gateway.grant(f"ev-{i}", "train", limit_micro_usd=reserved)
                    gateway.bind_host(token, os.getuid())  # this process is the candidate host
                    headers = {"authorization": f"Bearer {token}", "x-api-key": token}
                    marker = f"evaluation-{i}-marker"
                    answers = await asyncio.gather(
                        *(client.post(path, json=body, headers=headers) for _, path, body in _attacks(marker))
                    )
                    for (attack, _, _), answer in zip(_attacks(marker), answers, strict=True):
                        codes = outcomes.setdefault(attack, {})
                        codes[answer.status_code] = codes.get(answer.status_code, 0) + 1
                    for code in await _drain(client, headers, marker):
                        codes = outcomes.setdefault("plain calls until refused", {})
                        codes[code] = codes.get(code, 0) + 1
                    left[0] += reserved - (await gateway.revoke(token)).charged_micro_usd  # settled

                await asyncio.gather(*(evaluation(i) for i in range(EVALUATIONS)))
        billed = dict.fromkeys(range(EVALUATIONS), 0.0)
        for request in fake.requests:
            raw = json.dumps(request["body"]).encode()
            tokens_in, tokens_out = (
                request.get("billed", {}).get("input", 0),
                request.get("billed", {}).get("output", 0),
            )
            owner = next(i for i in range(EVALUATIONS) if f"evaluation-{i}-marker".encode() in raw)
            billed[owner] += tokens_in * PRICE_IN + tokens_out * PRICE_OUT
    print(f"{EVALUATIONS} evaluations, {EVALUATION_LIMIT_USD} USD each, {PARTITION_USD} USD partition budget")
    print(f"{'attack':28} answers (status: calls)")
    for attack, codes in outcomes.items():
        print(f"{attack:28} " + ", ".join(f"{code}: {n}" for code, n in sorted(codes.items())))
    print("billed per evaluation (USD): " + ", ".join(f"{v:.4f}" for v in billed.values()))
    e = max(billed.values()) / EVALUATION_LIMIT_USD
    p = sum(billed.values()) / PARTITION_USD
    print(f"billed/limit: {e:.3f} (evaluation), {p:.3f} (partition)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="timed calls per case and side (default 300)")
    parser.add_argument("--adversarial", action="store_true", help="measure what attacks are billed, not latency")
    arguments = parser.parse_args()
    asyncio.run(adversarial() if arguments.adversarial else main(arguments.calls))
