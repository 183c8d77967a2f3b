"""A real sidecar-like state for verifier tests, sealed into a real session archive.

Test modules import these helpers by this module's own name (`from verifier_bench import ...`),
never `from conftest import ...`: another test directory's `conftest` module of the same name
would shadow it depending on the order pytest collects the directories in.

`Workbench` holds: baseline files and their deterministic commit, an agent repository whose first
commit is that baseline, a sidecar state dir with a real candidate store (`vero.core.candidates`),
job store and budget ledger, and the cases directory. `seal()` writes the archive with
`vero.core.session.write_session_archive`.

`TableBackend` is the only stand-in: the real backend needs Docker. It implements the same
`EvaluationBackend` protocol and scores by (partition, tree of the checkout it was handed), where the
tree is hashed from the files actually present in `candidate_dir` (not from the commit id), so a
wrong checkout gives a wrong score.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import git

from vero.core.baseline import commit_baseline
from vero.core.candidates import CandidateRecord, CandidateStore
from vero.core.evaluation import AttemptResult, CaseResult, EvaluationResult
from vero.core.jobs import EvaluationJob, JobStore
from vero.core.ledger import BudgetLedger, BudgetTotals, Cost
from vero.core.run import NestedRun, PairedEvaluationBackend, PairedResult, RunArm, RunAs
from vero.core.session import SealHeader, Submission, write_session_archive
from vero.core.state import StateStore
from vero.core.submission import record_submission
from vero.errors import InfrastructureFailure
from vero.spec.compiled import AGENT_PRINCIPAL, VerifierConfig
from vero.spec.models import CandidateRuntime, HarborSpec, ScoringSpec, SelectionSpec, TargetPartition
from vero.verifier import Finalization, VerifierPaths, verify

SPEC_DIGEST = "sha256:" + "5e" * 32
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)

PARTITIONS = {
    "train": ["train-1", "train-2", "train-3"],
    "select": ["select-1", "select-2"],
    "hidden": ["hidden-1", "hidden-2"],
    "hidden-b": ["hidden-b-1"],
    "hidden-wide": [f"hidden-wide-{i}" for i in range(1, 9)],
}
AGENT_PARTITIONS = ("train", "select")


def worktree_tree(directory: Path) -> str:
    """Git tree id of the files present in `directory` (ignoring `.git`), via a throwaway repository."""
    scratch = directory.parent / f".{directory.name}.tree-git"
    env = {
        "PATH": os.environ["PATH"],
        "GIT_DIR": str(scratch),
        "GIT_WORK_TREE": str(directory),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "HOME": str(directory.parent),
    }
    try:
        plain = {k: v for k, v in env.items() if k not in ("GIT_DIR", "GIT_WORK_TREE")}
        subprocess.run(["git", "init", "-q", "--bare", str(scratch)], env=plain, check=True, capture_output=True)
        subprocess.run(
            ["git", "-c", f"safe.directory={directory}", "add", "-A", "-f", "."],
            cwd=directory,
            env=env,
            check=True,
            capture_output=True,
        )
        return subprocess.run(
            ["git", "-c", f"safe.directory={directory}", "write-tree"],
            cwd=directory,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@dataclass
class Call:
    partition: str
    tree: str
    candidate: str
    case_names: tuple[str, ...]
    env: dict[str, str]
    evaluation_id: str
    n_attempts: int = 1


class TableBackend:
    """Deterministic `EvaluationBackend`: every case of (partition, tree) scores the table's value
    (a number, or case name -> number for cases that differ).

    A missing entry raises `InfrastructureFailure` (the run measured nothing).
    """

    def __init__(self, table: Mapping[tuple[str, str], float | Mapping[str, float]]):
        self.table = dict(table)
        self.calls: list[Call] = []

    async def evaluate(self, run: NestedRun) -> EvaluationResult:
        assert run.candidate_dir.is_dir() and run.jobs_dir.is_dir()
        tree = await asyncio.to_thread(worktree_tree, run.candidate_dir)
        self.calls.append(
            Call(
                run.partition,
                tree,
                run.candidate,
                run.case_names,
                dict(run.env),
                run.evaluation_id,
                run.harbor.n_attempts,
            )
        )
        if (run.partition, tree) not in self.table:
            raise InfrastructureFailure("no trial produced a result")
        value = self.table[(run.partition, tree)]
        failure = run.scoring.effective_failure_value()
        cases = [
            CaseResult.from_attempts(
                name,
                [
                    AttemptResult(
                        trial_name=f"{name}__{run.candidate[:7]}-{k}",
                        reward=value[name] if isinstance(value, Mapping) else value,
                    )
                    for k in range(run.harbor.n_attempts)
                ],
                failure,
            )
            for name in run.case_names
        ]
        return EvaluationResult.from_cases(
            partition=run.partition,
            candidate=run.candidate,
            reward_key=run.scoring.reward_key,
            cases=cases,
            started_at=T0,
            finished_at=T0,
            job_dir=str(run.jobs_dir / run.evaluation_id),
        )

    async def evaluate_paired(self, run: NestedRun, baseline: RunArm) -> PairedResult:
        """Both arms, each as `evaluate` scores it; as the real backend does, only the candidate's
        arm fails the run: a baseline without a table entry comes back without attempts."""
        candidate = await self.evaluate(run)
        arm = run.model_copy(
            update={
                "candidate": baseline.candidate,
                "candidate_dir": baseline.candidate_dir,
                "candidate_env": baseline.candidate_env,
            }
        )
        try:
            base = await self.evaluate(arm)
        except InfrastructureFailure:
            failure = run.scoring.effective_failure_value()
            base = EvaluationResult.from_cases(
                partition=run.partition,
                candidate=baseline.candidate,
                reward_key=run.scoring.reward_key,
                cases=[CaseResult.from_attempts(name, [], failure) for name in run.case_names],
                started_at=T0,
                finished_at=T0,
            )
        return PairedResult(candidate=candidate, baseline=base)


_backend_check: type[PairedEvaluationBackend] = TableBackend  # the stub satisfies the protocol statically


class AgentRepo:
    """The agent's repository: the baseline commit plus commits made by `commit`."""

    def __init__(self, path: Path, baseline_files: Path):
        shutil.copytree(baseline_files, path)
        self.path = path
        self.baseline = commit_baseline(path)
        self.repo = git.Repo(path)
        self._n = 0

    def commit(self, content: str, message: str | None = None) -> str:
        """Commit `solution.txt` = `content`; returns the commit id."""
        self._n += 1
        (self.path / "solution.txt").write_text(content)
        self.repo.index.add(["solution.txt"])
        actor = git.Actor("agent", "agent@example.invalid")
        when = (T0 + timedelta(minutes=self._n)).strftime("%Y-%m-%dT%H:%M:%S +0000")
        commit = self.repo.index.commit(
            message or f"attempt {self._n}: {content.strip()}",
            author=actor,
            committer=actor,
            author_date=when,
            commit_date=when,
        )
        return commit.hexsha

    def tree(self, commit: str) -> str:
        return self.repo.commit(commit).tree.hexsha


@dataclass
class Workbench:
    root: Path
    budgets: dict[str, tuple[int, int]] = field(default_factory=lambda: {"train": (20, 200), "select": (10, 40)})
    baseline_extra: dict[str, str] = field(default_factory=dict)
    """More files of the baseline (name -> text), in every candidate too."""

    def __post_init__(self) -> None:
        self.baseline_files = self.root / "baseline"
        self.baseline_files.mkdir()
        (self.baseline_files / "solution.txt").write_text("baseline\n")
        (self.baseline_files / "README.md").write_text("# target\n")
        (self.baseline_files / "run.sh").write_text("#!/bin/sh\ncat solution.txt\n")
        (self.baseline_files / "run.sh").chmod(0o755)
        for name, text in self.baseline_extra.items():
            (self.baseline_files / name).write_text(text)
        self.agent = AgentRepo(self.root / "agent", self.baseline_files)
        self.baseline_commit = self.agent.baseline
        self.baseline_tree = self.agent.tree(self.baseline_commit)
        self.state = self.root / "state"
        self.state_store = StateStore.open(self.state / "state.db")
        self.store = CandidateStore.open(self.state, self.state_store)
        self.ledger = BudgetLedger.open(
            self.state_store,
            {(p, AGENT_PRINCIPAL): BudgetTotals(runs=runs, cases=cases) for p, (runs, cases) in self.budgets.items()},
        )
        self.jobs = JobStore(self.ledger)
        self.cases_dir = self.root / "cases"
        for names in PARTITIONS.values():
            for name in names:
                (self.cases_dir / name).mkdir(parents=True)
                (self.cases_dir / name / "task.toml").write_text('schema_version = "1.4"\n')
        self.clock = T0
        self.records: dict[str, CandidateRecord] = {}

    # -- building the sidecar state -----------------------------------------------------------

    def candidate(self, content: str, message: str | None = None) -> str:
        """Commit `content` in the agent repo and import it into the store; returns the commit id."""
        commit = self.agent.commit(content, message)
        self.records[commit] = self.store.import_version_sync(self.agent.path, commit)
        return commit

    def import_baseline(self) -> str:
        self.records[self.baseline_commit] = self.store.import_version_sync(self.agent.path, self.baseline_commit)
        return self.baseline_commit

    def evaluation(
        self,
        candidate: str,
        partition: str,
        score: float | None,
        *,
        cases: list[str] | None = None,
        state: str = "complete",
    ) -> EvaluationJob:
        """Record one evaluation job as the sidecar would: reserve, run, settle (or refund)."""
        chosen = list(cases) if cases is not None else list(PARTITIONS[partition])
        self.clock += timedelta(minutes=3)
        created, finished = self.clock, self.clock + timedelta(minutes=2)
        job_id = JobStore.new_id()
        result = None
        if score is not None:
            result = EvaluationResult.from_cases(
                partition=partition,
                candidate=candidate,
                reward_key="reward",
                cases=[
                    CaseResult.from_attempts(c, [AttemptResult(trial_name=f"{c}__x", reward=score)], 0.0)
                    for c in chosen
                ],
                started_at=created,
                finished_at=finished,
            )

        async def record() -> EvaluationJob:
            job = EvaluationJob(
                id=job_id,
                principal=AGENT_PRINCIPAL,
                partition=partition,
                cases=chosen,
                full_partition=cases is None,
                version=candidate,
                candidate=candidate,
                disclosure="aggregate",
                reservation_id=job_id,
                state="queued",
                created_at=created,
            )
            await self.jobs.admit(job, Cost.of_evaluation(len(chosen)))
            await self.jobs.update(job_id, state="running", started_at=created)
            return await self.jobs.finish(
                job_id,
                state,
                finished_at=finished,
                result=result,
                error=None if state == "complete" else "infrastructure",
            )

        return asyncio.run(record())

    def submit(self, candidate: str) -> None:
        self.clock += timedelta(minutes=1)
        asyncio.run(
            record_submission(
                self.state_store, Submission(candidate=candidate, version=candidate, submitted_at=self.clock)
            )
        )

    def seal(self, name: str = "session.tar.gz") -> Path:
        archive = self.root / "export" / name
        write_session_archive(
            self.state,
            archive,
            SealHeader(
                name="demo",
                spec_digest=SPEC_DIGEST,
                baseline_commit=self.baseline_commit,
                sealed_at=self.clock + timedelta(minutes=5),
                intake_closed_at=self.clock + timedelta(minutes=4),
                intake_closed_by="agent_ended",
            ),
            state=self.state_store,
        )
        return archive

    def tree(self, commit: str) -> str:
        return self.agent.tree(commit)

    # -- the verifier side --------------------------------------------------------------------

    def config(
        self,
        *,
        mode: str = "submit",
        partition: str | None = "select",
        rescore_top_k: int = 1,
        baseline_floor: bool = False,
        direction: str = "maximize",
        failure_value: float | None = None,
        targets: tuple[str, ...] = ("hidden",),
        target_failure: float | None = None,
        spec_digest: str = SPEC_DIGEST,
        secrets: list[str] | None = None,
        target: Mapping[str, object] | None = None,
        runtime: CandidateRuntime | None = None,
    ) -> VerifierConfig:
        """The verifier's config over this bench; `target` sets `TargetPartition` fields of every target;
        `runtime` the target's kind (default `kind: program`)."""
        scoring = ScoringSpec(direction=direction, failure_value=failure_value)
        keys = {targets[0]: "reward"} if len(targets) == 1 else {t: t for t in targets}
        fail = target_failure if target_failure is not None else scoring.effective_failure_value()
        return VerifierConfig(
            name="demo",
            spec_digest=spec_digest,
            baseline_commit=self.baseline_commit,
            runtime=runtime or CandidateRuntime(kind="program", install_path="/opt/candidate"),
            scoring=scoring,
            harbor=HarborSpec(),
            secrets=secrets or [],
            partitions={p: PARTITIONS[p] for p in ("select", *targets)},
            selection=SelectionSpec(
                mode=mode, partition=partition, rescore_top_k=rescore_top_k, baseline_floor=baseline_floor
            ),
            targets={t: TargetPartition.model_validate(target or {}) for t in targets},
            reward_keys=keys,
            failure_values=dict.fromkeys(targets, fail),
        )

    def verify(
        self,
        config: VerifierConfig,
        archive: Path,
        backend: PairedEvaluationBackend,
        *,
        env: dict[str, str] | None = None,
        tag: str = "run",
        run_as: RunAs | None = None,
    ) -> Finalization:
        out = self.root / tag
        return asyncio.run(
            verify(
                config,
                VerifierPaths(
                    session_archive=archive,
                    cases_dir=self.cases_dir,
                    baseline_dir=self.baseline_files,
                    reward_path=out / "logs" / "verifier" / "reward.json",
                    artifacts_dir=out / "logs" / "verifier" / "artifacts",
                    mirror_dirs=(out / "logs" / "artifacts",),
                    work_dir=out / "work",
                ),
                backend,
                env=env,
                run_as=run_as,
                allow_root_runs=True,  # the table backend runs no candidate code
            )
        )

    def reward_path(self, tag: str = "run") -> Path:
        return self.root / tag / "logs" / "verifier" / "reward.json"

    def artifacts(self, tag: str = "run") -> Path:
        return self.root / tag / "logs" / "verifier" / "artifacts"
