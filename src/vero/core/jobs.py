"""Durable evaluation jobs (DESIGN §6).

INTERFACE SKELETON — signatures and docstrings are the contract; bodies are to be implemented.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from vero.core.evaluation import EvaluationResult
from vero.errors import LedgerCorrupt, UnknownJob
from vero.spec.models import Disclosure

__all__ = ["EvaluationJob", "JobState", "JobStore", "TERMINAL_STATES"]

JobState = Literal["queued", "running", "complete", "failed", "cancelled"]
TERMINAL_STATES: frozenset[str] = frozenset({"complete", "failed", "cancelled"})


class EvaluationJob(BaseModel):
    """One evaluation request and its outcome. Written atomically on every change."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^ev-[0-9a-f]{16}$")
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


class JobStore:
    """Jobs under `root/jobs/<id>.json` plus `root/jobs/index.json` (ids in creation order).

    A record is written before the index; `open` reconciles the two after a crash in between
    (records missing from the index are added; index entries without a record are dropped).
    """

    root: Path

    @classmethod
    def open(cls, root: str | Path) -> "JobStore":
        """Open or create the store. Raises LedgerCorrupt for an unreadable index or record."""
        raise NotImplementedError

    @staticmethod
    def new_id() -> str:
        """A fresh `ev-<16 hex>` id."""
        raise NotImplementedError

    async def create(self, job: EvaluationJob) -> EvaluationJob:
        """Persist a new job (record, then index). Raises ValueError if the id exists."""
        raise NotImplementedError

    async def update(self, job_id: str, **changes) -> EvaluationJob:
        """Apply field changes and persist atomically. Raises UnknownJob."""
        raise NotImplementedError

    def get(self, job_id: str) -> EvaluationJob:
        """Raises UnknownJob."""
        raise NotImplementedError

    def list(self, principal: str | None = None) -> list[EvaluationJob]:
        """Jobs in creation order, optionally only one principal's."""
        raise NotImplementedError

    def unfinished(self) -> list[EvaluationJob]:
        """Jobs in `queued` or `running`."""
        raise NotImplementedError
