"""`vero harbor status|eval|result|submit|evaluations` in the typer application.

The commands themselves live in `vero.agent_cli` (standard library only, so the agent's tool calls
start fast); the `vero` console script sends them there before typer is loaded (`vero._entry`).
These entries list them in `vero harbor --help` and forward to the same implementation when the
typer application is invoked directly (`python -m vero.cli`, tests).
"""

from __future__ import annotations

import typer

from vero.agent_cli import EPILOG, HELP
from vero.cli import harbor_app

_FORWARD = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


def _forward(name: str) -> None:
    def command(ctx: typer.Context) -> None:
        from vero.agent_cli import main

        raise typer.Exit(main([name, *ctx.args]))

    command.__doc__ = HELP[name]
    harbor_app.command(name, help=HELP[name] + " (`vero harbor " + name + " --help` lists the options.)",
                       epilog=EPILOG, context_settings=_FORWARD, add_help_option=False)(command)


for _name in ("status", "eval", "result", "submit", "evaluations"):
    _forward(_name)
