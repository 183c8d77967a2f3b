"""Evaluation results: what a nested Harbor run measured, in vero's terms.

A case is one inner Harbor task; an attempt is one Harbor trial of it. A trial without a valid
reward (no `verifier_result`, `reward_valid` false, or no value under the reward key) is a *dead
attempt*: it scores the spec's failure value and stays in the mean, never dropped (HARBOR-NOTES
§8 rows 4-5: dropping them biased scores). Scores are in the reward's own units.
"""

from __future__ import annotations

from datetime import datetime
from statistics import fmean

from pydantic import BaseModel, ConfigDict

from vero.core.usage import InferenceUsage

__all__ = ["AttemptResult", "CaseResult", "EvaluationResult"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AttemptResult(_Record):
    """One Harbor trial of a case (from the trial's `result.json`)."""

    trial_name: str
    reward: float | None = None
    """The value under the reward key; None for a dead attempt."""
    exception_type: str | None = None
    """`exception_info.exception_type` of the trial, if any (an attempt may have both a reward and one)."""

    @property
    def dead(self) -> bool:
        return self.reward is None


class CaseResult(_Record):
    """All attempts of one case and their score."""

    case: str
    attempts: list[AttemptResult]
    score: float
    """Mean over attempts, dead attempts counted as the failure value."""

    @property
    def n_dead(self) -> int:
        return sum(1 for a in self.attempts if a.dead)

    @classmethod
    def from_attempts(cls, case: str, attempts: list[AttemptResult], failure_value: float) -> CaseResult:
        """Score a case; a case with no attempt at all scores `failure_value`."""
        values = [failure_value if a.reward is None else a.reward for a in attempts] or [failure_value]
        return cls(case=case, attempts=attempts, score=fmean(values))


class EvaluationResult(_Record):
    """The measurement of one candidate on a set of cases of one partition."""

    partition: str
    candidate: str
    """Commit id of the measured candidate."""
    reward_key: str
    cases: list[CaseResult]
    score: float
    """Mean of the case scores."""
    started_at: datetime
    finished_at: datetime
    job_dir: str | None = None
    """The nested Harbor job directory (trusted side only; never disclosed)."""
    infra_retries: int = 0
    """How many times the nested run was retried for infrastructure reasons before this result."""
    inference: InferenceUsage | None = None
    """Model calls of the evaluation, metered by the inference gateway (None without a gateway)."""

    @property
    def n_cases(self) -> int:
        return len(self.cases)

    @property
    def n_attempts(self) -> int:
        return sum(len(c.attempts) for c in self.cases)

    @property
    def n_dead(self) -> int:
        return sum(c.n_dead for c in self.cases)

    @classmethod
    def from_cases(cls, *, partition: str, candidate: str, reward_key: str, cases: list[CaseResult],
                   started_at: datetime, finished_at: datetime, **extra) -> EvaluationResult:
        """Build a result whose score is the mean of `cases` (which must not be empty)."""
        if not cases:
            raise ValueError("an evaluation result needs at least one case")
        return cls(partition=partition, candidate=candidate, reward_key=reward_key, cases=cases,
                   score=fmean(c.score for c in cases), started_at=started_at,
                   finished_at=finished_at, **extra)

