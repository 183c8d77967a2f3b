"""Reading a finished (or killed) Harbor job directory into per-trial outcomes.

Results come only from the files Harbor writes (HARBOR-NOTES §2 "Job output layout"): the job's
`result.json` (`JobResult`) and one `result.json` (`TrialResult`) per trial dir, parsed with
Harbor's own models. Never from the exit code (0 even when every trial errored) or stdout.

Each trial becomes one `TrialOutcome`, classified as:

- **scored** — `reward_valid` (Harbor: a verifier result whose every recorded exception, top-level
  and per step, keeps a valid reward, e.g. `AgentTimeoutError`, `NonZeroAgentExitCodeError`) and a
  finite number under the reward key: `reward` is that number;
- **dead** — no valid reward for any other reason (verifier crashed or timed out, no reward file,
  the key missing, the candidate's agent raised before the verifier ran, ...): `reward` is None and
  the attempt scores the failure value, counted in the mean (`vero.core.evaluation`);
- **infrastructure** — no valid reward *and* the failure cannot be the candidate's: an exception
  type of `INFRASTRUCTURE_EXCEPTION_TYPES`, or a trial-level exception raised after the environment
  started to come up but before the agent's setup began (a failed `docker compose build`/`up` is a
  plain `RuntimeError` in Harbor 0.26, `environments/docker/docker.py`, so the type alone cannot
  tell). Such attempts are not scores at all: they are left out of the case's attempts, and a case
  left with no attempt is re-run by the backend (HARBOR-NOTES §8 row 3: scoring them 0 made an
  optimizer chase noise).

A trial dir without a readable `result.json` (the run was killed mid-trial) yields no outcome.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Iterable, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from vero.core.evaluation import AttemptResult

__all__ = [
    "INFRASTRUCTURE_EXCEPTION_TYPES",
    "JobCollation",
    "TrialOutcome",
    "collate_job",
    "merge_outcomes",
    "read_trial",
]

logger = logging.getLogger(__name__)

INFRASTRUCTURE_EXCEPTION_TYPES: frozenset[str] = frozenset({
    # Harbor's "retry, do not grade" environment group (models/trial/error_policy.py), minus the two
    # memory errors: a program candidate that exhausts memory failed on its own account.
    "EnvironmentStartTimeoutError",
    "SandboxBuildFailedError",
    "HealthcheckError",
    "SSHAccessError",
    "GKEExecStreamClosedError",
    "GKEPodNotFoundError",
    "RuntimeRequestError",
    "AddTestsDirError",
    "DownloadVerifierDirError",
    # The trial was cancelled: only happens when the nested run itself is stopped.
    "CancelledError",
    # vero's candidate boundary could not start a host for a `kind: agent` candidate, before any
    # candidate code ran (`vero.harbor.boundary.agent`).
    "CandidateHostUnavailableError",
})
"""Exception types that mark a reward-less trial as an infrastructure failure, never a score.

`AgentSetupTimeoutError` is deliberately absent: a `kind: agent` candidate's own `setup()` runs in
that phase, so its timeout is the candidate's failure (a dead attempt)."""


@dataclass(frozen=True)
class TrialOutcome:
    """One Harbor trial, in vero's terms.

    Attributes:
        case: the case (task dir name) the trial ran.
        trial_name: Harbor's trial name (its dir name in the job dir).
        reward: the value under the reward key; None for a dead or infrastructure attempt.
        exception_type: the first recorded exception's type (trial level, then steps), if any.
        infrastructure: the trial failed for infrastructure reasons (never scored).
    """

    case: str
    trial_name: str
    reward: float | None
    exception_type: str | None
    infrastructure: bool = False


@dataclass(frozen=True)
class JobCollation:
    """Everything one job dir says.

    Attributes:
        job_dir: the job directory read.
        job_finished: the job's `result.json` exists and has `finished_at` (Harbor completed).
        trials: one outcome per trial dir with a readable `result.json`, sorted by trial name.
        n_unfinished: trial dirs without a readable `result.json`.
    """

    job_dir: Path
    job_finished: bool
    trials: tuple[TrialOutcome, ...]
    n_unfinished: int = 0


def _case_of(result) -> str:
    path = getattr(result.config.task, "path", None)
    return Path(path).name if path is not None else result.task_name


def _reward(result, reward_key: str) -> float | None:
    if not result.reward_valid or result.verifier_result is None:
        return None
    value = (result.verifier_result.rewards or {}).get(reward_key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _is_infrastructure(result) -> bool:
    exceptions = result.recorded_exceptions()
    if any(e.exception_type in INFRASTRUCTURE_EXCEPTION_TYPES for e in exceptions):
        return True
    # The candidate had no chance to act: the environment was being brought up (build, up, wait,
    # healthcheck, skills upload) and the agent's setup never started.
    return (result.exception_info is not None and result.environment_setup is not None
            and result.agent_setup is None)


def read_trial(trial_dir: Path, reward_key: str) -> TrialOutcome | None:
    """The outcome of one trial dir, or None when it has no readable `result.json`.

    Args:
        trial_dir: `<job_dir>/<trial_name>`.
        reward_key: key read from `verifier_result.rewards`.
    """
    from harbor.models.trial.result import TrialResult
    from pydantic import ValidationError

    path = trial_dir / "result.json"
    try:
        result = TrialResult.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError) as exc:
        logger.warning("unreadable trial result %s: %s", path, type(exc).__name__)
        return None
    reward = _reward(result, reward_key)
    exceptions = result.recorded_exceptions()
    return TrialOutcome(
        case=_case_of(result),
        trial_name=result.trial_name,
        reward=reward,
        exception_type=exceptions[0].exception_type if exceptions else None,
        infrastructure=reward is None and _is_infrastructure(result),
    )


def _job_finished(job_dir: Path) -> bool:
    from harbor.models.job.result import JobResult
    from pydantic import ValidationError

    try:
        job = JobResult.model_validate_json((job_dir / "result.json").read_bytes())
    except FileNotFoundError:
        return False
    except (OSError, ValidationError) as exc:
        logger.warning("unreadable job result in %s: %s", job_dir, type(exc).__name__)
        return False
    return job.finished_at is not None


def collate_job(job_dir: Path, reward_key: str) -> JobCollation:
    """Read every trial of a job dir (a missing job dir reads as an empty, unfinished job)."""
    trials: list[TrialOutcome] = []
    unfinished = 0
    if job_dir.is_dir():
        for child in sorted(job_dir.iterdir()):
            if not child.is_dir():
                continue
            outcome = read_trial(child, reward_key)
            if outcome is None:
                unfinished += 1
            else:
                trials.append(outcome)
    return JobCollation(job_dir=job_dir, job_finished=_job_finished(job_dir),
                        trials=tuple(sorted(trials, key=lambda t: t.trial_name)), n_unfinished=unfinished)


def merge_outcomes(attempts: MutableMapping[str, list[AttemptResult]], trials: Iterable[TrialOutcome],
                   cases: Collection[str]) -> int:
    """Append the scored and dead outcomes of `cases` to `attempts` (case -> attempts, in trial order).

    Infrastructure outcomes are dropped (they are no measurement); outcomes of other cases are
    ignored. Returns how many infrastructure outcomes were dropped.
    """
    dropped = 0
    for trial in trials:
        if trial.case not in cases:
            continue
        if trial.infrastructure:
            dropped += 1
            continue
        attempts.setdefault(trial.case, []).append(AttemptResult(
            trial_name=trial.trial_name, reward=trial.reward, exception_type=trial.exception_type))
    return dropped
