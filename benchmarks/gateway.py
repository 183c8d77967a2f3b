"""Added latency of the inference gateway per call, against calling the fake provider directly.

Starts the fake OpenAI/Anthropic-compatible provider of the tests (`tests/inference/fake_upstream.py`)
and a real gateway (`vero.inference.gateway.GatewayServer`) on loopback, then times the same
calls both ways in alternating rounds: chat completions (plain and streaming) and Anthropic
messages, sequentially and with 16 concurrent clients. Prints medians, p95 and the ratio
gateway / direct from one run. No network beyond 127.0.0.1.

    uv run python benchmarks/gateway.py [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from inference.fake_upstream import FakeUpstream

from vero.inference.gateway import BudgetPool, GatewayServer, InferenceGateway
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
            token, _ = gateway.grant("bench", "train", partition_pool=BudgetPool(10**12), evaluation_limit_usd=None)
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
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="timed calls per case and side (default 300)")
    asyncio.run(main(parser.parse_args().calls))
