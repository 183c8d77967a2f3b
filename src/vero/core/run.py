"""The evaluation contract: what one evaluation of a candidate over a partition's cases needs and gives.

`NestedRun` is the input, `EvaluationBackend` the protocol every evaluator implements, `RunAs` the
unprivileged identity a run takes. `vero.harbor.HarborBackend` implements it with nested
`harbor run`s; the sidecar, the verifier and `vero harbor check` depend on this contract, and
test stubs implement it too. No Harbor import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from vero.core.evaluation import EvaluationResult
from vero.spec.models import CandidateRuntime, HarborSpec, ScoringSpec

__all__ = ["EvaluationBackend", "NestedRun", "RunAs"]


class RunAs(BaseModel):
    """Unprivileged identity for the nested run when the caller is root."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    uid: int
    gid: int
    extra_groups: tuple[int, ...] = ()
    """E.g. the Docker socket's group, so the unprivileged run reaches the engine."""
    home: Path


class NestedRun(BaseModel):
    """Everything one nested evaluation needs. Paths are on the machine running `harbor`."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    evaluation_id: str
    """Unique per evaluation; becomes the Harbor job name."""
    partition: str
    candidate: str
    """Commit id of the candidate (recorded in the result)."""
    candidate_dir: Path
    """A checkout of the candidate (readable by `run_as`)."""
    cases_dir: Path
    """Directory whose subdirectories are the partition's Harbor task dirs."""
    case_names: tuple[str, ...]
    """Only these cases are run."""
    jobs_dir: Path
    """Parent of the Harbor job directory (writable by `run_as`)."""
    runtime: CandidateRuntime
    harbor: HarborSpec
    scoring: ScoringSpec
    reward_key: str | None = None
    """Key to read from trial rewards; default `scoring.reward_key`."""
    failure_value: float | None = None
    """Score of a dead attempt; default `scoring.effective_failure_value()`."""
    env: dict[str, str] = {}
    """Extra environment for the `harbor` process (secret values by name; never logged or recorded)."""
    run_as: RunAs | None = None
    session: str | None = None
    """The session owning the run (`vero.harbor.leftovers`: `ses-<16 hex>` for a sidecar,
    `verify-<16 hex>` for a verifier); labels its environments with `evaluation_id` so an
    interrupted run's leftovers can be found and removed. None: the backend's own session."""
    candidate_env: dict[str, str] = {}
    """`kind: agent`: extra environment of the candidate host processes only (the inference
    gateway's base URLs and this evaluation's token); never given to the `harbor` process."""
    case_network: str | None = None
    """Docker: the evaluation's network to the inference gateway, which each round's case
    containers join (`vero.harbor.case_route`; `inference.route_case_services`)."""
    baseline_dir: Path | None = None
    """`kind: program`: a checkout of the baseline (readable by `run_as`), the witness of a case
    where every attempt of the candidate failed to install (`vero.harbor.install_witness`): when the
    baseline fails there too, the case is broken (`CaseMisconfigured`, `install_failed`), else the
    attempts are the candidate's. The same path as `candidate_dir` when the candidate is the
    baseline (its own attempts decide). None: install failures stay the candidate's."""


class EvaluationBackend(Protocol):
    """Measures a candidate. Implementations: `vero.harbor.HarborBackend` (real), test stubs.

    A backend may also offer `interrupt() -> None`: the calling process is stopping, so every
    cancellation from then on must end fast (the sidecar calls it on SIGTERM before cancelling its
    jobs; `HarborBackend` then kills process groups without a grace period).
    """

    async def evaluate(self, run: NestedRun) -> EvaluationResult:
        """Run the selected cases and return their scores.

        Cancellation kills the whole process group and propagates `CancelledError`.

        Raises:
            InfrastructureFailure: no trial produced a result for infrastructure reasons even after
                `harbor.infra_retries` retries with back-off (the caller refunds the budget).
        """
        ...
