"""Ladder disclosure: aggregate scores that resist adaptive overfitting of a holdout partition.

After Blum & Hardt 2015, "The Ladder: A Reliable Leaderboard for Machine Learning Competitions"
(ICML 2015; arXiv:1502.04585), Algorithm 1: a leaderboard that answers every submission with the
best score so far, and moves only when a submission beats it by at least a step `eta`, reported
rounded to a multiple of `eta`. An analyst who adapts to the answers then learns little beyond
the sequence of significant improvements, so repeated evaluations on one holdout cannot be used to
fit it the way plain scores can (the adaptive-overfitting problem behind public/private
leaderboards; see also Dwork et al. 2015, "The reusable holdout", Science 349).

vero's rule (`LadderSpec`: `margin`, `precision` <= `margin`), kept per (principal, partition,
selected cases) since scores over different case sets are not comparable:

- The first finite score is disclosed, rounded to a multiple of `precision`.
- A later score is disclosed (rounded) only when it beats the best disclosed value by at least
  `margin` in the scoring direction (`maximize`: `score >= best + margin`; `minimize`:
  `score <= best - margin`); otherwise the answer is the best disclosed value, marked
  `improved=False`. A non-improving score is never disclosed.
- A non-finite score never improves.

Comparisons and rounding are exact over the decimal values of the floats (`fractions.Fraction` of
their shortest repr), so a margin of 0.1 means 0.1. Since `precision <= margin`, each improvement
moves the disclosed value by at least one `precision` step: over a score range `R`, at most
`R / precision` improvements can ever be disclosed per key.

The decision is recorded on the job in the same durable write as its terminal state
(`EvaluationJob.ladder`), so `LadderBoard.rebuild` restores every best after a restart; the trusted
full measurement stays in `EvaluationJob.result` for the verifier.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction

from pydantic import BaseModel, ConfigDict

from vero.spec.models import Direction, LadderSpec

__all__ = ["LadderBoard", "LadderDisclosure", "LadderKey", "ladder_step", "round_to_precision"]

LadderKey = tuple[str, str, tuple[str, ...]]
"""(principal, partition, selected cases in partition order): one ladder each."""


class LadderDisclosure(BaseModel):
    """What the Ladder disclosed for one evaluation (durable, on the job record)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    score: float | None
    """The disclosed score, rounded: the new best when `improved`, else the best disclosed before
    (None when nothing had been disclosed yet). Reward units."""
    improved: bool
    """Whether this evaluation's score beat the best disclosed before by at least the margin."""


def _exact(value: float) -> Fraction:
    # The shortest repr is the decimal the operator wrote (0.1 -> 1/10), not its binary neighbour.
    return Fraction(repr(float(value)))


def round_to_precision(score: float, precision: float) -> float:
    """`score` rounded to the nearest multiple of `precision` (ties to even), as a float.

    Raises:
        ValueError: `score` or `precision` is not finite, or `precision` <= 0.
    """
    if not (math.isfinite(score) and math.isfinite(precision)) or precision <= 0:
        raise ValueError("round_to_precision needs a finite score and a finite positive precision")
    step = _exact(precision)
    return float(round(_exact(score) / step) * step)


def ladder_step(best: float | None, score: float, rule: LadderSpec, direction: Direction) -> LadderDisclosure:
    """One Ladder answer (see the module docstring).

    Args:
        best: the best score disclosed so far on this key (rounded), or None.
        score: the trusted full measurement's score.
        rule: margin and precision.
        direction: `maximize` or `minimize` (`scoring.direction`).

    Returns:
        The disclosure: the rounded `score` when it improves on `best` by at least the margin (or
        `best` is None), else `best` with `improved=False`.
    """
    if not math.isfinite(score):
        return LadderDisclosure(score=best, improved=False)
    if best is not None:
        margin = _exact(rule.margin)
        gain = _exact(score) - _exact(best) if direction == "maximize" else _exact(best) - _exact(score)
        if gain < margin:
            return LadderDisclosure(score=best, improved=False)
    return LadderDisclosure(score=round_to_precision(score, rule.effective_precision), improved=True)


class LadderBoard:
    """The best disclosed score per `LadderKey`, in memory; the durable truth is on the job records.

    Not synchronized: the caller decides, writes the job durably and then calls `record`, all under
    one lock, so that two evaluations finishing at once are never both judged against a stale best.

    Args:
        direction: `scoring.direction`.
    """

    def __init__(self, direction: Direction) -> None:
        self.direction: Direction = direction
        self._best: dict[LadderKey, float] = {}

    @classmethod
    def rebuild(cls, decisions: Iterable[tuple[LadderKey, LadderDisclosure]], direction: Direction) -> LadderBoard:
        """A board from recorded decisions (any order): each key's best is the best improved score."""
        board = cls(direction)
        for key, disclosure in decisions:
            board.record(key, disclosure)
        return board

    def best(self, key: LadderKey) -> float | None:
        """The best disclosed score on `key`, or None before the first disclosure."""
        return self._best.get(key)

    def decide(self, key: LadderKey, score: float, rule: LadderSpec) -> LadderDisclosure:
        """`ladder_step` against the current best of `key` (changes nothing)."""
        return ladder_step(self.best(key), score, rule, self.direction)

    def record(self, key: LadderKey, disclosure: LadderDisclosure) -> None:
        """Take a durably recorded decision into account (only an improvement moves the best)."""
        if not disclosure.improved or disclosure.score is None:
            return
        current = self._best.get(key)
        better = max if self.direction == "maximize" else min
        self._best[key] = disclosure.score if current is None else better(current, disclosure.score)
