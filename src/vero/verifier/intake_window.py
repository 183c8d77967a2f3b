"""What the sidecar took after the coding agent ended: the intake window, set before the operator.

Intake closes at `main`'s collect hook (`vero.sidecar.intake`), the earliest point Harbor 0.26 lets
vero know the agent phase is over. Between the agent's end and that hook Harbor downloads and
uploads `/logs/agent`, so a process the agent left in `main` can still start an evaluation or
submit (docs/operating.md, "Intake ends with the agent", gives the window as measured). The
verifier cannot tell such late intake apart: nothing Harbor hands it about the agent's end can be
trusted. The host can: Harbor records `agent_execution.finished_at` in the trial's `result.json`
(`harbor/trial/trial.py`, set as the agent's `run` returns or times out). So the verifier records
what the sidecar took and when (`IntakeRecord`, in `finalization.json`), and the operator's readers
(`vero harbor run`, `vero harbor report`) set it beside the agent's end (`after_agent_end`).

Both clocks are the host's under Docker (containers share its kernel clock); on Modal the sidecar
runs on another machine, and the figures are off by the two machines' clock difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vero.core.session import Session

__all__ = [
    "AfterAgentEnd",
    "IntakeRecord",
    "after_agent_end",
    "agent_finished_at",
    "intake_record",
    "trial_after_agent_end",
]


class IntakeRecord(BaseModel):
    """What the sidecar took and when, from the sealed session (`finalization.json`'s `intake`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    closed_at: datetime | None = None
    """When intake closed; every evaluation and the submission predate it. None: the session was
    sealed by a vero that did not record it."""
    closed_by: Literal["agent_ended", "sealed"] | None = None
    """`agent_ended`: `main`'s collect hook; `sealed`: the hook never came and the seal closed it."""
    submitted_at: datetime | None = None
    """When the submission the session holds was accepted (None: nothing was submitted)."""
    admitted_at: list[datetime] = Field(default_factory=list)
    """When each evaluation was admitted (its job's `created_at`), in order."""


def intake_record(session: Session) -> IntakeRecord:
    """The intake record of a verified session (its manifest, jobs and submission)."""
    return IntakeRecord(
        closed_at=session.manifest.intake_closed_at,
        closed_by=session.manifest.intake_closed_by,
        submitted_at=session.submission.submitted_at if session.submission is not None else None,
        admitted_at=sorted(job.created_at for job in session.jobs),
    )


class AfterAgentEnd(BaseModel):
    """The intake record against the agent's end: what was taken after it, in seconds after it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    closed_after_sec: float | None
    """Intake's close, seconds after the agent's end (None when the session does not say)."""
    closed_by: Literal["agent_ended", "sealed"] | None
    evaluations: int
    """Evaluations admitted after the agent's end."""
    submission_after_sec: float | None
    """Seconds after the agent's end at which the submission was accepted; None when it came before
    (or there is none)."""

    @property
    def late(self) -> bool:
        """True when anything was taken after the agent's end."""
        return self.evaluations > 0 or self.submission_after_sec is not None

    def summary(self) -> str:
        """One line: what was taken after the agent's end, and when intake closed."""
        if self.closed_after_sec is None:
            closed = "the session does not say when intake closed"
        else:
            by = "main's hook" if self.closed_by == "agent_ended" else "the seal: main's hook never came"
            closed = f"intake closed {self.closed_after_sec:+.2f} s after it ({by})"
        if not self.late:
            return f"nothing taken after the agent's end; {closed}"
        taken = []
        if self.submission_after_sec is not None:
            taken.append(f"the submission ({self.submission_after_sec:+.2f} s)")
        if self.evaluations:
            taken.append(f"{self.evaluations} evaluation{'s' if self.evaluations != 1 else ''}")
        return f"taken after the agent's end: {', '.join(taken)}; {closed}"


def after_agent_end(record: IntakeRecord, agent_finished: datetime) -> AfterAgentEnd:
    """Set `record` against the agent's end (`agent_finished`, timezone-aware)."""

    def after(moment: datetime) -> float:
        return (moment - agent_finished).total_seconds()

    submitted = record.submitted_at
    return AfterAgentEnd(
        closed_after_sec=after(record.closed_at) if record.closed_at is not None else None,
        closed_by=record.closed_by,
        evaluations=sum(1 for moment in record.admitted_at if moment > agent_finished),
        submission_after_sec=after(submitted) if submitted is not None and submitted > agent_finished else None,
    )


class _Timing(BaseModel):
    finished_at: datetime | None = None


def agent_finished_at(result: Mapping[str, object]) -> datetime | None:
    """The agent's end from a Harbor trial's `result.json` (`agent_execution.finished_at`); None
    when it is absent, unreadable or has no timezone (it would not compare with the session's)."""
    try:
        timing = _Timing.model_validate(result.get("agent_execution") or {})
    except ValidationError:
        return None
    finished = timing.finished_at
    return finished if finished is not None and finished.tzinfo is not None else None


def trial_after_agent_end(
    result: Mapping[str, object], finalization: Mapping[str, object] | None
) -> AfterAgentEnd | None:
    """What a trial's sidecar took after its agent ended, from the trial's `result.json` and the
    verifier's `finalization.json` (as parsed JSON); None when either does not say (no agent end,
    no or an unreadable `intake` record: e.g. a refused session)."""
    finished = agent_finished_at(result)
    raw = (finalization or {}).get("intake")
    if finished is None or not isinstance(raw, Mapping):
        return None
    try:
        record = IntakeRecord.model_validate(raw)
    except ValidationError:
        return None
    return after_agent_end(record, finished)
