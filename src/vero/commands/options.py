"""Options shared by the commands that run a spec's cases with Harbor (`vero harbor run`, `vero harbor check`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["ConfigOption", "EnvFileOption", "EnvironmentOption", "parse_options"]

ConfigOption = Annotated[Path, typer.Option("--config", "-c", help="The optimization spec (build.yaml).")]

EnvironmentOption = Annotated[
    str | None,
    typer.Option(
        "--environment",
        "-e",
        help="Execution target; overrides harbor.environment of the spec (docker, modal).",
    ),
]

EnvFileOption = Annotated[
    Path | None,
    typer.Option(
        "--env-file",
        help="Dotenv file with the spec's secrets and provider keys; loaded into the environment, never put on a "
        "command line.",
    ),
]


def parse_options(items: list[str], option: str) -> dict[str, object]:
    """`KEY=VALUE` items -> a dict, parsed exactly as Harbor parses `--ek` (JSON or a Python
    literal when it is one, else the string: `vero.harbor.catalog.parse_kwargs`).

    Raises:
        typer.BadParameter: an item has no `=` (naming `option`).
    """
    from vero.harbor.catalog import parse_kwargs

    try:
        return parse_kwargs(items)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None
