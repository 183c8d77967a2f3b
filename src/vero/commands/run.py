"""`vero harbor run`: compile a spec and run it end to end with Harbor."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vero.commands.exit_codes import EXIT_FAILED, VERIFIER_STATUS_EXIT_CODES, run_command
from vero.commands.options import ConfigOption, EnvFileOption, EnvironmentOption

RUN_HELP = (
    "Compile the spec to a temporary task, run it with Harbor and print the reward(s).\n\n"
    "Checks the agent name and Docker (or Modal credentials) before building anything, streams "
    "Harbor's progress, then prints the rewards, the candidate the verifier chose, each target's verdict "
    "beside the baseline and where the trial, "
    "the artifacts and the compiled task are. When the verifier did not score every target, the causes "
    "(finalization.json errors and case problems) are printed too.\n\n"
    "Exit codes: 0 the verifier's status is scored; 21 unmeasurable (a target's verdict is: its causes "
    "are printed); 16 partial (some target at its failure value); 17 "
    "failed (no target measured, or nothing shipped); 10 the verifier refused the session; 1 the trial "
    "errored, produced no reward or no finalization.json; 2 bad usage or invalid spec; 5 Docker or "
    "Harbor unavailable."
)


def run(
    config: ConfigOption,
    agent: Annotated[
        str,
        typer.Option(
            "--agent",
            "-a",
            help="Harbor agent working in `main`: a name (oracle, nop, claude-code, codex, ...) or module:Class.",
        ),
    ] = "oracle",
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="Model for the agent, e.g. anthropic/claude-sonnet-4-5.",
        ),
    ] = None,
    environment: EnvironmentOption = None,
    env_file: EnvFileOption = None,
    jobs_dir: Annotated[
        Path,
        typer.Option(
            "--jobs-dir",
            "-o",
            help="Harbor jobs directory on this machine.",
        ),
    ] = Path("jobs"),
    job_name: Annotated[
        str | None,
        typer.Option(
            "--job-name",
            help="Harbor job name (default: vero-<spec name>-<random>).",
        ),
    ] = None,
) -> None:
    """`vero harbor run` (its help: `RUN_HELP`): run the spec's task with Harbor, print the outcome, exit by it."""
    from vero.launch import run_task

    outcome = run_command(
        lambda: run_task(
            config,
            agent=agent,
            model=model,
            environment=environment,
            env_file=env_file,
            jobs_dir=jobs_dir,
            job_name=job_name,
            on_warning=lambda w: typer.echo(f"warning: {w}", err=True),
        )
    )
    raise typer.Exit(report_outcome(outcome))


def report_outcome(outcome) -> int:
    """Print what a run produced (a table of rewards, choice and status; the verifier's warnings;
    where everything is; the causes when not every target was scored) and return the exit code.

    Args:
        outcome: `vero.launch.TaskRunOutcome`.
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    rows: list[tuple[str, str]] = []
    for key, value in sorted(outcome.rewards.items()):
        rows.append(("reward" if key == "reward" else f"reward[{key}]", f"{value:g}"))
    final = outcome.finalization or {}
    chosen = final.get("chosen") or {}
    if isinstance(chosen, dict) and chosen.get("candidate"):
        label = "baseline" if chosen.get("is_baseline") else (chosen.get("subject") or "")
        rows.append(("chosen candidate", f"{chosen['candidate']} {label}".strip()))
    selection = final.get("selection") or {}
    if isinstance(selection, dict) and selection.get("method"):
        rows.append(("selected by", str(selection["method"])))
    if final.get("status"):
        rows.append(("verifier status", str(final["status"])))
    rows += _verdict_lines(final)
    if outcome.exception_type:
        rows.append(("trial error", outcome.exception_type))
    table = Table(title="vero harbor run", show_header=True)
    table.add_column("what")
    table.add_column("value", overflow="fold")
    for what, text in rows:
        # As text, never markup: a candidate's commit subject is the agent's to write.
        table.add_row(Text(what), Text(text))
    Console().print(table)
    for warning in final.get("warnings") or []:
        typer.echo(f"warning: {warning}", err=True)
    # Paths as plain lines: a table would wrap them, and they are meant to be copied.
    if outcome.trial_dir is not None:
        typer.echo(f"trial:         {outcome.trial_dir}")
    elif outcome.job_dir.is_dir():
        typer.echo(f"job:           {outcome.job_dir} (no trial result; see job.log there)")
    else:
        typer.echo("job:           none (Harbor did not start the job; see its output above)")
    if outcome.artifacts_dir:
        typer.echo(f"artifacts:     {outcome.artifacts_dir}")
    typer.echo(f"compiled task: {outcome.task_dir}")
    status = final.get("status")
    causes = [
        f"case {p.get('case')!r}: {p.get('code')}: {p.get('detail')}"
        for p in final.get("problems") or []
        if isinstance(p, dict)
    ]
    causes += [str(e) for e in final.get("errors") or []]
    if outcome.ok and status != "scored" and causes:
        for line in causes[:_MAX_CAUSE_LINES]:
            typer.echo(f"cause: {line}", err=True)
        if len(causes) > _MAX_CAUSE_LINES:
            typer.echo(f"cause: ... {len(causes) - _MAX_CAUSE_LINES} more in finalization.json", err=True)
    if not outcome.ok:
        return EXIT_FAILED
    if not final:
        typer.echo("error: the verifier left no finalization.json", err=True)
        return EXIT_FAILED
    return VERIFIER_STATUS_EXIT_CODES.get(str(status), EXIT_FAILED)


_MAX_CAUSE_LINES = 20


def _verdict_lines(final: dict) -> list[tuple[str, str]]:
    """(row label, `Verdict.summary()`) per target of `finalization.json`'s `verdicts`: `verdict`
    for a single target, `verdict[<partition>]` otherwise; entries that do not parse are skipped."""
    from pydantic import ValidationError

    from vero.verifier.verdict import Verdict

    verdicts = []
    for entry in final.get("verdicts") or []:
        try:
            verdicts.append(Verdict.model_validate(entry))
        except ValidationError:
            continue
    single = len(verdicts) == 1
    return [("verdict" if single else f"verdict[{v.partition}]", v.summary()) for v in verdicts]
