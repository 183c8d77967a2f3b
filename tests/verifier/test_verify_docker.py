"""`verify` with the real `HarborBackend` on real Harbor cases (needs Docker; run by CI).

Uses the `tasks/minimal` example: the target's `word_count` splits on single spaces only, the
reference fixes it; the hidden case `words-spaces` tells them apart.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import git
import pytest

from vero.core.baseline import commit_baseline
from vero.core.candidates import CandidateStore
from vero.core.session import SealHeader, Submission, write_session_archive
from vero.core.state import StateStore
from vero.core.submission import record_submission
from vero.harbor import HarborBackend
from vero.spec.compiled import VerifierConfig
from vero.spec.models import CandidateRuntime, HarborSpec, ScoringSpec, SelectionSpec, TargetPartition
from vero.verifier import VerifierPaths, verify

MINIMAL = Path(__file__).resolve().parents[2] / "tasks" / "minimal"
SPEC_DIGEST = "sha256:" + "d0" * 32


def _session(tmp: Path, *, submit: bool) -> tuple[Path, str, Path]:
    agent = tmp / "agent"
    shutil.copytree(MINIMAL / "target", agent)
    baseline = commit_baseline(agent)
    shutil.copyfile(MINIMAL / "reference" / "textstats.py", agent / "textstats.py")
    repo = git.Repo(agent)
    repo.index.add(["textstats.py"])
    actor = git.Actor("agent", "agent@example.invalid")
    fixed = repo.index.commit("split on any whitespace", author=actor, committer=actor).hexsha
    state = tmp / "state"
    with StateStore.open(state / "state.db") as state_store:
        CandidateStore.open(state, state_store).import_version_sync(agent, fixed)
        if submit:
            asyncio.run(
                record_submission(
                    state_store, Submission(candidate=fixed, version="HEAD", submitted_at=datetime.now(UTC))
                )
            )
    archive = tmp / "export" / "session.tar.gz"
    write_session_archive(
        state,
        archive,
        SealHeader(
            name="minimal",
            spec_digest=SPEC_DIGEST,
            baseline_commit=baseline,
            sealed_at=datetime(2026, 3, 1, tzinfo=UTC),
        ),
    )
    return archive, baseline, fixed


def _config(baseline: str) -> VerifierConfig:
    return VerifierConfig(
        name="minimal",
        spec_digest=SPEC_DIGEST,
        baseline_commit=baseline,
        runtime=CandidateRuntime(kind="program", install_path="/opt/candidate"),
        scoring=ScoringSpec(),
        harbor=HarborSpec(n_concurrent=1, case_timeout_sec=60, evaluation_timeout_sec=600, infra_retries=1),
        partitions={"train": ["words-basic"], "hidden": ["words-spaces"]},
        selection=SelectionSpec(mode="submit", partition="train"),
        targets={"hidden": TargetPartition()},
        reward_keys={"hidden": "reward"},
        failure_values={"hidden": 0.0},
    )


@pytest.mark.docker
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("submit", "expected"), [(True, 1.0), (False, 0.0)])
def test_verify_scores_the_submission_or_the_baseline_with_nested_harbor_runs(
    tmp_path: Path, submit: bool, expected: float
) -> None:
    archive, baseline, fixed = _session(tmp_path, submit=submit)
    out = tmp_path / "logs"
    final = asyncio.run(
        verify(
            _config(baseline),
            VerifierPaths(
                session_archive=archive,
                cases_dir=MINIMAL / "cases",
                baseline_dir=MINIMAL / "target",
                reward_path=out / "verifier" / "reward.json",
                artifacts_dir=out / "verifier" / "artifacts",
                work_dir=tmp_path / "work",
            ),
            HarborBackend(),
            # The candidates are the example's own baseline and fix: trusted code, run as whoever runs the test.
            allow_root_runs=True,
        )
    )
    assert final.status == "scored", final.errors
    assert final.chosen.candidate == (fixed if submit else baseline)
    assert final.targets[0].measured and final.targets[0].n_cases == 1
    assert json.loads((out / "verifier" / "reward.json").read_text()) == {"reward": expected}
    job_dir = Path(final.measurements[-1].job_dir)
    assert (job_dir / "result.json").is_file()
