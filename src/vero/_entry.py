"""The `vero` console script: the agent's commands on the standard library, everything else via typer.

`vero harbor status|eval|result|submit|evaluations` run on every tool call of a coding agent, so they
go straight to `vero.agent_cli` (standard library only) before the typer application, its command
modules, pydantic or httpx are imported. Every other command, and `vero --help`, is `vero.cli`.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    """Console-script entry point."""
    argv = sys.argv[1:]
    if len(argv) >= 2 and argv[0] == "harbor":
        from vero.agent_cli import AGENT_COMMANDS

        if argv[1] in AGENT_COMMANDS:
            from vero.agent_cli import main as agent_main

            sys.exit(agent_main(argv[1:]))
    from vero.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
