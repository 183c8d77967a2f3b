"""Case problems at evaluation time (issue 11, situations 1-3): the nested-run backend refuses a
broken case before Harbor runs, with the problem's code, the case and Harbor's reason for the
operator, and nothing measured that could be charged to the candidate.

These need no Docker engine: the checks run Harbor's own task and environment code in a fresh
process (`python -I -m vero.harbor.case_checks`) with the nested run's environment, and stop the
evaluation before any `harbor run`. (Whether `no-network` is refused on Docker is asked of Harbor's
probe; the TPU row is refused on every machine.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from failure_cases import COMPOSE_KEY, UNSET_KEY, docker_egress_supported, write_case

from vero.commands.exit_codes import PROBLEM_EXIT_CODES, exit_code_for
from vero.core.diagnostics import RunDiagnostics
from vero.core.run import NestedRun
from vero.errors import CaseMisconfigured, InfrastructureFailure
from vero.harbor import HarborBackend
from vero.harbor import runner as runner_module
from vero.spec.models import CandidateRuntime, HarborSpec, ScoringSpec

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cases_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cases")
    for name in ("good", "no-tests", "needs-key", "compose-key", "key-default", "tpu", "no-internet"):
        write_case(root, name)
    return root


def make_run(
    cases_dir: Path,
    tmp_path: Path,
    case: str,
    *,
    env: dict[str, str] | None = None,
    runtime: CandidateRuntime | None = None,
) -> NestedRun:
    candidate = tmp_path / "candidate"
    candidate.mkdir(parents=True, exist_ok=True)
    (candidate / "answer.txt").write_text("1\n")
    return NestedRun(
        evaluation_id=f"ev-{case}",
        partition="hidden",
        candidate="0" * 40,
        candidate_dir=candidate,
        cases_dir=cases_dir,
        case_names=(case,),
        jobs_dir=tmp_path / "jobs",
        runtime=runtime or CandidateRuntime(kind="program", install_path="/opt/candidate"),
        harbor=HarborSpec(infra_retries=0),
        scoring=ScoringSpec(),
        env=env or {},
    )


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    monkeypatch.setattr(runner_module, "_CASE_CHECKS", {})
    for name in (UNSET_KEY, COMPOSE_KEY):
        monkeypatch.delenv(name, raising=False)


def evaluate(run: NestedRun, backend: HarborBackend | None = None):
    return asyncio.run((backend or HarborBackend()).evaluate(run))


EXPECTED = {
    "no-tests": ("case_invalid", "does not contain tests/test.sh"),
    "needs-key": ("missing_variables", f"{UNSET_KEY} (required by [environment.env])"),
    "compose-key": ("missing_variables", f"{COMPOSE_KEY} (required by environment/docker-compose.yaml)"),
    "tpu": ("setup_rejected", "TPU"),
}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_a_broken_case_is_refused_before_harbor_runs(case, cases_dir, tmp_path):
    code, needle = EXPECTED[case]
    with pytest.raises(CaseMisconfigured) as info:
        evaluate(make_run(cases_dir, tmp_path, case))
    error = info.value
    assert isinstance(error, InfrastructureFailure)  # refunded by every caller, like infrastructure
    assert error.code == code
    assert [(p.case, p.code) for p in error.problems] == [(case, code)]
    assert needle in error.problems[0].detail
    assert isinstance(error.diagnostics, RunDiagnostics) and error.diagnostics.problems == error.problems
    assert exit_code_for(error) == PROBLEM_EXIT_CODES[code]
    # No harbor job was started: nothing could have been measured or charged.
    assert not list((tmp_path / "jobs").glob(f"ev-{case}*"))


def test_no_network_is_refused_exactly_where_harbor_refuses_it(cases_dir, tmp_path):
    run = make_run(cases_dir, tmp_path, "no-internet")
    if docker_egress_supported():
        pytest.skip("this Docker engine enforces no-network: Harbor runs the case")
    with pytest.raises(CaseMisconfigured) as info:
        evaluate(run)
    assert info.value.code == "setup_rejected"
    assert "network_mode='no-network' is not supported" in info.value.problems[0].detail


def test_the_variables_the_nested_run_has_are_what_counts(cases_dir, tmp_path, monkeypatch):
    """A secret given to the run (`NestedRun.env`) satisfies the case; one set only in the
    backend's own process does not reach the nested run and does not."""
    backend = HarborBackend()
    monkeypatch.setenv(UNSET_KEY, "only-in-this-process")
    with pytest.raises(CaseMisconfigured):
        evaluate(make_run(cases_dir, tmp_path / "a", "needs-key"), backend)
    # Given to the run: the case passes its checks.
    run = make_run(cases_dir, tmp_path / "b", "needs-key", env={UNSET_KEY: "value-for-the-run"})
    problems = asyncio.run(
        backend._run_case_checks(run, ["needs-key", "key-default", "good"], runner_module.nested_env(run))
    )
    assert problems == []


def test_the_environment_options_are_checked_with_the_case(cases_dir, tmp_path):
    """The nested run's `harbor.environment_options` reach the setup check (`--options` of
    `python -m vero.harbor.case_checks`): an option Harbor's Docker environment refuses is the
    case's setup problem, as `harbor run --ek` would refuse it, before anything runs."""
    run = make_run(cases_dir, tmp_path, "good")
    bad = run.harbor.model_copy(update={"environment_options": {"frobnicate": 1}})
    with pytest.raises(CaseMisconfigured) as info:
        evaluate(run.model_copy(update={"harbor": bad}))
    assert info.value.code == "setup_rejected" and "frobnicate" in info.value.problems[0].detail
    good = run.harbor.model_copy(update={"environment_options": {"keep_containers": False}})
    problems = asyncio.run(
        HarborBackend()._run_case_checks(
            run.model_copy(update={"harbor": good}), ["good"], runner_module.nested_env(run)
        )
    )
    assert problems == []


def test_each_case_is_checked_once_per_process(cases_dir, tmp_path, monkeypatch):
    calls = []
    real = HarborBackend._run_case_checks

    async def counting(self, run, names, env):
        calls.append(tuple(names))
        return await real(self, run, names, env)

    monkeypatch.setattr(HarborBackend, "_run_case_checks", counting)
    for attempt in range(2):
        with pytest.raises(CaseMisconfigured):
            evaluate(make_run(cases_dir, tmp_path / str(attempt), "tpu"))
    assert calls == [("tpu",)]


def test_an_agent_candidate_cannot_shadow_the_checks(cases_dir, tmp_path):
    """`kind: agent` puts the checkout on the nested run's PYTHONPATH; the checks run isolated
    (`python -I`), so a candidate's own `vero` or `harbor` package cannot answer for them."""
    candidate = tmp_path / "candidate"
    for package in ("vero", "harbor"):
        (candidate / package).mkdir(parents=True)
        (candidate / package / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    (candidate / "agent.py").write_text("class Agent: ...\n")
    run = make_run(
        cases_dir, tmp_path, "no-tests", runtime=CandidateRuntime(kind="agent", agent_import_path="agent:Agent")
    )
    assert run.candidate_dir == candidate
    with pytest.raises(CaseMisconfigured) as info:
        evaluate(run)
    assert info.value.code == "case_invalid"
