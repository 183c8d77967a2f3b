"""The agent's views of a job as pure functions of its record and its rule (`vero.sidecar.disclosure`),
with the rule from one call to the policy (`AccessPolicy.rule_for`)."""

from __future__ import annotations

from datetime import UTC, datetime

from vero.core.diagnostics import CaseProblem, RunDiagnostics
from vero.core.evaluation import AttemptOutcome, AttemptResult, CaseResult, EvaluationResult
from vero.core.jobs import EvaluationJob
from vero.core.ladder import LadderDisclosure
from vero.core.ledger import BudgetBalance
from vero.core.policy import AccessPolicy, DisclosureRule
from vero.core.usage import InferenceUsage
from vero.sidecar.disclosure import budget_view, case_problem, disclose, job_view, summary_view
from vero.spec.models import LadderSpec, PartitionAccess

NOW = datetime(2026, 12, 1, tzinfo=UTC)
FULL, AGGREGATE, NONE = DisclosureRule(tier="full"), DisclosureRule(tier="aggregate"), DisclosureRule(tier="none")
LADDER = DisclosureRule(tier="aggregate", ladder=LadderSpec(margin=0.1))


def result(cases: tuple[str, ...] = ("c1", "c2")) -> EvaluationResult:
    return EvaluationResult(
        partition="train",
        candidate="a" * 40,
        reward_key="reward",
        cases=[
            CaseResult(
                case=case,
                attempts=[AttemptResult(trial_name=f"{case}-t", reward=0.5, outcome=AttemptOutcome.SCORED)],
                score=0.5,
            )
            for case in cases
        ],
        score=0.5,
        started_at=NOW,
        finished_at=NOW,
        inference=InferenceUsage(calls=3),
    )


def job(**fields) -> EvaluationJob:
    record = dict(
        id="ev-0123456789abcdef",
        principal="agent",
        partition="train",
        cases=["c1", "c2"],
        full_partition=True,
        version="HEAD",
        candidate="a" * 40,
        disclosure="full",
        reservation_id="r-1",
        state="complete",
        created_at=NOW,
        finished_at=NOW,
        result=result(),
    )
    record.update(fields)
    return EvaluationJob.model_validate(record)


def test_each_tier_shows_what_its_rule_allows():
    assert disclose(job(state="running", result=None), FULL) is None
    assert disclose(job(), NONE).model_dump(exclude_none=True) == {"disclosure": "none"}
    aggregate = disclose(job(), AGGREGATE)
    assert (aggregate.score, aggregate.n_cases, aggregate.cases, aggregate.artifacts_path) == (0.5, 2, None, None)
    assert aggregate.inference is None and aggregate.inference_usd == 0.0
    full = disclose(job(), FULL, "/context/ev-0123456789abcdef")
    assert [c.case for c in full.cases] == ["c1", "c2"] and full.cases[0].attempts[0].outcome == "scored"
    assert full.artifacts_path == "/context/ev-0123456789abcdef" and full.inference == InferenceUsage(calls=3)


def _spent(refused: int) -> EvaluationJob:
    """A job whose candidate made `refused` free refused calls and one charged call."""
    usage = InferenceUsage(
        calls=1, refused_calls={"model_not_allowed": refused} if refused else {}, charged_micro_usd=1234
    )
    return job(result=result().model_copy(update={"inference": usage}))


def test_counts_a_candidate_makes_for_free_pass_no_tier_but_full():
    """0 and 7 refused calls (e.g. a hidden case's answer) look the same on `none` and `aggregate`,
    in the job's view and in its summary (`/status`, `GET /evaluations`); money passes `aggregate`."""
    for rule in (NONE, AGGREGATE, LADDER):
        seen = [job_view(_spent(n), rule).model_dump_json() for n in (0, 7)]
        assert seen[0] == seen[1], rule
        listed = [summary_view(job_view(_spent(n), rule)).model_dump_json() for n in (0, 7)]
        assert listed[0] == listed[1], rule
    assert job_view(_spent(7), AGGREGATE).result.inference_usd == 0.001234
    assert job_view(_spent(7), NONE).result.inference_usd is None
    full = [job_view(_spent(n), FULL).result.inference for n in (0, 7)]
    assert full[0].n_refused == 0 and full[1].n_refused == 7


def _balance(**figures: int) -> BudgetBalance:
    """The `train` entry of 10 runs and 100 cases, with `figures` (others 0)."""
    base = dict(total_runs=10, total_cases=100, settled_runs=0, settled_cases=0, reserved_runs=0, reserved_cases=0)
    return BudgetBalance(partition="train", principal="agent", **{**base, **figures})


def _charged(micro_usd: int) -> EvaluationJob:
    return job(result=result().model_copy(update={"inference": InferenceUsage(calls=1, charged_micro_usd=micro_usd)}))


def test_aggregate_shows_money_in_hundredths_of_the_partitions_total():
    """A candidate chooses what it spends: on `aggregate` a micro-dollar figure carried a hidden
    answer exactly (1,748 micro-dollars for an answer of 1,748); in steps of a hundredth of the
    partition's money, spends within one step look the same, in the view and in `/status`."""
    access = PartitionAccess(
        disclosure="aggregate", min_aggregate_cases=1, total_runs=10, total_cases=100, total_inference_usd=0.5
    )
    policy = AccessPolicy({"train": access}, {"train": ["c1", "c2"]})
    rule = policy.rule_for("full", "agent", "train")
    assert rule == DisclosureRule(tier="aggregate", money_step_micro_usd=5_000)
    seen = {n: job_view(_charged(n), rule).model_dump_json() for n in (1, 1_748, 1_749, 5_000)}
    assert len(set(seen.values())) == 1
    assert job_view(_charged(1_748), rule).result.inference_usd == 0.005  # rounded up: never shown as free
    assert job_view(_charged(0), rule).result.inference_usd == 0.0
    assert job_view(_charged(5_001), rule).result.inference_usd == 0.01
    assert job_view(_charged(1_748), FULL).result.inference_usd == 0.001748  # `full` shows it exact

    def left(spent: int, shown: PartitionAccess) -> float | None:
        balance = _balance(total_inference_micro_usd=500_000, settled_inference_micro_usd=spent)
        return budget_view(balance, shown, metered=True, ladder=None).remaining_inference_usd

    # Rounded down: what is left never looks larger than it is.
    assert [left(n, access) for n in (1_748, 1_749, 4_999)] == [0.495, 0.495, 0.495]
    assert left(1_748, access.model_copy(update={"disclosure": "full"})) == 0.498252


def test_aggregate_withholds_the_score_under_the_ladder_and_over_other_cases():
    judged = job(ladder=LadderDisclosure(score=0.4, improved=False))
    shown = disclose(judged, LADDER)
    assert (shown.score, shown.improved, shown.n_cases, shown.n_attempts) == (0.4, False, 2, None)
    # Completed without a Ladder answer on a partition now in Ladder mode: no score.
    assert disclose(job(), LADDER).score is None
    # A result over other cases than the granted ones may not be a union of blocks: no score.
    assert disclose(job(result=result(("c1",))), AGGREGATE).score is None
    assert disclose(job(result=result(("c1",))), FULL).score == 0.5


def test_broken_cases_and_their_names_only_on_full():
    failed = job(
        state="failed",
        result=None,
        error="case_invalid",
        diagnostics=RunDiagnostics(problems=[CaseProblem(case="c2", code="case_invalid", detail="bad")]),
    )
    assert job_view(failed, FULL).broken_cases == ["c2"]
    assert job_view(failed, AGGREGATE).broken_cases is None
    assert case_problem(FULL, "case_invalid", ["c2", "c1"]).cases == ["c1", "c2"]
    assert case_problem(AGGREGATE, "case_invalid", ["c2"]).cases == []


def test_a_summary_drops_the_cases_only():
    view = job_view(job(), FULL)
    summary = summary_view(view)
    assert view.result.cases is not None and summary.result.cases is None
    assert summary.result.score == view.result.score and summary.id == view.id


def test_one_call_asks_the_policy_for_the_tier_and_the_ladder():
    ladder = LadderSpec(margin=0.1)
    policy = AccessPolicy(
        {
            "train": PartitionAccess(
                disclosure="aggregate", min_aggregate_cases=1, ladder=ladder, total_runs=10, total_cases=100
            ),
            "open": PartitionAccess(disclosure="full", total_runs=10, total_cases=100),
        },
        {"train": ["c1"], "open": ["c2"]},
    )
    assert policy.rule_for("full", "agent", "train") == DisclosureRule(tier="aggregate", ladder=ladder)
    assert policy.rule_for("none", "agent", "train") == DisclosureRule(tier="none")
    assert policy.rule_for("full", "agent", "open") == DisclosureRule(tier="full")
    assert policy.rule_for("full", "agent", "gone") == DisclosureRule(tier="none")  # fail closed


def test_a_budget_shows_what_is_left_of_the_money_only_where_the_tier_shows_scores():
    balance = _balance(
        settled_runs=2,
        settled_cases=20,
        reserved_runs=1,
        reserved_cases=10,
        total_inference_micro_usd=5_000_000,
        settled_inference_micro_usd=1_250_000,
    )
    shown = {
        disclosure: budget_view(
            balance,
            PartitionAccess(disclosure=disclosure, min_aggregate_cases=1, total_runs=10, total_cases=100),
            metered=True,
            ladder=None,
        )
        for disclosure in ("full", "aggregate", "none")
    }
    assert (shown["full"].remaining_runs, shown["full"].remaining_cases) == (7, 70)
    assert shown["full"].remaining_inference_usd == shown["aggregate"].remaining_inference_usd == 3.75
    # What is left moves with what the candidates spent: on `none` and under the Ladder it is withheld.
    assert shown["none"].remaining_inference_usd is None and shown["none"].total_inference_usd == 5.0
    under_ladder = budget_view(
        balance,
        PartitionAccess(disclosure="aggregate", min_aggregate_cases=1, total_runs=10, total_cases=100),
        metered=True,
        ladder=LadderSpec(margin=0.1),
    )
    assert under_ladder.remaining_inference_usd is None and under_ladder.remaining_runs == 7
    unmetered = budget_view(
        balance, PartitionAccess(disclosure="full", total_runs=10, total_cases=100), metered=False, ladder=None
    )
    assert unmetered.total_inference_usd is None and unmetered.remaining_inference_usd is None
