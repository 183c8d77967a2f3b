"""`vero harbor run`: compile a spec and run it end to end with Harbor."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vero.commands.exit_codes import EXIT_FAILED, VERIFIER_STATUS_EXIT_CODES, run_command
from vero.commands.options import ConfigOption, EnvFileOption, parse_options

RUN_HELP = (
    "Compile the spec to a temporary task, run it with Harbor and print the reward(s).\n\n"
    "Checks the agent name and Docker (or Modal credentials) before building anything, streams "
    "Harbor's progress, then prints the rewards, the candidate the verifier chose, each target's verdict "
    "beside the baseline and where the trial, the artifacts and the compiled task are (one table per trial "
    "with -k). When the verifier did not score every target, the causes (finalization.json errors and case "
    "problems) are printed too.\n\n"
    "--environment is where the trial runs and, unless --nested-environment is given, where its nested "
    "evaluations run; --ek sets the trial's environment options, harbor.environment_options the nested runs'.\n\n"
    "Exit codes (with -k, the first trial's that is not 0): 0 the verifier's status is scored; 21 unmeasurable "
    "(a target's verdict is: its causes are printed); 16 partial (some target at its failure value); 17 failed "
    "(no target measured, or nothing shipped); 10 the verifier refused the session; 1 the trial errored, "
    "produced no reward or no finalization.json; 2 bad usage or invalid spec; 5 Docker or Harbor unavailable."
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
    environment: Annotated[
        str | None,
        typer.Option(
            "--environment",
            "-e",
            help="Where the trial runs (docker, modal); also the nested runs' environment unless "
            "--nested-environment is given. Default: harbor.environment of the spec.",
        ),
    ] = None,
    nested_environment: Annotated[
        str | None,
        typer.Option(
            "--nested-environment",
            help="Where the sidecar's and the verifier's nested runs go (overrides harbor.environment), "
            "e.g. the trial on docker and its evaluations on modal.",
        ),
    ] = None,
    environment_option: Annotated[
        list[str] | None,
        typer.Option(
            "--ek",
            help="KEY=VALUE option of the trial's environment (Harbor's --ek; VALUE parsed as JSON when it "
            "is JSON), e.g. modal_vm_runtime=false. Repeatable. Nested runs take harbor.environment_options.",
        ),
    ] = None,
    n_concurrent: Annotated[
        int | None,
        typer.Option("--n-concurrent", "-n", min=1, help="Trials at once (Harbor's -n)."),
    ] = None,
    n_attempts: Annotated[
        int | None,
        typer.Option(
            "--n-attempts",
            "-k",
            min=1,
            help="Trials of the task (Harbor's -k), each with its own agent, sidecar and verifier.",
        ),
    ] = None,
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
    from vero.launch import HarborArgs, RunEnvironments, run_task

    outcome = run_command(
        lambda: run_task(
            config,
            agent=agent,
            model=model,
            environments=RunEnvironments(
                trial=environment,
                nested=nested_environment,
                trial_options=parse_options(environment_option or [], "--ek"),
            ),
            env_file=env_file,
            jobs_dir=jobs_dir,
            harbor_args=HarborArgs(job_name=job_name, n_concurrent=n_concurrent, n_attempts=n_attempts),
            on_warning=lambda w: typer.echo(f"warning: {w}", err=True),
        )
    )
    raise typer.Exit(report_outcome(outcome))


def report_outcome(outcome) -> int:
    """Print what a run produced and return the exit code: per trial (one with `-k 1`) a table of
    rewards, choice and status, the verifier's warnings, where everything is, and the causes when not
    every target was scored; the exit code is the first trial's that is not 0.

    Args:
        outcome: `vero.launch.TaskRunOutcome`.
    """
    if not outcome.trials:
        if outcome.job_dir.is_dir():
            typer.echo(f"job:           {outcome.job_dir} (no trial result; see job.log there)")
        else:
            typer.echo("job:           none (Harbor did not start the job; see its output above)")
        typer.echo(f"compiled task: {outcome.task_dir}")
        return EXIT_FAILED
    codes = [_report_trial(trial, many=len(outcome.trials) > 1) for trial in outcome.trials]
    typer.echo(f"compiled task: {outcome.task_dir}")
    return next((code for code in codes if code != 0), 0)


def _report_trial(trial, *, many: bool) -> int:
    """One trial's part of `report_outcome` (`trial`: `vero.launch.TrialRunOutcome`)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    final = trial.finalization or {}
    table = Table(
        title=Text(f"vero harbor run: {trial.trial_dir.name}" if many else "vero harbor run"), show_header=True
    )
    table.add_column("what")
    table.add_column("value", overflow="fold")
    for what, text in _trial_rows(trial, final):
        # As text, never markup: a candidate's commit subject is the agent's to write.
        table.add_row(Text(what), Text(text))
    Console().print(table)
    for warning in final.get("warnings") or []:
        typer.echo(f"warning: {warning}", err=True)
    if trial.after_agent_end is not None and trial.after_agent_end.late:
        typer.echo(f"warning: the sidecar took work after the agent ended: {trial.after_agent_end.summary()}", err=True)
    # Paths as plain lines: a table would wrap them, and they are meant to be copied.
    typer.echo(f"trial:         {trial.trial_dir}")
    if trial.artifacts_dir:
        typer.echo(f"artifacts:     {trial.artifacts_dir}")
    status = final.get("status")
    if trial.ok and status != "scored":
        _echo_causes(final)
    if not trial.ok:
        return EXIT_FAILED
    if not final:
        typer.echo("error: the verifier left no finalization.json", err=True)
        return EXIT_FAILED
    return VERIFIER_STATUS_EXIT_CODES.get(str(status), EXIT_FAILED)


def _trial_rows(trial, final: dict) -> list[tuple[str, str]]:
    """(what, value) rows of one trial's table: rewards, the chosen candidate, selection, status."""
    rows: list[tuple[str, str]] = []
    for key, value in sorted(trial.rewards.items()):
        rows.append(("reward" if key == "reward" else f"reward[{key}]", f"{value:g}"))
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
    if trial.after_agent_end is not None:
        rows.append(("after the agent's end", trial.after_agent_end.summary()))
    if trial.exception_type:
        rows.append(("trial error", trial.exception_type))
    return rows


def _echo_causes(final: dict) -> None:
    """Print the case problems and errors of a finalization that is not `scored` (at most
    `_MAX_CAUSE_LINES`)."""
    causes = [
        f"case {p.get('case')!r}: {p.get('code')}: {p.get('detail')}"
        for p in final.get("problems") or []
        if isinstance(p, dict)
    ]
    causes += [str(e) for e in final.get("errors") or []]
    for line in causes[:_MAX_CAUSE_LINES]:
        typer.echo(f"cause: {line}", err=True)
    if len(causes) > _MAX_CAUSE_LINES:
        typer.echo(f"cause: ... {len(causes) - _MAX_CAUSE_LINES} more in finalization.json", err=True)


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
