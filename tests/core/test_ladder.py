"""Ladder disclosure (Blum & Hardt 2015): only improvements beyond the margin, rounded; never a
non-improving score."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vero.core.ladder import LadderBoard, LadderDisclosure, ladder_step, round_to_precision
from vero.spec.models import LadderSpec

KEY = ("agent", "holdout", ("a", "b", "c"))


def run(scores, rule, direction="maximize"):
    board = LadderBoard(direction)
    answers = []
    for score in scores:
        answer = board.decide(KEY, score, rule)
        board.record(KEY, answer)
        answers.append((answer.score, answer.improved))
    return answers


def test_a_sequence_discloses_only_improvements_beyond_the_margin_rounded():
    rule = LadderSpec(margin=0.05, precision=0.01)
    scores = [0.5037, 0.52, 0.5612, 0.55, 0.6112, 0.6049, math.nan, math.inf, 0.7]
    assert run(scores, rule) == [
        (0.5, True),  # the first score is disclosed, rounded
        (0.5, False),  # +0.0163 < margin: the previous best again
        (0.56, True),  # +0.0612 from the disclosed 0.50
        (0.56, False),
        (0.61, True),  # +0.0512
        (0.61, False),  # -0.0051
        (0.61, False),  # not a number never improves
        (0.61, False),  # nor does infinity
        (0.7, True),
    ]


def test_the_margin_is_measured_from_the_disclosed_best_exactly():
    rule = LadderSpec(margin=0.1)
    # 0.7 + 0.1 is 0.7999999999999999 in binary floats; the margin is meant in decimals.
    assert run([0.7, 0.8], rule) == [(0.7, True), (0.8, True)]
    assert run([0.7, 0.7999], rule) == [(0.7, True), (0.7, False)]


def test_minimize_improves_downwards():
    rule = LadderSpec(margin=1.0, precision=0.5)
    assert run([10.2, 9.6, 8.9, 11.0, 7.1], rule, "minimize") == [
        (10.0, True),
        (10.0, False),
        (9.0, True),
        (9.0, False),
        (7.0, True),
    ]


def test_a_first_non_finite_score_discloses_nothing():
    rule = LadderSpec(margin=0.1)
    assert ladder_step(None, math.nan, rule, "maximize") == LadderDisclosure(score=None, improved=False)
    assert ladder_step(None, -math.inf, rule, "minimize") == LadderDisclosure(score=None, improved=False)


def test_rounding():
    assert round_to_precision(0.33333, 0.01) == 0.33
    assert round_to_precision(0.335, 0.01) == 0.34  # 0.335 is exactly representable as a decimal intent
    assert round_to_precision(-1.26, 0.5) == -1.5
    assert round_to_precision(1234.5678, 1e-3) == 1234.568
    with pytest.raises(ValueError):
        round_to_precision(math.nan, 0.1)


def test_rebuild_restores_the_best_in_any_order():
    rule = LadderSpec(margin=0.1)
    decisions = [
        (KEY, LadderDisclosure(score=0.5, improved=True)),
        (KEY, LadderDisclosure(score=0.5, improved=False)),
        (KEY, LadderDisclosure(score=0.7, improved=True)),
        (("agent", "holdout", ("a",)), LadderDisclosure(score=0.9, improved=True)),
    ]
    for order in (decisions, list(reversed(decisions))):
        board = LadderBoard.rebuild(order, "maximize")
        assert board.best(KEY) == 0.7
        assert board.decide(KEY, 0.75, rule) == LadderDisclosure(score=0.7, improved=False)
    assert LadderBoard.rebuild(decisions[:3], "minimize").best(KEY) == 0.5


@settings(max_examples=300, deadline=None)
@given(
    scores=st.lists(st.floats(min_value=-5, max_value=5, allow_nan=False), min_size=1, max_size=30),
    margin=st.sampled_from([0.001, 0.01, 0.05, 0.25, 1.0]),
    precision_share=st.sampled_from([1, 2, 5]),
    direction=st.sampled_from(["maximize", "minimize"]),
)
def test_a_non_improving_score_is_never_disclosed(scores, margin, precision_share, direction):
    """Property: each answer is either the previous answer unchanged (it does not depend on the new
    score at all) or the new score rounded, at least `margin` better than the previous best; the
    disclosed values only improve, by at least one precision step each time."""
    rule = LadderSpec(margin=margin, precision=margin / precision_share)
    precision = Fraction(repr(rule.effective_precision))
    sign = 1 if direction == "maximize" else -1
    best = None
    for score, (disclosed, improved) in zip(scores, run(scores, rule, direction), strict=True):
        if best is not None and sign * (Fraction(repr(score)) - Fraction(repr(best))) < Fraction(repr(margin)):
            assert (disclosed, improved) == (best, False)
            continue
        assert improved
        assert abs(Fraction(repr(disclosed)) - Fraction(repr(score))) <= precision / 2 + Fraction(1, 10**12)
        assert (Fraction(repr(disclosed)) / precision).denominator == 1  # on the precision grid
        if best is not None:
            assert sign * (Fraction(repr(disclosed)) - Fraction(repr(best))) >= precision
        best = disclosed
