"""What the compiler checks in the cases' own files, once they are fetched.

- `kit_warnings`: a `kind: program` case whose tests never call the case kit (`vero-kit`) runs
  candidate code with the test's privileges, so that code can forge its reward or read the case's
  answers. The build still succeeds (third-party cases cannot always be changed); the operator is
  warned, and `finalization.json` repeats the warning (`VerifierConfig.build_warnings`).
- `check_evaluation_time`: every evaluation the task can start must fit `harbor.evaluation_timeout_sec`,
  since a run cut by its wall clock charges the unfinished cases to the candidate
  (`vero.harbor.runner`). The largest evaluation of a partition is the whole partition:
  `ceil(cases x n_attempts / n_concurrent)` waves, each as long as the slowest case's agent plus
  verifier time (summed over steps), plus `EVALUATION_SETUP_MARGIN_SEC` for building and starting
  environments. A case's agent time is `harbor.case_timeout_sec` when set (vero applies it to every
  case), else its own `[agent].timeout_sec`; its verifier time is its `[verifier].timeout_sec`
  (Harbor 0.26 `models/task/config.py`, default 600 s).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vero.errors import SpecError, SpecIssue
from vero.harbor.casekit import KIT_NAME, mentions_kit
from vero.spec.models import OptimizationSpec, ProgramTarget

__all__ = [
    "EVALUATION_SETUP_MARGIN_SEC",
    "CaseTime",
    "case_time",
    "case_uses_kit",
    "check_evaluation_time",
    "kit_warnings",
]

EVALUATION_SETUP_MARGIN_SEC = 120.0
"""Time an evaluation needs beyond its cases' own agent and verifier limits (image builds, start,
teardown)."""


def _test_dirs(case_dir: Path) -> list[Path]:
    steps = case_dir / "steps"
    return [case_dir / "tests", *(sorted(p / "tests" for p in steps.iterdir() if p.is_dir()) if steps.is_dir() else [])]


def case_uses_kit(case_dir: Path) -> bool:
    """Whether the tests of the case at `case_dir` (its `tests/`, or a step's) name `vero-kit`.

    A test that never names the kit cannot run candidate code through it (`kit_warnings`;
    `vero harbor check` reports such a case as `kit_missing`).
    """
    return any(mentions_kit(d) for d in _test_dirs(case_dir))


def kit_warnings(
    spec: OptimizationSpec, case_dirs: Mapping[str, Path], partitions: Mapping[str, list[str]]
) -> list[str]:
    """One warning per program case whose tests never name `vero-kit` (none for agent targets).

    Args:
        spec: the validated spec.
        case_dirs: case name -> its fetched task dir.
        partitions: partition -> case names, for the cases compiled into the task.
    """
    if not isinstance(spec.target, ProgramTarget):
        return []
    guard = (
        f"scoring.reward_range {list(spec.scoring.reward_range)} rejects rewards outside it"
        if spec.scoring.reward_range is not None
        else "set scoring.reward_range to reject impossible rewards"
    )
    warnings = []
    for partition, names in sorted(partitions.items()):
        for case in sorted(names):
            if not case_uses_kit(case_dirs[case]):
                warnings.append(
                    f"case {case!r} (partition {partition}): its tests never call {KIT_NAME}, so candidate code "
                    f'they run can forge the reward or read /tests ({guard}; README "Writing program cases")'
                )
    return warnings


@dataclass(frozen=True)
class CaseTime:
    """The longest one trial of a case can take, by its limits (seconds; None = unbounded)."""

    agent_sec: float | None
    verifier_sec: float

    @property
    def total_sec(self) -> float | None:
        return None if self.agent_sec is None else self.agent_sec + self.verifier_sec


def case_time(case_dir: Path, case_timeout_sec: float | None) -> CaseTime:
    """Agent and verifier time of one trial of the case at `case_dir` (summed over steps).

    Raises:
        SpecError: the case's `task.toml` cannot be read by Harbor's `TaskConfig`.
    """
    from harbor.models.task.config import TaskConfig

    try:
        config = TaskConfig.model_validate_toml((case_dir / "task.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise SpecError.at("cases", f"case {case_dir.name!r}: task.toml cannot be read by Harbor") from None
    phases = (
        [
            (
                s.agent.timeout_sec if s.agent.timeout_sec is not None else config.agent.timeout_sec,
                s.verifier.timeout_sec if s.verifier.timeout_sec is not None else config.verifier.timeout_sec,
            )
            for s in config.steps
        ]
        if config.steps
        else [(config.agent.timeout_sec, config.verifier.timeout_sec)]
    )
    agents = [case_timeout_sec if case_timeout_sec is not None else agent for agent, _ in phases]
    agent_sec = None if any(a is None for a in agents) else float(sum(agents))
    return CaseTime(agent_sec=agent_sec, verifier_sec=float(sum(v for _, v in phases)))


def check_evaluation_time(
    spec: OptimizationSpec, case_dirs: Mapping[str, Path], scopes: Mapping[str, list[str]]
) -> None:
    """Refuse a spec whose `harbor.evaluation_timeout_sec` cannot fit the largest evaluation of a scope.

    Args:
        spec: the validated spec.
        case_dirs: case name -> its fetched task dir.
        scopes: partition -> its cases, for every partition an evaluation runs over (the
            agent-accessible partitions, the targets, the selection partition).

    Raises:
        SpecError: at `harbor.evaluation_timeout_sec`, one issue per partition that does not fit (with
            the numbers), or per case without any agent time limit.
    """
    harbor = spec.harbor
    limit = harbor.evaluation_timeout_sec
    issues: list[SpecIssue] = []
    loc = "harbor.evaluation_timeout_sec"
    times = {case: case_time(case_dirs[case], harbor.case_timeout_sec) for names in scopes.values() for case in names}
    for case, time in sorted(times.items()):
        if time.agent_sec is None:
            issues.append(
                SpecIssue(
                    loc,
                    f"case {case!r} declares no [agent].timeout_sec and harbor.case_timeout_sec "
                    "is unset: its agent time is unbounded, so no evaluation time fits it",
                )
            )
    if issues:
        raise SpecError(issues)
    for partition, names in sorted(scopes.items()):
        slowest = max(names, key=lambda c: (times[c].total_sec or 0.0, c))
        per_wave = times[slowest].total_sec or 0.0
        waves = math.ceil(len(names) * harbor.n_attempts / harbor.n_concurrent)
        needed = waves * per_wave + EVALUATION_SETUP_MARGIN_SEC
        if needed > limit:
            time = times[slowest]
            issues.append(
                SpecIssue(
                    loc,
                    (
                        f"{limit:g} s cannot fit partition {partition!r}: ceil({len(names)} case(s) x "
                        f"{harbor.n_attempts} attempt(s) / {harbor.n_concurrent} concurrent) = {waves} wave(s) x "
                        f"{per_wave:g} s (agent "
                        f"{time.agent_sec:g} s + verifier {time.verifier_sec:g} s of the slowest case, {slowest!r}) + "
                        f"{EVALUATION_SETUP_MARGIN_SEC:g} s setup margin = {needed:g} s"
                    ),
                )
            )
    if issues:
        raise SpecError(issues)
