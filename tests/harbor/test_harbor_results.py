"""Result collation from real Harbor 0.26 job dirs (`fixtures/jobs`, made by `fixtures/make_fixtures.py`)."""

from __future__ import annotations

import shutil

import pytest
from harbor_cases import FIXTURE_JOBS

from vero.core.evaluation import CaseResult
from vero.harbor.results import collate_job, merge_outcomes, read_trial

MIXED = FIXTURE_JOBS / "oracle-mixed"
INSTALL = FIXTURE_JOBS / "install-fails"


def by_case(collation):
    out: dict[str, list] = {}
    for trial in collation.trials:
        out.setdefault(trial.case, []).append(trial)
    return out


def scores(job_dir, reward_key, failure_value, cases):
    collation = collate_job(job_dir, reward_key)
    attempts: dict[str, list] = {}
    dropped = merge_outcomes(attempts, collation.trials, set(cases))
    return {c: CaseResult.from_attempts(c, attempts.get(c, []), failure_value) for c in cases}, attempts, dropped


def test_mixed_job_classification():
    collation = collate_job(MIXED, "reward")
    assert collation.job_finished
    assert collation.n_unfinished == 0
    cases = by_case(collation)
    assert sorted(cases) == ["agent-timeout", "build-fails", "multi.key", "no-reward", "start-timeout", "two-steps"]

    (multi,) = cases["multi.key"]
    assert (multi.reward, multi.exception_type, multi.infrastructure) == (0.75, None, False)

    (missing,) = cases["no-reward"]
    assert (missing.reward, missing.exception_type, missing.infrastructure) == \
        (None, "RewardFileNotFoundError", False)

    # AgentTimeoutError keeps its verifier reward (HARBOR-NOTES §8 rows 4-5).
    (timeout,) = cases["agent-timeout"]
    assert (timeout.reward, timeout.exception_type, timeout.infrastructure) == (0.25, "AgentTimeoutError", False)

    # Multi-step: top-level exception_info is null, rewards are present, the failure is in a step.
    (steps,) = cases["two-steps"]
    assert (steps.reward, steps.exception_type, steps.infrastructure) == (None, "RewardFileNotFoundError", False)

    # A failed image build is a plain RuntimeError before agent setup: infrastructure by phase.
    (build,) = cases["build-fails"]
    assert (build.reward, build.exception_type, build.infrastructure) == (None, "RuntimeError", True)
    (start,) = cases["start-timeout"]
    assert (start.reward, start.exception_type, start.infrastructure) == \
        (None, "EnvironmentStartTimeoutError", True)


def test_dead_attempts_score_the_failure_value_and_infrastructure_is_not_a_score():
    cases = ["multi.key", "no-reward", "agent-timeout", "two-steps", "build-fails", "start-timeout"]
    results, attempts, dropped = scores(MIXED, "reward", -5.0, cases)
    assert dropped == 2
    assert results["multi.key"].score == 0.75
    assert results["no-reward"].score == -5.0 and results["no-reward"].n_dead == 1
    assert results["agent-timeout"].score == 0.25 and results["agent-timeout"].n_dead == 0
    assert results["two-steps"].score == -5.0 and results["two-steps"].n_dead == 1
    # Dropped infrastructure attempts leave the case without attempts (the backend re-runs it);
    # they never appear as a dead attempt.
    assert "build-fails" not in attempts and "start-timeout" not in attempts


def test_multi_key_rewards_and_missing_key():
    results, _, _ = scores(MIXED, "speed", 0.0, ["multi.key", "agent-timeout"])
    assert results["multi.key"].score == 2.5
    # The key is absent from that trial's rewards: a dead attempt, not a dropped one.
    assert results["agent-timeout"].n_dead == 1
    assert results["agent-timeout"].attempts[0].exception_type == "AgentTimeoutError"
    assert results["agent-timeout"].score == 0.0

    results, _, _ = scores(MIXED, "no-such-key", 3.0, ["multi.key"])
    assert results["multi.key"].attempts[0].reward is None
    assert results["multi.key"].score == 3.0


def test_install_failure_is_graded_like_nonzero_agent_exit():
    results, attempts, dropped = scores(INSTALL, "reward", 0.0, ["installed"])
    assert dropped == 0
    assert len(attempts["installed"]) == 2
    assert {a.exception_type for a in attempts["installed"]} == {"NonZeroAgentExitCodeError"}
    assert results["installed"].score == 1.0


def test_dead_attempts_stay_in_the_mean(tmp_path):
    job = tmp_path / "job"
    shutil.copytree(INSTALL, job)
    first = sorted(p for p in job.iterdir() if p.is_dir())[0]
    text = (first / "result.json").read_text()
    # Turn one attempt into a verifier crash: reward gone, RewardFileNotFoundError recorded.
    import json

    data = json.loads(text)
    data["verifier_result"] = None
    data["exception_info"]["exception_type"] = "RewardFileNotFoundError"
    (first / "result.json").write_text(json.dumps(data))
    results, _, _ = scores(job, "reward", 0.0, ["installed"])
    assert [a.reward for a in results["installed"].attempts].count(None) == 1
    assert results["installed"].score == pytest.approx(0.5)


def test_unfinished_and_unreadable_trials_are_not_outcomes(tmp_path):
    job = tmp_path / "job"
    shutil.copytree(INSTALL, job)
    (job / "installed__killed1").mkdir()
    (job / "installed__torn000").mkdir()
    (job / "installed__torn000" / "result.json").write_text('{"task_name": "installed", "trial')
    collation = collate_job(job, "reward")
    assert collation.n_unfinished == 2
    assert len(collation.trials) == 2
    assert read_trial(job / "installed__killed1", "reward") is None


def test_missing_job_dir_reads_as_nothing(tmp_path):
    collation = collate_job(tmp_path / "never-created", "reward")
    assert collation.trials == () and not collation.job_finished


def test_job_without_result_is_not_finished(tmp_path):
    job = tmp_path / "job"
    shutil.copytree(INSTALL, job)
    (job / "result.json").unlink()
    collation = collate_job(job, "reward")
    assert not collation.job_finished
    assert len(collation.trials) == 2


def test_outcomes_of_other_cases_are_ignored():
    collation = collate_job(MIXED, "reward")
    attempts: dict[str, list] = {}
    merge_outcomes(attempts, collation.trials, {"multi.key"})
    assert list(attempts) == ["multi.key"]
