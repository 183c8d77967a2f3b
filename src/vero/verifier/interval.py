"""A confidence interval for a mean lift: the studentized (bootstrap-t) bootstrap over units.

The units are independent draws from the population the claim is about: the cases of a target
partition for one verification (each case's lift is the paired difference of the two arms' case
scores, so whatever a case shares between the arms cancels), or the trials of `vero harbor report`.
The attempts inside a case are not units: they are repeated measurements of that case, averaged
into its score before anything is resampled (resampling the top level of a hierarchy only is the
standard, conservative scheme: Davison & Hinkley 1997, *Bootstrap Methods and their Application*,
§3.8).

Method (Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, §12.5 "The bootstrap-t
interval"; Davison & Hinkley 1997 §5.2.1): with the units' mean `m`, standard deviation `s` and
standard error `se = s / sqrt(n)`, draw `resamples` samples of `n` units with replacement and
compute each one's `t* = (m* - m) / (s* / sqrt(n))`; with `t_lo`, `t_hi` the `(R + 1) * alpha / 2`-th
and `(R + 1) * (1 - alpha / 2)`-th smallest of the `R` values, the interval is
`[m - t_hi * se, m - t_lo * se]`.

Why this one and not the percentile bootstrap (the quantiles of `m*`) or Student's t interval: the
bootstrap-t is second-order accurate (Hall 1988, "Theoretical comparison of bootstrap confidence
intervals", *Annals of Statistics* 16(3):927-953; DiCiccio & Efron 1996, "Bootstrap confidence
intervals", *Statistical Science* 11(3):189-228), so it corrects for skew, which lifts of speed-ups
have, and it does not shrink by `sqrt((n - 1) / n)` at small `n` as the percentile interval does.
Measured here at 95% (1,000 simulated data sets per row, one run; `tests/verifier/test_interval.py`
checks the coverage again on paired targets):

| lifts | n | bootstrap-t | percentile bootstrap | Student's t |
|---|---|---|---|---|
| normal | 6 | 0.943 | 0.863 | 0.953 |
| normal | 8 | 0.948 | 0.900 | 0.954 |
| normal | 20 | 0.948 | 0.932 | 0.952 |
| log-normal (sigma 0.8) | 8 | 0.905 | 0.808 | 0.862 |
| log-normal (sigma 0.8) | 20 | 0.917 | 0.880 | 0.892 |

It is still an approximation: strongly skewed units at small `n` are covered less often than the
level says, by every method here.

Limits, stated where they are decided:
- fewer than `MIN_UNITS` units: no interval at all (the caller says so). With `n` units the
  resamples cannot leave the units' range, and the range covers a mean with probability
  `1 - 2^(1-n)` at best (75% for 3 units, 94% for 5), so no bootstrap can reach 95% below 6;
- units that all have the same value give a zero-width interval at that value: there is no spread
  to resample, which says nothing about the spread of cases not measured;
- resamples whose units are all the same one have no standard deviation and are skipped (at most
  `n^(1-n)` of them: under one in 7,000 for 6 units).

The result depends only on the values, the level, the seed and the number of resamples, so the same
measurements give the same interval (`random.Random(seed)`, `random.choices`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_RESAMPLES", "METHOD", "MIN_UNITS", "MeanInterval", "mean_interval"]

MIN_UNITS = 6
"""Fewest units an interval is computed for (see the module docstring)."""

DEFAULT_RESAMPLES = 1999
"""Bootstrap resamples: `(R + 1) * alpha / 2` is a whole number for the usual levels (Davison &
Hinkley 1997 §5.2.1), and 2,000 draws put the 2.5% quantile of `t*` within about 0.1 of its limit."""

METHOD = "studentized paired bootstrap over cases (bootstrap-t; Efron & Tibshirani 1993 §12.5)"
"""How the interval is computed, as reported next to it."""


@dataclass(frozen=True)
class MeanInterval:
    """The mean of some units and, when there are enough of them, a confidence interval for it.

    Attributes:
        mean: the units' mean (their own units, e.g. reward units of a lift).
        lo, hi: the interval's bounds, or None when none was computed (see `note`).
        n: how many units.
        confidence: the level asked for, in (0, 1).
        resamples: bootstrap resamples used (0 when no interval was computed).
        note: why there is no interval, or why it has no width; None otherwise.
    """

    mean: float
    lo: float | None
    hi: float | None
    n: int
    confidence: float
    resamples: int = 0
    note: str | None = None

    @property
    def interval(self) -> tuple[float, float] | None:
        """`(lo, hi)`, or None."""
        return (self.lo, self.hi) if self.lo is not None and self.hi is not None else None


def _order_statistic(sorted_values: Sequence[float], p: float) -> float:
    """The `(R + 1) * p`-th smallest of `R` sorted values, clamped to the first and the last."""
    k = math.floor((len(sorted_values) + 1) * p + 1e-9)
    return sorted_values[min(max(k, 1), len(sorted_values)) - 1]


def mean_interval(
    values: Sequence[float], *, confidence: float, seed: int, resamples: int = DEFAULT_RESAMPLES
) -> MeanInterval:
    """The mean of `values` and its bootstrap-t interval at `confidence` (see the module docstring).

    Args:
        values: one finite number per unit (at least one).
        confidence: the level, strictly between 0 and 1 (e.g. 0.95).
        seed: seeds the resampling; the same values, level, seed and `resamples` give the same interval.
        resamples: how many bootstrap samples (at least 99).

    Returns:
        A `MeanInterval`; `lo`/`hi` are None for fewer than `MIN_UNITS` values.

    Raises:
        ValueError: `values` is empty or holds a non-finite number, `confidence` is not in (0, 1),
            or `resamples` is below 99.
    """
    units = [float(v) for v in values]
    if not units:
        raise ValueError("an interval needs at least one value")
    if not all(math.isfinite(v) for v in units):
        raise ValueError("every value must be a finite number")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if resamples < 99:
        raise ValueError(f"resamples must be at least 99, got {resamples!r}")
    n = len(units)
    mean = math.fsum(units) / n
    if n < MIN_UNITS:
        return MeanInterval(
            mean,
            None,
            None,
            n,
            confidence,
            note=f"too few for an interval: {n} (at least {MIN_UNITS} are needed)",
        )
    # Centered at the mean, so that sums of squares keep their precision however large the values.
    centered = [v - mean for v in units]
    spread = math.fsum(c * c for c in centered)
    if spread == 0.0:
        return MeanInterval(
            mean,
            mean,
            mean,
            n,
            confidence,
            note="every unit has the same value: the interval has no width (there is no spread to resample)",
        )
    se = math.sqrt(spread / (n - 1)) / math.sqrt(n)
    rng = random.Random(seed)
    choices = rng.choices
    root_n = math.sqrt(n)
    t_stars: list[float] = []
    for _ in range(resamples):
        sample = choices(centered, k=n)
        total = sum(sample)
        squares = math.sumprod(sample, sample) - total * total / n
        if squares <= 0.0:
            continue  # all the same unit: no standard deviation (see the module docstring)
        t_stars.append((total / n) / (math.sqrt(squares / (n - 1)) / root_n))
    t_stars.sort()
    alpha = 1.0 - confidence
    t_lo = _order_statistic(t_stars, alpha / 2)
    t_hi = _order_statistic(t_stars, 1 - alpha / 2)
    return MeanInterval(mean, mean - t_hi * se, mean - t_lo * se, n, confidence, resamples=len(t_stars))
