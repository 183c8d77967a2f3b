"""The library client of the evaluation sidecar's agent surface (for programs and tests; the `vero harbor
status|eval|result|submit|evaluations` commands use the standard-library twin in `vero.agent_cli`,
which keeps the same retry rules and error table).

Speaks the wire shapes of `vero.sidecar.models` over httpx and turns every failure back into the
`vero.errors` class the server raised, so callers decide by type:

| answer | raised |
|---|---|
| transport error (refused, DNS, timeout), after retries | `SidecarUnavailable` |
| 400 | `CandidateRejected` |
| 402 | `BudgetExhausted` (built with `BudgetExhausted.from_message`: figures are None) |
| 403 | `PolicyDenied` |
| 404 | `UnknownJob` |
| 409 | `Conflict` |
| 413, 422 | `RequestInvalid` (body too large, schema) |
| 502 | `InfrastructureFailure` (also how `GET /evaluations/{id}` reports a job failed for infrastructure reasons) |
| 502 with a case problem code (`vero.errors.CASE_PROBLEM_CODES`) | `CaseMisconfigured` with that `code` and `cases` |
| 507 (the sidecar's disk is full; nothing was recorded), after retries where retried | `StorageFull` |
| other 5xx, after retries | `SidecarUnavailable` |
| any other status, or a 2xx body that is not the expected shape | `VeroError` |

Retries (tenacity, exponential back-off with jitter): reads (`GET`) are retried on every transport
error and on 5xx answers, except a 502 whose problem code is `infrastructure` or a case problem
code (a definite outcome, not a passing fault); so is `POST /submissions`, which the sidecar makes
idempotent (the last submission wins; the same candidate again answers 200 and changes nothing).
`POST /evaluations` is retried **only when the request surely never reached the server** (connect
errors, connect and pool timeouts): once the request may have been received, the sidecar may have
admitted a job and reserved budget for it, so it is never re-sent blindly. 4xx answers are never
retried.

Importing this module loads httpx, tenacity and pydantic, never FastAPI or Harbor.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, Self
from urllib.parse import quote, urlencode

import httpx
from pydantic import BaseModel, ValidationError
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from vero.core.job_states import TERMINAL_JOB_STATES
from vero.errors import CASE_PROBLEM_CODES, RequestInvalid, SidecarUnavailable, VeroError, error_for_status
from vero.sidecar.models import (
    EvaluationPage,
    EvaluationRequest,
    HealthResponse,
    JobView,
    Problem,
    StatusResponse,
    SubmissionRequest,
    SubmissionView,
)

__all__ = [
    "DEFAULT_SIDECAR_URL",
    "JOB_TERMINAL_STATES",
    "SIDECAR_URL_ENV",
    "SidecarClient",
    "error_from_response",
]

SIDECAR_URL_ENV = "VERO_SIDECAR_URL"
"""Environment variable holding the sidecar's base URL."""

DEFAULT_SIDECAR_URL = "http://eval-sidecar:8000"
"""The `eval-sidecar` Compose service as `main` reaches it."""

JOB_TERMINAL_STATES: frozenset[str] = frozenset(TERMINAL_JOB_STATES)
"""Job states after which a job never changes again."""

MAX_WAIT_SEC = 60.0
"""Longest long poll the sidecar accepts (`GET /evaluations/{id}?wait_sec=`)."""

LONG_POLL_SEC = 20.0
"""How long `wait` lets each poll be held; well under the HTTP read timeout."""

_logger = logging.getLogger(__name__)

# Errors after which the request surely never reached the server: no TCP connection was made
# (refused, DNS, unreachable, connect timeout) or none was taken from the pool.
_NOT_SENT_ERRORS: tuple[type[httpx.TransportError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
)
# Transport errors that are the caller's mistake; retrying cannot help.
_PERMANENT_TRANSPORT_ERRORS: tuple[type[httpx.TransportError], ...] = (
    httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,
)


class _TransientStatus(Exception):
    """A 5xx answer worth another try (internal: carries the response through tenacity)."""

    def __init__(self, response: httpx.Response):
        super().__init__(response.status_code)
        self.response = response


_FINAL_502_CODES = frozenset({"infrastructure", *CASE_PROBLEM_CODES})
"""A sidecar 502 with one of these codes is a definite answer, never retried."""


def _problem_of(response: httpx.Response) -> Problem | None:
    try:
        return Problem.model_validate_json(response.content)
    except ValidationError:
        return None


def _is_transient(response: httpx.Response) -> bool:
    if response.status_code < 500:
        return False
    if response.status_code == 502:
        problem = _problem_of(response)
        # The sidecar's own 502 says the evaluation failed for infrastructure reasons: final.
        # A 502 without a vero problem body comes from something in between and may pass.
        return problem is None or problem.code not in _FINAL_502_CODES
    return True


def error_from_response(response: httpx.Response, context: str | None = None) -> VeroError:
    """The `vero.errors` instance for a non-2xx sidecar answer (see the module table).

    The message is the problem body's `detail` (or `title`); the server keeps both generic. A body
    that is not a problem is never echoed: only the status code is named.

    Args:
        response: a response with a status code of 300 or more.
        context: put before the message with the status code (`"<context> (HTTP 401): <detail>"`),
            for an operator's command such as `vero harbor seal`.

    Returns:
        The error to raise; `SidecarUnavailable` for a 5xx other than 502, `VeroError` for a status
        with no vero meaning.
    """
    problem = _problem_of(response)
    detail = None if problem is None else (problem.detail or problem.title)
    if problem is None:
        return error_for_status(response.status_code, detail, context=context)
    return error_for_status(response.status_code, detail, problem.code, problem.cases, context=context)


class SidecarClient:
    """Blocking client of the sidecar's agent surface.

    Use as a context manager (or call `close`). One instance may be reused for many calls; it keeps
    one connection pool.

    Args:
        base_url: the sidecar's base URL; default `$VERO_SIDECAR_URL`, else `DEFAULT_SIDECAR_URL`.
        timeout_sec: read/write timeout of one HTTP request, in seconds. Admission imports a commit
            into the candidate store before answering, so keep it well above a git fetch.
        connect_timeout_sec: TCP connect timeout of one attempt, in seconds.
        retry_attempts: attempts per call (1 disables retrying), at least 1.
        retry_initial_sec: first back-off delay, in seconds; doubles per attempt, with jitter.
        retry_max_sec: cap on one back-off delay, in seconds.
        transport: an httpx transport to use instead of the network (e.g. `httpx.MockTransport`,
            or `httpx.WSGITransport`); retries apply to it too.

    Raises:
        SidecarUnavailable: `base_url` is not an absolute http(s) URL.
        ValueError: `retry_attempts` is below 1.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        timeout_sec: float = 60.0,
        connect_timeout_sec: float = 5.0,
        retry_attempts: int = 6,
        retry_initial_sec: float = 0.25,
        retry_max_sec: float = 4.0,
        transport: httpx.BaseTransport | None = None,
    ):
        if retry_attempts < 1:
            raise ValueError("retry_attempts must be at least 1")
        url = base_url if base_url is not None else os.environ.get(SIDECAR_URL_ENV) or DEFAULT_SIDECAR_URL
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL:
            parsed = None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
            raise SidecarUnavailable(
                f"the sidecar URL {url!r} is not an absolute http(s) URL like {DEFAULT_SIDECAR_URL} "
                f"(check --url or {SIDECAR_URL_ENV})"
            )
        self.base_url: str = str(parsed).rstrip("/")
        self.retry_attempts = retry_attempts
        self._retry_initial_sec = retry_initial_sec
        self._retry_max_sec = retry_max_sec
        from vero import __version__

        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout_sec, connect=connect_timeout_sec),
            headers={"accept": "application/json", "user-agent": f"vero/{__version__}"},
            transport=transport,
            # The sidecar is always reached directly on the task's network: an HTTP(S)_PROXY
            # inherited from the environment would send `eval-sidecar` to a proxy that cannot
            # resolve it.
            trust_env=False,
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    # -- the agent surface ---------------------------------------------------------------------

    def health(self) -> HealthResponse:
        """`GET /health`.

        Raises:
            SidecarUnavailable: not reachable after the retries, or answering 5xx.
        """
        return self._call("GET", "/health", HealthResponse)

    def status(self) -> StatusResponse:
        """`GET /status`: the partitions the agent may evaluate, budgets (unless hidden), its jobs.

        Raises:
            SidecarUnavailable: not reachable after the retries, or answering 5xx.
        """
        return self._call("GET", "/status", StatusResponse)

    def evaluate(
        self, partition: str, version: str = "HEAD", cases: list[str] | None = None, blocks: list[int] | None = None
    ) -> JobView:
        """`POST /evaluations`: start a detached evaluation job; returns once it is admitted.

        On return the version has been captured as a candidate and the budget reserved; the job
        runs on. Retried only after errors that prove the request never reached the server
        (connect errors and connect/pool timeouts); after a read timeout or a 5xx the sidecar may
        have admitted the job, so it is not re-sent: check `status()` before asking again.

        Args:
            partition: an agent-accessible partition.
            version: a commit-ish in the agent's repository (`HEAD`, a branch, a commit id).
            cases: a subset of the partition's case names; None for all of them. On an `aggregate`
                partition it must be a union of whole blocks.
            blocks: instead of `cases`, positions of an `aggregate` partition's blocks (as in
                `PartitionStatus.blocks`).

        Raises:
            RequestInvalid: the request is malformed (checked locally first, then HTTP 422).
            PolicyDenied: the policy refuses it (unknown partition, a selection that is not a union of
                whole blocks of an `aggregate` partition, closed).
            BudgetExhausted: the partition's runs or cases are used up (HTTP 402).
            CandidateRejected: the version cannot be imported (HTTP 400).
            SidecarUnavailable: not reachable, or the answer was lost (the job may exist).
        """
        request = self._request_model(
            EvaluationRequest, partition=partition, version=version, cases=cases, blocks=blocks
        )
        return self._call("POST", "/evaluations", JobView, json=request, idempotent=False)

    def job(self, job_id: str, wait_sec: float = 0.0) -> JobView:
        """`GET /evaluations/{id}`: the job's state and, when done, the disclosed result.

        Args:
            job_id: the job's id.
            wait_sec: long poll: let the sidecar hold the answer up to this many seconds (<= 60)
                until the job finishes.

        Raises:
            UnknownJob: no job with that id (HTTP 404).
            RequestInvalid: the id is longer than the sidecar accepts (HTTP 422).
            InfrastructureFailure: the job failed for infrastructure reasons (HTTP 502; its budget
                was refunded).
            SidecarUnavailable: not reachable after the retries, or answering 5xx.
        """
        path = f"/evaluations/{quote(job_id, safe='')}"
        if wait_sec > 0:
            path += f"?wait_sec={min(wait_sec, MAX_WAIT_SEC):g}"
        return self._call("GET", path, JobView)

    def evaluations(
        self, *, limit: int = 20, before: str | None = None, partition: str | None = None, state: str | None = None
    ) -> EvaluationPage:
        """`GET /evaluations`: one page of the agent's evaluations, newest first (no per-case results).

        Args:
            limit: jobs per page, 1..100.
            before: the previous page's `next_cursor`; None starts at the newest.
            partition, state: optional filters.

        Raises:
            UnknownJob: `before` is not one of the agent's jobs (HTTP 404).
            RequestInvalid: a parameter is out of range (HTTP 422).
            SidecarUnavailable: not reachable after the retries, or answering 5xx.
        """
        query = {"limit": limit, "before": before, "partition": partition, "state": state}
        path = "/evaluations?" + urlencode({k: v for k, v in query.items() if v is not None})
        return self._call("GET", path, EvaluationPage)

    def wait(
        self,
        job_id: str,
        poll_interval_sec: float = 2.0,
        timeout_sec: float | None = None,
        on_update: Callable[[JobView], None] | None = None,
    ) -> JobView:
        """Poll `job(job_id)` until the job reaches a terminal state or `timeout_sec` elapses.

        Args:
            job_id: the job's id.
            poll_interval_sec: pause between two polls when a poll comes back early. Each poll is
                a long poll (the sidecar answers as soon as the job finishes, or after
                `LONG_POLL_SEC`), so completion is seen at once.
            timeout_sec: give up waiting after this many seconds (None: wait as long as it takes).
                Giving up leaves the job running on the sidecar.
            on_update: called with every polled view (including the last), e.g. to draw progress.

        Returns:
            The last view: its `state` is in `JOB_TERMINAL_STATES`, or still `queued`/`running`
            when `timeout_sec` elapsed first.

        Raises:
            Whatever `job` raises.
        """
        deadline = None if timeout_sec is None else time.monotonic() + timeout_sec
        wait_sec = 0.0
        while True:
            asked_at = time.monotonic()
            view = self.job(job_id, wait_sec=wait_sec)
            if on_update is not None:
                on_update(view)
            if view.state in JOB_TERMINAL_STATES:
                return view
            left_sec = None if deadline is None else deadline - time.monotonic()
            if left_sec is not None and left_sec <= 0:
                return view
            if wait_sec and time.monotonic() - asked_at < wait_sec / 2:
                # The long poll came back early (a sidecar that does not hold answers): pace it.
                time.sleep(min(poll_interval_sec, left_sec if left_sec is not None else poll_interval_sec))
            wait_sec = LONG_POLL_SEC if left_sec is None else max(min(LONG_POLL_SEC, left_sec), 0.0)

    def submit(self, version: str = "HEAD") -> SubmissionView:
        """`POST /submissions`: record `version` as the candidate the verifier scores.

        The last submission wins and re-submitting the same candidate changes nothing, so this is
        retried like a read (transport errors and 5xx).

        Raises:
            RequestInvalid: the version is malformed (locally, or HTTP 422).
            CandidateRejected: the version cannot be imported (HTTP 400).
            Conflict: submissions are disabled (`auto_best` selection) or the session is sealed.
            SidecarUnavailable: not reachable after the retries, or answering 5xx.
        """
        request = self._request_model(SubmissionRequest, version=version)
        return self._call("POST", "/submissions", SubmissionView, json=request, idempotent=True)

    # -- plumbing --------------------------------------------------------------------------------

    @staticmethod
    def _request_model[M: BaseModel](model: type[M], **fields: Any) -> dict[str, Any]:
        try:
            return model(**fields).model_dump(mode="json", exclude_none=True)
        except ValidationError as exc:
            where = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<request>'}: {e['msg']}" for e in exc.errors())
            raise RequestInvalid(f"invalid request: {where}") from None

    def _call[M: BaseModel](
        self,
        method: str,
        path: str,
        model: type[M],
        *,
        json: dict[str, Any] | None = None,
        idempotent: bool = True,
    ) -> M:
        response = self._send(method, path, json=json, idempotent=idempotent)
        try:
            return model.model_validate_json(response.content)
        except ValidationError:
            raise VeroError(
                f"the sidecar at {self.base_url} answered {method} {path} with an unexpected body "
                f"(HTTP {response.status_code}); client and sidecar versions may differ"
            ) from None

    def _send(self, method: str, path: str, *, json: dict[str, Any] | None, idempotent: bool) -> httpx.Response:
        def should_retry(exc: BaseException) -> bool:
            if isinstance(exc, _TransientStatus):
                return idempotent
            if isinstance(exc, _PERMANENT_TRANSPORT_ERRORS):
                return False
            if isinstance(exc, _NOT_SENT_ERRORS):
                return True
            return idempotent and isinstance(exc, httpx.TransportError)

        def log_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            reason = f"HTTP {exc.response.status_code}" if isinstance(exc, _TransientStatus) else type(exc).__name__
            delay_sec = state.next_action.sleep if state.next_action else 0.0
            _logger.warning(
                "sidecar %s %s: %s; retry %d/%d in %.1fs",
                method,
                path,
                reason,
                state.attempt_number,
                self.retry_attempts - 1,
                delay_sec,
            )

        def attempt() -> httpx.Response:
            response = self._http.request(method, path, json=json)
            if idempotent and _is_transient(response):
                raise _TransientStatus(response)
            return response

        retrying = Retrying(
            stop=stop_after_attempt(self.retry_attempts),
            wait=wait_exponential_jitter(initial=self._retry_initial_sec, max=self._retry_max_sec),
            retry=retry_if_exception(should_retry),
            before_sleep=log_retry,
            reraise=True,
        )
        try:
            response = retrying(attempt)
        except _TransientStatus as exc:
            response = exc.response
        except httpx.TransportError as exc:
            raise self._unavailable(exc, method, path, idempotent) from None
        if response.is_success:
            return response
        raise error_from_response(response)

    def _unavailable(self, exc: httpx.TransportError, method: str, path: str, idempotent: bool) -> SidecarUnavailable:
        # Only the exception's class is named: its text may quote request details.
        message = f"cannot reach the sidecar at {self.base_url} ({type(exc).__name__}"
        if isinstance(exc, _NOT_SENT_ERRORS):
            message += f", after {self.retry_attempts} attempt(s)); is {SIDECAR_URL_ENV} right and the sidecar up?"
        else:
            message += ")"
            if not idempotent:
                message += (
                    f"; the request {method} {path} may have been received: check `vero harbor status` "
                    "before sending it again"
                )
        return SidecarUnavailable(message)
