"""What a nested evaluation's failures were, kept for the operator (`vero.core.diagnostics`).

`CauseLog` collects, over the rounds of one evaluation, the tail of each `harbor run`'s output
(already scrubbed of secret values by `vero.harbor.process`), each case problem found, and every
trial that recorded an exception or was not scored, with Harbor's exception type, message and the
end of its traceback, read from the trial's `result.json` (`exception_info`, then each step's)
after the runner scrubbed the job dir, and the end of its test's own output
(`verifier/test-stdout.txt`), both scrubbed again here. Texts are clipped
(`MAX_DETAIL_CHARS`), at most `MAX_TRIAL_FAILURES` trials are kept (all are counted).

These go into the trusted records only (the job record in the sidecar's state, the verifier's
`finalization.json`, `experiment.html`); nothing here is ever disclosed to the agent.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from vero.core.diagnostics import (
    MAX_TEST_OUTPUT_CHARS,
    MAX_TRIAL_FAILURES,
    CaseProblem,
    RoundLog,
    RunDiagnostics,
    TrialFailure,
    clip,
)
from vero.harbor.command import scrub
from vero.harbor.results import TrialOutcome

__all__ = ["CauseLog", "trial_label"]

logger = logging.getLogger(__name__)

_RESULT_MAX_BYTES = 16 * 1024 * 1024
_TEST_OUTPUT = "test-stdout.txt"
_TEST_OUTPUT_READ_BYTES = 4 * MAX_TEST_OUTPUT_CHARS


def trial_label(trial: TrialOutcome) -> str:
    """How vero classified a trial: its `AttemptOutcome` (`vero.harbor.results.classify_trial`)."""
    return trial.outcome.value


def _exception_info(result: dict) -> dict | None:
    info = result.get("exception_info")
    if isinstance(info, dict):
        return info
    for step in result.get("step_results") or []:
        if isinstance(step, dict) and isinstance(step.get("exception_info"), dict):
            return step["exception_info"]
    return None


def _test_output_tail(trial_dir: Path) -> str | None:
    """The last bytes of the trial's `verifier/test-stdout.txt` (Harbor 0.26 `verifier/verifier.py`
    runs `tests/test.sh > /logs/verifier/test-stdout.txt 2>&1`), or of the last step's for a
    multi-step trial (`steps/<step>/verifier/`), decoded leniently; None when there is none.

    Never followed through a link: a case whose tests let candidate code write `/logs/verifier`
    could plant one, and Harbor copies the dir to the host as it is."""
    candidates = [trial_dir / "verifier" / _TEST_OUTPUT]
    steps = trial_dir / "steps"
    if steps.is_dir() and not steps.is_symlink():
        candidates += sorted((p / "verifier" / _TEST_OUTPUT for p in steps.iterdir()), reverse=True)
    for path in candidates:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                continue
            os.lseek(fd, max(info.st_size - _TEST_OUTPUT_READ_BYTES, 0), os.SEEK_SET)
            data = os.read(fd, _TEST_OUTPUT_READ_BYTES)
        except OSError:
            continue
        finally:
            os.close(fd)
        return data.decode("utf-8", errors="replace")
    return None


class CauseLog:
    """Causes of one evaluation, accumulated round by round (not thread-safe; one per evaluation).

    Args:
        secrets: values scrubbed from every kept text (as `vero.harbor.command.scrub` does).
    """

    def __init__(self, secrets: Sequence[str] = ()):
        self._secrets = list(secrets)
        self._rounds: list[RoundLog] = []
        self._problems: list[CaseProblem] = []
        self._failures: list[TrialFailure] = []
        self._n_failures = 0

    def _clean(self, text: str | None) -> str | None:
        return clip(scrub(text, self._secrets)) if text else text

    def _clean_tail(self, text: str | None) -> str | None:
        return clip(scrub(text, self._secrets), MAX_TEST_OUTPUT_CHARS) if text else None

    def add_round(
        self,
        job_name: str,
        *,
        returncode: int | None,
        timed_out: bool = False,
        duration_sec: float = 0.0,
        output_tail: str = "",
    ) -> None:
        """One `harbor run` (its output tail is scrubbed again and clipped)."""
        self._rounds.append(
            RoundLog(
                job_name=job_name,
                returncode=returncode,
                timed_out=timed_out,
                duration_sec=round(duration_sec, 1),
                output_tail=self._clean(output_tail) or "",
            )
        )

    def add_problems(self, problems: Iterable[CaseProblem]) -> None:
        self._problems.extend(problems)

    def add_trials(self, job_dir: Path, trials: Iterable[TrialOutcome], arm: str | None = None) -> None:
        """Every trial of `trials` (`TrialOutcome`s of `job_dir`) that failed: an exception
        recorded, or no reward (with the keys found, for `reward_key_missing`), with the tail of
        its test's output; `arm` labels them in a paired run (`TrialFailure.arm`)."""
        for trial in trials:
            label = trial_label(trial)
            if trial.exception_type is None and label == "scored":
                continue
            self._n_failures += 1
            if len(self._failures) >= MAX_TRIAL_FAILURES:
                continue
            info = self._read_exception(job_dir / trial.trial_name)
            self._failures.append(
                TrialFailure(
                    job_name=job_dir.name,
                    trial_name=trial.trial_name,
                    case=trial.case,
                    outcome=label,
                    exception_type=trial.exception_type,
                    message=self._clean(info.get("exception_message")) if info else None,
                    traceback_tail=self._clean(info.get("exception_traceback")) if info else None,
                    reward_keys=list(trial.reward_keys) if trial.reward_keys is not None else None,
                    test_output_tail=self._clean_tail(_test_output_tail(job_dir / trial.trial_name)),
                    arm=arm,
                )
            )

    def add_unrun(self, case: str, trial_name: str, exception_type: str, message: str, arm: str | None = None) -> None:
        """A dead attempt that never reached Harbor (the candidate's dependency install or import
        pre-flight failed): job `preflight`, its message scrubbed and clipped; `arm` as `add_trials`."""
        self._n_failures += 1
        if len(self._failures) < MAX_TRIAL_FAILURES:
            self._failures.append(
                TrialFailure(
                    job_name="preflight",
                    trial_name=trial_name,
                    case=case,
                    outcome="dead",
                    exception_type=exception_type,
                    message=self._clean(message),
                    arm=arm,
                )
            )

    @staticmethod
    def _read_exception(trial_dir: Path) -> dict | None:
        path = trial_dir / "result.json"
        try:
            if path.is_symlink() or path.stat().st_size > _RESULT_MAX_BYTES:
                return None
            result = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(result, dict):
            return None
        info = _exception_info(result)
        if info is None:
            return None
        return {
            key: value
            for key, value in info.items()
            if key in ("exception_message", "exception_traceback") and isinstance(value, str)
        }

    @property
    def problems(self) -> list[CaseProblem]:
        return list(self._problems)

    def build(self) -> RunDiagnostics:
        """The diagnostics so far."""
        return RunDiagnostics(
            rounds=list(self._rounds),
            problems=list(self._problems),
            trial_failures=list(self._failures),
            n_trial_failures=self._n_failures,
        )
