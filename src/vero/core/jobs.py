"""Durable evaluation jobs (DESIGN §6).

Layout under the state directory (`/var/lib/vero`):

```
jobs/
  index.json        {"schema_version": 1, "ids": [job ids in creation order]}
  ev-<16 hex>.json  one EvaluationJob per file, rewritten atomically on every change
```

Every write goes through `vero.core.storage` (temp file, fsync, rename, directory fsync) in a worker
thread, and memory changes only after the write landed (the recipe is in `vero.core._offloop`).
`create` writes the record before the index, so a crash in between leaves a record the index does
not list; `open` reconciles both directions (records missing from the index are appended in
`created_at` order; index entries without a record are dropped) and rewrites the index.

State machine: `queued` -> `running` -> one of `complete`, `failed`, `cancelled` (a queued job may
also end directly). A terminal state never changes again; other fields of a terminal job may still be
updated (e.g. attaching the result after marking it complete).

On restart the sidecar calls `recover_interrupted`, which fails the jobs that were queued or running
and brings the budget ledger in line with the job records.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vero.core._offloop import SerialCommits
from vero.core.evaluation import EvaluationResult
from vero.core.ladder import LadderDisclosure
from vero.core.ledger import BudgetLedger
from vero.core.storage import atomic_write_json, atomic_write_model, remove_stale_temp_files
from vero.errors import Conflict, LedgerCorrupt, UnknownJob
from vero.spec.models import Disclosure

__all__ = ["EvaluationJob", "JobState", "JobStore", "TERMINAL_STATES", "recover_interrupted"]

JobState = Literal["queued", "running", "complete", "failed", "cancelled"]
TERMINAL_STATES: frozenset[str] = frozenset({"complete", "failed", "cancelled"})

_JOB_ID_PATTERN = r"^ev-[0-9a-f]{16}$"
_INDEX_SCHEMA_VERSION = 1


class EvaluationJob(BaseModel):
    """One evaluation request and its outcome. Written atomically on every change."""

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
    """Generic reason for `failed`/`cancelled`: `interrupted`, `infrastructure`, `cancelled`, `sealed`."""
    result: EvaluationResult | None = None
    """The full trusted result (never sent to the agent as is)."""
    ladder: LadderDisclosure | None = None
    """On a partition in Ladder mode: what was disclosed, recorded in the same write as `complete`
    (`vero.core.ladder`); the agent is shown this, never `result.score`."""


class _JobIndex(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1] = _INDEX_SCHEMA_VERSION
    ids: list[str]


def _read_model[M: BaseModel](path: Path, model: type[M], what: str) -> M:
    try:
        return model.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise LedgerCorrupt(f"{what} {path} cannot be read ({type(exc).__name__})") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "<root>"
        raise LedgerCorrupt(f"{what} {path} is invalid at {where}: {first['msg']}") from None


class JobStore:
    """Jobs under `root/jobs/<id>.json` plus `root/jobs/index.json` (ids in creation order).

    A record is written before the index; `open` reconciles the two after a crash in between
    (records missing from the index are added; index entries without a record are dropped).
    Jobs are frozen models: accessors return the stored snapshots themselves (no copy), which callers
    cannot change; `update` stores a new snapshot.
    """

    root: Path

    def __init__(self, root: Path, jobs: dict[str, EvaluationJob]) -> None:
        """Use `JobStore.open`."""
        self.root = root
        self._jobs = jobs  # insertion order is creation order
        self._commits = SerialCommits()

    @property
    def directory(self) -> Path:
        """`root/jobs`."""
        return self.root / "jobs"

    @property
    def index_path(self) -> Path:
        """`root/jobs/index.json`."""
        return self.directory / "index.json"

    def record_path(self, job_id: str) -> Path:
        """`root/jobs/<job_id>.json`."""
        return self.directory / f"{job_id}.json"

    @classmethod
    def open(cls, root: str | Path) -> "JobStore":
        """Open or create the store. Raises LedgerCorrupt for an unreadable index or record.

        Synchronous file I/O: call it at startup, or through `asyncio.to_thread` from a running loop.

        Reconciles the index with the record files (see the class docstring) and rewrites the index
        when they differed; removes temp files left by writes a crash cut short.

        Raises:
            LedgerCorrupt: the index or a record cannot be read or validated, or a record's file
                name differs from its id.
            OSError: the directory cannot be created or the reconciled index cannot be written.
        """
        store = cls(Path(root), {})
        directory = store.directory
        directory.mkdir(parents=True, exist_ok=True)
        # Temp files of writes cut short by a crash (the sidecar is the store's only writer).
        remove_stale_temp_files(directory)
        records: dict[str, EvaluationJob] = {}
        for path in sorted(directory.glob("ev-*.json")):
            job = _read_model(path, EvaluationJob, "job record")
            if path.name != f"{job.id}.json":
                raise LedgerCorrupt(f"job record {path} holds a job with a different id")
            records[job.id] = job
        index_ids: list[str] = []
        index_exists = store.index_path.exists() or store.index_path.is_symlink()
        if index_exists:
            index_ids = _read_model(store.index_path, _JobIndex, "job index").ids
        ordered = [job_id for job_id in dict.fromkeys(index_ids) if job_id in records]
        listed = set(ordered)
        missing = sorted((job for job_id, job in records.items() if job_id not in listed),
                         key=lambda job: (job.created_at, job.id))
        ordered.extend(job.id for job in missing)
        if not index_exists or ordered != index_ids:
            atomic_write_json(store.index_path, _JobIndex(ids=ordered).model_dump(mode="json"))
        store._jobs = {job_id: records[job_id] for job_id in ordered}
        return store

    @staticmethod
    def new_id() -> str:
        """A fresh `ev-<16 hex>` id."""
        return "ev-" + secrets.token_hex(8)

    async def create(self, job: EvaluationJob) -> EvaluationJob:
        """Persist a new job (record, then index).

        Returns:
            The stored job: a validated copy of `job` (a `model_copy(update=...)` skips validation).

        Raises:
            ValueError: the id exists, or `job` fails validation.
        """
        job = EvaluationJob.model_validate(job.model_dump())

        def step() -> EvaluationJob:
            if job.id in self._jobs:
                raise ValueError("job id already exists")
            atomic_write_model(self.record_path(job.id), job)
            ids = [*self._jobs, job.id]
            atomic_write_json(self.index_path, _JobIndex(ids=ids).model_dump(mode="json"))
            self._jobs = {**self._jobs, job.id: job}
            return job

        return await self._commits.run(step)

    async def update(self, job_id: str, **changes: Any) -> EvaluationJob:
        """Apply field changes and persist atomically.

        Returns:
            The updated job (the new stored snapshot).

        Raises:
            UnknownJob: no job with that id.
            ValueError: a change names an unknown field, changes `id`, or fails validation.
            Conflict: the change moves a terminal job to another state, or a running job back to
                `queued`.
        """
        if "id" in changes:
            raise ValueError("a job's id cannot change")

        def step() -> EvaluationJob:
            current = self._jobs.get(job_id)
            if current is None:
                raise UnknownJob("no evaluation job with that id")
            data = current.model_dump()
            data.update(changes)
            updated = EvaluationJob.model_validate(data)
            if updated.state != current.state:
                if current.state in TERMINAL_STATES:
                    raise Conflict(f"the job is already {current.state}")
                if current.state == "running" and updated.state == "queued":
                    raise Conflict("a running job cannot go back to queued")
            atomic_write_model(self.record_path(job_id), updated)
            self._jobs = {**self._jobs, job_id: updated}
            return updated

        return await self._commits.run(step)

    def get(self, job_id: str) -> EvaluationJob:
        """One job (an immutable snapshot, shared: do not mutate nested results). Raises UnknownJob."""
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJob("no evaluation job with that id")
        return job

    def list(self, principal: str | None = None) -> list[EvaluationJob]:
        """Jobs in creation order, optionally only one principal's (immutable snapshots)."""
        return [job for job in self._jobs.values()
                if principal is None or job.principal == principal]

    def unfinished(self) -> list[EvaluationJob]:
        """Jobs in `queued` or `running`, in creation order (immutable snapshots)."""
        return [job for job in self._jobs.values() if job.state not in TERMINAL_STATES]


async def recover_interrupted(jobs: JobStore, ledger: BudgetLedger, *,
                              reconcile_reservations: bool = True) -> list[EvaluationJob]:
    """After a restart: fail the jobs that were queued or running and refund their reservations.

    Call it once at startup, before the sidecar accepts requests: it treats every open reservation
    and every unfinished job as left over from the previous process. For each unfinished job the
    reservation is refunded first (reason `interrupted`), then the job is marked `failed` with
    error `interrupted`; a crash between the two steps is repaired by the next call. A reservation
    that is unknown, already refunded or already settled is left as it is.

    With `reconcile_reservations` (the default) the ledger is also brought in line with finished
    jobs and with reservations no job owns (a crash between `reserve` and `JobStore.create`, or
    between a job's final update and its settle/refund): an open reservation of a `complete` job is
    settled (`measured`); of a `failed` or `cancelled` job refunded with the job's error (or
    `interrupted`); of no job refunded (`interrupted`). The sidecar should therefore record a job's
    final state before settling or refunding it.

    Idempotent: a second call finds nothing to do and returns an empty list.

    Returns:
        The jobs marked failed by this call (their updated snapshots), in creation order.

    Raises:
        OSError: a record or the ledger could not be written (what was written stays written).
    """
    recovered: list[EvaluationJob] = []
    for job in jobs.unfinished():
        await _close_quietly(ledger, job.reservation_id, "refunded", "interrupted")
        recovered.append(await jobs.update(job.id, state="failed", error="interrupted",
                                           finished_at=datetime.now(UTC)))
    if reconcile_reservations:
        owners = {job.reservation_id: job for job in jobs.list()}
        for reservation in ledger.open_reservations():
            owner = owners.get(reservation.id)
            if owner is not None and owner.state == "complete":
                await _close_quietly(ledger, reservation.id, "settled", "measured")
            else:
                reason = (owner.error if owner is not None else None) or "interrupted"
                await _close_quietly(ledger, reservation.id, "refunded", reason)
    return recovered


async def _close_quietly(ledger: BudgetLedger, reservation_id: str, target: Literal["settled", "refunded"],
                         reason: str) -> None:
    try:
        if target == "settled":
            await ledger.settle(reservation_id, reason)
        else:
            await ledger.refund(reservation_id, reason)
    except (KeyError, ValueError):
        # Unknown, or already closed the other way: nothing left to release.
        pass
