"""`vero harbor status|eval|result|submit|evaluations` in the typer application.

The commands themselves live in `vero.agent_cli` (standard library only, so the agent's tool calls
start fast); the `vero` console script sends them there before typer is loaded (`vero._entry`).
These entries list them in `vero harbor --help` and forward to the same implementation when the
typer application is invoked directly (`python -m vero.cli`, tests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from vero.agent_cli import EPILOG, HELP
from vero.commands.registry import COMMANDS

__all__ = ["FORWARDED", "forwarder"]

FORWARDED = ("status", "eval", "result", "submit", "evaluations")
"""The agent's commands, in the order of `vero harbor --help`."""

_FORWARD = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


def forwarder(name: str) -> tuple[Callable[[typer.Context], None], dict[str, Any]]:
    """The typer callback of `vero harbor <name>` and the options to register it with."""

    def command(ctx: typer.Context) -> None:
        from vero.agent_cli import main

        raise typer.Exit(main([name, *ctx.args]))

    command.__doc__ = HELP[name]
    options = dict(
        help=next(e.summary for e in COMMANDS if e.group == "harbor" and e.name == name),
        epilog=EPILOG,
        context_settings=_FORWARD,
        add_help_option=False,
    )
    return command, options
