"""One evaluation's lease (`vero.core.run.EvaluationLease`) with the real gateway on loopback and
the fake provider (`fake_upstream.py`): what the sidecar's job runner, the verifier's scoring and
`check` all enter.

A lease gives its run the gateway's variables and keeps the run's own environment; leaving it
revokes the token (the next call is refused) and keeps the usage, also when the block is cancelled;
a case route that cannot open revokes the token and raises; `settle` turns an unreachable provider
into an infrastructure failure; the providers' keys never reach a nested run.
"""

from __future__ import annotations

import asyncio
import os
import socket
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from vero.core.diagnostics import RunDiagnostics
from vero.core.evaluation import EvaluationResult
from vero.core.run import EvaluationRuntime, NestedRun, nested_secret_env, provider_key_names
from vero.errors import InfrastructureFailure
from vero.harbor.case_route import CaseRouter
from vero.inference.gateway import GatewayServer, InferenceGateway
from vero.spec.models import CandidateRuntime, HarborSpec, ScoringSpec

from .fake_upstream import FakeUpstream
from .test_gateway import KEY_ANTHROPIC, KEY_OPENAI, chat, spec_for

pytestmark = pytest.mark.timeout(120)


def nested_run(evaluation_id: str = "ev-lease") -> NestedRun:
    return NestedRun(
        evaluation_id=evaluation_id,
        partition="train",
        candidate="0" * 40,
        candidate_dir=Path("/nonexistent/candidate"),
        cases_dir=Path("/nonexistent/cases"),
        case_names=("a",),
        jobs_dir=Path("/nonexistent/jobs"),
        runtime=CandidateRuntime(kind="program", install_path="/opt/cand"),
        harbor=HarborSpec(),
        scoring=ScoringSpec(),
        env={"DOCKER_HOST": "unix:///run/docker.sock"},
    )


def result_of(run: NestedRun) -> EvaluationResult:
    now = datetime.now(UTC)
    return EvaluationResult(
        partition=run.partition,
        candidate=run.candidate,
        reward_key="reward",
        cases=[],
        score=1.0,
        started_at=now,
        finished_at=now,
    )


async def call(gateway: InferenceGateway, token: str) -> int:
    async with httpx.AsyncClient(base_url=gateway.base_url or "", timeout=30) as client:
        answer = await client.post(
            "/openai/v1/chat/completions", json=chat("fake-ok"), headers={"authorization": f"Bearer {token}"}
        )
    return answer.status_code


async def served(url: str, body):
    gateway = InferenceGateway(spec_for(url), {"OPENAI_KEY": KEY_OPENAI, "ANTHROPIC_KEY": KEY_ANTHROPIC})
    async with GatewayServer(gateway):
        return await body(gateway)


def test_a_lease_gives_the_run_its_token_and_revokes_it_on_leaving():
    with FakeUpstream() as upstream:

        async def body(gateway):
            lease = EvaluationRuntime(gateway, evaluation_limit_usd=1.0).lease(nested_run())
            async with lease as run:
                token = run.candidate_env["VERO_INFERENCE_TOKEN"]
                gateway.bind_host(token, os.getuid())  # the candidate host is this test's process
                during = await call(gateway, token)
            after = await call(gateway, token)
            return run, lease, during, after

        run, lease, during, after = asyncio.run(served(upstream.url, body))
    assert during == 200 and after == 401
    assert run.env == {"DOCKER_HOST": "unix:///run/docker.sock"}  # no route: the run's own environment
    assert run.candidate_env["OPENAI_BASE_URL"].endswith("/openai/v1") and run.case_network is None
    assert lease.usage is not None and lease.usage.charged_micro_usd > 0
    settled = lease.settle(result_of(run))
    assert settled.inference == lease.usage and settled.score == 1.0


def test_a_cancelled_lease_still_revokes_its_token_and_keeps_the_usage():
    with FakeUpstream() as upstream:

        async def body(gateway):
            lease = EvaluationRuntime(gateway).lease(nested_run())
            started = asyncio.Event()
            tokens: list[str] = []

            async def evaluation() -> None:
                async with lease as run:
                    tokens.append(run.candidate_env["VERO_INFERENCE_TOKEN"])
                    gateway.bind_host(tokens[0], os.getuid())
                    assert await call(gateway, tokens[0]) == 200
                    started.set()
                    await asyncio.sleep(3600)

            task = asyncio.create_task(evaluation())
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return lease, await call(gateway, tokens[0])

        lease, after = asyncio.run(served(upstream.url, body))
    assert after == 401
    assert lease.usage is not None and lease.usage.calls == 1


def test_a_route_that_cannot_open_revokes_the_token_and_raises():
    with FakeUpstream() as upstream:

        async def body(gateway):
            # A real router whose engine does not exist: opening its network fails.
            router = CaseRouter(gateway, {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}, "ses-lease-test")
            lease = EvaluationRuntime(gateway, router).lease(nested_run())
            with pytest.raises(InfrastructureFailure):
                async with lease:
                    raise AssertionError("entered without its route")
            return lease

        lease = asyncio.run(served(upstream.url, body))
    assert lease.usage is not None and lease.usage.calls == 0  # revoked: its usage was read


def test_settle_makes_an_unreachable_provider_an_infrastructure_failure():
    closed = socket.socket()  # bound, never listening: connections are refused
    closed.bind(("127.0.0.1", 0))
    try:

        async def body(gateway):
            lease = EvaluationRuntime(gateway).lease(nested_run())
            async with lease as run:
                token = run.candidate_env["VERO_INFERENCE_TOKEN"]
                gateway.bind_host(token, os.getuid())
                assert await call(gateway, token) == 502
            return lease, run

        lease, run = asyncio.run(served(f"http://127.0.0.1:{closed.getsockname()[1]}", body))
    finally:
        closed.close()
    with pytest.raises(InfrastructureFailure) as raised:
        lease.settle(result_of(run))
    assert isinstance(raised.value.diagnostics, RunDiagnostics)
    assert "could not reach the provider" in str(raised.value)


def test_without_a_gateway_a_lease_leaves_the_run_as_it_is():
    async def body():
        lease = EvaluationRuntime().lease(nested_run())
        async with lease as run:
            pass
        return lease, run

    lease, run = asyncio.run(body())
    assert run == nested_run() and lease.usage is None
    result = result_of(run)
    assert lease.settle(result) is result


def test_the_providers_keys_never_reach_a_nested_run():
    inference = spec_for("http://127.0.0.1:1")
    assert provider_key_names(inference) == {"OPENAI_KEY", "ANTHROPIC_KEY"}
    environ = {"OPENAI_KEY": KEY_OPENAI, "GRADER_TOKEN": "g", "OTHER": "o"}
    names = ["OPENAI_KEY", "ANTHROPIC_KEY", "GRADER_TOKEN", "UNSET"]
    assert nested_secret_env(names, environ, inference) == {"GRADER_TOKEN": "g"}
    assert nested_secret_env(names, environ, None) == {"OPENAI_KEY": KEY_OPENAI, "GRADER_TOKEN": "g"}
