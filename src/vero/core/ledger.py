"""Durable budget ledger per (partition, principal) (DESIGN §6).

INTERFACE SKELETON — signatures and docstrings are the contract; bodies are to be implemented.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from vero.errors import BudgetExhausted, LedgerCorrupt, PolicyDenied

__all__ = ["BudgetBalance", "BudgetLedger", "BudgetTotals", "Cost", "Reservation"]


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


class BudgetLedger:
    """The ledger. Create with `BudgetLedger.open`; all mutations are async and serialized.

    Durability: every mutation is written with `vero.core.storage` (temp + fsync + rename) off the
    event loop, shielded from cancellation; the in-memory state changes only after the write
    landed. The persisted file wins over configured totals on open; differences are reported in
    `config_drift`, never applied silently.
    """

    path: Path
    config_drift: list[str]

    @classmethod
    def open(cls, path: str | Path, totals: Mapping[tuple[str, str], BudgetTotals]) -> "BudgetLedger":
        """Load the ledger at `path`, or create it from `totals` (keys are (partition, principal)).

        Raises:
            LedgerCorrupt: the file exists but cannot be read, parsed or validated, or its figures
                break the invariant (refuse to start; never reset).
        """
        raise NotImplementedError

    async def reserve(self, partition: str, principal: str, cost: Cost, reservation_id: str | None = None) -> Reservation:
        """Reserve `cost`; never grants more than the totals under any concurrency.

        Raises:
            PolicyDenied: no entry for (partition, principal) (fail closed).
            BudgetExhausted: runs or cases would go past the total (runs checked first).
        """
        raise NotImplementedError

    async def settle(self, reservation_id: str, reason: str = "measured") -> Reservation:
        """Keep a reservation charged (completed measurement, including zero scores). Idempotent.

        Raises:
            KeyError: unknown reservation. ValueError: it was already refunded.
        """
        raise NotImplementedError

    async def refund(self, reservation_id: str, reason: str) -> Reservation:
        """Release a reservation (cancellation, infrastructure failure, interruption). Idempotent.

        Raises:
            KeyError: unknown reservation. ValueError: it was already settled.
        """
        raise NotImplementedError

    def balance(self, partition: str, principal: str) -> BudgetBalance:
        """Current figures. Raises PolicyDenied for an unknown entry."""
        raise NotImplementedError

    def balances(self) -> list[BudgetBalance]:
        """Every entry, sorted by (partition, principal)."""
        raise NotImplementedError

    def reservation(self, reservation_id: str) -> Reservation:
        """Raises KeyError for an unknown id."""
        raise NotImplementedError

    def open_reservations(self) -> list[Reservation]:
        """Reservations still `reserved`."""
        raise NotImplementedError
