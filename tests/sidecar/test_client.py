"""The agent-side client against the real sidecar app under uvicorn on loopback (stub backend, real
git repos, real state dirs): wire shapes, errors back to `vero.errors`, and the retry policy."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from vero.errors import (
    BudgetExhausted,
    CandidateRejected,
    Conflict,
    InfrastructureFailure,
    PolicyDenied,
    RequestInvalid,
    SidecarUnavailable,
    StorageFull,
    UnknownJob,
    VeroError,
)
from vero.sidecar.client import DEFAULT_SIDECAR_URL, SIDECAR_URL_ENV, SidecarClient, error_from_response
from vero.sidecar.models import JobView

from ._client_support import CountingApp, bound_port, serve_later
from ._server import ServerThread, SidecarHarness, StubBackend, commit_file, make_harness

FAST_RETRIES = dict(retry_attempts=4, retry_initial_sec=0.05, retry_max_sec=0.2)


@contextmanager
def running(harness: SidecarHarness) -> Iterator[tuple[str, CountingApp]]:
    app = CountingApp(harness.create_app())
    with ServerThread(app) as server:
        yield server.url, app


@pytest.fixture
def harness(tmp_path: Path) -> SidecarHarness:
    return make_harness(tmp_path, drain_timeout_sec=0.2)


@pytest.mark.timeout(60)
def test_round_trip_health_status_evaluate_wait_submit(harness: SidecarHarness) -> None:
    version = commit_file(harness.agent_repo, "solve.py", "print('faster')\n", "faster")
    harness.backend.scores = {"t1": 1.0, "t2": 0.0}
    with running(harness) as (url, app), SidecarClient(url) as client:
        assert client.health().status == "ok"
        status = client.status()
        assert {p.name for p in status.partitions} == {"train", "val", "blind"}
        train = next(p for p in status.partitions if p.name == "train")
        assert train.budget is not None and train.budget.remaining_runs == 5

        admitted = client.evaluate("train", version=version, cases=["t1", "t2"])
        assert admitted.candidate == version and admitted.n_cases == 2
        assert admitted.state in ("queued", "running", "complete")

        seen: list[JobView] = []
        done = client.wait(admitted.id, poll_interval_sec=0.05, timeout_sec=30, on_update=seen.append)
        assert done.state == "complete" and seen[-1] == done
        assert done.result is not None and done.result.disclosure == "full"
        assert done.result.score == pytest.approx(0.5)
        assert {c.case: c.score for c in done.result.cases or []} == {"t1": 1.0, "t2": 0.0}

        submission = client.submit(version)
        assert submission.candidate == version
        again = client.submit(version)  # the same candidate: recorded once, answered 200
        assert again.candidate == version

        status = client.status()
        assert [job.id for job in status.jobs] == [admitted.id]
        assert status.submission is not None and status.submission.candidate == version
        train = next(p for p in status.partitions if p.name == "train")
        assert train.budget is not None and (train.budget.remaining_runs, train.budget.remaining_cases) == (4, 28)
    assert app.arrived("POST", "/evaluations") == 1


@pytest.mark.timeout(60)
def test_problem_bodies_become_vero_errors_and_4xx_are_sent_once(harness: SidecarHarness) -> None:
    with running(harness) as (url, app), SidecarClient(url, **FAST_RETRIES) as client:
        with pytest.raises(PolicyDenied):
            client.evaluate("no-such-partition")
        with pytest.raises(PolicyDenied):
            client.evaluate("val", cases=["v1"])  # not a union of the aggregate partition's blocks
        with pytest.raises(CandidateRejected):
            client.evaluate("train", version="no-such-branch")
        with pytest.raises(UnknownJob):
            client.job("ev-0123456789abcdef")
        with pytest.raises(RequestInvalid):
            client.job("ev-" + "0" * 100)  # the server's path schema caps ids at 64 characters

        # `blind` allows 2 runs: the third is refused with 402 and the figures are not on the wire.
        for _ in range(2):
            client.evaluate("blind")
        with pytest.raises(BudgetExhausted) as exhausted:
            client.evaluate("blind")
        assert exhausted.value.requested is None and exhausted.value.remaining is None
        assert "exhausted" in str(exhausted.value)

    assert app.arrived("POST", "/evaluations") == 6  # 3 refused + 2 admitted + 1 over budget, none re-sent
    assert app.arrived_prefix("GET", "/evaluations/") == 2
    assert sorted(a.status for a in app.answers if a.method == "POST") == [202, 202, 400, 402, 403, 403]


@pytest.mark.timeout(60)
def test_submit_conflicts_when_submissions_are_disabled(tmp_path: Path) -> None:
    harness = make_harness(tmp_path, submit_enabled=False)
    with running(harness) as (url, app), SidecarClient(url, **FAST_RETRIES) as client:
        with pytest.raises(Conflict):
            client.submit()
    assert app.arrived("POST", "/submissions") == 1


@pytest.mark.timeout(60)
def test_infrastructure_failure_is_raised_not_retried(tmp_path: Path) -> None:
    harness = make_harness(tmp_path, backend=StubBackend(fail_with_infrastructure=True))
    with running(harness) as (url, app), SidecarClient(url, **FAST_RETRIES) as client:
        job = client.evaluate("train")
        with pytest.raises(InfrastructureFailure) as failure:
            client.wait(job.id, poll_interval_sec=0.05, timeout_sec=30)
        assert "docker" not in str(failure.value)  # the backend's text never reaches the agent
        polls = app.arrived("GET", f"/evaluations/{job.id}")
        with pytest.raises(InfrastructureFailure):
            client.job(job.id)
        # A 502 with the sidecar's `infrastructure` problem is final: one request per call.
        assert app.arrived("GET", f"/evaluations/{job.id}") == polls + 1
        train = next(p for p in client.status().partitions if p.name == "train")
        assert train.budget is not None and train.budget.remaining_runs == 5  # refunded


@pytest.mark.timeout(60)
def test_reads_retry_5xx_but_evaluations_are_never_resent_after_reaching_the_server(harness: SidecarHarness) -> None:
    with running(harness) as (url, app), SidecarClient(url, **FAST_RETRIES) as client:
        app.faults[("GET", "/status")] = [503, 502]  # a 502 that is not the sidecar's own problem
        assert client.status().name == "demo"
        assert app.arrived("GET", "/status") == 3

        app.faults[("GET", "/status")] = [500] * 4  # exactly retry_attempts
        with pytest.raises(SidecarUnavailable, match="HTTP 500"):
            client.status()
        assert app.arrived("GET", "/status") == 3 + 4  # retry_attempts

        app.faults[("POST", "/submissions")] = [503]
        assert client.submit().version == "HEAD"
        assert app.arrived("POST", "/submissions") == 2

        app.faults[("POST", "/evaluations")] = [503]
        with pytest.raises(SidecarUnavailable, match="HTTP 503"):
            client.evaluate("train")
        assert app.arrived("POST", "/evaluations") == 1
        assert client.status().jobs == []


@pytest.mark.timeout(60)
def test_a_lost_answer_to_an_evaluation_is_not_resent(harness: SidecarHarness) -> None:
    with running(harness) as (url, app):
        app.answer_delays_sec[("POST", "/evaluations")] = 2.0
        with SidecarClient(url, timeout_sec=0.5, **FAST_RETRIES) as client:
            with pytest.raises(SidecarUnavailable, match="may have been received") as lost:
                client.evaluate("train")
            assert "ReadTimeout" in str(lost.value)
            deadline = time.monotonic() + 10
            while len(app.answers) == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            app.answer_delays_sec.clear()
            assert app.arrived("POST", "/evaluations") == 1
            assert len(client.status().jobs) == 1  # the sidecar admitted it once


@pytest.mark.timeout(60)
def test_connection_errors_are_retried_until_the_sidecar_listens(harness: SidecarHarness) -> None:
    version = commit_file(harness.agent_repo, "solve.py", "print('v2')\n")
    app = CountingApp(harness.create_app())
    with serve_later(app, delay_sec=1.5) as (url, _server):
        with SidecarClient(url, retry_attempts=12, retry_initial_sec=0.1, retry_max_sec=0.5) as client:
            started = time.monotonic()
            # Even the non-idempotent POST is retried: a refused connection proves it was never sent.
            job = client.evaluate("train", version=version)
            assert time.monotonic() - started >= 1.0
            assert job.candidate == version
            assert app.arrived("POST", "/evaluations") == 1
            assert [j.id for j in client.status().jobs] == [job.id]


@pytest.mark.timeout(60)
def test_unreachable_sidecar_raises_sidecar_unavailable() -> None:
    with bound_port() as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with SidecarClient(url, **FAST_RETRIES) as client:
            with pytest.raises(SidecarUnavailable, match="cannot reach the sidecar at " + url) as error:
                client.status()
    assert "ConnectError" in str(error.value) and SIDECAR_URL_ENV in str(error.value)


@pytest.mark.timeout(60)
def test_wait_returns_the_running_job_when_its_timeout_elapses(tmp_path: Path) -> None:
    release = threading.Event()
    harness = make_harness(tmp_path, backend=StubBackend(block=release), drain_timeout_sec=0.2)
    with running(harness) as (url, _app), SidecarClient(url) as client:
        job = client.evaluate("train")
        updates: list[JobView] = []
        started = time.monotonic()
        view = client.wait(job.id, poll_interval_sec=0.05, timeout_sec=0.5, on_update=updates.append)
        assert 0.4 <= time.monotonic() - started < 5
        assert view.state in ("queued", "running") and len(updates) >= 2
        release.set()
        assert client.wait(job.id, poll_interval_sec=0.05, timeout_sec=30).state == "complete"


def test_base_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SIDECAR_URL_ENV, raising=False)
    assert SidecarClient().base_url == DEFAULT_SIDECAR_URL
    monkeypatch.setenv(SIDECAR_URL_ENV, "http://127.0.0.1:9999/")
    assert SidecarClient().base_url == "http://127.0.0.1:9999"
    assert SidecarClient("http://other:1").base_url == "http://other:1"
    monkeypatch.setenv(SIDECAR_URL_ENV, "eval-sidecar:8000")
    with pytest.raises(SidecarUnavailable, match=SIDECAR_URL_ENV):
        SidecarClient()


def test_requests_are_checked_before_sending() -> None:
    with SidecarClient("http://127.0.0.1:9", retry_attempts=1) as client:
        with pytest.raises(RequestInvalid, match="partition"):
            client.evaluate("")
        with pytest.raises(RequestInvalid, match="version"):
            client.submit("")


def test_answers_that_are_not_problem_bodies_are_never_echoed() -> None:
    request = httpx.Request("GET", "http://sidecar/evaluations/x")
    html = httpx.Response(404, text="<html>secret-path /var/lib/vero</html>", request=request)
    error = error_from_response(html)
    assert type(error) is UnknownJob and "secret" not in str(error) and "HTTP 404" in str(error)
    error = error_from_response(httpx.Response(503, text="upstream secret", request=request))
    assert type(error) is SidecarUnavailable and "secret" not in str(error)
    error = error_from_response(httpx.Response(418, request=request))
    assert type(error) is VeroError
    problem = {
        "title": "Payment Required",
        "status": 402,
        "code": "payment_required",
        "detail": "the budget of this partition is exhausted",
    }
    error = error_from_response(httpx.Response(402, json=problem, request=request))
    assert isinstance(error, BudgetExhausted) and str(error) == problem["detail"]
    assert error.partition is None


def test_an_operators_context_names_the_status_once() -> None:
    request = httpx.Request("POST", "http://sidecar/admin/seal")
    problem = {"title": "Insufficient Storage", "status": 507, "code": "storage_full", "detail": "the disk is full"}
    error = error_from_response(
        httpx.Response(507, json=problem, request=request), context="the sidecar refused to seal"
    )
    assert type(error) is StorageFull
    assert str(error) == "the sidecar refused to seal (HTTP 507): the disk is full"
    error = error_from_response(httpx.Response(503, json={**problem, "status": 503}, request=request), context="seal")
    assert type(error) is SidecarUnavailable and str(error) == "seal (HTTP 503): the disk is full"
    error = error_from_response(httpx.Response(401, json={**problem, "status": 401}, request=request), context="seal")
    assert str(error) == "seal (HTTP 401): the disk is full"
    error = error_from_response(httpx.Response(500, text="<html>secret</html>", request=request), context="seal")
    assert type(error) is SidecarUnavailable and str(error) == "seal (HTTP 500)"


def test_importing_the_client_loads_neither_fastapi_nor_harbor() -> None:
    code = "import sys, json, vero.sidecar.client; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    loaded = set(
        json.loads(
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60).stdout
        )
    )
    assert "httpx" in loaded  # the probe sees real imports
    assert not loaded & {"fastapi", "starlette", "uvicorn", "harbor", "git", "docker"}
