"""Durable budget ledger per (partition, principal), kept in the state store (docs/architecture.md).

The ledger lives in the `budgets`, `reservations` and `reservation_costs` tables of
`vero.core.state`: one row per (partition, principal, *resource*) with its total, settled and
reserved figures, and every `Reservation` ever made with its cost per resource. Resources are
named (`RESOURCES`: `runs`, `cases`, `inference_micro_usd`); a further dimension is a new name, a
field on `Cost` and `BudgetTotals`, and more rows: the database schema does not change.

Inference money (`inference_micro_usd`) is reserved *up to* its amount (`UP_TO_RESOURCES`): an
evaluation reserves the smaller of its per-evaluation limit and what is left, and its model calls
are held against that reservation alone (`vero.inference.gateway`). What a reservation charges of a
resource when it closes can be set while it is open (`charge_in`): its calls' metered cost, at most
the reserved amount; a reservation closed without one charges all of it when settled and nothing
when refunded.
The invariants (settled + reserved + remaining = total, no negative figure, figures equal the sums
over reservations, one reservation per job) are SQLite constraints and triggers, and are checked
again when the store opens (the budgets against their running totals, the newest rows one by one)
and in full at seal (`vero.core.state`), so a tampered database is refused (`LedgerCorrupt`).

Life of a reservation: `reserve` after every policy check and before the evaluation (cost = 1 run +
the number of selected cases + its inference money); then exactly one of `settle` (a completed
measurement stays charged, zero scores included) or `refund` (cancellation, infrastructure
failure, interruption). Both are idempotent in their own direction and refuse the other direction.
A job's reservation is closed by `vero.core.jobs.JobStore.finish`, in the same transaction as the
job's terminal state; the ledger refuses to close it on its own while the job is unfinished.

Opening: the persisted figures win over the configured totals. Differences are listed in
`config_drift` and never applied. A (partition, principal) pair, or a resource of one, that is
configured but absent from the store is *added* with its configured total and no usage (and
reported in `config_drift`): a partition made agent-accessible by a new config must get a budget,
and adding one cannot hand out anything already spent. Pairs no longer configured are kept.

Every mutation is one transaction of `vero.core.state.StateStore` (off the event loop, completes
even if the caller is cancelled). A caller cancelled during `reserve` does not receive the
`Reservation`; pass your own `reservation_id` so you can refund it.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vero.core.state import StateStore, iso
from vero.errors import BudgetExhausted, PolicyDenied, ReservationConflict, UnknownReservation

__all__ = [
    "AGENT_INFERENCE_PARTITION",
    "RESOURCES",
    "BudgetBalance",
    "BudgetFigures",
    "BudgetLedger",
    "BudgetTotals",
    "Cost",
    "LedgerExport",
    "Reservation",
    "check_ledger_invariants",
]

AGENT_INFERENCE_PARTITION = "@agent"
"""The ledger entry of the coding agent's own model calls (`inference.agent`; one reservation per
call, `vero.sidecar.agent_inference`): not a partition name (those start with a letter or digit)."""
RESOURCES: tuple[str, ...] = ("runs", "cases", "inference_micro_usd")
"""The budget's named resources, in the order a reservation checks them (runs first)."""
UP_TO_RESOURCES: frozenset[str] = frozenset({"inference_micro_usd"})
"""Resources a reservation takes up to its amount (what is left, if less) instead of refusing."""


class _Amounts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def amounts(self) -> dict[str, int]:
        """Resource name -> amount: every field, `RESOURCES` first in their order (a subclass or a
        later version may add resources as fields)."""
        fields = type(self).model_fields
        names = [r for r in RESOURCES if r in fields] + [f for f in fields if f not in RESOURCES]
        return {name: getattr(self, name) for name in names}


class Cost(_Amounts):
    """What an evaluation costs: 1 run plus one case per selected case, and the inference money
    (micro-dollars) its model calls may spend."""

    runs: int = Field(ge=0)
    cases: int = Field(ge=0)
    inference_micro_usd: int = Field(default=0, ge=0)

    @classmethod
    def of_evaluation(cls, n_cases: int, inference_micro_usd: int = 0) -> Cost:
        return cls(runs=1, cases=n_cases, inference_micro_usd=inference_micro_usd)


class BudgetTotals(_Amounts):
    """Configured totals of one (partition, principal) entry."""

    runs: int = Field(ge=0)
    cases: int = Field(ge=0)
    inference_micro_usd: int = Field(default=0, ge=0)

    def amounts(self) -> dict[str, int]:
        """As `_Amounts.amounts`, without inference money when there is none: a budget without
        any has no row for it (its evaluations reserve none)."""
        amounts = super().amounts()
        if not amounts.get("inference_micro_usd"):
            amounts.pop("inference_micro_usd", None)
        return amounts


class Reservation(BaseModel):
    """One reservation; `reserved` until settled (stays charged) or refunded (released)."""

    model_config = ConfigDict(extra="forbid")
    id: str
    partition: str
    principal: str
    cost: Cost
    charged: dict[str, int] = Field(default_factory=dict)
    """Resource -> what closing charges of it, where set (`BudgetLedger.charge_in`); a resource not
    listed is charged its whole cost when settled, nothing when refunded."""
    overrun: dict[str, int] = Field(default_factory=dict)
    """Resource -> what was metered above what it could charge (recorded, never charged: a model
    call billed past its bound, `vero.sidecar.agent_inference`); a resource not listed has none."""
    state: Literal["reserved", "settled", "refunded"]
    created_at: datetime
    closed_at: datetime | None = None
    reason: str | None = None
    """Why it was refunded (`cancelled`, `infrastructure`, `interrupted`) or settled (`measured`)."""


class BudgetFigures(BaseModel):
    """One row of the ledger: a resource of one (partition, principal) budget."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    partition: str
    principal: str
    resource: str
    total: int = Field(ge=0)
    settled: int = Field(ge=0)
    reserved: int = Field(ge=0)

    @property
    def remaining(self) -> int:
        return self.total - self.settled - self.reserved


class BudgetBalance(BaseModel):
    """Figures of one entry. Invariant: settled + reserved + remaining == total, per resource."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    partition: str
    principal: str
    total_runs: int
    total_cases: int
    settled_runs: int
    settled_cases: int
    reserved_runs: int
    reserved_cases: int
    total_inference_micro_usd: int = 0
    settled_inference_micro_usd: int = 0
    reserved_inference_micro_usd: int = 0

    @property
    def remaining_runs(self) -> int:
        return self.total_runs - self.settled_runs - self.reserved_runs

    @property
    def remaining_cases(self) -> int:
        return self.total_cases - self.settled_cases - self.reserved_cases

    @property
    def remaining_inference_micro_usd(self) -> int:
        return self.total_inference_micro_usd - self.settled_inference_micro_usd - self.reserved_inference_micro_usd

    @classmethod
    def from_figures(cls, partition: str, principal: str, figures: Mapping[str, BudgetFigures]) -> BudgetBalance:
        """The balance of one pair from its rows (resource -> figures; a missing resource reads as 0)."""
        values: dict[str, int] = {}
        for resource in RESOURCES:
            row = figures.get(resource)
            values[f"total_{resource}"] = row.total if row else 0
            values[f"settled_{resource}"] = row.settled if row else 0
            values[f"reserved_{resource}"] = row.reserved if row else 0
        return cls(partition=partition, principal=principal, **values)


def balances_of(rows: list[BudgetFigures]) -> list[BudgetBalance]:
    """Group ledger rows into one `BudgetBalance` per (partition, principal), sorted."""
    grouped: dict[tuple[str, str], dict[str, BudgetFigures]] = {}
    for row in rows:
        grouped.setdefault((row.partition, row.principal), {})[row.resource] = row
    return [BudgetBalance.from_figures(*key, grouped[key]) for key in sorted(grouped)]


def check_ledger_invariants(budgets: list[BudgetFigures], reservations: list[Reservation]) -> None:
    """The ledger's invariants over exported rows (the sealed session's reader runs this).

    Raises:
        ValueError: names the first broken invariant: a duplicate budget row or reservation id,
            settled + reserved over a total, a reservation of no budget or resource, closed_at not
            matching the state, or figures that differ from the sums over the reservations.
    """
    sums: dict[tuple[str, str, str], list[int]] = {}
    for row in budgets:
        key = (row.partition, row.principal, row.resource)
        if key in sums:
            raise ValueError("a budget row appears twice")
        if row.remaining < 0:
            raise ValueError("a budget has settled and reserved more than its total")
        sums[key] = [0, 0]
    seen: set[str] = set()
    for reservation in reservations:
        if reservation.id in seen:
            raise ValueError("a reservation id appears twice")
        seen.add(reservation.id)
        if (reservation.state == "reserved") != (reservation.closed_at is None):
            raise ValueError("a reservation's closed_at does not match its state")
        _add_reservation(sums, reservation)
    for row in budgets:
        if [row.settled, row.reserved] != sums[(row.partition, row.principal, row.resource)]:
            raise ValueError("a budget's figures differ from the sum of its reservations")


def _add_reservation(sums: dict[tuple[str, str, str], list[int]], reservation: Reservation) -> None:
    """Add what `reservation` holds (reserved) or charged (closed) to `sums` ([settled, reserved] per
    budget row). Raises ValueError as `check_ledger_invariants`."""
    for resource, amount in reservation.cost.amounts().items():
        key = (reservation.partition, reservation.principal, resource)
        if key not in sums:
            if amount:
                raise ValueError("a reservation belongs to no budget")
            continue
        charged = reservation.charged.get(resource)
        if charged is not None and not 0 <= charged <= amount:
            raise ValueError("a reservation charges more than it reserved")
        if reservation.overrun.get(resource, 0) < 0:
            raise ValueError("a reservation records a negative overrun")
        if reservation.state == "reserved":
            sums[key][1] += amount
        elif charged is not None:
            sums[key][0] += charged
        elif reservation.state == "settled":
            sums[key][0] += amount


class LedgerExport(BaseModel):
    """The ledger as exported (budget rows sorted, reservations in creation order), validated."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    budgets: list[BudgetFigures]
    reservations: list[Reservation]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        check_ledger_invariants(self.budgets, self.reservations)
        return self


def _no_entry() -> PolicyDenied:
    # Generic on purpose: the pair may have been requested with a hidden partition's name.
    return PolicyDenied("no budget is configured for the requested partition")


_RESERVATION_COLUMNS = (
    "r.id, r.partition, r.principal, r.state, r.created_at, r.closed_at, r.reason, "
    "(SELECT json_group_object(c.resource, c.amount) FROM reservation_costs c "
    "WHERE c.reservation_id = r.id), "
    "(SELECT json_group_object(c.resource, c.charged) FROM reservation_costs c "
    "WHERE c.reservation_id = r.id AND c.charged IS NOT NULL), "
    "(SELECT json_group_object(c.resource, c.overrun) FROM reservation_costs c "
    "WHERE c.reservation_id = r.id AND c.overrun > 0)"
)


def _reservation(row: tuple) -> Reservation:
    rid, partition, principal, state, created_at, closed_at, reason, cost, charged, overrun = row
    return Reservation(
        id=rid,
        partition=partition,
        principal=principal,
        cost=Cost(**json.loads(cost or "{}")),
        charged=json.loads(charged or "{}"),
        overrun=json.loads(overrun or "{}"),
        state=state,
        created_at=created_at,
        closed_at=closed_at,
        reason=reason,
    )


def _figures(conn: sqlite3.Connection, where: str = "", parameters: tuple = ()) -> list[BudgetFigures]:
    return [
        BudgetFigures(partition=p, principal=q, resource=r, total=t, settled=s, reserved=v)
        for p, q, r, t, s, v in conn.execute(
            f"SELECT partition, principal, resource, total, settled, reserved FROM budgets {where} "
            "ORDER BY partition, principal, resource",
            parameters,
        )
    ]


class BudgetLedger:
    """The ledger of one state store. Create with `BudgetLedger.open`; mutations are async.

    Attributes:
        state: the state store holding the ledger (shared with the job store and candidates).
        config_drift: human-readable differences between the store and the configured totals.
    """

    state: StateStore
    config_drift: list[str]

    def __init__(self, state: StateStore, config_drift: list[str]) -> None:
        """Use `BudgetLedger.open`."""
        self.state = state
        self.config_drift = config_drift

    @property
    def path(self) -> Path:
        """The state database file."""
        return self.state.path

    @classmethod
    def open(cls, state: StateStore | str | Path, totals: Mapping[tuple[str, str], BudgetTotals]) -> BudgetLedger:
        """The ledger of `state` (a store, or the path of its database), with `totals` configured.

        Configured pairs or resources absent from the store are added with zero usage (one
        transaction); every difference is reported in `config_drift`. Synchronous: call it at
        startup, or through `asyncio.to_thread` from a running loop.

        Raises:
            LedgerCorrupt: the database exists but is refused by `StateStore.open`.
            OSError: the database cannot be created or written.
        """
        store = state if isinstance(state, StateStore) else StateStore.open(state)

        def reconcile(conn: sqlite3.Connection) -> list[str]:
            drift: list[str] = []
            recorded = {(f.partition, f.principal, f.resource): f for f in _figures(conn)}
            pairs = {(p, q) for p, q, _ in recorded}
            for key, configured in sorted(totals.items()):
                label = f"budget of partition {key[0]!r}, principal {key[1]!r}"
                amounts = configured.amounts()
                if key not in pairs and recorded:  # a store's first budgets are no drift
                    drift.append(
                        f"{label}: newly configured ("
                        + ", ".join(f"{r} {a}" for r, a in amounts.items())
                        + "); added with no usage"
                    )
                added = [r for r in amounts if (*key, r) not in recorded]
                for resource in added:
                    conn.execute(
                        "INSERT INTO budgets (partition, principal, resource, total) VALUES (?, ?, ?, ?)",
                        (*key, resource, amounts[resource]),
                    )
                if key in pairs and added:
                    drift.append(f"{label}: resource(s) {', '.join(added)} newly configured; added with no usage")
                kept = {r: recorded[(*key, r)].total for r in amounts if (*key, r) in recorded}
                if key in pairs and any(kept[r] != amounts[r] for r in kept):
                    drift.append(
                        f"{label}: configured "
                        + ", ".join(f"{r} {amounts[r]}" for r in kept)
                        + "; the ledger keeps "
                        + ", ".join(f"{r} {kept[r]}" for r in kept)
                    )
            for key in sorted(pairs - set(totals)):
                drift.append(
                    f"budget of partition {key[0]!r}, principal {key[1]!r}: no longer configured; kept as recorded"
                )
            return drift

        needs_write = any(
            (*key, resource) not in _present(store)
            for key, configured in totals.items()
            for resource in configured.amounts()
        )
        drift = store.commit_sync(reconcile) if needs_write else store.read(reconcile)
        return cls(store, drift)

    # -- mutations (also usable inside a caller's transaction) --------------------------------------

    def reserve_in(
        self, conn: sqlite3.Connection, partition: str, principal: str, cost: Cost, reservation_id: str
    ) -> Reservation:
        """`reserve` inside the caller's transaction `conn` (see `StateStore.commit`).

        Raises:
            As `reserve`.
        """
        remaining = dict(
            conn.execute(
                "SELECT resource, total - settled - reserved FROM budgets WHERE partition = ? AND principal = ?",
                (partition, principal),
            )
        )
        if not remaining:
            raise _no_entry()
        if conn.execute("SELECT 1 FROM reservations WHERE id = ?", (reservation_id,)).fetchone():
            raise ReservationConflict("reservation id already used")
        amounts = cost.amounts()
        for resource, amount in amounts.items():
            if resource not in remaining:
                if amount and resource not in UP_TO_RESOURCES:
                    raise _no_entry()
                amounts[resource] = 0
                continue
            if resource in UP_TO_RESOURCES:
                amounts[resource] = min(amount, remaining[resource])
            elif amount > remaining[resource]:
                raise BudgetExhausted(partition, principal, resource, amount, remaining[resource])
        cost = Cost(**amounts)
        reservation = Reservation(
            id=reservation_id,
            partition=partition,
            principal=principal,
            cost=cost,
            state="reserved",
            created_at=datetime.now(UTC),
        )
        conn.execute(
            "INSERT INTO reservations (id, partition, principal, state, created_at) VALUES (?, ?, ?, 'reserved', ?)",
            (reservation_id, partition, principal, iso(reservation.created_at)),
        )
        conn.executemany(
            "INSERT INTO reservation_costs (reservation_id, partition, principal, resource, amount) "
            "VALUES (?, ?, ?, ?, ?)",
            [(reservation_id, partition, principal, r, a) for r, a in amounts.items() if r in remaining],
        )
        return reservation

    def charge_in(
        self, conn: sqlite3.Connection, reservation_id: str, resource: str, amount: int, overrun: int = 0
    ) -> int:
        """Set what the open reservation charges of `resource` when it closes: `amount`, at most
        what it reserved (returned). A resource it did not reserve charges nothing (0). `overrun`
        (and whatever of `amount` is above the reservation) is recorded as the reservation's
        `overrun` of `resource`: metered, never charged.

        Raises:
            ReservationConflict (a ValueError): the reservation is closed (its charge is final).
        """
        row = conn.execute(
            "SELECT c.amount, r.state FROM reservation_costs c JOIN reservations r ON r.id = c.reservation_id "
            "WHERE c.reservation_id = ? AND c.resource = ?",
            (reservation_id, resource),
        ).fetchone()
        if row is None:
            return 0
        if row[1] != "reserved":
            raise ReservationConflict(f"reservation is already {row[1]}")
        charge = max(0, min(int(amount), row[0]))
        above = max(0, int(overrun)) + max(0, int(amount) - charge)
        conn.execute(
            "UPDATE reservation_costs SET charged = ?, overrun = ? WHERE reservation_id = ? AND resource = ?",
            (charge, above, reservation_id, resource),
        )
        return charge

    def close_in(
        self, conn: sqlite3.Connection, reservation_id: str, target: Literal["settled", "refunded"], reason: str
    ) -> Reservation:
        """`settle` or `refund` inside the caller's transaction `conn`.

        Raises:
            UnknownReservation (a KeyError): unknown reservation. ReservationConflict (a
                ValueError): it was already closed the other way, or it belongs to a job that has
                not finished (close it with `JobStore.finish`).
        """
        row = conn.execute(
            f"SELECT {_RESERVATION_COLUMNS} FROM reservations r WHERE r.id = ?", (reservation_id,)
        ).fetchone()
        if row is None:
            raise UnknownReservation(f"no budget reservation {reservation_id!r}")
        current = _reservation(row)
        if current.state == target:
            return current
        if current.state != "reserved":
            raise ReservationConflict(f"reservation is already {current.state}")
        owner = conn.execute("SELECT state FROM jobs WHERE reservation_id = ?", (reservation_id,)).fetchone()
        if owner is not None and owner[0] not in ("complete", "failed", "cancelled"):
            raise ReservationConflict("the reservation belongs to a job that has not finished")
        closed_at = datetime.now(UTC)
        closed = current.model_copy(update={"state": target, "closed_at": closed_at, "reason": reason})
        conn.execute(
            "UPDATE reservations SET state = ?, closed_at = ?, reason = ? WHERE id = ?",
            (target, iso(closed_at), reason, reservation_id),
        )
        return closed

    async def reserve(
        self, partition: str, principal: str, cost: Cost, reservation_id: str | None = None
    ) -> Reservation:
        """Reserve `cost`; never grants more than the totals under any concurrency.

        Args:
            partition: partition name (already authorized by the policy).
            principal: who pays.
            cost: runs and cases to reserve (`Cost.of_evaluation(n_cases)`).
            reservation_id: the id to use (e.g. the job id); a fresh `rs-<16 hex>` when None.

        Returns:
            The new reservation, state `reserved`.

        Raises:
            PolicyDenied: no entry for (partition, principal) (fail closed).
            BudgetExhausted: a resource would go past its total (checked in `RESOURCES` order).
            ReservationConflict (a ValueError): `reservation_id` is already used.
        """
        rid = reservation_id if reservation_id is not None else "rs-" + secrets.token_hex(8)
        return await self.state.commit(lambda conn: self.reserve_in(conn, partition, principal, cost, rid))

    async def settle(self, reservation_id: str, reason: str = "measured") -> Reservation:
        """Keep a reservation charged (completed measurement, including zero scores). Idempotent.

        Settling an already settled reservation returns it unchanged (its first reason is kept).

        Raises:
            UnknownReservation (a KeyError): unknown reservation. ReservationConflict (a
                ValueError): it was already refunded, or its job has not finished.
        """
        return await self.state.commit(lambda conn: self.close_in(conn, reservation_id, "settled", reason))

    async def refund(self, reservation_id: str, reason: str) -> Reservation:
        """Release a reservation (cancellation, infrastructure failure, interruption). Idempotent.

        Refunding an already refunded reservation returns it unchanged (its first reason is kept).

        Raises:
            UnknownReservation (a KeyError): unknown reservation. ReservationConflict (a
                ValueError): it was already settled, or its job has not finished.
        """
        return await self.state.commit(lambda conn: self.close_in(conn, reservation_id, "refunded", reason))

    # -- reading --------------------------------------------------------------------------------------

    def balance(self, partition: str, principal: str) -> BudgetBalance:
        """Current figures. Raises PolicyDenied for an unknown entry."""
        rows = self.state.read(
            lambda conn: _figures(conn, "WHERE partition = ? AND principal = ?", (partition, principal))
        )
        if not rows:
            raise _no_entry()
        return BudgetBalance.from_figures(partition, principal, {row.resource: row for row in rows})

    def balances(self) -> list[BudgetBalance]:
        """Every entry, sorted by (partition, principal)."""
        return balances_of(self.state.read(_figures))

    def figures(self) -> list[BudgetFigures]:
        """Every ledger row (one per partition, principal and resource), sorted."""
        return self.state.read(_figures)

    def reservation(self, reservation_id: str) -> Reservation:
        """One reservation. Raises UnknownReservation (a KeyError) for an unknown id."""
        row = self.state.read(
            lambda conn: conn.execute(
                f"SELECT {_RESERVATION_COLUMNS} FROM reservations r WHERE r.id = ?", (reservation_id,)
            ).fetchone()
        )
        if row is None:
            raise UnknownReservation(f"no budget reservation {reservation_id!r}")
        return _reservation(row)

    def reservations(self) -> list[Reservation]:
        """Every reservation, in creation order."""
        return [
            _reservation(row)
            for row in self.state.read(
                lambda conn: conn.execute(
                    f"SELECT {_RESERVATION_COLUMNS} FROM reservations r ORDER BY r.seq"
                ).fetchall()
            )
        ]

    def open_reservations(self) -> list[Reservation]:
        """Reservations still `reserved`, in creation order."""
        return [
            _reservation(row)
            for row in self.state.read(
                lambda conn: conn.execute(
                    f"SELECT {_RESERVATION_COLUMNS} FROM reservations r WHERE r.state = 'reserved' ORDER BY r.seq"
                ).fetchall()
            )
        ]

    def snapshot(self) -> LedgerExport:
        """The whole ledger in one read snapshot (validated: it satisfies every invariant)."""

        def read(conn: sqlite3.Connection) -> LedgerExport:
            rows = conn.execute(f"SELECT {_RESERVATION_COLUMNS} FROM reservations r ORDER BY r.seq").fetchall()
            return LedgerExport(budgets=_figures(conn), reservations=[_reservation(row) for row in rows])

        return self.state.read(read)


def _present(store: StateStore) -> set[tuple[str, str, str]]:
    return {tuple(row) for row in store.rows("SELECT partition, principal, resource FROM budgets")}
