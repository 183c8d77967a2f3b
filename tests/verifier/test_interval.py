"""The interval of a mean lift (`vero.verifier.interval`): its coverage on simulated paired data, its
determinism, and what it refuses to claim."""

from __future__ import annotations

import math
import random

import pytest

from vero.core.evaluation import AttemptResult, CaseResult
from vero.verifier.interval import MIN_UNITS, mean_interval
from vero.verifier.verdict import ArmRecord, TargetRule, judge

SIMULATIONS = 1000


def _paired_data(rng: random.Random, n_cases: int, n_attempts: int, true_lift: float) -> tuple[ArmRecord, ArmRecord]:
    """One simulated target: cases of different difficulty (shared by both arms, so the pairing
    cancels it), a candidate effect that varies from case to case around `true_lift`, and noise on
    every attempt of either arm (skewed, as timings are: log-normal factors)."""
    candidate: dict[str, CaseResult] = {}
    baseline: dict[str, CaseResult] = {}
    for i in range(n_cases):
        name = f"case-{i}"
        difficulty = rng.gauss(1.0, 0.4)
        effect = rng.gauss(true_lift, 0.3)

        def attempts(mean: float, arm: str, name: str = name) -> list[AttemptResult]:
            return [
                AttemptResult(
                    trial_name=f"{name}__{arm}{k}", reward=mean * math.exp(rng.gauss(0, 0.05)), outcome="scored"
                )
                for k in range(n_attempts)
            ]

        base_mean = 2.0 + difficulty
        candidate[name] = CaseResult.from_attempts(name, attempts(base_mean + effect, "c"), 0.0)
        baseline[name] = CaseResult.from_attempts(name, attempts(base_mean, "b"), 0.0)
    return ArmRecord(cases=candidate), ArmRecord(cases=baseline)


@pytest.mark.timeout(600)
def test_the_95_percent_interval_covers_the_true_lift_93_to_97_percent_of_the_time():
    """1,000 seeded simulations of a 20-case target with 2 attempts per case and arm, judged exactly
    as the verifier judges a target. The true lift is the mean of the case effects' distribution
    (0.25; the log-normal attempt noise has mean exp(0.05^2 / 2) per arm, which multiplies both arms'
    case means alike and so moves the mean lift by 0.25 x 0.00125, far below the interval widths)."""
    rng = random.Random(20260601)
    true_lift = 0.25 * math.exp(0.05**2 / 2)
    covered = 0
    widths = []
    for sim in range(SIMULATIONS):
        candidate, baseline = _paired_data(rng, n_cases=20, n_attempts=2, true_lift=0.25)
        rule = TargetRule(
            partition="hidden",
            case_names=[f"case-{i}" for i in range(20)],
            n_attempts=2,
            direction="maximize",
            failure_value=0.0,
            confidence=0.95,
            max_missing_fraction=0.1,
            seed=sim,
        )
        verdict = judge(rule, candidate, baseline)
        assert verdict.interval is not None and verdict.n_cases == 20
        lo, hi = verdict.interval
        covered += lo <= true_lift <= hi
        widths.append(hi - lo)
    coverage = covered / SIMULATIONS
    print(f"\n[interval] coverage of the 95% interval over {SIMULATIONS} simulations: {coverage:.3f}")
    assert 0.93 <= coverage <= 0.97, coverage
    assert 0.0 < min(widths) and max(widths) < 1.0  # an interval of the lift, not of everything


@pytest.mark.timeout(300)
def test_small_samples_cover_too_and_the_interval_narrows_with_more_cases():
    """At the smallest size an interval is given for (6 cases), normal lifts: still near 95%; and
    the mean width shrinks about as 1 / sqrt(n) from 6 to 24 cases."""
    rng = random.Random(6)
    covered, widths = 0, {6: [], 24: []}
    for sim in range(SIMULATIONS):
        values = [rng.gauss(0.5, 1.0) for _ in range(MIN_UNITS)]
        result = mean_interval(values, confidence=0.95, seed=sim)
        assert result.interval is not None
        covered += result.lo <= 0.5 <= result.hi
        widths[6].append(result.hi - result.lo)
        if sim < 200:
            more = mean_interval([rng.gauss(0.5, 1.0) for _ in range(24)], confidence=0.95, seed=sim)
            widths[24].append(more.hi - more.lo)
    coverage = covered / SIMULATIONS
    print(f"\n[interval] coverage at {MIN_UNITS} units: {coverage:.3f}")
    assert 0.93 <= coverage <= 0.97, coverage
    ratio = (sum(widths[6]) / len(widths[6])) / (sum(widths[24]) / len(widths[24]))
    assert 1.8 < ratio < 3.2, ratio  # sqrt(4) = 2, plus the small-sample widening


def test_the_same_measurements_and_seed_give_the_same_interval_and_another_seed_another():
    values = [0.31, 0.12, 0.55, -0.08, 0.27, 0.40, 0.19, 0.05]
    first = mean_interval(values, confidence=0.95, seed=42)
    again = mean_interval(list(values), confidence=0.95, seed=42)
    other = mean_interval(values, confidence=0.95, seed=43)
    assert first == again
    assert first.interval != other.interval  # the seed matters: it is not a constant in disguise
    assert first.mean == pytest.approx(sum(values) / len(values))
    assert first.lo < first.mean < first.hi
    # A higher level gives a wider interval around the same mean.
    wider = mean_interval(values, confidence=0.99, seed=42)
    assert wider.lo < first.lo and wider.hi > first.hi


def test_too_few_units_get_no_interval_and_a_note():
    result = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0], confidence=0.95, seed=1)
    assert result.interval is None and result.n == 5 and result.mean == 3.0
    assert result.note == f"too few for an interval: 5 (at least {MIN_UNITS} are needed)"


def test_units_without_spread_give_a_zero_width_interval_that_says_so():
    result = mean_interval([2.5] * 8, confidence=0.95, seed=1)
    assert result.interval == (2.5, 2.5) and "no width" in (result.note or "")


@pytest.mark.parametrize(
    ("values", "confidence", "resamples", "message"),
    [
        ([], 0.95, 1999, "at least one value"),
        ([1.0, math.nan], 0.95, 1999, "finite"),
        ([1.0, math.inf], 0.95, 1999, "finite"),
        ([1.0, 2.0], 1.0, 1999, "confidence"),
        ([1.0, 2.0], 0.0, 1999, "confidence"),
        ([1.0, 2.0], 0.95, 10, "resamples"),
    ],
)
def test_bad_input_is_refused(values, confidence, resamples, message):
    with pytest.raises(ValueError, match=message):
        mean_interval(values, confidence=confidence, seed=0, resamples=resamples)


def test_large_values_with_a_small_spread_keep_their_precision():
    """Speed-ups in the thousands that differ in the sixth digit: the interval is still around the
    mean and ordered (sums of squares are taken around the mean, never of the raw values)."""
    values = [1000.0 + 1e-6 * k for k in (1, 3, 2, 5, 4, 6, 2, 3)]
    result = mean_interval(values, confidence=0.95, seed=7)
    assert result.lo < result.mean < result.hi
    assert result.hi - result.lo < 1e-5
