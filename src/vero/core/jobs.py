"""Durable evaluation jobs, kept in the state store beside the ledger (docs/architecture.md).

A job is one row of the `jobs` table of `vero.core.state`: its id, owner, partition, state and
reservation as columns (indexed, constrained) and the whole `EvaluationJob` as JSON in `record`
(so a new optional field needs no schema change). Jobs are listed in creation order (`seq`).

State machine: `queued` -> `running` -> one of `complete`, `failed`, `cancelled` (a queued job may
also end directly). A terminal state never changes again; other fields of a terminal job may still
be updated. The job and its reservation change together, each in one transaction:

- `admit`: the reservation and the job record (a job never exists without its reservation, and
  no reservation is left behind by a crash between the two);
- `finish`: the terminal state and the settle (`complete`) or refund (anything else).

So nobody ever observes a terminal job whose reservation is open, or a closed reservation whose job
is unfinished; `vero.core.state` refuses a database where that holds.

On restart the sidecar calls `recover_interrupted`, which fails the jobs that were queued or running
and refunds their reservations, one transaction for all.
"""

from __future__ import annotations

import builtins
import secrets
import sqlite3
import threading
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vero.core.diagnostics import RunDiagnostics
from vero.core.evaluation import EvaluationResult
from vero.core.job_states import TERMINAL_JOB_STATES
from vero.core.ladder import LadderDisclosure
from vero.core.ledger import BudgetLedger, Cost, Reservation
from vero.errors import Conflict, LedgerCorrupt, UnknownJob
from vero.spec.models import Disclosure

__all__ = ["TERMINAL_STATES", "EvaluationJob", "JobPage", "JobState", "JobStore", "recover_interrupted"]

JobState = Literal["queued", "running", "complete", "failed", "cancelled"]
TERMINAL_STATES: frozenset[str] = frozenset(TERMINAL_JOB_STATES)

_JOB_ID_PATTERN = r"^ev-[0-9a-f]{16}$"
_PARSED_CACHE_SIZE = 4096


class EvaluationJob(BaseModel):
    """One evaluation request and its outcome."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(pattern=_JOB_ID_PATTERN)
    principal: str
    partition: str
    cases: list[str]
    full_partition: bool
    version: str
    """The version string as the agent gave it (already validated by the candidate store)."""
    candidate: str = Field(pattern=r"^[0-9a-f]{40}$")
    """Commit id captured before the job was acknowledged."""
    disclosure: Disclosure
    """Tier granted at admission; disclosure later uses the narrower of this and the current config."""
    reservation_id: str
    state: JobState = "queued"
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    inference_charged_micro_usd: int | None = Field(default=None, ge=0)
    """Of a job that measured nothing, the inference money (micro-dollars) that stays charged when
    its reservation is refunded: what its calls were charged when it was cancelled, all of its
    reservation when a restart interrupted it running (what its calls cost died with the process);
    None: nothing (an infrastructure failure gives its model calls back). A complete job is charged
    `result.inference.charged_micro_usd`. At most the job's reservation (`BudgetLedger.charge_in`)."""
    """Generic reason for `failed`/`cancelled`: `interrupted`, `infrastructure`, `cancelled`, `sealed`."""
    result: EvaluationResult | None = None
    """The full trusted result (never sent to the agent as is)."""
    diagnostics: RunDiagnostics | None = None
    """Why a `failed` job measured nothing: case problems, each nested run's output tail, each
    failed trial's exception (trusted, in the session archive, never disclosed). A `complete`
    job's are in `result.diagnostics`."""
    ladder: LadderDisclosure | None = None
    """On a partition in Ladder mode: what was disclosed, recorded in the same write as `complete`
    (`vero.core.ladder`); the agent is shown this, never `result.score`."""


class JobPage(BaseModel):
    """One page of a principal's jobs, newest first."""

    model_config = ConfigDict(frozen=True)
    jobs: list[EvaluationJob]
    next_cursor: str | None
    """The id of the last job of this page when older jobs remain (pass it as `before`), else None."""


class JobStore:
    """The jobs of one state store; mutations are async transactions (`vero.core.state`).

    Jobs are frozen models. Reading a job whose stored record has not changed since it was last
    parsed returns the same object (so callers may cache work per snapshot by identity).

    Args:
        ledger: the budget ledger of the same state store (reservations are closed with the jobs).
    """

    def __init__(self, ledger: BudgetLedger) -> None:
        self.ledger = ledger
        self.state = ledger.state
        self._parsed: OrderedDict[str, tuple[str, EvaluationJob]] = OrderedDict()
        self._parsed_lock = threading.Lock()

    @staticmethod
    def new_id() -> str:
        """A fresh `ev-<16 hex>` id."""
        return "ev-" + secrets.token_hex(8)

    # -- writing --------------------------------------------------------------------------------------

    @staticmethod
    def _insert(conn: sqlite3.Connection, job: EvaluationJob) -> None:
        if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job.id,)).fetchone():
            raise ValueError("job id already exists")
        try:
            conn.execute(
                "INSERT INTO jobs (id, principal, partition, state, reservation_id, record) VALUES (?, ?, ?, ?, ?, ?)",
                (job.id, job.principal, job.partition, job.state, job.reservation_id, job.model_dump_json()),
            )
        except sqlite3.IntegrityError:
            raise ValueError(
                "a job needs an open reservation of its own budget that no other job owns, and starts unfinished"
            ) from None

    async def admit(self, job: EvaluationJob, cost: Cost) -> tuple[EvaluationJob, Reservation]:
        """Reserve `cost` under `job.reservation_id` and record `job`, in one transaction.

        Returns:
            The stored job (validated) and its reservation.

        Raises:
            PolicyDenied, BudgetExhausted: as `BudgetLedger.reserve` (nothing is recorded).
            ValueError: the job or reservation id exists, the job is terminal, or it fails validation.
        """
        job = EvaluationJob.model_validate(job.model_dump())

        def change(conn: sqlite3.Connection) -> tuple[EvaluationJob, Reservation]:
            reservation = self.ledger.reserve_in(conn, job.partition, job.principal, cost, job.reservation_id)
            self._insert(conn, job)
            return job, reservation

        return await self.state.commit(change)

    async def create(self, job: EvaluationJob) -> EvaluationJob:
        """Record a job whose reservation (`job.reservation_id`) is already open.

        Returns:
            The stored job: a validated copy of `job` (a `model_copy(update=...)` skips validation).

        Raises:
            ValueError: the id exists; the reservation is unknown, closed, of another budget or
                owned by another job; the job is terminal; or it fails validation.
        """
        job = EvaluationJob.model_validate(job.model_dump())

        def change(conn: sqlite3.Connection) -> EvaluationJob:
            self._insert(conn, job)
            return job

        return await self.state.commit(change)

    @staticmethod
    def _load(conn: sqlite3.Connection, job_id: str) -> EvaluationJob:
        row = conn.execute("SELECT record FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise UnknownJob("no evaluation job with that id")
        return _parse(row[0])

    @staticmethod
    def _store(conn: sqlite3.Connection, job: EvaluationJob) -> None:
        try:
            conn.execute(
                "UPDATE jobs SET state = ?, record = ? WHERE id = ?", (job.state, job.model_dump_json(), job.id)
            )
        except sqlite3.IntegrityError:
            raise Conflict("the job's state cannot change this way") from None

    async def update(self, job_id: str, **changes: Any) -> EvaluationJob:
        """Apply field changes to a job, in one transaction.

        A job becomes terminal only through `finish` (which closes its reservation with it).

        Returns:
            The updated job.

        Raises:
            UnknownJob: no job with that id.
            ValueError: a change names an unknown field, changes `id`, `principal`, `partition` or
                `reservation_id`, fails validation, or moves the job into a terminal state.
            Conflict: the change moves a terminal job to another state, or a running job back to
                `queued`.
        """
        for fixed in ("id", "principal", "partition", "reservation_id"):
            if fixed in changes:
                raise ValueError(f"a job's {fixed} cannot change")

        def change(conn: sqlite3.Connection) -> EvaluationJob:
            current = self._load(conn, job_id)
            updated = _changed(current, changes)
            if updated.state != current.state:
                if current.state in TERMINAL_STATES:
                    raise Conflict(f"the job is already {current.state}")
                if updated.state in TERMINAL_STATES:
                    raise ValueError("a job finishes through JobStore.finish, which closes its reservation")
                if current.state == "running" and updated.state == "queued":
                    raise Conflict("a running job cannot go back to queued")
            self._store(conn, updated)
            return updated

        return await self.state.commit(change)

    def finish_in(
        self,
        conn: sqlite3.Connection,
        job_id: str,
        state: Literal["complete", "failed", "cancelled"],
        *,
        error: str | None = None,
        result: EvaluationResult | None = None,
        finished_at: datetime | None = None,
        **fields: Any,
    ) -> EvaluationJob:
        """`finish` inside the caller's transaction `conn` (so a caller can record more state, e.g. its
        own table, in the same transaction as the job's end)."""
        if state not in TERMINAL_STATES:
            raise ValueError(f"{state!r} is not a terminal state")
        for fixed in ("id", "principal", "partition", "reservation_id", "state"):
            if fixed in fields:
                raise ValueError(f"finish cannot change the job's {fixed}")
        current = self._load(conn, job_id)
        if current.state in TERMINAL_STATES:
            raise Conflict(f"the job is already {current.state}")
        updates: dict[str, Any] = {**fields, "state": state, "finished_at": finished_at or datetime.now(UTC)}
        if error is not None:
            updates["error"] = error
        if result is not None:
            updates["result"] = result
        finished = _changed(current, updates)
        self._store(conn, finished)
        # Inference money: a complete job is charged what its calls were (at most its reservation);
        # an unmeasured one what its record says stays charged (nothing by default: refunded).
        spent = finished.inference_charged_micro_usd
        if state == "complete":
            usage = finished.result.inference if finished.result is not None else None
            spent = usage.charged_micro_usd if usage is not None else 0
        self.ledger.charge_in(conn, current.reservation_id, "inference_micro_usd", spent or 0)
        if state == "complete":
            self.ledger.close_in(conn, current.reservation_id, "settled", "measured")
        else:
            self.ledger.close_in(conn, current.reservation_id, "refunded", error or state)
        return finished

    async def finish(
        self,
        job_id: str,
        state: Literal["complete", "failed", "cancelled"],
        *,
        error: str | None = None,
        result: EvaluationResult | None = None,
        finished_at: datetime | None = None,
        **fields: Any,
    ) -> EvaluationJob:
        """End a job and close its reservation, in one transaction.

        `complete` settles the reservation (a measurement stays charged, zero scores included) and
        charges the inference money its result says its calls were charged; `failed` and
        `cancelled` refund it with `error` (or the state) as the reason, except the inference money
        the field `inference_charged_micro_usd` says stays charged (default nothing).

        Args:
            job_id: the job.
            state: the terminal state.
            error: the generic reason (`infrastructure`, `interrupted`, `cancelled`, `sealed`).
            result: the trusted full result (`complete`).
            finished_at: when it ended (default: now, aware UTC).
            fields: further `EvaluationJob` fields recorded with the end (e.g. what was disclosed).

        Returns:
            The finished job.

        Raises:
            UnknownJob: no job with that id.
            Conflict: the job has already finished (nothing changes).
            ValueError: `state` is not terminal, or the fields fail validation.
        """
        return await self.state.commit(
            lambda conn: self.finish_in(
                conn,
                job_id,
                state,
                error=error,
                result=result,
                finished_at=finished_at,
                **fields,
            )
        )

    # -- reading --------------------------------------------------------------------------------------

    def _cached(self, job_id: str, record: str) -> EvaluationJob:
        with self._parsed_lock:
            hit = self._parsed.get(job_id)
        if hit is not None and hit[0] == record:
            return hit[1]
        job = _parse(record)
        with self._parsed_lock:
            self._parsed[job_id] = (record, job)
            self._parsed.move_to_end(job_id)
            while len(self._parsed) > _PARSED_CACHE_SIZE:
                self._parsed.popitem(last=False)
        return job

    def get(self, job_id: str) -> EvaluationJob:
        """One job. Raises UnknownJob."""
        row = self.state.read(
            lambda conn: conn.execute("SELECT id, record FROM jobs WHERE id = ?", (job_id,)).fetchone()
        )
        if row is None:
            raise UnknownJob("no evaluation job with that id")
        return self._cached(*row)

    def list(self, principal: str | None = None) -> list[EvaluationJob]:
        """Every job in creation order, optionally only one principal's (reads them all: for exports
        and tools, not for request paths; see `page`)."""
        if principal is None:
            rows = self.state.rows("SELECT id, record FROM jobs ORDER BY seq")
        else:
            rows = self.state.rows("SELECT id, record FROM jobs WHERE principal = ? ORDER BY seq", (principal,))
        return [self._cached(*row) for row in rows]

    def with_field(self, name: str) -> builtins.list[EvaluationJob]:  # `list` is a method here
        """Jobs whose record has the field `name` set (not null), in creation order (e.g. the jobs the
        Ladder judged). Reads only those records.

        Raises:
            ValueError: `name` is not an `EvaluationJob` field.
        """
        if name not in EvaluationJob.model_fields:
            raise ValueError(f"{name!r} is not a job field")
        rows = self.state.rows(
            f"SELECT id, record FROM jobs WHERE json_extract(record, '$.{name}') IS NOT NULL ORDER BY seq"
        )
        return [self._cached(*row) for row in rows]

    def unfinished(self) -> builtins.list[EvaluationJob]:
        """Jobs in `queued` or `running`, in creation order."""
        # The very terms of the partial index `jobs_unfinished` (vero.core.state): a read of the few
        # unfinished jobs, not a scan of the history.
        rows = self.state.rows("SELECT id, record FROM jobs WHERE state IN ('queued', 'running') ORDER BY seq")
        return [self._cached(*row) for row in rows]

    def counts(self, principal: str) -> dict[str, dict[str, int]]:
        """Partition -> state -> number of `principal`'s jobs (states with no job are absent)."""
        counts: dict[str, dict[str, int]] = {}
        for partition, state, n in self.state.rows(
            "SELECT partition, state, count(*) FROM jobs WHERE principal = ? GROUP BY partition, state", (principal,)
        ):
            counts.setdefault(partition, {})[state] = n
        return counts

    def page(
        self,
        principal: str,
        *,
        limit: int,
        before: str | None = None,
        partition: str | None = None,
        state: str | None = None,
    ) -> JobPage:
        """`principal`'s jobs newest first, `limit` at a time, optionally of one partition or state.

        Args:
            principal: whose jobs.
            limit: at most this many (>= 1).
            before: the cursor: list only jobs created before this job (the previous page's
                `next_cursor`); None starts at the newest.
            partition, state: filters.

        Raises:
            UnknownJob: `before` is not one of `principal`'s jobs.
            ValueError: `limit` < 1.
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")

        def query(conn: sqlite3.Connection) -> JobPage:
            where, parameters = ["principal = ?"], [principal]
            if before is not None:
                row = conn.execute(
                    "SELECT seq FROM jobs WHERE id = ? AND principal = ?", (before, principal)
                ).fetchone()
                if row is None:
                    raise UnknownJob("no evaluation job with that id")
                where.append("seq < ?")
                parameters.append(row[0])
            if partition is not None:
                where.append("partition = ?")
                parameters.append(partition)
            if state is not None:
                where.append("state = ?")
                parameters.append(state)
            rows = conn.execute(
                f"SELECT id, record FROM jobs WHERE {' AND '.join(where)} ORDER BY seq DESC LIMIT ?",
                (*parameters, limit + 1),
            ).fetchall()
            jobs = [self._cached(*row) for row in rows[:limit]]
            return JobPage(jobs=jobs, next_cursor=jobs[-1].id if len(rows) > limit else None)

        return self.state.read(query)


def _changed(job: EvaluationJob, changes: dict[str, Any]) -> EvaluationJob:
    data = job.model_dump()
    unknown = set(changes) - set(data)
    if unknown:
        raise ValueError(f"unknown job field(s): {', '.join(sorted(unknown))}")
    data.update(changes)
    return EvaluationJob.model_validate(data)


def _parse(record: str) -> EvaluationJob:
    try:
        return EvaluationJob.model_validate_json(record)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "<root>"
        raise LedgerCorrupt(f"a job record in the state store is invalid at {where}: {first['msg']}") from None


async def recover_interrupted(
    jobs: JobStore, ledger: BudgetLedger | None = None, *, reconcile_reservations: bool = True
) -> list[EvaluationJob]:
    """After a restart: fail the jobs that were queued or running and refund their reservations.

    Call it once at startup, before the sidecar accepts requests: it treats every unfinished job and
    every open reservation as left over from the previous process. In one transaction, each
    unfinished job becomes `failed` with error `interrupted` and its reservation is refunded
    (reason `interrupted`), except the inference money of a job that was running: what its model
    calls cost died with the process, and the provider may bill them, so all of it stays charged;
    with `reconcile_reservations` (the default) an open reservation that no
    job owns (made with `BudgetLedger.reserve` alone) is refunded too.

    Idempotent: a second call finds nothing to do and returns an empty list.

    Args:
        jobs: the job store.
        ledger: ignored (the job store's own ledger is used); kept for callers of the older form.

    Returns:
        The jobs marked failed by this call, in creation order.

    Raises:
        OSError: the transaction could not be written (nothing changed).
    """
    del ledger

    def change(conn: sqlite3.Connection) -> list[EvaluationJob]:
        now = datetime.now(UTC)
        unfinished = conn.execute(
            "SELECT j.id, j.state, coalesce(c.amount, 0) FROM jobs j LEFT JOIN reservation_costs c "
            "ON c.reservation_id = j.reservation_id AND c.resource = 'inference_micro_usd' "
            "WHERE j.state IN ('queued', 'running') ORDER BY j.seq"  # the partial index jobs_unfinished
        ).fetchall()
        recovered = [
            jobs.finish_in(
                conn,
                job_id,
                "failed",
                error="interrupted",
                finished_at=now,
                inference_charged_micro_usd=reserved if state == "running" else 0,
            )
            for job_id, state, reserved in unfinished
        ]
        if reconcile_reservations:
            orphans = [
                rid
                for (rid,) in conn.execute(
                    "SELECT r.id FROM reservations r WHERE r.state = 'reserved' "
                    "AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.reservation_id = r.id) ORDER BY r.seq"
                )
            ]
            for rid in orphans:
                jobs.ledger.close_in(conn, rid, "refunded", "interrupted")
        return recovered

    return await jobs.state.commit(change)
