"""Which candidate the verifier ships (docs/operating.md): submission replay, `auto_best`, the baseline floor.

Rules, in the order they apply:

1. **Mode `submit`**: the recorded submission's candidate; no submission -> the baseline (said so).
2. **Mode `auto_best`**: the sidecar's *full-partition* evaluations of the selection partition that
   completed with a result are ranked (subset evaluations, failed and cancelled jobs are not
   eligible). Candidates with the same tree are one entry: their evaluations are pooled and
   averaged together. Entries are ordered by mean in the spec's direction, ties by the earliest
   evaluation, then by tree id, so the order never depends on dict or file order. The top
   `rescore_top_k` entries are re-scored by the verifier itself on the selection partition and the
   best re-score wins (ties keep the recorded order). If no re-score produced a measurement, the
   best recorded entry is kept and the selection says so. No eligible evaluation -> the baseline.
3. **Baseline floor** (`baseline_floor: true`, either mode): unless the chosen candidate *is* the
   baseline (same commit or tree), the baseline is re-scored on the selection partition and shipped
   unless the candidate's verifier re-score strictly beats it (when the candidate has no re-score
   yet, the two measurements run side by side: neither depends on the other, and both are taken
   under the same load). If the candidate cannot be re-scored
   it cannot show that it beats the baseline, so the baseline ships. If the baseline itself cannot
   be measured (or its files do not rebuild the compiled baseline commit), the floor **fails
   closed: nothing is shipped** and every target gets its failure value. Shipping the candidate
   unmeasured would let the floor be bypassed by breaking the baseline run; shipping the baseline
   unmeasured would report a reward for something the floor never checked. Failure values are the
   one outcome that can never beat a real measurement.

Only the verifier's own measurements decide between candidates it re-scored; a measurement that
failed is never turned into a number for ranking (it is excluded), so an unmeasured candidate can
never outrank a measured one in either direction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vero.core.diagnostics import RunDiagnostics
from vero.core.evaluation import CaseResult, DependencyInstall, mean_score
from vero.core.jobs import EvaluationJob
from vero.core.usage import InferenceUsage
from vero.spec.models import Direction

__all__ = [
    "FloorOutcome",
    "Measure",
    "Measurement",
    "PooledEntry",
    "Rescore",
    "Selection",
    "SelectionMethod",
    "better",
    "eligible_jobs",
    "rank_recorded",
    "select_candidate",
]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Measurement(_Model):
    """One measurement the verifier made itself (a nested `harbor run` over one partition)."""

    evaluation_id: str
    """The nested run's id (its Harbor job name)."""
    partition: str
    candidate: str
    """Commit id of the measured candidate."""
    purpose: str
    """Why it was run: `rescore`, `floor-baseline`, `floor-candidate`, `target`, `target-baseline`
    (the baseline's arm of a target's paired run: the same `evaluation_id` as its `target`)."""
    score: float | None = None
    """Mean case score in the reward's units; None when nothing could be measured."""
    n_cases: int = 0
    n_attempts: int = 1
    """Attempts asked for per case."""
    n_dead: int = 0
    """Attempts without a valid reward (scored as the failure value inside `score`)."""
    cases: list[CaseResult] = Field(default_factory=list)
    """Each case the run reported: its attempts (outcome, reward, exception, flags) and score."""
    error: str | None = None
    """Why `score` is None (e.g. `InfrastructureFailure: ...`)."""
    flags: dict[str, int] = Field(default_factory=dict)
    """Attempts per notable outcome and case-kit flag (`EvaluationResult.flag_counts`), e.g.
    `{"reward_out_of_range": 1}`."""
    job_dir: str | None = None
    """The nested Harbor job directory, for operators."""
    inference: InferenceUsage | None = None
    """Model calls of the run, metered by the verifier's inference gateway (None without one)."""
    diagnostics: RunDiagnostics | None = None
    """Why it failed, or which trials failed inside it: case problems, each nested run's output
    tail, each failed trial's exception (scrubbed; `vero.core.diagnostics`). None for a clean run."""
    dependencies: DependencyInstall | None = None
    """`kind: agent`: the install of the candidate's declared dependencies (time, size, reused)."""

    @property
    def measured(self) -> bool:
        return self.score is not None


Measure = Callable[[str, str, str], Coroutine[Any, Any, Measurement]]
"""`await measure(candidate_id, partition, purpose)` -> a `Measurement` (never raises for a failed run)."""


class PooledEntry(_Model):
    """Candidates sharing one tree, with their eligible recorded evaluations pooled."""

    tree: str
    candidates: list[str]
    """Commit ids with this tree, in order of their first eligible evaluation."""
    representative: str
    """The candidate that is re-scored and shipped for this tree (the first evaluated one)."""
    mean: float
    """Mean of the pooled evaluations' scores (each a full-partition mean)."""
    evaluation_ids: list[str]
    first_evaluated_at: datetime
    """`created_at` of the earliest pooled evaluation (the tie-breaker)."""


class Rescore(_Model):
    """The verifier's re-score of one ranked entry."""

    tree: str
    candidate: str
    recorded_mean: float
    measurement: Measurement


SelectionMethod = Literal[
    "submission",
    "baseline_no_submission",
    "auto_best_rescored",
    "auto_best_recorded",
    "baseline_no_eligible_evaluation",
]
"""How the candidate was picked before the floor: the recorded submission, the baseline for want of
one, the best verifier re-score, the best recorded mean (no re-score succeeded), or the baseline
because no full-partition evaluation was eligible."""


class FloorOutcome(_Model):
    """What the baseline floor decided."""

    applied: bool
    """False when the floor is off or the chosen candidate already is the baseline."""
    baseline: Measurement | None = None
    candidate: Measurement | None = None
    shipped: Literal["candidate", "baseline", "nothing"] = "candidate"
    reason: str = ""


class Selection(_Model):
    """The verifier's choice and how it was reached."""

    mode: Literal["submit", "auto_best"]
    partition: str | None
    method: SelectionMethod
    picked: str | None
    """Commit id picked by the mode (before the floor); None only if nothing could be picked."""
    shipped: str | None
    """Commit id that is scored on the targets; None when the floor failed closed."""
    shipped_is_baseline: bool
    ranking: list[PooledEntry] = []
    rescores: list[Rescore] = []
    floor: FloorOutcome = FloorOutcome(applied=False)
    notes: list[str] = []


def better(a: float, b: float, direction: Direction) -> bool:
    """True when score `a` is strictly better than `b` in `direction`."""
    return a > b if direction == "maximize" else a < b


def eligible_jobs(
    jobs: Iterable[EvaluationJob], partition: str, case_names: Iterable[str] | None = None
) -> list[EvaluationJob]:
    """The jobs that may rank a candidate: complete, with a result, over the whole `partition`.

    Args:
        jobs: the session's jobs.
        partition: the selection partition.
        case_names: the partition's cases per the verifier's config; when given, a job must have
            run exactly this set (a `full_partition` flag alone is not trusted to mean "all cases").
    """
    expected = set(case_names) if case_names is not None else None
    selected = []
    for job in jobs:
        result = job.result
        if job.state != "complete" or result is None or not job.full_partition:
            continue
        if job.partition != partition or result.partition != partition or result.candidate != job.candidate:
            continue
        if expected is not None and set(job.cases) != expected:
            continue
        selected.append(job)
    return selected


def rank_recorded(
    jobs: Iterable[EvaluationJob],
    trees: Mapping[str, str],
    *,
    partition: str,
    direction: Direction,
    case_names: Iterable[str] | None = None,
) -> list[PooledEntry]:
    """Pool eligible evaluations by tree and order the entries best first.

    Args:
        jobs: the session's jobs (any states and partitions; ineligible ones are skipped).
        trees: candidate commit id -> tree id. Jobs of a candidate missing here are skipped.
        partition: the selection partition.
        direction: `maximize` or `minimize` (`scoring.direction`).
        case_names: see `eligible_jobs`.

    Returns:
        Entries sorted by mean (best first), then earliest evaluation, then tree id.
    """
    pooled: dict[str, list[EvaluationJob]] = {}
    for job in sorted(eligible_jobs(jobs, partition, case_names), key=lambda j: (j.created_at, j.id)):
        tree = trees.get(job.candidate)
        if tree is not None:
            pooled.setdefault(tree, []).append(job)
    entries = []
    for tree, group in pooled.items():
        candidates = list(dict.fromkeys(job.candidate for job in group))
        entries.append(
            PooledEntry(
                tree=tree,
                candidates=candidates,
                representative=candidates[0],
                mean=mean_score(job.result.score for job in group if job.result is not None),  # all: eligible
                evaluation_ids=[job.id for job in group],
                first_evaluated_at=group[0].created_at,
            )
        )
    sign = -1.0 if direction == "maximize" else 1.0
    return sorted(entries, key=lambda e: (sign * e.mean, e.first_evaluated_at, e.tree))


async def select_candidate(
    *,
    mode: Literal["submit", "auto_best"],
    partition: str | None,
    direction: Direction,
    rescore_top_k: int,
    baseline_floor: bool,
    jobs: list[EvaluationJob],
    trees: Mapping[str, str],
    submission: str | None,
    baseline_commit: str,
    baseline_tree: str | None,
    baseline_available: bool,
    measure: Measure,
    case_names: Iterable[str] | None = None,
) -> Selection:
    """Apply the selection rules of this module's docstring.

    Args:
        mode, partition, direction, rescore_top_k, baseline_floor: from the verifier config.
        jobs: the session's jobs. trees: candidate id -> tree id (from the session's records).
        submission: the submitted candidate id, or None.
        baseline_commit: the compiled baseline commit id.
        baseline_tree: its tree id, when the baseline files were rebuilt successfully.
        baseline_available: False when the baseline files do not rebuild `baseline_commit`; the
            baseline then can be neither measured nor shipped.
        measure: runs one verifier measurement (see `Measure`).
        case_names: the selection partition's cases (see `eligible_jobs`).

    Returns:
        The `Selection`; `shipped` is None when nothing may be shipped.

    Raises:
        ValueError: `auto_best` or `baseline_floor` without a selection partition.
    """
    if (mode == "auto_best" or baseline_floor) and partition is None:
        raise ValueError("auto_best and baseline_floor need a selection partition")
    notes: list[str] = []
    ranking: list[PooledEntry] = []
    rescores: list[Rescore] = []

    if mode == "submit":
        if submission is not None:
            picked, method = submission, "submission"
        else:
            picked, method = baseline_commit, "baseline_no_submission"
            notes.append("no submission was recorded: the baseline is scored")
    else:
        assert partition is not None  # auto_best without a partition was refused above
        ranking = rank_recorded(jobs, trees, partition=partition, direction=direction, case_names=case_names)
        if not ranking:
            picked, method = baseline_commit, "baseline_no_eligible_evaluation"
            notes.append("no complete full-partition evaluation of the selection partition: the baseline is scored")
        else:
            for entry in ranking[:rescore_top_k]:
                measurement = await measure(entry.representative, partition, "rescore")
                rescores.append(
                    Rescore(
                        tree=entry.tree,
                        candidate=entry.representative,
                        recorded_mean=entry.mean,
                        measurement=measurement,
                    )
                )
            best: Rescore | None = None
            best_score = 0.0
            for rescore in rescores:
                score = rescore.measurement.score
                if score is not None and (best is None or better(score, best_score, direction)):
                    best, best_score = rescore, score
            if best is not None:
                picked, method = best.candidate, "auto_best_rescored"
            else:
                picked, method = ranking[0].representative, "auto_best_recorded"
                notes.append("no re-score produced a measurement: the best recorded mean is kept")

    is_baseline = picked == baseline_commit or (baseline_tree is not None and trees.get(picked) == baseline_tree)
    floor = FloorOutcome(applied=False)
    shipped: str | None = picked
    if baseline_floor and not is_baseline:
        assert partition is not None  # a floor without a partition was refused above
        floor = await _apply_floor(picked, partition, direction, rescores, baseline_commit, baseline_available, measure)
        shipped = {"candidate": picked, "baseline": baseline_commit, "nothing": None}[floor.shipped]
    if shipped == baseline_commit and not baseline_available:
        notes.append("the baseline files do not rebuild the compiled baseline commit: nothing is shipped")
        shipped = None
    return Selection(
        mode=mode,
        partition=partition,
        method=method,
        picked=picked,
        shipped=shipped,
        shipped_is_baseline=shipped is not None and (shipped == baseline_commit or is_baseline),
        ranking=ranking,
        rescores=rescores,
        floor=floor,
        notes=notes,
    )


async def _apply_floor(
    candidate: str,
    partition: str,
    direction: Direction,
    rescores: list[Rescore],
    baseline_commit: str,
    baseline_available: bool,
    measure: Measure,
) -> FloorOutcome:
    if not baseline_available:
        return FloorOutcome(
            applied=True,
            shipped="nothing",
            reason="the baseline cannot be rebuilt, so the floor cannot be checked (fail closed)",
        )
    own = next((r.measurement for r in rescores if r.candidate == candidate and r.measurement.measured), None)
    if own is None:
        # A TaskGroup, not gather: should one measurement raise, the other nested run is cancelled.
        async with asyncio.TaskGroup() as group:
            baseline_run = group.create_task(measure(baseline_commit, partition, "floor-baseline"))
            candidate_run = group.create_task(measure(candidate, partition, "floor-candidate"))
        baseline, own = baseline_run.result(), candidate_run.result()
    else:
        baseline = await measure(baseline_commit, partition, "floor-baseline")
    if baseline.score is None:
        return FloorOutcome(
            applied=True,
            baseline=baseline,
            candidate=own,
            shipped="nothing",
            reason="the baseline could not be measured on the selection partition (fail closed)",
        )
    if own.score is None:
        return FloorOutcome(
            applied=True,
            baseline=baseline,
            candidate=own,
            shipped="baseline",
            reason="the candidate could not be re-scored, so it does not beat the baseline",
        )
    if better(own.score, baseline.score, direction):
        return FloorOutcome(
            applied=True,
            baseline=baseline,
            candidate=own,
            shipped="candidate",
            reason="the candidate strictly beats the baseline on the selection partition",
        )
    return FloorOutcome(
        applied=True,
        baseline=baseline,
        candidate=own,
        shipped="baseline",
        reason="the candidate does not strictly beat the baseline on the selection partition",
    )
