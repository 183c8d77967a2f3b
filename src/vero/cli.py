"""The `vero` command line: `vero harbor build|check|run|serve|seal|verify|report|eval|...`, `vero report`.

Every command is registered here, in the order of `vero harbor --help` (as Harbor's `cli/main.py`
does); the `vero.commands.*` modules define plain functions and never import this module. Each
command parses options, imports what it needs lazily, calls one library function, prints, and exits
through `vero.commands.exit_codes`. Importing this module stays cheap so `vero --help` is instant.
"""

from __future__ import annotations

import typer

from vero.commands import agent, build, check, report, run, sidecar, verify

__all__ = ["app", "harbor_app", "main"]

app = typer.Typer(
    name="vero",
    help="Compile program-optimization specs into Harbor tasks and run their trusted services.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
harbor_app = typer.Typer(
    help="Build and run Harbor tasks; talk to the evaluation sidecar.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(harbor_app, name="harbor")

harbor_app.command("build")(build.build)
harbor_app.command("check", help=check.CHECK_HELP)(check.check)
harbor_app.command("run", help=run.RUN_HELP)(run.run)
harbor_app.command("serve")(sidecar.serve_command)
harbor_app.command("seal")(sidecar.seal_command)
for _name in agent.FORWARDED:
    _callback, _options = agent.forwarder(_name)
    harbor_app.command(_name, **_options)(_callback)
harbor_app.command("verify", help=verify.VERIFY_HELP)(verify.verify_command)
harbor_app.command("report", help=report.JOBS_REPORT_HELP)(report.jobs_report_command)
app.command("report", help=verify.REPORT_HELP)(verify.report_command)


def main() -> None:
    """Console-script entry point."""
    app()
