"""Options shared by the commands that run a spec's cases with Harbor (`vero harbor run`, `vero harbor check`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["ConfigOption", "EnvFileOption", "EnvironmentOption"]

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
