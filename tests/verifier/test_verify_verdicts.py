"""`verify` judges every target beside the baseline (`vero.verifier.verdict`), over real sealed
sessions with the table backend: the status, the reward, the causes and the artifacts it leaves."""

from __future__ import annotations

import json

import pytest
from verifier_bench import PARTITIONS, TableBackend, Workbench

from vero.commands.exit_codes import VERIFIER_STATUS_EXIT_CODES
from vero.core.evaluation import AttemptResult, CaseResult, EvaluationResult

pytestmark = pytest.mark.timeout(240)

WIDE = PARTITIONS["hidden-wide"]


def reward(bench: Workbench) -> dict[str, float]:
    return json.loads(bench.reward_path().read_text())


def spread(base: float, step: float) -> dict[str, float]:
    return {case: base + step * i for i, case in enumerate(WIDE)}


class SilentBackend(TableBackend):
    """The hidden cases' tests never write a reward: every trial of every arm ends in Harbor's
    `RewardFileNotFoundError` (what a harness that passes an empty value to `vero-kit reward` gets)."""

    async def evaluate(self, run):
        result = await super().evaluate(run)
        failure = run.scoring.effective_failure_value()
        cases = [
            CaseResult.from_attempts(
                name,
                [AttemptResult(trial_name=f"{name}__{run.candidate[:7]}", exception_type="RewardFileNotFoundError")],
                failure,
            )
            for name in run.case_names
        ]
        return EvaluationResult.from_cases(
            partition=run.partition,
            candidate=run.candidate,
            reward_key=result.reward_key,
            cases=cases,
            started_at=result.started_at,
            finished_at=result.finished_at,
        )


def test_a_clear_improvement_on_enough_cases_is_improved_and_the_same_session_gives_the_same_interval(
    bench: Workbench,
) -> None:
    a = bench.candidate("a\n")
    bench.submit(a)
    table = {("hidden-wide", bench.tree(a)): spread(3.0, 0.2), ("hidden-wide", bench.baseline_tree): spread(1.0, 0.05)}
    archive = bench.seal()
    config = bench.config(targets=("hidden-wide",))

    final = bench.verify(config, archive, TableBackend(table))

    assert final.status == "scored" and reward(bench) == {"reward": pytest.approx(3.7)}  # the score, as before
    (verdict,) = final.verdicts
    assert verdict.verdict == "improved" and verdict.n_cases == 8 and verdict.confidence == 0.95
    lo, hi = verdict.interval
    assert 0 < lo < verdict.lift < hi
    assert verdict.lift == pytest.approx(3.7 - 1.175)
    assert final.baseline.rewards == {"reward": pytest.approx(1.175)}
    again = bench.verify(config, archive, TableBackend(table), tag="again")
    assert again.verdicts[0].interval == verdict.interval and again.verdicts[0].seed == verdict.seed
    written = json.loads((bench.artifacts() / "finalization.json").read_text())
    assert written["verdicts"][0]["interval"] == list(verdict.interval)
    assert written["verdicts"][0]["verdict"] == "improved"


def test_a_target_whose_test_never_writes_a_reward_is_unmeasurable_never_scored(bench: Workbench) -> None:
    a = bench.candidate("a\n")
    bench.submit(a)
    backend = SilentBackend({("hidden", bench.tree(a)): 0.0, ("hidden", bench.baseline_tree): 0.0})

    final = bench.verify(bench.config(direction="minimize", failure_value=100.0), bench.seal(), backend)

    assert final.status == "unmeasurable" and VERIFIER_STATUS_EXIT_CODES[final.status] == 21
    assert reward(bench) == {"reward": 100.0}  # every attempt dead: the failure value, as before
    (verdict,) = final.verdicts
    assert verdict.verdict == "unmeasurable" and verdict.interval is None
    assert verdict.missing.candidate.by_reason == {"no_reward": 2}
    assert verdict.missing.baseline.by_reason == {"no_reward": 2}
    (cause,) = [e for e in final.errors if e.startswith("target hidden: unmeasurable:")]
    assert "the candidate arm has no valid measurement: 2 of 2 attempt(s) missing (no_reward 2)" in cause
    assert "case 'hidden-1': no_reward" in cause and "RewardFileNotFoundError" in cause
    assert final.targets[0].verdict == "unmeasurable" and final.targets[0].measured


def test_reward_lift_makes_the_reward_the_lift_and_an_unmeasurable_lift_the_failure_value(bench: Workbench) -> None:
    a = bench.candidate("a\n")
    bench.submit(a)
    table = {("hidden-wide", bench.tree(a)): spread(3.0, 0.2), ("hidden-wide", bench.baseline_tree): spread(1.0, 0.05)}
    config = bench.config(
        targets=("hidden-wide",), target={"reward": "lift", "failure_value": -1000.0}, target_failure=-1000.0
    )

    final = bench.verify(config, bench.seal(), TableBackend(table))

    assert final.status == "scored" and reward(bench) == {"reward": pytest.approx(3.7 - 1.175)}
    assert final.targets[0].reward == pytest.approx(final.verdicts[0].lift)

    # Without a baseline measurement there is no lift: the failure value, and the status says so.
    missing = {("hidden-wide", bench.tree(a)): spread(3.0, 0.2)}
    final = bench.verify(config, bench.seal(), TableBackend(missing), tag="no-baseline")
    assert final.verdicts[0].verdict == "unmeasurable"
    assert json.loads((bench.root / "no-baseline" / "logs" / "verifier" / "reward.json").read_text()) == {
        "reward": -1000.0
    }
    assert final.status == "failed" and not final.targets[0].measured


def test_score_baseline_false_scores_the_candidate_alone_and_compares_nothing(bench: Workbench) -> None:
    a = bench.candidate("a\n")
    bench.submit(a)
    backend = TableBackend({("hidden", bench.tree(a)): 0.5})

    final = bench.verify(bench.config(target={"score_baseline": False}), bench.seal(), backend)

    assert [(c.partition, c.tree) for c in backend.calls] == [("hidden", bench.tree(a))]
    assert final.status == "scored" and reward(bench) == {"reward": 0.5}
    assert final.verdicts[0].verdict == "not_compared" and final.verdicts[0].baseline_score is None
    assert final.baseline.rewards is None


def test_target_attempts_reach_both_arms_of_the_run(bench: Workbench) -> None:
    a = bench.candidate("a\n")
    bench.submit(a)
    backend = TableBackend({("hidden", bench.tree(a)): 0.5, ("hidden", bench.baseline_tree): 0.25})

    final = bench.verify(bench.config(target={"n_attempts": 3}), bench.seal(), backend)

    assert [c.n_attempts for c in backend.calls] == [3, 3]
    verdict = final.verdicts[0]
    assert verdict.missing.candidate.n_attempts == verdict.missing.baseline.n_attempts == 6
    assert verdict.missing.candidate.n_valid == 6 and final.measurements[0].n_attempts == 3


def test_the_shipped_baseline_is_scored_once_and_the_verdict_says_so(bench: Workbench) -> None:
    backend = TableBackend({("hidden", bench.baseline_tree): 0.3})

    final = bench.verify(bench.config(), bench.seal(), backend)

    assert [(c.partition, c.tree) for c in backend.calls] == [("hidden", bench.baseline_tree)]
    assert final.status == "scored" and final.chosen.is_baseline
    (verdict,) = final.verdicts
    assert verdict.baseline_shipped and verdict.verdict == "no_detectable_change" and verdict.lift == 0.0
    assert "the baseline itself shipped" in verdict.note
    assert final.baseline.rewards == {"reward": 0.3}


def test_a_baseline_arm_that_measures_nothing_leaves_the_candidates_score_and_makes_the_verdict_unmeasurable(
    bench: Workbench,
) -> None:
    a = bench.candidate("a\n")
    bench.submit(a)
    backend = TableBackend({("hidden", bench.tree(a)): 0.8})  # the baseline's arm gets no trial

    final = bench.verify(bench.config(), bench.seal(), backend)

    assert reward(bench) == {"reward": 0.8} and final.targets[0].measured
    assert final.status == "unmeasurable"
    verdict = final.verdicts[0]
    assert verdict.missing.baseline.by_reason == {"infrastructure": 2}
    assert "the baseline arm has no valid measurement" in verdict.cause


def test_without_a_rebuilt_baseline_the_candidate_is_scored_and_the_verdict_is_unmeasurable(
    bench: Workbench,
) -> None:
    a = bench.candidate("a\n")
    bench.submit(a)
    (bench.baseline_files / "solution.txt").write_text("not the compiled baseline\n")
    backend = TableBackend({("hidden", bench.tree(a)): 0.8})

    final = bench.verify(bench.config(), bench.seal(), backend)

    assert [(c.partition, c.tree) for c in backend.calls] == [("hidden", bench.tree(a))]
    assert reward(bench) == {"reward": 0.8} and final.status == "unmeasurable"
    assert "do not rebuild the compiled baseline commit" in final.verdicts[0].cause


def test_a_baseline_checkout_that_fails_leaves_the_candidate_measured_alone(bench: Workbench, tmp_path) -> None:
    import asyncio
    import shutil

    from vero.verifier.scoring import Scorer

    a = bench.candidate("a\n")
    source = bench.root / "agent"

    def checkout(candidate: str, dest):
        if candidate == bench.baseline_commit:
            raise OSError("disk full")
        shutil.copytree(source, dest, ignore=shutil.ignore_patterns(".git"))
        return dest

    backend = TableBackend({("hidden", bench.tree(a)): 0.7})
    scorer = Scorer(
        backend=backend, config=bench.config(), checkout=checkout, cases_dir=bench.cases_dir, work_dir=tmp_path / "w"
    )
    candidate, baseline = asyncio.run(scorer.measure_paired(a, bench.baseline_commit, "hidden"))

    assert candidate.score == 0.7 and candidate.purpose == "target"
    assert baseline.score is None and baseline.error == "checkout failed (OSError)"
    assert baseline.purpose == "target-baseline" and baseline.evaluation_id == candidate.evaluation_id
    assert [c.tree for c in backend.calls] == [bench.tree(a)]  # the candidate ran alone
    assert [m.purpose for m in scorer.measurements] == ["target", "target-baseline"]
