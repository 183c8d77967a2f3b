"""The `vero` command line: `vero harbor build|run|serve|seal|verify|eval|status|result|submit`, `vero report`.

Commands live in `vero.commands.*` modules and register themselves on `harbor_app` (or `app`); each
parses options, imports what it needs lazily, calls one library function, prints, and exits through
`vero.commands.exit_codes`. Importing this module stays cheap so `vero --help` is instant.
"""

from __future__ import annotations

import typer

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


def main() -> None:
    """Console-script entry point."""
    app()


# Each command module registers its commands on the apps above, so it is imported after them; the
# import order is the order of `vero harbor --help`.
from vero.commands import build, run, sidecar, agent, verify  # noqa: E402, F401, I001
