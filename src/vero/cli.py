"""The `vero` command line: `vero harbor build|check|run|serve|seal|verify|report|eval|...`, `vero report`.

Every command is registered from `vero.commands.registry` (in the order of `vero harbor --help`, as
Harbor's `cli/main.py` does); the `vero.commands.*` modules define plain functions and never import
this module. Each command parses options, imports what it needs lazily, calls one library function,
prints, and exits through `vero.commands.exit_codes`.

`main` registers only the command a call names (`vero harbor build ...` imports no other command
module: `vero.commands.sidecar` alone would load the sidecar's models); anything else (`--help` of a
group, an unknown or abbreviated name, no command) gets the whole application. `app` and
`harbor_app`, for tests and callers, are the whole application, built on first access.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Sequence
from typing import Any

import typer

from vero.commands.registry import APP_HELP, COMMANDS, HARBOR_HELP, CommandEntry

__all__ = ["build_app", "main"]  # and `app`, `harbor_app` (module attributes built on first access)


def _register(target: typer.Typer, entry: CommandEntry) -> None:
    module = importlib.import_module(entry.module)
    if entry.function is None:
        callback, forwarded = module.forwarder(entry.name)
        target.command(entry.name, **forwarded)(callback)
        return
    options: dict[str, Any] = {}
    if entry.help_constant is not None:
        options["help"] = getattr(module, entry.help_constant)
    target.command(entry.name, **options)(getattr(module, entry.function))


def build_app(only: CommandEntry | None = None) -> tuple[typer.Typer, typer.Typer]:
    """The typer application `(vero, vero harbor)` with every command, or with only `only`.

    The groups are the same either way (name, help, options), so a call of `only` parses, prints
    its help and fails exactly as in the whole application.
    """
    root = typer.Typer(
        name="vero",
        help=APP_HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    harbor = typer.Typer(help=HARBOR_HELP, no_args_is_help=True, pretty_exceptions_enable=False)
    root.add_typer(harbor, name="harbor")
    for entry in COMMANDS:
        if only is None or entry == only:
            _register(harbor if entry.group == "harbor" else root, entry)
    return root, harbor


@functools.cache
def _whole() -> tuple[typer.Typer, typer.Typer]:
    return build_app()


def __getattr__(name: str) -> typer.Typer:
    if name == "app":
        return _whole()[0]
    if name == "harbor_app":
        return _whole()[1]
    raise AttributeError(name)


def _named(argv: Sequence[str]) -> CommandEntry | None:
    """The command `argv` names exactly (`harbor build ...`, `report ...`), or None."""
    for entry in COMMANDS:
        path = [entry.group, entry.name] if entry.group else [entry.name]
        if list(argv[: len(path)]) == path:
            return entry
    return None


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point (`argv`: the arguments after the program name; default `sys.argv`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    named = _named(args)
    root = _whole()[0] if named is None else build_app(named)[0]
    root(args)
