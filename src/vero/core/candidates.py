"""Candidate store: agent commits imported into a trusted bare Git repository (DESIGN §6).

INTERFACE SKELETON — signatures and docstrings are the contract; bodies are to be implemented.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from vero.errors import CandidateRejected

__all__ = ["CandidateRecord", "CandidateStore", "RESERVED_PATHS"]

RESERVED_PATHS: tuple[str, ...] = (".vero",)
"""Top-level paths a candidate tree may not track."""


class CandidateRecord(BaseModel):
    """Durable description of an imported candidate (`root/candidates/<id>.json`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str = Field(pattern=r"^[0-9a-f]{40}$")
    """Commit object id."""
    parent: str | None
    tree: str
    subject: str
    """First line of the commit message (truncated to 200 characters)."""
    imported_at: datetime


class CandidateStore:
    """A bare repository at `root/candidates.git` plus records at `root/candidates/`.

    Candidates live under `refs/vero/candidates/<id>`; no branch or tag is ever created.
    """

    root: Path
    git_dir: Path

    @classmethod
    def open(cls, root: str | Path) -> "CandidateStore":
        """Open or create the store under `root`."""
        raise NotImplementedError

    async def import_version(self, source_repo: str | Path, version: str) -> CandidateRecord:
        """Import `version` (a commit-ish) from the agent's repository; idempotent.

        Off the event loop; the temporary ref is removed even when the caller is cancelled.

        Raises:
            CandidateRejected: malformed version (empty, NUL, leading `-`, control chars, too long),
                unknown object, not a commit, fetched id mismatch, tree tracking a reserved path, or a
                symlink pointing outside the tree. The store is unchanged.
        """
        raise NotImplementedError

    def import_version_sync(self, source_repo: str | Path, version: str) -> CandidateRecord:
        """Blocking form of `import_version` (for threads and tools)."""
        raise NotImplementedError

    def import_commit_from_store(self, other_git_dir: str | Path, commit: str) -> CandidateRecord:
        """Import a commit from another trusted repository (e.g. the baseline repo); same checks."""
        raise NotImplementedError

    def get(self, candidate_id: str) -> CandidateRecord:
        """Raises KeyError for an unknown id."""
        raise NotImplementedError

    def list(self) -> list[CandidateRecord]:
        """All records, by `imported_at`."""
        raise NotImplementedError

    def checkout(self, candidate_id: str, dest: str | Path) -> Path:
        """Materialize a candidate into a fresh directory `dest` (must not exist) as a detached work tree.

        The result has its own `.git` and does not depend on the agent's repository or the store.
        Raises KeyError for an unknown id.
        """
        raise NotImplementedError
