"""The states of an evaluation job: one definition for the state store, the job records, the
sidecar's models and both agent-side clients (standard library only: the agent's CLI imports it).

A job is `queued`, then `running`, then one of the terminal states: `complete` (measured; charged),
`failed` (no measurement; refunded) or `cancelled` (refunded). `vero.core.jobs.JobState` is the
same list as a `Literal` for type checkers (a test keeps the two equal).
"""

from __future__ import annotations

__all__ = ["JOB_STATES", "TERMINAL_JOB_STATES"]

JOB_STATES: tuple[str, ...] = ("queued", "running", "complete", "failed", "cancelled")
"""Every state, in lifecycle order."""

TERMINAL_JOB_STATES: tuple[str, ...] = ("complete", "failed", "cancelled")
"""States a job never leaves (its reservation is closed in the same transaction)."""
