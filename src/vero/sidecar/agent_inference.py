"""The coding agent's producer scope: its own model calls through the sidecar's gateway, metered
and capped in the budget ledger (docs/inference.md, "The coding agent's own calls").

`vero harbor run` mints the agent's token on the host and gives it to `main` alone (Harbor's
agent environment, `--ae`); the sidecar gets only its SHA-256 (`AGENT_TOKEN_DIGEST_ENV`), so
nothing the sidecar holds, and nothing `main` can read but the token itself, yields the token.
The gateway serves the scope at `/inference` of the sidecar's API (`AgentInferenceMount`), behind
the API's guard, so only `main` reaches it; candidate hosts are fenced off the API's port.

Money: the ledger entry (`AGENT_INFERENCE_PARTITION`, the agent's principal) holds
`inference.agent.total_usd` as `inference_micro_usd`. Each call's whole bound is reserved in the
ledger before it is forwarded and settled at what it was charged when it ends
(`LedgerCallJournal`), at most its bound: what the provider billed above it (a model's
`unbounded_call_usd`, a tier the provider chose) is recorded with the call as its `overrun`, shown
beside the spend (`/status`, `finalization.json`, the job report); a restart settles calls left
open at their whole bound
(`settle_interrupted_agent_calls`: the provider may bill a call it took), so a restart never hands
spent money back.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from typing import TYPE_CHECKING

from starlette.types import Receive, Scope, Send

from vero.core.ledger import AGENT_INFERENCE_PARTITION, BudgetLedger, BudgetTotals, Cost
from vero.inference.pricing import to_micro_usd
from vero.sidecar.errors import problem_response
from vero.sidecar.models import AgentInferenceView
from vero.spec.compiled import AGENT_INFERENCE_PATH, AGENT_TOKEN_DIGEST_ENV, SidecarConfig
from vero.spec.models import AgentInference

if TYPE_CHECKING:
    from vero.inference.gateway import InferenceGateway

__all__ = [
    "AGENT_INFERENCE_PATH",
    "AGENT_TOKEN_DIGEST_ENV",
    "AgentInferenceMount",
    "LedgerCallJournal",
    "agent_budget_totals",
    "agent_inference_view",
    "agent_scope",
    "open_agent_scope",
    "settle_interrupted_agent_calls",
]

_logger = logging.getLogger("vero.sidecar")


def agent_scope(config: SidecarConfig) -> AgentInference | None:
    """`inference.agent` of `config`, if any."""
    return config.inference.agent if config.inference is not None else None


def agent_budget_totals(agent: AgentInference | None, principal: str) -> dict[tuple[str, str], BudgetTotals]:
    """The ledger entry of the agent's scope (none without `inference.agent`)."""
    if agent is None:
        return {}
    return {
        (AGENT_INFERENCE_PARTITION, principal): BudgetTotals(
            runs=0, cases=0, inference_micro_usd=to_micro_usd(agent.total_usd)
        )
    }


def agent_inference_view(ledger: BudgetLedger, principal: str) -> AgentInferenceView | None:
    """`GET /status`'s `agent_inference`: the agent's entry of the ledger (None without one)."""
    figures = [
        f
        for f in ledger.figures()
        if f.partition == AGENT_INFERENCE_PARTITION and f.principal == principal and f.resource == "inference_micro_usd"
    ]
    if not figures:
        return None
    money = figures[0]
    calls, overrun = ledger.state.read(
        lambda conn: conn.execute(
            "SELECT count(*), coalesce(sum(c.overrun), 0) FROM reservations r LEFT JOIN reservation_costs c "
            "ON c.reservation_id = r.id AND c.resource = 'inference_micro_usd' "
            "WHERE r.partition = ? AND r.principal = ?",
            (AGENT_INFERENCE_PARTITION, principal),
        ).fetchone()
    )
    return AgentInferenceView(
        total_usd=money.total / 1e6,
        spent_usd=money.settled / 1e6,
        remaining_usd=money.remaining / 1e6,
        overrun_usd=int(overrun) / 1e6,
        calls=int(calls),
    )


class LedgerCallJournal:
    """`vero.inference.gateway.CallJournal` on the budget ledger: one reservation per call.

    Args:
        ledger: the sidecar's ledger.
        principal: the agent's principal (the entry's).
    """

    def __init__(self, ledger: BudgetLedger, principal: str) -> None:
        self.ledger = ledger
        self.principal = principal
        self._pending: set[asyncio.Task[None]] = set()

    async def opened(self, call_id: str, held_micro_usd: int) -> None:
        """Reserve the call's bound (one transaction).

        Raises:
            OSError: the store could not be written, or it holds less than the bound (the
                gateway refuses the call).
        """
        # Settlements already made in memory first: the gateway's pool is then never ahead of
        # the ledger, so the ledger can reserve the whole bound (a commit of this call could
        # otherwise overtake a settlement task that has not started yet).
        await self.written()
        cost = Cost(runs=0, cases=0, inference_micro_usd=held_micro_usd)
        reservation = await self.ledger.state.commit(
            lambda conn: self.ledger.reserve_in(conn, AGENT_INFERENCE_PARTITION, self.principal, cost, call_id)
        )
        if reservation.cost.inference_micro_usd < held_micro_usd:
            # The ledger has less left than the gateway thought (never expected): fail closed.
            await self.ledger.state.commit(lambda conn: self.ledger.close_in(conn, call_id, "refunded", "unreserved"))
            raise OSError("the ledger could not reserve the call's whole bound")

    def closed(self, call_id: str, charged_micro_usd: int, overrun_micro_usd: int = 0) -> None:
        """Settle the call's reservation at `charged_micro_usd`, recording `overrun_micro_usd`
        (what the provider billed above it) with it, in a task of its own (the state store
        completes a commit even if its awaiter is cancelled; `drain` waits for them)."""

        def settle(conn: sqlite3.Connection) -> None:
            self.ledger.charge_in(conn, call_id, "inference_micro_usd", charged_micro_usd, overrun_micro_usd)
            self.ledger.close_in(conn, call_id, "settled", "metered")

        task = asyncio.get_running_loop().create_task(self._commit(call_id, settle))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _commit(self, call_id: str, change) -> None:
        try:
            await self.ledger.state.commit(change)
        except Exception as exc:  # noqa: BLE001 - the next start settles it at its whole bound
            _logger.error("the agent's call %s was not settled (%s)", call_id, type(exc).__name__)

    async def written(self) -> None:
        """Wait for the settlements pending now, not for later ones (a read after a call's answer
        then sees its charge, and a stream of new calls cannot hold the reader)."""
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def drain(self) -> None:
        """Wait for every settlement written so far (the seal exports the ledger after this)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)


async def settle_interrupted_agent_calls(ledger: BudgetLedger, principal: str) -> int:
    """At start, before jobs are recovered: settle the agent's calls a stopped process left open,
    each at its whole bound (the provider may bill a call it took). Returns how many."""

    def change(conn: sqlite3.Connection) -> int:
        rows = conn.execute(
            "SELECT id FROM reservations WHERE state = 'reserved' AND partition = ? AND principal = ?",
            (AGENT_INFERENCE_PARTITION, principal),
        ).fetchall()
        for (call_id,) in rows:
            ledger.close_in(conn, call_id, "settled", "interrupted")
        return len(rows)

    settled = await ledger.state.commit(change)
    if settled:
        _logger.warning("%d call(s) of the agent were interrupted by a restart: charged their bound", settled)
    return settled


def open_agent_scope(
    gateway: InferenceGateway, agent: AgentInference, ledger: BudgetLedger, principal: str, token_sha256: str | None
) -> LedgerCallJournal | None:
    """Open the agent's scope on `gateway` with what is left of its ledger entry; None (scope
    closed, logged) when the sidecar was given no token digest (a task run without
    `vero harbor run`: the agent then has no gateway).

    Raises:
        ValueError: the digest is malformed.
    """
    if not token_sha256:
        _logger.warning(
            "inference.agent is set but no agent token was given (%s): no agent gateway", AGENT_TOKEN_DIGEST_ENV
        )
        return None
    balance = ledger.balance(AGENT_INFERENCE_PARTITION, principal)
    journal = LedgerCallJournal(ledger, principal)
    gateway.grant_agent(
        token_sha256, agent.models, limit_micro_usd=balance.remaining_inference_micro_usd, journal=journal
    )
    _logger.info(
        "agent gateway open at %s: %d model(s), %.6f USD left",
        AGENT_INFERENCE_PATH,
        len(agent.models),
        balance.remaining_inference_micro_usd / 1e6,
    )
    return journal


class AgentInferenceMount:
    """The ASGI app mounted at `AGENT_INFERENCE_PATH`: the gateway's agent-scope app once the
    job runner has opened it (`vero.sidecar.runner.JobRunner.serve_gateway`), else 404 (no
    `inference.agent`, or no token given)."""

    def __init__(self, runner: object) -> None:
        self.runner = runner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = getattr(self.runner, "agent_inference_app", None)
        if app is None:
            if scope["type"] == "http":
                await problem_response(404, "the coding agent has no inference gateway")(scope, receive, send)
            return
        await app(scope, receive, send)
