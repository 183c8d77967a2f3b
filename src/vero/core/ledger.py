"""Durable budget ledger per (partition, principal) (DESIGN §6).

The ledger file (`/var/lib/vero/ledger.json`, format `LedgerFile`, schema version 1) holds one
`BudgetBalance` per (partition, principal) and every `Reservation` ever made. The aggregate
figures are redundant with the reservation records on purpose: on open both must agree, so a
file that was edited, truncated or double-counted is detected and the sidecar refuses to start.

Life of a reservation (DESIGN §6): `reserve` after every policy check and before the evaluation
(cost = 1 run + the number of selected cases); then exactly one of `settle` (a completed
measurement stays charged, zero scores included) or `refund` (cancellation, infrastructure failure,
interruption). Both are idempotent in their own direction and refuse the other direction.

Opening: the persisted file wins over the configured totals. Differences are listed in
`config_drift` and never applied. A (partition, principal) pair that is configured but absent from
the file is *added* with its configured totals and no usage (and reported in `config_drift`): a
partition made agent-accessible by a new config must get a budget, and adding one cannot hand out
anything already spent. Pairs in the file but no longer configured are kept (the policy decides
access; the ledger keeps the history).

Concurrency and durability: see `vero.core._offloop`. A mutation computes the new state, writes
the whole file with `vero.core.storage.atomic_write_json` (temp file, fsync, rename, directory
fsync) in a worker thread, and only then replaces the in-memory state, so a failed write changes
nothing and a cancelled caller still leaves memory equal to disk. A caller cancelled during
`reserve` does not receive the `Reservation`; pass your own `reservation_id` so you can refund it.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from vero.core._offloop import SerialCommits
from vero.core.storage import atomic_write_json, remove_stale_temp_files
from vero.errors import BudgetExhausted, LedgerCorrupt, PolicyDenied

__all__ = ["BudgetBalance", "BudgetLedger", "BudgetTotals", "Cost", "LedgerFile", "Reservation", "read_ledger_file"]

LEDGER_SCHEMA_VERSION = 1


class Cost(BaseModel):
    """What an evaluation costs: 1 run plus one case per selected case."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    runs: int = Field(ge=0)
    cases: int = Field(ge=0)

    @classmethod
    def of_evaluation(cls, n_cases: int) -> "Cost":
        return cls(runs=1, cases=n_cases)


class BudgetTotals(BaseModel):
    """Configured totals of one (partition, principal) entry."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    runs: int = Field(ge=0)
    cases: int = Field(ge=0)


class Reservation(BaseModel):
    """One reservation; `reserved` until settled (stays charged) or refunded (released)."""

    model_config = ConfigDict(extra="forbid")
    id: str
    partition: str
    principal: str
    cost: Cost
    state: Literal["reserved", "settled", "refunded"]
    created_at: datetime
    closed_at: datetime | None = None
    reason: str | None = None
    """Why it was refunded (`cancelled`, `infrastructure`, `interrupted`) or settled (`measured`)."""


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

    @property
    def remaining_runs(self) -> int:
        return self.total_runs - self.settled_runs - self.reserved_runs

    @property
    def remaining_cases(self) -> int:
        return self.total_cases - self.settled_cases - self.reserved_cases


class LedgerFile(BaseModel):
    """The persisted ledger (`ledger.json`), validated as a whole.

    Validation enforces, besides the field types: figures are non-negative; settled + reserved never
    exceeds a total; (partition, principal) pairs and reservation ids are unique; every reservation
    belongs to an entry; and each entry's settled and reserved figures equal the sums over its
    reservations in that state (so no reservation is counted twice or lost).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    schema_version: Literal[1] = LEDGER_SCHEMA_VERSION
    entries: list[BudgetBalance]
    """One per (partition, principal), sorted."""
    reservations: list[Reservation]
    """Every reservation, in creation order."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        sums: dict[tuple[str, str], list[int]] = {}
        for entry in self.entries:
            key = (entry.partition, entry.principal)
            if key in sums:
                raise ValueError("a (partition, principal) entry appears twice")
            figures = (entry.total_runs, entry.total_cases, entry.settled_runs, entry.settled_cases,
                       entry.reserved_runs, entry.reserved_cases)
            if min(figures) < 0:
                raise ValueError("an entry has a negative figure")
            if entry.remaining_runs < 0 or entry.remaining_cases < 0:
                raise ValueError("an entry has settled and reserved more than its total")
            sums[key] = [0, 0, 0, 0]
        seen: set[str] = set()
        for reservation in self.reservations:
            if reservation.id in seen:
                raise ValueError("a reservation id appears twice")
            seen.add(reservation.id)
            key = (reservation.partition, reservation.principal)
            if key not in sums:
                raise ValueError("a reservation belongs to no entry")
            if (reservation.state == "reserved") != (reservation.closed_at is None):
                raise ValueError("a reservation's closed_at does not match its state")
            if reservation.state == "settled":
                sums[key][0] += reservation.cost.runs
                sums[key][1] += reservation.cost.cases
            elif reservation.state == "reserved":
                sums[key][2] += reservation.cost.runs
                sums[key][3] += reservation.cost.cases
        for entry in self.entries:
            actual = [entry.settled_runs, entry.settled_cases, entry.reserved_runs, entry.reserved_cases]
            if actual != sums[(entry.partition, entry.principal)]:
                raise ValueError("an entry's figures differ from the sum of its reservations")
        return self


def read_ledger_file(path: str | Path) -> LedgerFile:
    """Read and validate a persisted ledger (also used to read the ledger of a sealed session).

    Raises:
        LedgerCorrupt: the file cannot be read, is not JSON, or fails `LedgerFile` validation. The
            message names the file and the kind of problem, never the file's content.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LedgerCorrupt(f"budget ledger {path} cannot be read ({type(exc).__name__}); "
                            f"refusing to start rather than reset it") from None
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise LedgerCorrupt(f"budget ledger {path} is not valid JSON; refusing to start rather than reset it") from None
    try:
        return LedgerFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "<root>"
        raise LedgerCorrupt(f"budget ledger {path} is invalid at {where}: {first['msg']}; "
                            f"refusing to start rather than reset it") from None


@dataclass(frozen=True)
class _State:
    """An immutable snapshot; mutations build a new one and swap it in after the write."""

    entries: dict[tuple[str, str], BudgetBalance]
    reservations: dict[str, Reservation]

    def to_file(self) -> LedgerFile:
        return LedgerFile.model_construct(
            schema_version=LEDGER_SCHEMA_VERSION,
            entries=[self.entries[key] for key in sorted(self.entries)],
            reservations=list(self.reservations.values()),
        )

    def to_json(self) -> dict:
        return self.to_file().model_dump(mode="json")


def _shift(entry: BudgetBalance, *, settled: Cost | None = None, reserved: Cost | None = None,
           sign: int = 1) -> BudgetBalance:
    update: dict[str, int] = {}
    if settled is not None:
        update["settled_runs"] = entry.settled_runs + sign * settled.runs
        update["settled_cases"] = entry.settled_cases + sign * settled.cases
    if reserved is not None:
        update["reserved_runs"] = entry.reserved_runs + sign * reserved.runs
        update["reserved_cases"] = entry.reserved_cases + sign * reserved.cases
    return entry.model_copy(update=update)


def _no_entry() -> PolicyDenied:
    # Generic on purpose: the pair may have been requested with a hidden partition's name.
    return PolicyDenied("no budget is configured for the requested partition")


class BudgetLedger:
    """The ledger. Create with `BudgetLedger.open`; all mutations are async and serialized.

    Durability: every mutation is written with `vero.core.storage` (temp + fsync + rename) off the
    event loop, shielded from cancellation; the in-memory state changes only after the write
    landed. The persisted file wins over configured totals on open; differences are reported in
    `config_drift`, never applied silently.

    One process owns a ledger file at a time (the sidecar); the object may be used from several
    event loops over its lifetime.
    """

    path: Path
    config_drift: list[str]

    def __init__(self, path: Path, state: _State, config_drift: list[str]) -> None:
        """Use `BudgetLedger.open`."""
        self.path = path
        self.config_drift = config_drift
        self._state = state
        self._commits = SerialCommits()

    @classmethod
    def open(cls, path: str | Path, totals: Mapping[tuple[str, str], BudgetTotals]) -> "BudgetLedger":
        """Load the ledger at `path`, or create it from `totals` (keys are (partition, principal)).

        A missing file is created (with its directory); temp files left by a writer that was killed
        mid-write are removed. A configured pair absent from an existing file
        is added with zero usage and the file rewritten; every difference is reported in
        `config_drift` (human-readable lines for the operator's log). Synchronous file I/O: call it at
        startup, or through `asyncio.to_thread` from a running loop.

        Raises:
            LedgerCorrupt: the file exists but cannot be read, parsed or validated, or its figures
                break the invariant (refuse to start; never reset).
            OSError: the ledger cannot be created or updated (directory not writable, disk full).
        """
        path = Path(path)
        drift: list[str] = []
        # Safe because one process owns the ledger: no other writer can be half-way through a write.
        remove_stale_temp_files(path.parent, path.name)
        if path.exists() or path.is_symlink():
            loaded = read_ledger_file(path)
            entries = {(e.partition, e.principal): e for e in loaded.entries}
            reservations = {r.id: r for r in loaded.reservations}
            changed = False
            for key, configured in sorted(totals.items()):
                entry = entries.get(key)
                label = f"budget of partition {key[0]!r}, principal {key[1]!r}"
                if entry is None:
                    entries[key] = cls._fresh_entry(key, configured)
                    changed = True
                    drift.append(f"{label}: newly configured (runs {configured.runs}, cases "
                                 f"{configured.cases}); added with no usage")
                elif (entry.total_runs, entry.total_cases) != (configured.runs, configured.cases):
                    drift.append(f"{label}: configured runs {configured.runs}, cases {configured.cases}; "
                                 f"the ledger keeps runs {entry.total_runs}, cases {entry.total_cases}")
            for key in sorted(set(entries) - set(totals)):
                drift.append(f"budget of partition {key[0]!r}, principal {key[1]!r}: no longer configured; "
                             f"kept as recorded")
            state = _State(entries, reservations)
            if changed:
                atomic_write_json(path, state.to_json())
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            state = _State({key: cls._fresh_entry(key, value) for key, value in totals.items()}, {})
            atomic_write_json(path, state.to_json())
        return cls(path, state, drift)

    @staticmethod
    def _fresh_entry(key: tuple[str, str], totals: BudgetTotals) -> BudgetBalance:
        return BudgetBalance(partition=key[0], principal=key[1], total_runs=totals.runs,
                             total_cases=totals.cases, settled_runs=0, settled_cases=0,
                             reserved_runs=0, reserved_cases=0)

    async def _commit[T](self, plan: Callable[[_State], tuple[_State | None, T]]) -> T:
        """Run `plan` on the current state; persist and swap in the state it returns (None: no change)."""

        def step() -> T:
            new_state, value = plan(self._state)
            if new_state is not None:
                atomic_write_json(self.path, new_state.to_json())
                self._state = new_state
            return value

        return await self._commits.run(step)

    async def reserve(self, partition: str, principal: str, cost: Cost, reservation_id: str | None = None) -> Reservation:
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
            BudgetExhausted: runs or cases would go past the total (runs checked first).
            ValueError: `reservation_id` is already used.
        """
        rid = reservation_id if reservation_id is not None else "rs-" + secrets.token_hex(8)

        def plan(state: _State) -> tuple[_State, Reservation]:
            key = (partition, principal)
            entry = state.entries.get(key)
            if entry is None:
                raise _no_entry()
            if rid in state.reservations:
                raise ValueError("reservation id already used")
            if cost.runs > entry.remaining_runs:
                raise BudgetExhausted(partition, principal, "runs", cost.runs, entry.remaining_runs)
            if cost.cases > entry.remaining_cases:
                raise BudgetExhausted(partition, principal, "cases", cost.cases, entry.remaining_cases)
            reservation = Reservation(id=rid, partition=partition, principal=principal, cost=cost,
                                      state="reserved", created_at=datetime.now(UTC))
            entries = dict(state.entries)
            entries[key] = _shift(entry, reserved=cost)
            reservations = dict(state.reservations)
            reservations[rid] = reservation
            return _State(entries, reservations), reservation

        return (await self._commit(plan)).model_copy()

    async def _close(self, reservation_id: str, target: Literal["settled", "refunded"], reason: str) -> Reservation:
        def plan(state: _State) -> tuple[_State | None, Reservation]:
            current = state.reservations.get(reservation_id)
            if current is None:
                raise KeyError(reservation_id)
            if current.state == target:
                return None, current
            if current.state != "reserved":
                raise ValueError(f"reservation is already {current.state}")
            closed = current.model_copy(update={"state": target, "closed_at": datetime.now(UTC), "reason": reason})
            key = (current.partition, current.principal)
            entry = _shift(state.entries[key], reserved=current.cost, sign=-1)
            if target == "settled":
                entry = _shift(entry, settled=current.cost)
            entries = dict(state.entries)
            entries[key] = entry
            reservations = dict(state.reservations)
            reservations[reservation_id] = closed
            return _State(entries, reservations), closed

        return (await self._commit(plan)).model_copy()

    async def settle(self, reservation_id: str, reason: str = "measured") -> Reservation:
        """Keep a reservation charged (completed measurement, including zero scores). Idempotent.

        Settling an already settled reservation returns it unchanged (its first reason is kept).

        Raises:
            KeyError: unknown reservation. ValueError: it was already refunded.
        """
        return await self._close(reservation_id, "settled", reason)

    async def refund(self, reservation_id: str, reason: str) -> Reservation:
        """Release a reservation (cancellation, infrastructure failure, interruption). Idempotent.

        Refunding an already refunded reservation returns it unchanged (its first reason is kept).

        Raises:
            KeyError: unknown reservation. ValueError: it was already settled.
        """
        return await self._close(reservation_id, "refunded", reason)

    def balance(self, partition: str, principal: str) -> BudgetBalance:
        """Current figures. Raises PolicyDenied for an unknown entry."""
        entry = self._state.entries.get((partition, principal))
        if entry is None:
            raise _no_entry()
        return entry

    def balances(self) -> list[BudgetBalance]:
        """Every entry, sorted by (partition, principal)."""
        entries = self._state.entries
        return [entries[key] for key in sorted(entries)]

    def reservation(self, reservation_id: str) -> Reservation:
        """A copy of one reservation. Raises KeyError for an unknown id."""
        return self._state.reservations[reservation_id].model_copy()

    def reservations(self) -> list[Reservation]:
        """Copies of every reservation, in creation order."""
        return [r.model_copy() for r in self._state.reservations.values()]

    def open_reservations(self) -> list[Reservation]:
        """Reservations still `reserved`, in creation order (copies)."""
        return [r.model_copy() for r in self._state.reservations.values() if r.state == "reserved"]

    def snapshot(self) -> LedgerFile:
        """The in-memory ledger in its file format (equal to what `read_ledger_file` returns for `path`)."""
        return LedgerFile.model_validate(self._state.to_json())
