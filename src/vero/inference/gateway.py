"""The inference gateway: the only way a candidate agent reaches a model (docs/trust-model.md).

It runs inside the sidecar and the verifier (`GatewayServer`, loopback by default) and serves:

| route | wire format |
|---|---|
| `POST /openai/v1/chat/completions` | OpenAI chat completions (streaming included) |
| `POST /openai/v1/responses` | OpenAI responses (streaming included) |
| `GET /openai/v1/models` | the allow-list, OpenAI's list format |
| `POST /anthropic/v1/messages` | Anthropic messages (streaming included) |

A connection is admitted first, under the caps on open connections per caller, per evaluation and
in all (`vero.inference.connections`; one past a cap is closed as it is accepted). A call is then
checked in this order: size (413) -> JSON (400) -> token (401: `Authorization: Bearer`
or `x-api-key`, one per evaluation, minted by `grant`) -> caller (401: a token works only from where
its evaluation's candidate runs: from a candidate host bound to it, `bind_host`, i.e. a socket of
that host's uid in this network namespace, `vero.inference.callers`; or on its evaluation's own case
route listener from that route's network; any other use is refused, logged and counted as
`foreign_token` on the evaluation it came from) -> model on the allow-list and served by this
endpoint's wire format (403 `model_not_allowed`) -> the call's bound (400 naming the field when the
body cannot bound it, `vero.inference.bounds`) -> budget hold of the whole bound (402
`budget_exhausted`) -> upstream call with the provider key only the gateway holds (the caller's
headers are never forwarded).

Holds are upper bounds, so what the provider bills never exceeds the budgets: a call is forwarded
only once its whole bound is held against the evaluation's limit and the partition's budget. A
bound more than what is left once the calls in flight settle is refused at once (402, refusal
`over_budget`, the message says the bound and what is left; `budget_exhausted` when nothing is
left). A bound that is only short of money held by calls in flight waits until they settle (so
whether a call of an agent that calls concurrently is refused never depends on timing); at most
`MAX_WAITING_CALLS` per evaluation wait, further ones get 429 at once.

Metering: after the response, the provider's `usage` is priced (`vero.inference.pricing`: service
tier, context tier, cache reads and writes) and charged, the rest of the hold released; a call
costs more than its hold only under a model's `unbounded_call_usd` or a tier the provider chose
itself, and is then charged what is free, the rest recorded as `overrun_usd`. Streaming
responses are passed through as they arrive while their usage events are read (OpenAI chat
streams get `stream_options.include_usage`); a response without usage is charged its hold, and so
is a call whose caller goes away before it ends. Who pays a failure: the provider may bill any
call it took, so a call it took and did not answer (not within `timeout_sec`, an answer that
broke off) is charged its hold (`_lost`), and a started stream that stalls
(`stream_idle_timeout_sec`), runs past `timeout_sec` or breaks off ends with an error event in its
format and is charged its hold unless its usage arrived (`_relay`); upstream 5xx (the provider
says it failed) and connection failures (nothing reached it) answer 502/504 and charge nothing; a
call that could not connect at all is counted `unreachable_calls` (the verifier leaves such a
measurement unmeasured; the sidecar charges it as measured, since calling is the candidate's
choice: `EvaluationLease.charged`); 4xx pass through (a provider's 401/403 becomes a generic 502: its body may
echo a key). Key values are scrubbed from every body passed back, a stream's across its events
(`vero.inference.scrub`), and never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import ipaddress
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from vero.core.usage import InferenceUsage, ModelUsage
from vero.inference.bounds import CallBound, Unbounded, bound_call
from vero.inference.callers import Peer, peer_of
from vero.inference.connections import ConnectionCaps, ConnectionGate, gated_protocol
from vero.inference.pricing import STANDARD_TIER, CacheTokens, ModelPrice, price_of, to_micro_usd
from vero.inference.scrub import SecretScrub, StreamScrub
from vero.spec.models import InferenceModel, InferenceProvider, InferenceSpec

if TYPE_CHECKING:
    import uvicorn

__all__ = [
    "AGENT_TOKEN_PREFIX",
    "BudgetPool",
    "CallJournal",
    "GatewayServer",
    "InferenceGateway",
    "InferenceGrant",
    "create_gateway_app",
    "gateway_environment",
]

logger = logging.getLogger("vero.inference")

Api = Literal["openai", "anthropic"]
Scope = Literal["evaluation", "agent"]
"""Whose calls a grant pays for: one evaluation's candidate, or the coding agent in `main` (its
producer scope, served on the sidecar's API at `/inference`). A token works only on the listener
of its own scope."""

AGENT_TOKEN_PREFIX = "vero-ag-"
"""Prefix of a coding agent's token (`vero.launch` mints it); evaluation tokens are `vero-ev-...`."""
_OFFLOOP_PARSE_BYTES = 256 * 1024
"""Bodies larger than this are parsed and bounded in a worker thread, not on the event loop."""

MAX_REQUEST_BYTES = 32 * 1024 * 1024
DRAIN_LIMIT_BYTES = 128 * 1024 * 1024
"""Most of an oversized request body read (and dropped) before its 413 is sent, in bytes; a
larger body is cut off and its caller may see a connection reset."""
_ANTHROPIC_VERSION = "2023-06-01"
_IDLE_WAIT_SEC = 10.0
MAX_WAITING_CALLS = 8
"""Calls of one evaluation that may wait for held money at once; more are answered 429 at once
(a candidate cannot park unbounded connections on the gateway for free)."""


class BudgetPool:
    """Money one can spend, in micro-dollars: `total` (None: unlimited), `spent`, `held` (in flight)."""

    def __init__(self, total_micro_usd: int | None, spent_micro_usd: int = 0) -> None:
        self.total = total_micro_usd
        self.spent = spent_micro_usd
        self.held = 0

    @property
    def available(self) -> int | None:
        return None if self.total is None else max(0, self.total - self.spent - self.held)

    @property
    def unspent(self) -> int | None:
        """What is left once every call in flight has settled at most its hold (None: unlimited)."""
        return None if self.total is None else max(0, self.total - self.spent)


def _min_available(pools: list[BudgetPool]) -> int | None:
    values = [p.available for p in pools if p.available is not None]
    return min(values) if values else None


@dataclass(frozen=True)
class _Refused:
    """A call refused before any money was held: the `refused_calls` reason and the answer."""

    reason: str
    response: Response


class _TooManyWaiting(Exception):
    """Raised by `InferenceGateway._hold` when an evaluation has too many calls waiting."""


class CallJournal(Protocol):
    """Where a grant's calls are also recorded durably (the coding agent's scope: the sidecar's
    budget ledger, `vero.sidecar.agent_inference`): each forwarded call once when its hold is
    taken, and once when it is settled."""

    async def opened(self, call_id: str, held_micro_usd: int) -> None:
        """Record the hold before the call is forwarded; raising refuses the call (503)."""

    def closed(self, call_id: str, charged_micro_usd: int, overrun_micro_usd: int = 0) -> None:
        """Record what the call was charged (0: released; never more than its hold) and what it
        cost above that (`overrun_micro_usd`). Called on the event loop, without awaiting: the
        write must complete on its own."""


@dataclass(eq=False)
class _Call:
    """One forwarded call: what it holds until it is metered or released (exactly once)."""

    route: _Route
    bound: CallBound
    id: str = field(default_factory=lambda: "ic-" + secrets.token_hex(8))
    done: bool = False
    started_at: float = field(default_factory=time.monotonic)
    """When the call was forwarded (`time.monotonic`, the event loop's clock): its `timeout_sec` counts from here."""


@dataclass(eq=False)
class InferenceGrant:
    """One evaluation's access: its token (kept only as a digest), budget pools and metered usage."""

    evaluation_id: str
    partition: str
    pools: list[BudgetPool]
    usage: InferenceUsage = field(default_factory=InferenceUsage)
    closed: bool = False
    open_calls: set[_Call] = field(default_factory=set)
    hosts: dict[int, int] = field(default_factory=dict)
    """uid -> live candidate hosts of this evaluation running as it (`InferenceGateway.bind_host`):
    the local callers the token works for."""
    waiting_calls: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    scope: Scope = "evaluation"
    models: frozenset[str] | None = None
    """The model names this grant may call (None: the whole allow-list)."""
    journal: CallJournal | None = None

    def hold(self, bound_micro_usd: int) -> bool:
        """Hold all of `bound` against every pool, or nothing (False: not free now)."""
        available = _min_available(self.pools)
        if available is not None and available < bound_micro_usd:
            return False
        for pool in self.pools:
            pool.held += bound_micro_usd
        return True

    def can_ever_hold(self, bound_micro_usd: int) -> bool:
        """Whether `bound` fits in what is left once the calls in flight settle (they settle at most
        their holds, so a False here stays False)."""
        return all(pool.unspent is None or pool.unspent >= bound_micro_usd for pool in self.pools)

    def settle(self, held: int, cost_micro_usd: int) -> int:
        """Release `held`, charge the metered cost (capped at what is free, and with a journal at
        `held`: the journal's record of the call reserved that much); returns the charge."""
        for pool in self.pools:
            pool.held -= held
        available = _min_available(self.pools)
        charge = cost_micro_usd if available is None else min(cost_micro_usd, available)
        if self.journal is not None:
            charge = min(charge, held)
        for pool in self.pools:
            pool.spent += charge
        self.usage.charged_micro_usd += charge
        return charge

    def release(self, held: int) -> None:
        for pool in self.pools:
            pool.held -= held


@dataclass(frozen=True)
class _Route:
    name: str
    model: InferenceModel
    provider: InferenceProvider
    price: ModelPrice
    key: str | None

    @property
    def upstream_model(self) -> str:
        return self.model.upstream_model or self.name


@dataclass
class _Count:
    input_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    """Cache writes of all durations (Anthropic `cache_creation_input_tokens`)."""
    cache_write_1h_tokens: int = 0
    """Of `cache_write_tokens`, one-hour writes (`cache_creation.ephemeral_1h_input_tokens`)."""
    output_tokens: int = 0
    service_tier: str | None = None
    """The tier the provider says it served the call in (OpenAI's `service_tier`), if any."""
    seen: bool = False

    def absorb(self, usage: Any, api: Api) -> None:
        """Fold a provider `usage` object in (streaming figures are cumulative: keep the largest)."""
        if not isinstance(usage, dict):
            return

        def number(*path: str) -> int:
            value: Any = usage
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 0

        if api == "anthropic":
            self.input_tokens = max(self.input_tokens, number("input_tokens"))
            self.cached_tokens = max(self.cached_tokens, number("cache_read_input_tokens"))
            self.cache_write_tokens = max(self.cache_write_tokens, number("cache_creation_input_tokens"))
            self.cache_write_1h_tokens = max(
                self.cache_write_1h_tokens, number("cache_creation", "ephemeral_1h_input_tokens")
            )
            self.output_tokens = max(self.output_tokens, number("output_tokens"))
        else:
            prompt = number("prompt_tokens") or number("input_tokens")
            cached = number("prompt_tokens_details", "cached_tokens") or number("input_tokens_details", "cached_tokens")
            self.cached_tokens = max(self.cached_tokens, min(cached, prompt))
            self.input_tokens = max(self.input_tokens, prompt - min(cached, prompt))
            self.output_tokens = max(self.output_tokens, number("completion_tokens") or number("output_tokens"))
        self.seen = self.seen or any(
            k in usage for k in ("input_tokens", "output_tokens", "prompt_tokens", "completion_tokens")
        )

    def absorb_event(self, event: Any, api: Api) -> None:
        """Usage carried by one JSON body or SSE event of any of the three formats."""
        if not isinstance(event, dict):
            return
        if api == "anthropic":
            if event.get("type") == "message_start" and isinstance(event.get("message"), dict):
                self.absorb(event["message"].get("usage"), api)
            else:
                self.absorb(event.get("usage"), api)
            return
        for holder in (event, event.get("response")):  # responses API stream: response.completed etc.
            if isinstance(holder, dict):
                self.absorb(holder.get("usage"), api)
                if isinstance(holder.get("service_tier"), str):
                    self.service_tier = holder["service_tier"]

    def cost_usd(self, price: ModelPrice, bound: CallBound | None) -> float:
        """The call's cost at `price`: in the tier the provider reports when it prices that tier,
        else the one asked for; cache writes of unknown duration at the one-hour rate when the call
        asked for one-hour writes."""
        tier = bound.service_tier if bound is not None else STANDARD_TIER
        reported = {"default": STANDARD_TIER, "auto": STANDARD_TIER}.get(self.service_tier or "", self.service_tier)
        if reported is not None and reported in price.tiers:
            tier = reported
        one_hour = min(self.cache_write_1h_tokens, self.cache_write_tokens)
        if bound is not None and bound.cache_write_1h and not one_hour:
            one_hour = self.cache_write_tokens
        cache = CacheTokens(read=self.cached_tokens, write=self.cache_write_tokens - one_hour, write_1h=one_hour)
        return price.cost_usd(self.input_tokens, self.output_tokens, cache, tier)


def _unauthorized(api: Api) -> JSONResponse:
    return _error(
        api,
        401,
        "authentication_error" if api == "anthropic" else "invalid_api_key",
        "a valid evaluation token is required",
    )


def _error(api: Api, status: int, kind: str, message: str) -> JSONResponse:
    if api == "anthropic":
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        body = {"error": {"message": message, "type": kind, "code": kind, "param": None}}
    return JSONResponse(body, status_code=status)


def _stream_error(api: Api, *, timeout: bool) -> bytes:
    """The SSE error event ending a stream the provider broke off or stopped feeding (`timeout`);
    OpenAI's and Anthropic's SDKs both raise on it."""
    kind = "upstream_timeout" if timeout else "upstream_error"
    message = "the model provider stopped answering in time" if timeout else "the model provider's stream broke off"
    if api == "anthropic":
        error = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"\nevent: error\ndata: " + json.dumps(error).encode() + b"\n\n"
    error = {"error": {"message": message, "type": kind, "code": kind, "param": None}}
    return b"\ndata: " + json.dumps(error).encode() + b"\n\n"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class InferenceGateway:
    """Routes, keys, grants and the upstream client of one gateway (see the module docstring).

    Args:
        spec: the spec's `inference` section.
        keys: secret name -> value (only the names `providers.*.api_key_secret` are read).
        transport: httpx transport for upstream calls (tests: none needed, they run a real server).
        connection_caps: how many connections candidates may hold open (`vero.inference.connections`).

    Raises:
        vero.inference.pricing.PriceUnknown: an allow-listed model has no price.
        ValueError: a model names an unknown provider.
    """

    def __init__(
        self,
        spec: InferenceSpec,
        keys: Mapping[str, str],
        transport: httpx.AsyncBaseTransport | None = None,
        connection_caps: ConnectionCaps | None = None,
    ) -> None:
        self.spec = spec
        routes: dict[str, _Route] = {}
        for name, model in spec.models.items():
            provider = spec.providers.get(model.provider)
            if provider is None:
                raise ValueError(f"inference.models.{name}.provider: unknown provider {model.provider!r}")
            key = keys.get(provider.api_key_secret) if provider.api_key_secret else None
            routes[name] = _Route(name, model, provider, price_of(name, model), key or None)
        self._routes = routes
        self._scrub = SecretScrub([r.key for r in routes.values() if r.key])
        self._grants: dict[str, InferenceGrant] = {}
        self._freed = asyncio.Event()  # set (and replaced) whenever held money is settled or released
        self._client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(spec.timeout_sec, connect=min(30.0, spec.timeout_sec)),
            follow_redirects=False,
            trust_env=False,
        )
        self.base_url: str | None = None
        """`http://host:port` once the server listens (set by `GatewayServer`)."""
        self.connections = ConnectionGate(connection_caps or ConnectionCaps(), self._refused_connection)
        """The caps on candidates' open connections, over all of this gateway's listeners."""

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- grants ----------------------------------------------------------------------------------

    def grant(self, evaluation_id: str, partition: str, *, limit_micro_usd: int | None) -> tuple[str, InferenceGrant]:
        """Mint the token of one evaluation, whose calls may spend `limit_micro_usd` (None: no
        limit; in the sidecar, its job's reservation in the ledger). Returns `(token, grant)`; the
        token is not kept."""
        pools = [BudgetPool(limit_micro_usd)]
        token = "vero-ev-" + secrets.token_urlsafe(32)
        grant = InferenceGrant(evaluation_id=evaluation_id, partition=partition, pools=pools)
        grant.idle.set()
        self._grants[_digest(token)] = grant
        return token, grant

    def grant_agent(
        self,
        token_sha256: str,
        models: Iterable[str],
        *,
        limit_micro_usd: int,
        journal: CallJournal | None = None,
    ) -> InferenceGrant:
        """Open the coding agent's scope: calls with the token whose SHA-256 (hex) is
        `token_sha256` may call `models` (names of the allow-list) for `limit_micro_usd` in all,
        on the agent listener only (`create_gateway_app(..., scope="agent")`). The token itself is
        never given to the gateway: `vero harbor run` minted it and gave it to `main` alone.

        Raises:
            ValueError: `token_sha256` is not 64 hex digits, or a model is not allow-listed.
        """
        digest = token_sha256.strip().lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError("the agent token's digest must be 64 hex digits (SHA-256)")
        allowed = frozenset(models)
        unknown = sorted(allowed - set(self._routes))
        if unknown:
            raise ValueError(f"inference.agent.models: not allow-listed: {', '.join(unknown)}")
        grant = InferenceGrant(
            evaluation_id="agent",
            partition="",
            pools=[BudgetPool(limit_micro_usd)],
            scope="agent",
            models=allowed,
            journal=journal,
        )
        grant.idle.set()
        self._grants[digest] = grant
        return grant

    async def revoke(self, token: str) -> InferenceUsage:
        """Close the token (further calls: 401), wait briefly for calls in flight, return the usage."""
        grant = self._grants.get(_digest(token))
        if grant is None:
            return InferenceUsage()
        grant.closed = True
        self._budget_freed()  # calls waiting for money see the token closed
        try:
            await asyncio.wait_for(grant.idle.wait(), timeout=_IDLE_WAIT_SEC)
        except TimeoutError:
            logger.warning(
                "evaluation %s: %d inference call(s) still open at revocation; charged what they hold",
                grant.evaluation_id,
                len(grant.open_calls),
            )
            for call in list(grant.open_calls):
                self._meter(grant, call, _Count())
        self._grants.pop(_digest(token), None)
        return grant.usage.model_copy(deep=True)

    def bind_host(self, token: str, uid: int) -> None:
        """A candidate host of `token`'s evaluation runs as `uid`: its calls may use the token (until
        `release_host`). Unknown tokens are ignored."""
        grant = self._grants.get(_digest(token))
        if grant is not None:
            grant.hosts[uid] = grant.hosts.get(uid, 0) + 1

    def release_host(self, token: str, uid: int) -> None:
        """The host bound by `bind_host(token, uid)` has ended (and everything it started)."""
        grant = self._grants.get(_digest(token))
        if grant is not None and uid in grant.hosts:
            grant.hosts[uid] -= 1
            if grant.hosts[uid] <= 0:
                del grant.hosts[uid]

    def environment(self, token: str, host: str | None = None) -> dict[str, str]:
        """The variables a candidate (or a case service) finds the gateway by (docs/inference.md)."""
        return gateway_environment(self._base(host), token)

    def _base(self, host: str | None) -> str:
        if self.base_url is None:
            raise RuntimeError("the gateway is not listening")
        if host is None:
            return self.base_url
        port = self.base_url.rsplit(":", 1)[1]
        return f"http://{host}:{port}"

    # -- calls -----------------------------------------------------------------------------------

    def _authorize(self, request: Request) -> InferenceGrant | None:
        """The open grant of the request's token, if the call comes from where its evaluation's
        candidate runs (see the module docstring); None otherwise."""
        token = request.headers.get("x-api-key")
        authorization = request.headers.get("authorization", "")
        if not token and authorization.lower().startswith("bearer "):
            token = authorization[7:].strip()
        if not token:
            return None
        grant = self._grants.get(_digest(token))
        if grant is None or grant.closed:
            return None
        scope: Scope = "agent" if getattr(request.app.state, "scope", None) == "agent" else "evaluation"
        if not self._in_scope(grant, scope):
            return None
        if scope == "agent":
            # Served on the sidecar's API, behind its guard: only `main` reaches it.
            return grant
        only = getattr(request.app.state, "evaluation_id", None)
        if only is not None and grant.evaluation_id != only:
            self._misused(grant, f"on the case route of evaluation {only}", self._grant_of(only))
            return None
        peer = _peer(request)
        if peer.local:
            if peer.uid is not None and peer.uid in grant.hosts:
                return grant
            offenders = [] if peer.uid is None else [g for g in self._grants.values() if peer.uid in g.hosts]
            self._misused(grant, f"by local uid {peer.uid}", offenders[0] if len(offenders) == 1 else None)
            return None
        network = getattr(request.app.state, "remote_network", None)
        client = request.client
        if only is not None and network is not None and client is not None and _in_network(client.host, network):
            return grant
        self._misused(grant, "from outside its case route", self._grant_of(only) if only is not None else None)
        return None

    def _in_scope(self, grant: InferenceGrant, scope: Scope) -> bool:
        """Whether `grant` may be used on a listener of `scope`. An agent token on a candidate's
        listener, or an evaluation token on the agent's, is refused and logged (the latter counted
        `foreign_token` on its evaluation): each works only where its own scope is served."""
        if grant.scope == scope:
            return True
        whose = "an evaluation's token" if grant.scope == "evaluation" else "the coding agent's token"
        logger.warning("%s was used on the %s gateway: refused", whose, scope)
        if grant.scope == "evaluation":
            self._refuse(grant, "foreign_token")
        return False

    def evaluation_of_host(self, uid: int | None) -> str | None:
        """The evaluation whose candidate host runs as `uid` (`bind_host`), if exactly one."""
        found = {g.evaluation_id for g in self._grants.values() if uid is not None and uid in g.hosts}
        return found.pop() if len(found) == 1 else None

    def _refused_connection(self, evaluation_id: str | None) -> None:
        if evaluation_id is not None:
            self._refuse(self._grant_of(evaluation_id), "too_many_connections")

    def _grant_of(self, evaluation_id: str) -> InferenceGrant | None:
        found = [g for g in self._grants.values() if g.evaluation_id == evaluation_id and not g.closed]
        return found[0] if len(found) == 1 else None

    def _misused(self, grant: InferenceGrant, where: str, offender: InferenceGrant | None) -> None:
        """A live token used from somewhere its evaluation's candidate does not run: refused, logged
        for the operator, and counted on the evaluation it came from (its own candidate's doing, so
        counting it there discloses nothing of the token's evaluation)."""
        logger.warning(
            "evaluation %s: its gateway token was used %s%s: refused",
            grant.evaluation_id,
            where,
            f" (a candidate of evaluation {offender.evaluation_id})" if offender is not None else "",
        )
        if offender is not None and offender is not grant:
            self._refuse(offender, "foreign_token")

    def _refuse(self, grant: InferenceGrant | None, reason: str) -> None:
        if grant is not None:
            grant.usage.refused_calls[reason] = grant.usage.refused_calls.get(reason, 0) + 1

    def models_response(self, request: Request) -> Response:
        """`GET /openai/v1/models`: the OpenAI models the token may call (401 without a valid one)."""
        if self._authorize(request) is None:
            return _error("openai", 401, "invalid_api_key", "a valid evaluation token is required")
        grant = self._authorize(request)
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "vero-gateway"}
            for name, route in sorted(self._routes.items())
            if route.provider.api == "openai" and (grant is None or grant.models is None or name in grant.models)
        ]
        return JSONResponse({"object": "list", "data": data})

    async def handle(self, request: Request, api: Api, path: str) -> Response:
        """One model call (see the module docstring for the order of checks)."""
        body = await _read_limited(request, MAX_REQUEST_BYTES)
        grant = self._authorize(request)
        if grant is None:
            return _unauthorized(api)
        if body is not None and len(body) > _OFFLOOP_PARSE_BYTES:
            admitted = await asyncio.to_thread(self._admit, grant.models, body, api, path)
        else:
            admitted = self._admit(grant.models, body, api, path)
        if isinstance(admitted, _Refused):
            self._refuse(grant, admitted.reason)  # on the loop: usage is only changed here
            return admitted.response
        route, bound = admitted
        refusal = await self._hold_or_refuse(grant, bound, api)
        if refusal is not None:
            return refusal
        call = _Call(route, bound)
        grant.open_calls.add(call)
        grant.idle.clear()
        if grant.journal is not None and not await self._journal_opened(grant, call):
            return _error(api, 503, "unavailable", "the gateway could not record the call; nothing was sent")
        try:
            return await self._forward(grant, call, request, api, path)
        except BaseException:
            # Cancelled (the caller went away) while the provider may have answered: the call is
            # charged what it holds, never released for free.
            self._meter(grant, call, _Count())
            raise

    async def _journal_opened(self, grant: InferenceGrant, call: _Call) -> bool:
        """Record `call`'s hold in the grant's journal; False (hold released) when it cannot be."""
        assert grant.journal is not None
        try:
            await grant.journal.opened(call.id, call.bound.micro_usd)
        except Exception as exc:  # noqa: BLE001 - nothing was recorded: released here, not in the journal
            if self._close_call(grant, call):
                grant.release(call.bound.micro_usd)
                self._budget_freed()
            logger.error("%s: recording an inference call failed (%s)", grant.evaluation_id, type(exc).__name__)
            return False
        except BaseException:  # cancelled once recorded (the store completes its commits): closed at 0
            self._end_call(grant, call)
            raise
        return True

    def _admit(
        self, models: frozenset[str] | None, body: bytes | None, api: Api, path: str
    ) -> _Refused | tuple[_Route, CallBound]:
        """Size, JSON, allow-list (`models`: the grant's, None for all) and bound checks: the route,
        the body to forward and its bound (`vero.inference.bounds`), or the refusal. Changes no
        state (it may run in a worker thread)."""
        if body is None:
            return _Refused(
                "too_large", _error(api, 413, "request_too_large", f"request body over {MAX_REQUEST_BYTES} bytes")
            )
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
            return _Refused(
                "bad_request", _error(api, 400, "invalid_request_error", "expected a JSON object with a `model`")
            )
        route = self._routes.get(payload["model"])
        if route is None or route.provider.api != api or (models is not None and route.name not in models):
            kind = "permission_error" if api == "anthropic" else "model_not_allowed"
            return _Refused("model_not_allowed", _error(api, 403, kind, "this model is not on the allow-list"))
        try:
            bound = self.bound_of(payload, api, path)
        except Unbounded as exc:
            message = f"the gateway cannot bound this call's cost: {exc}"
            return _Refused("unbounded_request", _error(api, 400, "invalid_request_error", message))
        return route, bound

    def bound_of(self, payload: dict[str, Any], api: Api, path: str) -> CallBound:
        """The bound and the upstream body of a request to allow-listed model `payload["model"]`
        (`vero.inference.bounds.bound_call`); `payload` becomes the upstream request (its model id,
        its output limit, OpenAI chat streams asked for their usage).

        Raises:
            KeyError: the model is not allow-listed.
            vero.inference.bounds.Unbounded: the request cannot be bounded.
        """
        route = self._routes[payload["model"]]
        payload["model"] = route.upstream_model
        if payload.get("stream") is True and api == "openai" and path == "/chat/completions":
            requested = payload.get("stream_options")
            options = requested if isinstance(requested, dict) else {}
            payload["stream_options"] = {**options, "include_usage": True}
        return bound_call(payload, api, path, route.price, route.model.unbounded_call_usd)

    async def _hold_or_refuse(self, grant: InferenceGrant, bound: CallBound, api: Api) -> Response | None:
        """Hold the call's bound (`_hold`); the refusal when it cannot be held (None: held)."""
        try:
            outcome = await self._hold(grant, bound.micro_usd)
        except _TooManyWaiting:
            self._refuse(grant, "too_many_waiting")
            return _error(
                api,
                429,
                "rate_limit_error" if api == "anthropic" else "rate_limit_exceeded",
                f"more than {MAX_WAITING_CALLS} calls are waiting for money held by calls in flight",
            )
        if outcome == "held":
            return None
        if outcome == "closed":
            return _unauthorized(api)
        whose = "the coding agent's" if grant.scope == "agent" else "the evaluation's"
        if outcome == "spent":
            self._refuse(grant, "budget_exhausted")
            return _error(api, 402, "budget_exhausted", f"{whose} inference budget is exhausted")
        self._refuse(grant, "over_budget")
        left = min(p.unspent for p in grant.pools if p.unspent is not None)
        return _error(
            api,
            402,
            "budget_exhausted",
            f"this call could cost up to {bound.micro_usd / 1e6:.6f} USD ({bound.input_tokens} input tokens "
            f"from its size, {bound.output_tokens} output tokens from its limit) and {whose} inference "
            f"budget has {left / 1e6:.6f} USD left: ask for fewer output tokens or send less",
        )

    async def _forward(self, grant: InferenceGrant, call: _Call, request: Request, api: Api, path: str) -> Response:
        """Send the call upstream and answer with what came back (module docstring: who pays what)."""
        route = call.route
        try:
            upstream = self._client.build_request(
                "POST",
                _upstream_url(route.provider, path),
                content=call.bound.body,
                headers=_upstream_headers(route, request),
            )
            async with asyncio.timeout(self.spec.timeout_sec):
                response = await self._client.send(upstream, stream=True)
        except TimeoutError:
            self._lost(grant, call)
            logger.warning("evaluation %s: the provider of %s did not answer in time", grant.evaluation_id, route.name)
            return _error(api, 504, "upstream_timeout", "the model provider did not answer in time")
        except httpx.HTTPError as exc:
            if isinstance(exc, _UNREACHABLE):
                self._fail(grant, call, unreachable=True)
            else:  # the request went out: the provider may bill what it did with it
                self._lost(grant, call)
            # The type and errno only: a message may carry the URL, and the URL a key.
            logger.warning(
                "evaluation %s: calling the provider of %s failed (%s%s)",
                grant.evaluation_id,
                route.name,
                type(exc).__name__,
                _errno_of(exc),
            )
            if isinstance(exc, httpx.TimeoutException):
                return _error(api, 504, "upstream_timeout", "the model provider did not answer in time")
            return _error(api, 502, "upstream_error", "the model provider could not be reached")
        if response.status_code >= 400:
            try:
                data = await response.aread()
            finally:
                await response.aclose()
            if response.status_code >= 500 or response.status_code in (401, 403, 407):
                self._fail(grant, call)
                logger.warning(
                    "evaluation %s: upstream answered %d for %s", grant.evaluation_id, response.status_code, route.name
                )
                return _error(api, 502, "upstream_error", f"the model provider failed ({response.status_code})")
            self._end_call(grant, call)
            return Response(
                self._scrub.body(data),
                status_code=response.status_code,
                media_type=response.headers.get("content-type", "application/json"),
            )
        if not call.bound.stream or "text/event-stream" not in response.headers.get("content-type", ""):
            try:
                async with asyncio.timeout(max(0.0, call.started_at + self.spec.timeout_sec - time.monotonic())):
                    data = await response.aread()
            except (httpx.HTTPError, TimeoutError):
                self._lost(grant, call)
                return _error(api, 502, "upstream_error", "the model provider's answer broke off")
            finally:
                await response.aclose()
            count = _Count()
            try:
                count.absorb_event(json.loads(data), api)
            except ValueError:
                pass
            self._meter(grant, call, count)
            return Response(
                self._scrub.body(data),
                status_code=response.status_code,
                media_type=response.headers.get("content-type", "application/json"),
            )
        return StreamingResponse(
            self._relay(grant, call, response, api), status_code=response.status_code, media_type="text/event-stream"
        )

    async def _relay(
        self, grant: InferenceGrant, call: _Call, response: httpx.Response, api: Api
    ) -> AsyncIterator[bytes]:
        """Pass a provider's stream through, reading its usage events; end it when it stalls.

        A stream that sends nothing for `stream_idle_timeout_sec`, or is still going when the
        call's `timeout_sec` is up, is ended with an error event in its format. A stream that does
        not end with its usage (stalled, broken off, or left by its caller) is charged its hold:
        the provider took the request and may bill what it generated.
        """
        loop = asyncio.get_running_loop()
        deadline = call.started_at + self.spec.timeout_sec
        idle_sec = self.spec.stream_idle_timeout_sec
        count = _Count()
        scrub = self._scrub.stream()
        pending = b""
        complete = False
        failure: str | None = None
        chunks = response.aiter_bytes().__aiter__()
        try:
            while True:
                wait_sec = min(idle_sec, deadline - loop.time())
                try:
                    async with asyncio.timeout(max(wait_sec, 0.0)):
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    failure = "stalled" if wait_sec == idle_sec else "over_time"
                    break
                pending += chunk
                # Whole lines only: a usage event (or a key) is never split between two reads.
                cut = pending.rfind(b"\n") + 1
                lines, pending = pending[:cut], pending[cut:]
                _take_lines(lines, scrub, count, api)
                if ready := scrub.ready():
                    yield ready
            if failure is None:
                _take_lines(pending, scrub, count, api)
                complete = True
        except httpx.HTTPError as exc:
            failure = type(exc).__name__
        finally:
            # Settled before anything is awaited: a caller that went away cancels this generator,
            # and the settlement must not depend on a later await running. Without its usage, the
            # call is charged its hold (`_Count()` seen nothing).
            self._meter(grant, call, count if (complete or count.seen) else _Count())
            await response.aclose()
        # Lines held back while they could start a key (`vero.inference.scrub`), then the error.
        if rest := scrub.finish():
            yield rest
        if failure is not None:
            logger.warning(
                "evaluation %s: the stream of %s ended early (%s)", grant.evaluation_id, call.route.name, failure
            )
            # Said in the stream's own format, so that the caller's SDK raises instead of taking a
            # cut-off answer for a whole one.
            yield _stream_error(api, timeout=failure in ("stalled", "over_time"))

    async def _hold(self, grant: InferenceGrant, bound_micro_usd: int) -> Literal["held", "closed", "spent", "over"]:
        """Hold a call's whole bound (`InferenceGrant.hold`), waiting while what is missing is only
        held by calls in flight (of this evaluation or of others sharing its partition's budget).

        Returns `held`; `closed` when the token was closed meanwhile; `spent` when nothing is left;
        `over` when the bound is more than what will be left however the calls in flight settle.
        The wait is bounded: every hold is settled or released when its call ends, at the latest by
        `revoke` or the upstream timeout.

        Raises:
            _TooManyWaiting: `MAX_WAITING_CALLS` calls of this evaluation are waiting already.
        """
        while True:
            freed = self._freed  # taken before the check: a settlement after it wakes this wait
            if grant.closed:
                return "closed"
            if not grant.can_ever_hold(bound_micro_usd):
                return "spent" if any(pool.unspent == 0 for pool in grant.pools) else "over"
            if grant.hold(bound_micro_usd):
                return "held"
            if grant.waiting_calls >= MAX_WAITING_CALLS:
                raise _TooManyWaiting
            grant.waiting_calls += 1
            try:
                await freed.wait()
            finally:
                grant.waiting_calls -= 1

    def _budget_freed(self) -> None:
        self._freed.set()
        self._freed = asyncio.Event()

    def _close_call(self, grant: InferenceGrant, call: _Call) -> bool:
        """Mark `call` done; False if it already was (each call is settled exactly once)."""
        if call.done:
            return False
        call.done = True
        grant.open_calls.discard(call)
        if not grant.open_calls:
            grant.idle.set()
        return True

    def _end_call(self, grant: InferenceGrant, call: _Call) -> None:
        """Release the hold: the call cost nothing (the provider refused it, 4xx)."""
        if self._close_call(grant, call):
            grant.release(call.bound.micro_usd)
            self._budget_freed()
            self._journal_closed(grant, call, 0)

    @staticmethod
    def _journal_closed(grant: InferenceGrant, call: _Call, charged_micro_usd: int, overrun_micro_usd: int = 0) -> None:
        if grant.journal is not None:
            grant.journal.closed(call.id, charged_micro_usd, overrun_micro_usd)

    def _lost(self, grant: InferenceGrant, call: _Call) -> None:
        """The provider took the call and gave no answer (timed out, broke off): charged its hold,
        as a call without usage is, and counted as failed."""
        if not call.done:
            grant.usage.failed_calls += 1
        self._meter(grant, call, _Count())

    def _fail(self, grant: InferenceGrant, call: _Call, *, unreachable: bool = False) -> None:
        """The provider failed the call (5xx, timeout, connection): released, counted as failed;
        `unreachable` when no connection to it could be made (`InferenceUsage.unreachable_calls`)."""
        if self._close_call(grant, call):
            grant.release(call.bound.micro_usd)
            self._budget_freed()
            self._journal_closed(grant, call, 0)
            grant.usage.failed_calls += 1
            if unreachable:
                grant.usage.unreachable_calls += 1

    def _meter(self, grant: InferenceGrant, call: _Call, count: _Count) -> None:
        if not self._close_call(grant, call):
            return
        route, held = call.route, call.bound.micro_usd
        usage = grant.usage
        if count.seen:
            cost = count.cost_usd(route.price, call.bound)
            cost_micro = to_micro_usd(cost)
        else:
            usage.unmetered_calls += 1
            cost_micro = held
            cost = held / 1_000_000
        charged = grant.settle(held, cost_micro)
        self._budget_freed()
        self._journal_closed(grant, call, charged, max(0, cost_micro - charged))
        usage.calls += 1
        usage.input_tokens += count.input_tokens
        usage.cached_input_tokens += count.cached_tokens + count.cache_write_tokens
        usage.output_tokens += count.output_tokens
        usage.cost_usd += cost
        usage.overrun_usd += max(0, cost_micro - charged) / 1_000_000
        model = usage.by_model.setdefault(route.name, ModelUsage())
        model.calls += 1
        model.input_tokens += count.input_tokens
        model.cached_input_tokens += count.cached_tokens + count.cache_write_tokens
        model.output_tokens += count.output_tokens
        model.cost_usd += cost
        logger.info(
            "evaluation %s: %s call, %d in / %d out tokens, %.6f USD",
            grant.evaluation_id,
            route.name,
            count.input_tokens + count.cached_tokens,
            count.output_tokens,
            cost,
        )


def _take_lines(lines: bytes, scrub: StreamScrub, count: _Count, api: Api) -> None:
    """Read the usage of each of `lines` (whole SSE lines) into `count` and queue it in `scrub`."""
    for line in lines.splitlines(keepends=True):
        event = None
        if line.startswith(b"data:"):
            with contextlib.suppress(ValueError):
                event = json.loads(line[5:].strip())
            count.absorb_event(event, api)
        scrub.add(line, event)


def _peer(request: Request) -> Peer:
    """Who holds the calling end of `request`'s connection (`vero.inference.callers`)."""
    client, server = request.client, request.scope.get("server")
    if client is None or not server or server[1] is None:
        return Peer(local=False, uid=None)
    return peer_of((client.host, client.port), (str(server[0]), int(server[1])))


def _in_network(host: str, network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    try:
        return ipaddress.ip_address(host) in network
    except ValueError:
        return False


def gateway_environment(base_url: str, token: str) -> dict[str, str]:
    """Variables naming the gateway: vero's own and the ones OpenAI's and Anthropic's SDKs (and
    LiteLLM) read, so an unmodified client reaches the gateway with the evaluation's token."""
    openai, anthropic = f"{base_url}/openai/v1", f"{base_url}/anthropic"
    return {
        "VERO_INFERENCE_OPENAI_BASE_URL": openai,
        "VERO_INFERENCE_ANTHROPIC_BASE_URL": anthropic,
        "VERO_INFERENCE_TOKEN": token,
        "OPENAI_BASE_URL": openai,
        "OPENAI_API_BASE": openai,
        "OPENAI_API_KEY": token,
        "ANTHROPIC_BASE_URL": anthropic,
        "ANTHROPIC_API_KEY": token,
    }


def _upstream_url(provider: InferenceProvider, path: str) -> str:
    base = provider.base_url.rstrip("/")
    return f"{base}/v1/messages" if provider.api == "anthropic" else f"{base}{path}"


def _upstream_headers(route: _Route, request: Request) -> dict[str, str]:
    headers = {"content-type": "application/json", "accept": request.headers.get("accept", "application/json")}
    if route.provider.api == "anthropic":
        headers["anthropic-version"] = request.headers.get("anthropic-version", _ANTHROPIC_VERSION)
        if beta := request.headers.get("anthropic-beta"):
            headers["anthropic-beta"] = beta
        if route.key:
            headers["x-api-key"] = route.key
    elif route.key:
        headers["authorization"] = f"Bearer {route.key}"
    return headers


_UNREACHABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol)
"""Failures before anything of the call reached the provider: nothing a candidate sends causes them
(no connection, or a provider URL that cannot be called), so the evaluation measured the provider's
absence, not the candidate (`vero.core.usage.InferenceUsage.unreachable_calls`)."""


def _errno_of(exc: BaseException) -> str:
    """`: <errno name>` of the OS error under an httpx error (e.g. `: ECONNREFUSED`), or ``."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno is not None:
            return ": " + errno.errorcode.get(cause.errno, str(cause.errno))
        cause = cause.__cause__ or cause.__context__
    return ""


async def _read_limited(request: Request, limit: int) -> bytes | None:
    """The request body, or None when it is over `limit` bytes.

    An oversized body is still read to its end (dropped, up to `DRAIN_LIMIT_BYTES`) before the
    413 is sent: a server that closes a connection with unread data resets it, and the caller's
    SDK would see a connection error instead of the answer (`vero.sidecar.app.drain_request_body`
    says the same for the sidecar).
    """
    declared = request.headers.get("content-length")
    too_large = declared is not None and declared.isdigit() and int(declared) > limit
    data = bytearray()
    seen = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > DRAIN_LIMIT_BYTES:
            break
        if not too_large:
            data += chunk
            too_large = len(data) > limit
            if too_large:
                data = bytearray()
    return None if too_large else bytes(data)


def create_gateway_app(
    gateway: InferenceGateway,
    evaluation_id: str | None = None,
    remote_network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None,
    *,
    scope: Scope = "evaluation",
) -> FastAPI:
    """The gateway's FastAPI app (no docs routes: it serves candidates, not people).

    With `evaluation_id`, the app accepts only that evaluation's token (any other: 401): the
    listener a case network reaches (`vero.inference.case_route`) serves one evaluation only, to
    callers from `remote_network` (that network) or its own bound candidate hosts. Without it, only
    bound candidate hosts in this network namespace are served. With `scope="agent"` the app
    serves the coding agent's token only (`InferenceGateway.grant_agent`), whoever calls: it is
    mounted in the sidecar's API, whose guard lets only `main` in."""
    app = FastAPI(title="vero inference gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gateway
    app.state.scope = scope
    app.state.evaluation_id = evaluation_id
    app.state.remote_network = remote_network

    @app.get("/openai/v1/models")
    async def models(request: Request) -> Response:
        return gateway.models_response(request)

    @app.post("/openai/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await gateway.handle(request, "openai", "/chat/completions")

    @app.post("/openai/v1/responses")
    async def responses(request: Request) -> Response:
        return await gateway.handle(request, "openai", "/responses")

    @app.post("/anthropic/v1/messages")
    async def messages(request: Request) -> Response:
        return await gateway.handle(request, "anthropic", "/messages")

    return app


@functools.cache
def _embedded_server_class() -> type[uvicorn.Server]:
    import uvicorn

    class EmbeddedServer(uvicorn.Server):
        """A uvicorn server that leaves the process's signal handlers alone.

        `uvicorn.Server.serve` replaces the SIGINT/SIGTERM handlers while it runs in the main thread
        (uvicorn `server.py`, `capture_signals`); the gateway lives inside the sidecar's or the
        verifier's process, whose own handlers must keep receiving them.
        """

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return EmbeddedServer


class GatewayServer:
    """Serves a gateway with uvicorn on this event loop; `async with` starts and stops it.

    The primary server (no `evaluation_id`) sets `gateway.base_url` and closes the gateway's
    upstream client when it stops; a server for one evaluation (`vero.inference.case_route`) only
    listens, and accepts that evaluation's token only.

    Args:
        gateway: the gateway.
        host: the interface (loopback by default: only processes of this container reach it).
        port: the port (0: a free one; `url` says which).
        evaluation_id: serve this evaluation only (a further listener of a running gateway).
        remote_network: with `evaluation_id`, the network whose other hosts may call (its case
            containers); None: only this network namespace's bound candidate hosts.
    """

    def __init__(
        self,
        gateway: InferenceGateway,
        host: str = "127.0.0.1",
        port: int = 0,
        evaluation_id: str | None = None,
        remote_network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None,
    ) -> None:
        import uvicorn
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        self.gateway = gateway
        self.primary = evaluation_id is None
        self.evaluation_id = evaluation_id
        self._config = uvicorn.Config(
            create_gateway_app(gateway, evaluation_id, remote_network),
            http=gated_protocol(AutoHTTPProtocol, gateway.connections, self._caller),
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        self._server = _embedded_server_class()(self._config)
        self._task: asyncio.Task[None] | None = None
        self.host = host
        self.url: str | None = None
        """`http://host:port` once listening."""

    def _caller(self, client: tuple[str, int] | None, server: tuple[str, int] | None) -> tuple[Hashable, str | None]:
        """Whose connection `client` -> `server` is (`ConnectionGate`): a uid of this network
        namespace, else the calling address; and its evaluation, where one is known."""
        if client is None or server is None:
            return ("unknown",), self.evaluation_id
        peer = peer_of((client[0], int(client[1])), (server[0], int(server[1])))
        if peer.local:
            return ("uid", peer.uid), self.evaluation_id or self.gateway.evaluation_of_host(peer.uid)
        return ("address", client[0]), self.evaluation_id

    async def _serve(self) -> None:
        try:
            await self._server.serve()
        except SystemExit as exc:
            # uvicorn exits the process when it cannot bind (`sys.exit` in its startup): raised in
            # this task, a `SystemExit` would leave the event loop itself (the sidecar's), not
            # only this listener, so it ends here as this listener's failure.
            raise RuntimeError(f"the inference gateway could not listen on {self.host} (exit {exc.code})") from None

    async def __aenter__(self) -> GatewayServer:
        """Start listening; the address is in `url` once this returns.

        Raises:
            RuntimeError: the listener could not bind or did not start within 30 s.
        """
        self._task = asyncio.create_task(self._serve(), name="vero-inference-gateway")
        deadline = time.monotonic() + 30
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the inference gateway did not start")
            if time.monotonic() > deadline:
                raise RuntimeError("the inference gateway did not start within 30 s")
            await asyncio.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        self.url = f"http://{host}:{port}"
        if self.primary:
            self.gateway.base_url = self.url
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self.primary:
            await self.gateway.aclose()
