"""`vero harbor report JOBS_DIR...`: one table over every trial of one or several Harbor jobs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from vero.commands.exit_codes import run_command

JOBS_REPORT_HELP = (
    "One table over every trial of one or several Harbor jobs of compiled vero tasks (the -k N "
    "trials of one task, several agents, several jobs): per trial the reward, the verifier's status, "
    "each target's verdict and lift over the baseline, the shipped candidate and what the trial spent; "
    "then, per task, agent and target, the mean lift over the trials with its interval across trials.\n\n"
    "JOBS_DIR is a Harbor job dir or a jobs dir holding job dirs. --json prints the report as JSON "
    "instead; --html FILE also writes it as a self-contained page. Exit codes: 0 written; 2 a path "
    "holds no Harbor job or an option is invalid."
)


def jobs_report_command(
    jobs_dirs: Annotated[
        list[Path], typer.Argument(metavar="JOBS_DIR", help="Harbor job dirs, or jobs dirs holding them.")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON instead of tables.")] = False,
    html: Annotated[Path | None, typer.Option("--html", help="Also write the report as an HTML page here.")] = None,
    confidence: Annotated[float, typer.Option("--confidence", help="Level of the pooled intervals, in (0, 1).")] = 0.95,
) -> None:
    """`vero harbor report` (its help: `JOBS_REPORT_HELP`)."""
    from vero.verifier.job_report import build_report, write_html

    report = run_command(lambda: build_report(jobs_dirs, confidence=confidence))
    if html is not None:
        run_command(lambda: _write(write_html, report, html))
    if as_json:
        typer.echo(json.dumps(report.model_dump(mode="json"), indent=2, sort_keys=True))
        return
    _print_tables(report)
    if html is not None:
        typer.echo(f"html: {html}")


def _write(write, report, path: Path) -> Path:
    from vero.errors import SpecError

    try:
        return write(report, path)
    except OSError as exc:
        raise SpecError.at("--html", f"cannot write {path}: {exc.strerror or type(exc).__name__}") from None


def _print_tables(report) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from vero.verifier.job_report import rewards_text, trial_spend_text

    console = Console()
    trials = Table(title=f"vero harbor report: {len(report.trials)} trial(s)", show_header=True)
    for column in ("trial", "task", "agent", "reward", "status", "verdict", "chosen candidate", "spend"):
        trials.add_column(column, overflow="fold")
    for row in report.trials:
        verdicts = "\n".join(f"{p}: {v.summary}" for p, v in row.verdicts.items()) or (row.problem or "")
        chosen = f"{row.chosen[:12]} {row.chosen_label or ''}".strip() if row.chosen else ""
        # As text, never markup: a commit subject is the agent's to write.
        trials.add_row(
            *(
                Text(value)
                for value in (
                    f"{row.job}/{row.trial}",
                    row.task,
                    row.agent,
                    rewards_text(row.rewards),
                    row.status or row.exception_type or "",
                    verdicts,
                    chosen,
                    trial_spend_text(row.spend),
                )
            )
        )
    console.print(trials)
    for row in report.trials:
        if row.after_agent_end is not None and row.after_agent_end.late:
            console.print(Text(f"late intake: {row.job}/{row.trial}: {row.after_agent_end.summary()}"))
    if report.pooled:
        pooled = Table(title="pooled over trials (units: trials)", show_header=True)
        for column in ("task", "agent", "target", "pooled lift"):
            pooled.add_column(column, overflow="fold")
        for row in report.pooled:
            pooled.add_row(*(Text(v) for v in (row.task, row.agent, row.partition, row.summary())))
        console.print(pooled)
