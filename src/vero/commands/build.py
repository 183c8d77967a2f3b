"""`vero harbor build`: compile an optimization spec into a Harbor task directory and tarball."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vero.commands.exit_codes import EXIT_FAILED, fail, run_command


def build(
    config: Annotated[
        Path,
        typer.Option(
            "--config",
            "-c",
            help="The optimization spec (build.yaml). Relative paths in it resolve against its directory.",
        ),
    ],
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="Task directory to write (created). Must be empty unless --force.",
        ),
    ],
    tarball: Annotated[
        Path | None,
        typer.Option(
            "--tarball",
            help="Where to write the canonical .tar.gz (default: OUTPUT.tar.gz beside the directory); "
            "its sha256 goes to TARBALL.sha256.",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Replace OUTPUT when it already holds a compiled task.",
        ),
    ] = False,
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent",
            "-a",
            help="The Harbor agent the task is for (terminus-2, claude-code, codex, module:Class): the MCP server "
            "and the vero skill are declared only if it supports them, and main gets the tools it needs. "
            "Default: any agent (both declared).",
        ),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Compile build.yaml into a Harbor task (task.toml, instruction, main + eval-sidecar, verifier, oracle).

    Secrets named in the spec must be set in this environment; only their names are written.

    Prints the tarball's path and sha256 (also in TARBALL.sha256). Same spec and inputs, same bytes.
    """
    import json

    from vero.compiler import compile_task

    try:
        result = run_command(lambda: compile_task(config, output, tarball=tarball, force=force, agent=agent))
    except OSError as exc:
        # An input that cannot be read or an output that cannot be written. Only the path and the
        # system's reason: nothing read from the inputs is echoed.
        where = f" at {exc.filename}" if exc.filename else ""
        fail(f"the build failed{where}: {exc.strerror or type(exc).__name__}", EXIT_FAILED)
    for note in result.notes:
        typer.echo(f"note: {note}", err=True)
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if json_output:
        typer.echo(
            json.dumps(
                {
                    "task_dir": str(result.task_dir),
                    "tarball": str(result.tarball),
                    "sha256": result.sha256,
                    "spec_digest": result.spec_digest,
                    "baseline_commit": result.baseline_commit,
                    "notes": list(result.notes),
                    "warnings": list(result.warnings),
                },
                indent=2,
            )
        )
        return
    typer.echo(f"task     {result.task_dir}")
    typer.echo(f"tarball  {result.tarball}")
    typer.echo(f"sha256   {result.sha256}")
