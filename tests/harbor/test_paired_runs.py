"""`HarborBackend.evaluate_paired`: the verifier's two arms (the shipped candidate and the baseline) in
one real `harbor run` on real Docker, interleaved per case (`vero.harbor.runner`, "Paired runs")."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path

import pytest
import tenacity
from harbor_cases import make_run

from vero.core.run import RunArm
from vero.harbor import HarborBackend
from vero.spec.models import CandidateRuntime, HarborSpec

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

FAST = dict(infra_wait=tenacity.wait_none(), kill_grace_sec=5.0)
PROGRAM = CandidateRuntime(kind="program", install_path="/opt/cand", install_command="id -un > installed.marker")
AGENT = CandidateRuntime(kind="agent", agent_import_path="cand_agent:EchoAgent")
BASELINE_AGENT = '''
from harbor.agents.base import BaseAgent


class EchoAgent(BaseAgent):
    """The baseline's agent: writes the wrong line."""

    @staticmethod
    def name() -> str:
        return "echo-baseline"

    def version(self) -> str:
        return "0.0.1"

    async def setup(self, environment) -> None:
        return

    async def run(self, instruction, environment, context) -> None:
        await environment.exec("echo 'hello from the baseline' > /app/out.txt")
'''


def _trials(job_dir: Path) -> list[dict]:
    return [json.loads((p / "result.json").read_text()) for p in sorted(job_dir.iterdir()) if p.is_dir()]


def test_both_arms_run_in_one_job_interleaved_per_case_each_with_its_own_scores(
    cases_dir, program_candidate, jobs_dir, own_root
):
    baseline = own_root / "paired-baseline"
    (baseline / ".git").mkdir(parents=True)
    (baseline / "data.txt").write_text("bye\n")  # prog-pass rewards only `hello`
    run = make_run(
        evaluation_id="ev-paired",
        cases_dir=cases_dir,
        candidate="c" * 40,
        candidate_dir=program_candidate,
        jobs_dir=jobs_dir,
        case_names=("prog-pass", "prog-fail.v2"),
        runtime=PROGRAM,
        harbor=HarborSpec(n_concurrent=2, n_attempts=2, case_timeout_sec=120, infra_retries=0),
    )

    paired = asyncio.run(HarborBackend(**FAST).evaluate_paired(run, RunArm(candidate="b" * 40, candidate_dir=baseline)))

    candidate, base = paired.candidate, paired.baseline
    assert (candidate.candidate, base.candidate) == ("c" * 40, "b" * 40)
    assert {c.case: [a.reward for a in c.attempts] for c in candidate.cases} == {
        "prog-pass": [1.0, 1.0],
        "prog-fail.v2": [0.0, 0.0],
    }
    assert {c.case: [a.reward for a in c.attempts] for c in base.cases} == {
        "prog-pass": [0.0, 0.0],
        "prog-fail.v2": [0.0, 0.0],
    }
    assert candidate.job_dir == base.job_dir == str(jobs_dir / "ev-paired")
    # One Harbor job: one agent config per arm, each naming its own checkout.
    config = json.loads((jobs_dir / "ev-paired" / "config.json").read_text())
    assert [a["kwargs"]["candidate_dir"] for a in config["agents"]] == [
        str(program_candidate.absolute()),
        str(baseline.absolute()),
    ]
    # Interleaved: in the order the trials started, each case's two arms come one after the other
    # (Harbor queues attempt by attempt, case by case, agent config by agent config).
    trials = sorted(_trials(jobs_dir / "ev-paired"), key=lambda t: datetime.fromisoformat(t["started_at"]))
    order = [(Path(t["config"]["task"]["path"]).name, t["config"]["agent"]["kwargs"]["candidate_dir"]) for t in trials]
    assert len(order) == 8
    for first, second in zip(order[0::2], order[1::2], strict=True):
        assert first[0] == second[0] and {first[1], second[1]} == {
            str(program_candidate.absolute()),
            str(baseline.absolute()),
        }, order
    # ... and the attempts come round by round: both cases once, then both again.
    pairs = [case for case, _ in order[0::2]]
    assert pairs[:2] == pairs[2:] and sorted(pairs[:2]) == ["prog-fail.v2", "prog-pass"], pairs


def test_agent_arms_each_get_their_own_candidate_hosts(
    cases_dir, agent_candidate, jobs_dir, own_root, portable_toolchain
):
    baseline = own_root / "paired-baseline-agent"
    (baseline / "cand_agent").mkdir(parents=True)
    (baseline / "cand_agent" / "__init__.py").write_text(BASELINE_AGENT)
    run = make_run(
        evaluation_id="ev-paired-agent",
        cases_dir=cases_dir,
        candidate_dir=agent_candidate,
        jobs_dir=jobs_dir,
        case_names=("agent-echo",),
        runtime=AGENT,
        harbor=HarborSpec(n_concurrent=2, infra_retries=0),
    )
    backend = HarborBackend(python_executable=portable_toolchain[1], **FAST)

    paired = asyncio.run(backend.evaluate_paired(run, RunArm(candidate="b" * 40, candidate_dir=baseline)))

    assert [c.score for c in paired.candidate.cases] == [1.0]
    assert [c.score for c in paired.baseline.cases] == [0.0]
    config = json.loads((jobs_dir / "ev-paired-agent" / "config.json").read_text())
    launchers = [a["kwargs"]["launcher"] for a in config["agents"]]
    assert len(set(launchers)) == 2  # a launcher (and so hosts and a gateway token) per arm
