"""The `vero` console script: the agent's commands and the groups' help on the standard library,
everything else via typer.

`vero harbor status|eval|result|submit|evaluations` run on every tool call of a coding agent, so they
go straight to `vero.agent_cli` (standard library only) before the typer application, its command
modules, pydantic or httpx are imported. `vero --help`, `vero harbor --help`, a group without a
command and the other commands' `--help` into a pipe are printed by `vero.commands.group_help`
(typer's page, without typer). Every other call is `vero.cli`, which imports only the command it
runs.
"""

from __future__ import annotations

import sys

__all__ = ["AGENT_COMMANDS", "main"]

AGENT_COMMANDS = frozenset({"status", "eval", "result", "submit", "evaluations"})
"""The `vero harbor` commands `vero.agent_cli` serves. Kept here so that every other call (the
sidecar's start among them) decides without importing `vero.agent_cli` (argparse: about 30 ms)."""


def main() -> None:
    """Console-script entry point."""
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[-1] == "--help":  # a help page, maybe one typer need not print
        from vero.commands.group_help import static_help

        answer = static_help(argv)
        if answer is not None:
            page, code = answer
            sys.stdout.write(page)
            sys.stdout.flush()
            if code:
                sys.exit(code)
            return
    if len(argv) >= 2 and argv[0] == "harbor" and argv[1] in AGENT_COMMANDS:
        from vero.agent_cli import main as agent_main

        sys.exit(agent_main(argv[1:]))
    from vero.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
