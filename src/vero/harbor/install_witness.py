"""Whose install failure is it: the candidate's, or the case's? The baseline is the witness.

A trial whose candidate vero's install agent could not install (`install_failed`:
`CandidateInstallError`, the upload into the case failed or `install_command` exited non-zero)
measured the image, never the candidate, so it is no score (`vero.harbor.results`). Whether it is
the candidate's dead attempt or a broken case depends on whether any candidate installs there, and
the one candidate every spec has is the baseline:

1. `suspect_cases`: the cases of an evaluation where every attempt failed to install (a case where
   some attempt installed can install: its failures are the candidate's);
2. for each, the baseline's install there: the evaluation's own attempts when its candidate is the
   baseline (`NestedRun.baseline_dir` is its `candidate_dir`), else one *witness round*: vero's
   install agent with the baseline on those cases, one attempt, no tests
   (`--disable-verification`), asked once per case and process (`_BASELINE_INSTALLS`);
3. where the baseline fails too, the case is broken: one `CaseProblem` (`install_failed`, with
   the baseline's failure, scrubbed) per case, raised as `CaseMisconfigured` (refunded; the sidecar
   quarantines the case, the verifier leaves the target unmeasured, `vero harbor check` names it).
   Where the baseline installed, the attempts stand: the candidate's dead attempts, charged.

A witness round that says nothing about a case (its trial was infrastructure, or never finished)
leaves that case's attempts the candidate's for this evaluation, and the case is asked again the
next time. Without `NestedRun.baseline_dir` nothing is asked: install failures are the candidate's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence

from vero.core.diagnostics import CaseProblem, clip
from vero.core.evaluation import AttemptOutcome, AttemptResult
from vero.core.run import NestedRun
from vero.errors import CaseMisconfigured
from vero.harbor.causes import CauseLog
from vero.harbor.command import scrub
from vero.harbor.results import JobCollation

__all__ = ["WITNESS_JOB_SUFFIX", "baseline_installs", "judge_install_failures", "suspect_cases"]

logger = logging.getLogger("vero.harbor")

WITNESS_JOB_SUFFIX = ".witness"
"""The witness round's Harbor job is `<evaluation_id>.witness`, beside the evaluation's own."""

_BASELINE_INSTALLS: dict[tuple, str | None] = {}
"""Per process: (cases dir, case, baseline dir, install path and command, environment, uid) -> the
baseline's install failure there, or None when it installs. Only definite answers are kept."""

_DETAIL_CHARS = 1200


def suspect_cases(attempts: Mapping[str, Sequence[AttemptResult]]) -> list[str]:
    """The cases (in `attempts`' order) whose attempts all ended `install_failed`."""
    return [
        case
        for case, kept in attempts.items()
        if kept and all(attempt.kind is AttemptOutcome.INSTALL_FAILED for attempt in kept)
    ]


def baseline_installs(collation: JobCollation) -> dict[str, str | None]:
    """What a witness round says, per case: the baseline's install failure (its message), or None
    when it installed (the trial ran without an exception). Cases it says nothing about (only
    infrastructure trials, none finished, another exception) are absent."""
    answers: dict[str, str | None] = {}
    for trial in collation.trials:
        if trial.outcome is AttemptOutcome.INSTALL_FAILED:
            answers[trial.case] = trial.exception_message or "the install failed"
        elif trial.exception_type is None and not trial.infrastructure:
            answers.setdefault(trial.case, None)
    return answers


def _is_own_witness(run: NestedRun) -> bool:
    assert run.baseline_dir is not None
    return run.baseline_dir.resolve() == run.candidate_dir.resolve()


def _key(run: NestedRun, case: str) -> tuple:
    assert run.baseline_dir is not None
    uid = run.run_as.uid if run.run_as is not None else os.geteuid()
    runtime = (run.runtime.install_path, run.runtime.install_command)
    return (str(run.cases_dir.resolve()), case, str(run.baseline_dir.resolve()), runtime, run.harbor.environment, uid)


async def judge_install_failures(
    run: NestedRun,
    attempts: Mapping[str, Sequence[AttemptResult]],
    messages: Mapping[str, str],
    *,
    run_witness: Callable[[NestedRun, list[str]], Awaitable[JobCollation]],
    secrets: Sequence[str],
    causes: CauseLog,
) -> None:
    """Raise `CaseMisconfigured` (`install_failed`) for the cases where the baseline fails to
    install too (see the module docstring); return when every install failure is the candidate's.

    Args:
        run: the evaluation (its `baseline_dir` names the witness).
        attempts: case -> the evaluation's kept attempts.
        messages: case -> the install failure of one of its attempts (the trial's exception message).
        run_witness: runs the witness round of `NestedRun` (the baseline as candidate, one attempt)
            on the given cases, with the install agent and no tests, and returns its collation.
        secrets: values scrubbed from the problems' details.
        causes: the evaluation's causes (the problems are added).

    Raises:
        CaseMisconfigured: code `install_failed`, one problem per such case.
    """
    suspects = suspect_cases(attempts)
    if not suspects or run.baseline_dir is None or run.runtime.kind != "program":
        return
    failures: dict[str, str] = {}
    if _is_own_witness(run):
        failures = {case: messages.get(case) or "the install failed" for case in suspects}
    else:
        keys = {case: _key(run, case) for case in suspects}
        unknown = [case for case in suspects if keys[case] not in _BASELINE_INSTALLS]
        if unknown:
            witness = run.model_copy(
                update={
                    "candidate_dir": run.baseline_dir,
                    "harbor": run.harbor.model_copy(update={"n_attempts": 1}),
                }
            )
            answers = baseline_installs(await run_witness(witness, unknown))
            for case in unknown:
                if case in answers:
                    _BASELINE_INSTALLS[keys[case]] = answers[case]
            logger.info(
                "evaluation %s: the baseline's install witnessed on %d case(s): %d failed, %d installed, %d unknown",
                run.evaluation_id,
                len(unknown),
                sum(1 for case in unknown if answers.get(case) is not None),
                sum(1 for case in unknown if case in answers and answers[case] is None),
                sum(1 for case in unknown if case not in answers),
            )
        for case in suspects:
            failure = _BASELINE_INSTALLS.get(keys[case])
            if failure is not None:
                failures[case] = failure
    if not failures:
        return
    problems = [
        CaseProblem(
            case=case,
            code="install_failed",
            detail="vero's install agent cannot install the baseline in this case, so no candidate can be "
            f"measured there: {clip(scrub(message, secrets), _DETAIL_CHARS)}",
        )
        for case, message in sorted(failures.items())
    ]
    causes.add_problems(problems)
    logger.warning(
        "evaluation %s: the baseline cannot be installed in %d case(s): %s",
        run.evaluation_id,
        len(problems),
        ", ".join(p.case for p in problems),
    )
    raise CaseMisconfigured(
        "; ".join(f"case {p.case!r}: {p.code}: {p.detail}" for p in problems),
        code="install_failed",
        problems=problems,
        diagnostics=causes.build(),
    )
