"""The verifier's own measurements: checkouts, nested runs through an `EvaluationBackend`, run-as.

Every measurement checks the candidate out into a fresh directory, runs the partition's cases as
one nested evaluation (`vero.core.run.EvaluationBackend`) and turns the outcome into a
`Measurement`. A failed run never raises out of `Scorer.measure`: it comes back with `score=None`
and the reason, so the caller decides what an unmeasured candidate or target means (selection
excludes it, the reward gets the failure value).

When the verifier runs as root, nested runs run as the unprivileged `vero-runner` user (docs/trust-model.md:
candidate code never runs as root); `kind: agent` candidates run in candidate hosts as throw-away
uids (`vero.harbor.boundary`). The checkout and the Harbor jobs dir of each run are handed to that
user; secrets reach the run by name from the verifier's environment (`config.secrets`), except the
provider keys only the inference gateway holds. With `config.inference`, each measurement gets its
own gateway token (capped at `evaluation_limit_usd`, default `VERIFIER_EVALUATION_LIMIT_USD`) and
its metered usage is recorded on the `Measurement`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import secrets as _secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vero.core.diagnostics import RunDiagnostics
from vero.core.evaluation import EvaluationResult, mean_score
from vero.core.run import EvaluationLease, EvaluationRuntime, NestedRun, PairedEvaluationBackend, RunArm, RunAs
from vero.core.storage import remove_tree
from vero.errors import InfrastructureFailure, VeroError
from vero.harbor.process import DOCKER_SOCKET, RUNNER_USER, runner_identity
from vero.spec.compiled import VerifierConfig
from vero.spec.models import HarborSpec
from vero.verifier.selection import Measurement

__all__ = [
    "Checkout",
    "Scorer",
    "hand_over",
    "new_evaluation_id",
    "resolve_run_as",
]

logger = logging.getLogger("vero.verifier")

VERIFIER_EVALUATION_LIMIT_USD = 10.0
"""Most one verifier measurement may spend on model calls when the spec sets no `evaluation_limit_usd`."""

Checkout = Callable[[str, Path], Path]
"""`checkout(candidate_id, dest)` materializes a candidate in the fresh directory `dest` and returns it.
Raises KeyError for an unknown candidate."""


def resolve_run_as(user: str = RUNNER_USER, docker_socket: Path = DOCKER_SOCKET) -> RunAs | None:
    """The identity nested runs take, or None to run as the current user.

    `vero.harbor.process.runner_identity` (shared with the sidecar), except that a missing `user`
    gives None instead of raising: the verifier still writes its reward, and `verify` then
    refuses every measurement (or, with `allow_root_runs`, runs them as root and warns).
    """
    try:
        return runner_identity(user, docker_socket)
    except InfrastructureFailure:
        return None


def hand_over(path: Path, run_as: RunAs | None) -> None:
    """Make the tree at `path` owned by `run_as` (no-op for None); links are not followed."""
    if run_as is None:
        return
    os.lchown(path, run_as.uid, run_as.gid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), run_as.uid, run_as.gid)


def new_evaluation_id(purpose: str, partition: str) -> str:
    """A unique id for one verifier measurement, usable as a Harbor job name.

    Shape: `verify-<purpose>-<partition>-<8 hex>`; Harbor's default job name is a timestamp to the
    second (docs/harbor-notes.md §7), so the random suffix is what keeps runs apart.
    """
    return f"verify-{purpose}-{partition[:64]}-{_secrets.token_hex(4)}"


@dataclass(frozen=True)
class _Plan:
    """One measurement's nested run, whichever arms it has: its id, cases, Harbor settings and job dir."""

    evaluation_id: str
    partition: str
    harbor: HarborSpec
    case_names: tuple[str, ...]
    jobs_dir: Path

    def failed(
        self, arms: Sequence[tuple[str, str]], error: str, diagnostics: RunDiagnostics | None = None
    ) -> list[Measurement]:
        """Each arm's (candidate, purpose) unmeasured with `error`; the diagnostics go to the first."""
        return [
            Measurement(
                evaluation_id=self.evaluation_id,
                partition=self.partition,
                candidate=candidate,
                purpose=purpose,
                n_attempts=self.harbor.n_attempts,
                error=error,
                diagnostics=diagnostics if index == 0 else None,
            )
            for index, (candidate, purpose) in enumerate(arms)
        ]


class Scorer:
    """Runs the verifier's measurements for one verification.

    Args:
        backend: the nested evaluation backend (`vero.harbor.HarborBackend`, or a test stub); it
            measures the targets' two arms in one run (`evaluate_paired`).
        config: the verifier config (runtime, scoring, harbor settings, partitions).
        checkout: materializes a candidate (see `Checkout`).
        cases_dir: directory whose subdirectories are the cases (`/opt/vero/cases`).
        work_dir: where each run gets `runs/<evaluation id>/{candidate,jobs}`.
        env: extra environment for the `harbor` process (secret values; never logged or recorded).
        run_as: unprivileged identity for the runs, or None.
        refusal: when set, no nested run is started and every measurement fails with this reason
            (e.g. the verifier is root and has no unprivileged user to run candidates as).
        runtime: each measurement's lease of the inference gateway and its case route
            (`vero.core.run.EvaluationRuntime`; default none: no token, no route); in a paired
            run each arm gets its own lease (its own token).
        baseline_dir: the baseline's files (readable by `run_as`), the witness of a case where a
            candidate fails to install (`NestedRun.baseline_dir`); None when the baseline is not
            available.
    """

    def __init__(
        self,
        *,
        backend: PairedEvaluationBackend,
        config: VerifierConfig,
        checkout: Checkout,
        cases_dir: Path,
        work_dir: Path,
        env: Mapping[str, str] | None = None,
        run_as: RunAs | None = None,
        refusal: str | None = None,
        runtime: EvaluationRuntime | None = None,
        baseline_dir: Path | None = None,
    ):
        self.backend = backend
        self.baseline_dir = baseline_dir
        self.runtime = runtime or EvaluationRuntime()
        self.config = config
        self.checkout = checkout
        self.cases_dir = Path(cases_dir)
        self.work_dir = Path(work_dir)
        self.env = dict(env or {})
        self.run_as = run_as
        self.refusal = refusal
        self._started: list[Measurement | None] = []
        """One slot per `measure` call, in call order; filled when the measurement finishes."""

    @property
    def measurements(self) -> list[Measurement]:
        """Every finished measurement, in the order they were started (measurements may overlap)."""
        return [m for m in self._started if m is not None]

    async def measure(
        self, candidate: str, partition: str, purpose: str, *, n_attempts: int | None = None
    ) -> Measurement:
        """Score `candidate` on every case of `partition` (as configured) with one nested run.

        Args:
            candidate, partition, purpose: what is measured where, and why (`Measurement.purpose`).
            n_attempts: attempts per case (default `harbor.n_attempts`; a target's `n_attempts`).

        Returns:
            A `Measurement`: `score` is the mean case score over the partition's configured cases
            (a case the backend did not report counts at the per-case failure value, like a dead
            attempt); None with `error` set when the checkout or the run failed.

        Raises:
            asyncio.CancelledError: the verification was cancelled (the backend kills its run).
        """
        (measurement,) = await self._record([(candidate, purpose)], partition, n_attempts)
        return measurement

    async def measure_paired(
        self, candidate: str, baseline: str, partition: str, *, n_attempts: int | None = None
    ) -> tuple[Measurement, Measurement]:
        """Score `candidate` and `baseline` on every case of `partition` in one nested run, both arms
        interleaved per case (`vero.core.run.PairedEvaluationBackend`): purposes `target` and
        `target-baseline`, one evaluation id (with a case router, two jobs side by side: `_run`). As
        `measure` otherwise; the baseline's arm fails on
        its own (an unmeasured baseline never unmeasures the candidate), except that a failure of
        the whole run (a checkout, the backend) fails both.

        Raises:
            asyncio.CancelledError: the verification was cancelled.
        """
        first, second = await self._record(
            [(candidate, "target"), (baseline, "target-baseline")], partition, n_attempts
        )
        return first, second

    async def _record(self, arms: list[tuple[str, str]], partition: str, n_attempts: int | None) -> list[Measurement]:
        """Run one (or one paired) measurement, keeping its slots in `measurements` in call order."""
        evaluation_id = new_evaluation_id(arms[0][1], partition)
        slot = len(self._started)
        self._started.extend([None] * len(arms))
        measurements = await self._measure(evaluation_id, arms, partition, n_attempts)
        for index, measurement in enumerate(measurements):
            self._started[slot + index] = measurement
            level = logging.INFO if measurement.measured else logging.WARNING
            logger.log(
                level,
                "%s %s on %s: %s",
                measurement.purpose,
                measurement.candidate[:12],
                partition,
                measurement.score if measurement.measured else measurement.error,
            )
        return measurements

    async def _measure(
        self, evaluation_id: str, arms: list[tuple[str, str]], partition: str, n_attempts: int | None
    ) -> list[Measurement]:
        harbor = self.config.harbor
        if n_attempts is not None:
            harbor = harbor.model_copy(update={"n_attempts": n_attempts})
        run_dir = self.work_dir / "runs" / evaluation_id
        plan = _Plan(
            evaluation_id, partition, harbor, tuple(self.config.partitions.get(partition, ())), run_dir / "jobs"
        )
        if self.refusal is not None:
            return plan.failed(arms, self.refusal)
        if not plan.case_names:
            return plan.failed(arms, f"partition {partition!r} has no cases in the verifier config")
        checkouts: list[Path] = []
        try:
            plan.jobs_dir.mkdir(parents=True)
            checkouts.append(await asyncio.to_thread(self.checkout, arms[0][0], run_dir / "candidate"))
            await asyncio.to_thread(hand_over, run_dir, self.run_as)
        except KeyError:
            return plan.failed(arms, "the candidate is not in the session's candidate store")
        except Exception as exc:  # any checkout failure leaves the candidate unmeasured
            logger.exception("checkout of %s failed", arms[0][0][:12])
            return plan.failed(arms, f"checkout failed ({type(exc).__name__})")
        if len(arms) > 1:
            try:
                checkouts.append(await asyncio.to_thread(self.checkout, arms[1][0], run_dir / "baseline"))
                await asyncio.to_thread(hand_over, run_dir / "baseline", self.run_as)
            except Exception as exc:  # the baseline's arm is lost; the candidate is measured alone
                logger.exception("checkout of the baseline %s failed", arms[1][0][:12])
                (lost,) = plan.failed(arms[1:], f"checkout failed ({type(exc).__name__})")
                return [*await self._run(plan, arms[:1], checkouts), lost]
        return await self._run(plan, arms, checkouts)

    async def _run(self, plan: _Plan, arms: list[tuple[str, str]], checkouts: list[Path]) -> list[Measurement]:
        """The nested run of checked-out arms (one, or a paired two) and their measurements.

        With a case router (`inference.route_case_services`), a pair is two jobs side by side
        instead of one (`<id>` and `<id>.baseline`): a case route serves one evaluation's token to
        every case container of its job, so the baseline's cases would spend, and be metered on,
        the candidate's token. The arms then run at the same time, not interleaved per case.
        """
        if len(arms) > 1 and self.runtime.router is not None:
            async with asyncio.TaskGroup() as group:
                runs = [
                    group.create_task(
                        self._run(
                            dataclasses.replace(plan, evaluation_id=f"{plan.evaluation_id}.baseline")
                            if index
                            else plan,
                            [arm],
                            [checkout],
                        )
                    )
                    for index, (arm, checkout) in enumerate(zip(arms, checkouts, strict=True))
                ]
            return [run.result()[0] for run in runs]

        run = NestedRun(
            evaluation_id=plan.evaluation_id,
            partition=plan.partition,
            candidate=arms[0][0],
            candidate_dir=checkouts[0],
            cases_dir=self.cases_dir,
            case_names=plan.case_names,
            jobs_dir=plan.jobs_dir,
            runtime=self.config.runtime,
            harbor=plan.harbor,
            scoring=self.config.scoring,
            env=self.env,
            run_as=self.run_as,
            # The baseline measured is its own witness; any other candidate is judged by the baseline
            # (in a paired run, by the baseline's own arm).
            baseline_dir=checkouts[0]
            if arms[0][0] == self.config.baseline_commit
            else checkouts[1]
            if len(arms) > 1
            else self.baseline_dir,
        )
        # One lease per arm: each arm its own token and cap, so the baseline's model calls never
        # spend, nor are metered on, the candidate's (a routed pair never gets here: see above).
        leases: list[EvaluationLease] = [self.runtime.lease(run)]
        if len(arms) > 1:
            baseline_run = run.model_copy(
                update={
                    "evaluation_id": f"{plan.evaluation_id}.baseline",
                    "candidate": arms[1][0],
                    "candidate_dir": checkouts[1],
                }
            )
            leases.append(self.runtime.lease(baseline_run))
        try:
            async with contextlib.AsyncExitStack() as stack:
                entered = [await stack.enter_async_context(lease) for lease in leases]
                if len(arms) == 1:
                    results: list[EvaluationResult] = [await self.backend.evaluate(entered[0])]
                else:
                    arm = RunArm(
                        candidate=arms[1][0], candidate_dir=checkouts[1], candidate_env=entered[1].candidate_env
                    )
                    paired = await self.backend.evaluate_paired(entered[0], arm)
                    results = [paired.candidate, paired.baseline]
        except VeroError as exc:  # InfrastructureFailure above all (its route, or the run): nothing measured
            diagnostics = getattr(exc, "diagnostics", None)
            code = getattr(exc, "code", None)
            return plan.failed(
                arms,
                f"{type(exc).__name__}{f' ({code})' if code else ''}: {exc}",
                diagnostics if isinstance(diagnostics, RunDiagnostics) else None,
            )
        except Exception as exc:  # a backend bug must not lose the reward file
            logger.exception("nested evaluation %s raised", plan.evaluation_id)
            return plan.failed(arms, f"{type(exc).__name__} (unexpected; see the verifier log)")

        return [
            self._measurement(plan, arm, result, lease)
            for arm, result, lease in zip(arms, results, leases, strict=True)
        ]

    def _measurement(
        self, plan: _Plan, arm: tuple[str, str], result: EvaluationResult, lease: EvaluationLease
    ) -> Measurement:
        """One arm's (candidate, purpose) `Measurement` from the backend's result (or why it is not one)."""
        candidate, purpose = arm
        partition, case_names, evaluation_id = plan.partition, plan.case_names, plan.evaluation_id

        def failed(error: str, diagnostics: RunDiagnostics | None = None) -> Measurement:
            (measurement,) = plan.failed([arm], error, diagnostics)
            return measurement

        if result.partition != partition or result.candidate != candidate:
            return failed("the backend reported a different partition or candidate")
        try:
            lease.settle(result)
        except InfrastructureFailure as exc:  # a model call never reached its provider
            diagnostics = exc.diagnostics if isinstance(exc.diagnostics, RunDiagnostics) else None
            return failed(f"InfrastructureFailure: {exc}", diagnostics)
        by_case = {case.case: case for case in result.cases}
        failure_value = self.config.scoring.effective_failure_value()
        scores = [by_case[name].score if name in by_case else failure_value for name in case_names]
        score = mean_score(scores)
        if not math.isfinite(score):
            return failed("the backend reported a non-finite score")
        n_dead = sum(by_case[name].n_dead for name in case_names if name in by_case)
        n_missing = sum(1 for name in case_names if name not in by_case)
        return Measurement(
            evaluation_id=evaluation_id,
            partition=partition,
            candidate=candidate,
            purpose=purpose,
            score=score,
            n_cases=len(case_names),
            n_attempts=plan.harbor.n_attempts,
            n_dead=n_dead + n_missing,
            flags=result.flag_counts(),
            job_dir=result.job_dir,
            inference=lease.usage,
            diagnostics=result.diagnostics,
            cases=[by_case[name] for name in case_names if name in by_case],
            dependencies=result.dependencies,
        )

    def discard_checkouts(self) -> None:
        """Remove the checkouts of finished runs, both arms' (the Harbor job dirs are kept)."""
        runs = self.work_dir / "runs"
        if runs.is_dir():
            for run_dir in runs.iterdir():
                remove_tree(run_dir / "candidate")
                remove_tree(run_dir / "baseline")
