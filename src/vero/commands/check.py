"""`vero harbor check`: run every case with Harbor against the baseline and the reference, print a table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from vero.commands.exit_codes import EXIT_CHECK_PROBLEMS, EXIT_OK, run_command
from vero.commands.options import ConfigOption, EnvFileOption, EnvironmentOption

if TYPE_CHECKING:
    from rich.progress import TaskID

    from vero.harbor import HarborBackend
    from vero.spec.models import OptimizationSpec

CHECK_HELP = (
    "Run every case directly with Harbor against the baseline and the reference, before an agent run "
    "is spent.\n\n"
    "Each case is first checked with Harbor's own code (a valid task; every host variable it requires "
    "a declared secret; its setup accepted by the environment), then evaluated once with the baseline "
    "and once with the reference (target.reference applied as the oracle does) in the spec's "
    "environment, one nested harbor job per candidate over all its cases (a spec with inference gets its "
    "gateway, with the provider keys from the environment or --env-file, and one run per case and "
    "candidate). With --probe, each case runs once more "
    "under a probe. kind: program: the first time the case's tests open a file of the installed "
    "candidate, a process is planted as the candidate user that keeps trying to write the reward files "
    "and read /tests. kind: agent: a planted candidate agent tries to upload where only root may write, "
    "download what only root may read, leave a process that writes the reward during the tests, and "
    "break the collection of the trial's files.\n\n"
    "The table shows each case's partition, both rewards, the probe's verdict, the time the runs took "
    "and its problems: case_invalid, missing_variables, setup_rejected, reward_key_missing (keys "
    "found), kit_shadowed (program cases whose tests could run a candidate file for vero-kit as root), "
    "kit_missing (program cases whose tests run where the candidate is installed and never "
    "call vero-kit), no_artifacts (a separate verifier environment given no artifacts), install_failed "
    "(the baseline cannot be installed), agent_user_root (agent cases whose agent user is root), "
    "infrastructure, no_reward, reward_out_of_range, forgeable and probe_not_exercised (--probe; not "
    "applicable where the tests run in a separate verifier environment), and reference_not_better for "
    "the spec as a whole.\n\n"
    "Exit codes: 0 no problem; 18 some problem (listed); 2 invalid spec or usage; 5 Docker or Harbor "
    "unavailable."
)


def check(
    config: ConfigOption,
    environment: EnvironmentOption = None,
    env_file: EnvFileOption = None,
    case: Annotated[
        list[str] | None,
        typer.Option(
            "--case",
            help="Check only this case (repeatable). Default: every case of every partition.",
        ),
    ] = None,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            "-n",
            min=1,
            help="Trials at a time in all (with inference in the spec: nested runs at a time).",
        ),
    ] = 4,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            "--work-dir",
            help="Where the fetched cases, candidates and Harbor job dirs go (default: a new temporary "
            "directory, kept).",
        ),
    ] = None,
    probe: Annotated[
        bool,
        typer.Option(
            "--probe",
            help="Also run each case once more under a probe (kind: program: a process planted as the "
            "candidate user that tries to rewrite the reward files and read /tests; kind: agent: a planted "
            "candidate agent that tries root-only uploads and downloads, a process that outlives its run, "
            "and files that break the trial's collection); a case where it succeeds is forgeable.",
        ),
    ] = False,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the report as JSON (no table, no progress display).",
        ),
    ] = False,
    report_path: Annotated[
        Path | None,
        typer.Option(
            "--report",
            help="Also write the JSON report to this file (the table is still printed).",
        ),
    ] = None,
) -> None:
    """`vero harbor check` (its help: `CHECK_HELP`): parse, call `vero.check.check_spec`, print, exit."""
    import asyncio
    import json
    import tempfile

    from vero.check import check_spec
    from vero.launch import load_run_spec

    def call():
        spec, env = load_run_spec(config, environment=environment, env_file=env_file)
        backend, probe_backend = check_backends(spec, probe)
        # Absolute: the nested runs work in other directories (a relative one named nothing there).
        work = (work_dir or Path(tempfile.mkdtemp(prefix=f"vero-check-{spec.name}-"))).absolute()
        progress = None if json_output else _Progress()
        try:
            if progress is not None:
                progress.start()
            report = asyncio.run(
                check_spec(
                    spec,
                    env,
                    work_dir=work,
                    concurrency=concurrency,
                    progress=progress,
                    cases=case or None,
                    probe=probe,
                    backend=backend,
                    probe_backend=probe_backend,
                )
            )
        finally:
            if progress is not None:
                progress.stop()
        return report, work

    report, work = run_command(call)
    document = json.dumps({**report.model_dump(mode="json"), "ok": report.ok, "work_dir": str(work)}, indent=2)
    if report_path is not None:
        report_path.write_text(document + "\n")
    if json_output:
        typer.echo(document)
    else:
        _print_report(report, work)
    raise typer.Exit(EXIT_OK if report.ok else EXIT_CHECK_PROBLEMS)


class _Progress:
    """A rich progress display on stderr: one line per running nested run, a bar for all of them."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._overall: TaskID | None = None
        self._tasks: dict[tuple[str, str], TaskID] = {}

    def start(self) -> None:
        self._progress.start()
        self._overall = self._progress.add_task("nested runs", total=None)

    def stop(self) -> None:
        self._progress.stop()

    def started(self, case: str, candidate: str) -> None:
        self._tasks[case, candidate] = self._progress.add_task(f"{case} ({candidate})", total=1)
        if self._overall is not None:
            self._progress.update(self._overall, total=(self._progress.tasks[0].total or 0) + 1)

    def finished(self, case: str, candidate: str, run) -> None:
        task = self._tasks.pop((case, candidate), None)
        if task is not None:
            self._progress.remove_task(task)
        if self._overall is not None:
            self._progress.advance(self._overall)
        outcome = f"{run.reward:g}" if run.reward is not None else run.outcome
        installed = getattr(run, "dependencies", None)
        if installed is not None:
            outcome += (
                " (dependencies reused)"
                if installed.reused
                else f" (dependencies installed in {installed.install_sec:.1f} s"
                + (", failed)" if installed.error else ")")
            )
        self._progress.console.print(f"{case} ({candidate}): {outcome} in {run.seconds:.1f} s", markup=False)


def _reward_cell(run) -> str:
    if run is None:
        return "-"
    cell = f"{run.reward:g}" if run.reward is not None else run.outcome
    usage = run.inference
    if usage is not None and (usage.calls or usage.n_refused or usage.failed_calls):
        cell += f"\n{usage.calls} model call(s), ${usage.cost_usd:.6f}"
        if usage.n_refused or usage.failed_calls:
            cell += f" ({usage.n_refused} refused, {usage.failed_calls} failed)"
    return cell


def _probe_cell(probe) -> str:
    if probe is None:
        return "-"
    return probe.verdict.replace("_", " ")


def _print_report(report, work: Path) -> None:
    """The table, then the spec's problems and the warnings. Every text from the report (case names,
    problem details, warnings) is a `rich.text.Text`, never markup: details name locations such as
    `[environment.env]`, which Rich would read as a style tag and drop."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(width=None if Console().is_terminal else 160)
    table = Table(
        title=Text(
            f"vero harbor check: {report.name} on {report.environment} "
            f"(reward key {report.reward_key!r}, {report.direction})"
        ),
        show_lines=True,
    )
    columns = [
        "case",
        "partition",
        "baseline reward",
        "reference reward",
        *(["probe"] if report.probed else []),
        "time",
        "problems",
    ]
    for column in columns:
        table.add_column(column, overflow="fold", justify="right" if column in ("time",) else "left")
    for row in report.cases:
        problems = "\n".join(f"{p.code}: {p.detail}" for p in row.problems) or "ok"
        reference = _reward_cell(row.reference) if report.has_reference else "(no reference)"
        probe = [_probe_cell(row.probe)] if report.probed else []
        cells = [row.case, row.partition, _reward_cell(row.baseline), reference, *probe]
        cells += [f"{row.seconds:.1f} s" if row.seconds else "-", problems]
        table.add_row(*(Text(cell) for cell in cells), style="red" if row.problems else None)
    console.print(table)
    for problem in report.problems:
        console.print(Text.assemble(("problem", "red"), f" {problem.code}: {problem.detail}"))
    for warning in report.warnings:
        console.print(Text.assemble(("warning", "yellow"), f" {warning}"))
    n_bad = sum(1 for row in report.cases if row.problems) + len(report.problems)
    console.print(
        "no problem found" if report.ok else f"{n_bad} problem(s) found", style="green" if report.ok else "red"
    )
    typer.echo(f"work dir: {work}")


def check_backends(spec: OptimizationSpec, probe: bool) -> tuple[HarborBackend, HarborBackend | None]:
    """The backends of `vero harbor check`: `HarborBackend` without its per-run case check (the
    check does it once) and with `kind: agent` candidate hosts as the caller's user (the candidates
    are the operator's own baseline and reference, so the caller's interpreter need not be runnable
    by other users); with `probe`, the probe's: for a `kind: program` target one with the probe
    agent (`vero.harbor.probe`), for `kind: agent` one like the check's whose planted candidate
    agent (`vero.harbor.agent_probe`) is given the reward key; else None.

    Raises:
        InfrastructureFailure: the probe cannot be built (no C compiler, or the static build failed).
    """
    from vero.harbor import HarborBackend
    from vero.spec.models import ProgramTarget

    backend = HarborBackend(check_cases=False, isolate_candidates=False)
    if not probe:
        return backend, None
    if not isinstance(spec.target, ProgramTarget):
        agent_probe = HarborBackend(
            check_cases=False, isolate_candidates=False, agent_kwargs={"reward_key": spec.scoring.reward_key}
        )
        return backend, agent_probe
    from vero.harbor.probe import PROBE_AGENT_IMPORT_PATH, probe_binary

    probe_backend = HarborBackend(
        check_cases=False,
        program_agent=PROBE_AGENT_IMPORT_PATH,
        agent_kwargs={"probe_path": str(probe_binary()), "reward_key": spec.scoring.reward_key},
    )
    return backend, probe_backend
