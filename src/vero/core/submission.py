"""The submission: the version the agent asked the verifier to score (`POST /submissions`).

Kept as the single row of the state store's `submission` table (`vero.core.state`); the last
submission wins. The candidate must already be recorded (a foreign key to `candidates`).
"""

from __future__ import annotations

import sqlite3
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from vero.core.state import StateStore, iso

__all__ = ["Submission", "read_submission", "record_submission"]


class Submission(BaseModel):
    """The version the agent asked to be scored; the last one wins."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    candidate: str = Field(pattern=r"^[0-9a-f]{40}$")
    version: str
    submitted_at: datetime


def read_submission(state: StateStore) -> Submission | None:
    """The recorded submission, or None."""
    rows = state.rows("SELECT candidate, version, submitted_at FROM submission")
    if not rows:
        return None
    candidate, version, submitted_at = rows[0]
    return Submission(candidate=candidate, version=version, submitted_at=submitted_at)


async def record_submission(state: StateStore, submission: Submission) -> Submission:
    """Record `submission` (replacing any earlier one), in one transaction.

    Raises:
        ValueError: the candidate is not recorded in the store.
    """

    def change(conn: sqlite3.Connection) -> Submission:
        try:
            conn.execute(
                "INSERT INTO submission (slot, candidate, version, submitted_at) VALUES (1, ?, ?, ?) "
                "ON CONFLICT (slot) DO UPDATE SET candidate = excluded.candidate, "
                "version = excluded.version, submitted_at = excluded.submitted_at",
                (submission.candidate, submission.version, iso(submission.submitted_at)),
            )
        except sqlite3.IntegrityError:
            raise ValueError("the submitted candidate is not recorded") from None
        return submission

    return await state.commit(change)
