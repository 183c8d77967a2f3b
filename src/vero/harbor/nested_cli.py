"""`vero-harbor-run`: Harbor's own `harbor run`, without importing the rest of Harbor's CLI.

Every nested evaluation round is one `harbor run` process (`vero.harbor.command.build_command`).
Harbor's `harbor` script imports `harbor.cli.main`, which imports every subcommand's module (hub,
publish, the viewer's server, adapters, traces...) before it parses a single argument; a nested run
uses only `run`. This entry registers the very same command function, `harbor.cli.jobs.start` (what
`harbor.cli.main` registers as `run`), on a Typer application built like Harbor's (the same context
settings, the same root callback's effects), so the options, their parsing and the job it starts are
Harbor's own; only the unused command modules stay unimported. Harbor 0.26 `cli/main.py` is the
source of what is mirrored here; `tests/harbor/test_nested_cli.py` checks that the `run` command's
parameters are the same objects' as Harbor's.

Its root callback keeps what `harbor.cli.main.main` does: `HARBOR_LAUNCH_SOURCE` defaults to `cli`
and the command's job ids start empty; the command-finished telemetry event is Harbor's, with the
flag names of the arguments given (nested runs force `HARBOR_TELEMETRY=0`, so it sends nothing
there: `vero.harbor.command.FORCED_ENV`).

Anything but `run` (or no argument) goes to Harbor's full application unchanged.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Protocol

import typer

__all__ = ["build_app", "main"]

SCRIPT_NAME = "vero-harbor-run"
"""The console script (pyproject `[project.scripts]`), installed next to `harbor`."""


def build_app() -> typer.Typer:
    """A Typer application with Harbor's `run` command only (`harbor.cli.jobs.start`).

    Returns:
        An application whose root callback mirrors `harbor.cli.main.main` (no `--version`: nested
        runs never ask for it, and anything but `run` goes to Harbor's application, `main`).
    """
    from harbor.cli.jobs import start
    from harbor.telemetry import LAUNCH_SOURCE_ENV, capture_command_finished, reset_command_job_ids

    app = typer.Typer(no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]})

    @app.callback()
    def root(ctx: typer.Context) -> None:
        os.environ.setdefault(LAUNCH_SOURCE_ENV, "cli")
        reset_command_job_ids()
        started_at = time.monotonic()
        flags = _flag_names(ctx, sys.argv[1:])

        def capture() -> None:
            capture_command_finished(
                command_path="run",
                command_flags=flags,
                duration_seconds=time.monotonic() - started_at,
                exception=sys.exc_info()[1],
            )

        ctx.call_on_close(capture)

    app.command(name="run", help="Start a job. Alias for `harbor job start`.")(start)
    return app


def _flag_names(ctx: typer.Context, args: list[str]) -> list[str]:
    """The registered flag names among `args`, once each, in order (Harbor's
    `_command_telemetry_from_argv` for the `run` path: values that look like flags are not named)."""
    group = ctx.command
    known = set(ctx.help_option_names) | _option_names(group)
    commands = getattr(group, "commands", {})
    if "run" in commands:
        known |= _option_names(commands["run"])
    flags: list[str] = []
    for arg in args:
        if arg == "--":
            break
        looks_like_flag = (arg.startswith("--") and len(arg) > 2) or (
            arg.startswith("-") and len(arg) > 1 and arg[1].isalpha()
        )
        if looks_like_flag:
            flag = arg.split("=", 1)[0]
            if flag in known and flag not in flags:
                flags.append(flag)
    return flags


class _Parameter(Protocol):
    opts: list[str]
    secondary_opts: list[str]


class _Command(Protocol):
    # Typer's own click (`typer._click`), which it does not export under a public name.
    @property
    def params(self) -> Sequence[_Parameter]: ...


def _option_names(command: _Command) -> set[str]:
    names: set[str] = set()
    for param in command.params:
        names.update(param.opts)
        names.update(param.secondary_opts)
    return names


def main() -> None:
    """Console-script entry: `vero-harbor-run run ARGS...` is `harbor run ARGS...`."""
    if sys.argv[1:2] != ["run"]:
        from harbor.cli.main import app as harbor_app

        harbor_app(prog_name="harbor")
        return
    # Usage lines and errors name `harbor`, as Harbor's own script's do.
    build_app()(prog_name="harbor")


if __name__ == "__main__":
    main()
