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
import logging
import math
import os
import secrets as _secrets
from collections.abc import Callable, Mapping
from pathlib import Path

from vero.core.diagnostics import RunDiagnostics
from vero.core.evaluation import mean_score
from vero.core.run import EvaluationBackend, EvaluationRuntime, NestedRun, RunAs
from vero.core.storage import remove_tree
from vero.errors import InfrastructureFailure, VeroError
from vero.harbor.process import DOCKER_SOCKET, RUNNER_USER, runner_identity
from vero.spec.compiled import VerifierConfig
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


class Scorer:
    """Runs the verifier's measurements for one verification.

    Args:
        backend: the nested evaluation backend (`vero.harbor.HarborBackend`, or a test stub).
        config: the verifier config (runtime, scoring, harbor settings, partitions).
        checkout: materializes a candidate (see `Checkout`).
        cases_dir: directory whose subdirectories are the cases (`/opt/vero/cases`).
        work_dir: where each run gets `runs/<evaluation id>/{candidate,jobs}`.
        env: extra environment for the `harbor` process (secret values; never logged or recorded).
        run_as: unprivileged identity for the runs, or None.
        refusal: when set, no nested run is started and every measurement fails with this reason
            (e.g. the verifier is root and has no unprivileged user to run candidates as).
        runtime: each measurement's lease of the inference gateway and its case route
            (`vero.core.run.EvaluationRuntime`; default none: no token, no route).
        baseline_dir: the baseline's files (readable by `run_as`), the witness of a case where a
            candidate fails to install (`NestedRun.baseline_dir`); None when the baseline is not
            available.
    """

    def __init__(
        self,
        *,
        backend: EvaluationBackend,
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

    async def measure(self, candidate: str, partition: str, purpose: str) -> Measurement:
        """Score `candidate` on every case of `partition` (as configured) with one nested run.

        Returns:
            A `Measurement`: `score` is the mean case score over the partition's configured cases
            (a case the backend did not report counts at the per-case failure value, like a dead
            attempt); None with `error` set when the checkout or the run failed.

        Raises:
            asyncio.CancelledError: the verification was cancelled (the backend kills its run).
        """
        evaluation_id = new_evaluation_id(purpose, partition)
        slot = len(self._started)
        self._started.append(None)
        measurement = await self._measure(evaluation_id, candidate, partition, purpose)
        self._started[slot] = measurement
        level = logging.INFO if measurement.measured else logging.WARNING
        logger.log(
            level,
            "%s %s on %s: %s",
            purpose,
            candidate[:12],
            partition,
            measurement.score if measurement.measured else measurement.error,
        )
        return measurement

    async def _measure(self, evaluation_id: str, candidate: str, partition: str, purpose: str) -> Measurement:
        def failed(error: str, diagnostics: RunDiagnostics | None = None) -> Measurement:
            return Measurement(
                evaluation_id=evaluation_id,
                partition=partition,
                candidate=candidate,
                purpose=purpose,
                error=error,
                diagnostics=diagnostics,
            )

        if self.refusal is not None:
            return failed(self.refusal)
        case_names = tuple(self.config.partitions.get(partition, ()))
        if not case_names:
            return failed(f"partition {partition!r} has no cases in the verifier config")
        run_dir = self.work_dir / "runs" / evaluation_id
        jobs_dir = run_dir / "jobs"
        try:
            jobs_dir.mkdir(parents=True)
            candidate_dir = await asyncio.to_thread(self.checkout, candidate, run_dir / "candidate")
            await asyncio.to_thread(hand_over, run_dir, self.run_as)
        except KeyError:
            return failed("the candidate is not in the session's candidate store")
        except Exception as exc:  # any checkout failure leaves the candidate unmeasured
            logger.exception("checkout of %s failed", candidate[:12])
            return failed(f"checkout failed ({type(exc).__name__})")

        lease = self.runtime.lease(
            NestedRun(
                evaluation_id=evaluation_id,
                partition=partition,
                candidate=candidate,
                candidate_dir=candidate_dir,
                cases_dir=self.cases_dir,
                case_names=case_names,
                jobs_dir=jobs_dir,
                runtime=self.config.runtime,
                harbor=self.config.harbor,
                scoring=self.config.scoring,
                env=self.env,
                run_as=self.run_as,
                # The baseline measured is its own witness; any other candidate is judged by the baseline.
                baseline_dir=candidate_dir if candidate == self.config.baseline_commit else self.baseline_dir,
            )
        )
        try:
            async with lease as run:
                result = await self.backend.evaluate(run)
        except VeroError as exc:  # InfrastructureFailure above all (its route, or the run): nothing measured
            diagnostics = getattr(exc, "diagnostics", None)
            code = getattr(exc, "code", None)
            return failed(
                f"{type(exc).__name__}{f' ({code})' if code else ''}: {exc}",
                diagnostics if isinstance(diagnostics, RunDiagnostics) else None,
            )
        except Exception as exc:  # a backend bug must not lose the reward file
            logger.exception("nested evaluation %s raised", evaluation_id)
            return failed(f"{type(exc).__name__} (unexpected; see the verifier log)")

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
            n_dead=n_dead + n_missing,
            flags=result.flag_counts(),
            job_dir=result.job_dir,
            inference=lease.usage,
            diagnostics=result.diagnostics,
        )

    def discard_checkouts(self) -> None:
        """Remove the candidate checkouts of finished runs (the Harbor job dirs are kept)."""
        runs = self.work_dir / "runs"
        if runs.is_dir():
            for run_dir in runs.iterdir():
                remove_tree(run_dir / "candidate")
