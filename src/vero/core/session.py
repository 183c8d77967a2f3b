"""The sealed session archive: what the sidecar hands to the verifier (docs/architecture.md).

INTERFACE SKELETON — signatures and docstrings are the contract; bodies are to be implemented.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from vero.core.candidates import CandidateRecord
from vero.core.jobs import EvaluationJob
from vero.core.ledger import BudgetBalance
from vero.errors import SessionInvalid

__all__ = ["SealManifest", "Session", "Submission", "read_session", "write_session_archive"]


class Submission(BaseModel):
    """The version the agent asked to be scored (`POST /submissions`); the last one wins."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    candidate: str = Field(pattern=r"^[0-9a-f]{40}$")
    version: str
    submitted_at: datetime


class SealManifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    schema_version: int = 1
    name: str
    spec_digest: str
    baseline_commit: str
    sealed_at: datetime
    files: dict[str, str]
    """Relative path -> `sha256:<hex>` for every other file in the archive."""


class Session(BaseModel):
    """A verified, extracted session."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    root: Path
    """Extraction directory (holds `candidates.git`, a bare repo with the bundle's refs)."""
    manifest: SealManifest
    candidates: list[CandidateRecord]
    jobs: list[EvaluationJob]
    balances: list[BudgetBalance]
    submission: Submission | None

    @property
    def git_dir(self) -> Path:
        return self.root / "candidates.git"


def write_session_archive(state_dir: str | Path, dest: str | Path, *, name: str, spec_digest: str,
                          baseline_commit: str, sealed_at: datetime) -> str:
    """Pack the sidecar state under `state_dir` into the canonical archive `dest`; write `dest.sha256`.

    Returns the archive's sha256 hex digest. Same state and `sealed_at` -> same bytes.
    """
    raise NotImplementedError


def read_session(archive: str | Path, dest: str | Path, *, spec_digest: str,
                 baseline_commit: str) -> Session:
    """Check and extract a sealed archive into `dest`.

    Raises:
        SessionInvalid: missing or mismatching `.sha256`, a file digest mismatch, a different
            `spec_digest` or `baseline_commit`, unsafe entries, or unreadable records.
    """
    raise NotImplementedError
