"""Which command lives where: the `vero` CLI's commands in `--help` order, on the standard library.

`vero.cli` registers the typer application from `COMMANDS` (all of them, or only the one a call
names, so `vero harbor build` imports no other command module); `vero.commands.group_help` prints
`vero --help` and `vero harbor --help` from the same table without importing typer. The summaries
are what typer lists for each command (the first paragraph of its help);
tests/launch/test_group_help.py checks them and the printed pages against the typer application.
"""

from __future__ import annotations

__all__ = ["APP_HELP", "COMMANDS", "HARBOR_HELP", "CommandEntry", "entries"]

APP_HELP = "Compile program-optimization specs into Harbor tasks and run their trusted services."
"""The help of `vero` (the root group)."""

HARBOR_HELP = "Build and run Harbor tasks; talk to the evaluation sidecar."
"""The help of `vero harbor`."""


class CommandEntry:
    """One command of the typer application.

    Attributes:
        group: `"harbor"` (`vero harbor <name>`) or `""` (`vero <name>`).
        name: the command's name.
        module: the `vero.commands` module defining it.
        function: the function typer registers (None: an agent command forwarded to `vero.agent_cli`
            through `vero.commands.agent.forwarder`).
        help_constant: the module attribute holding its `help=` text (None: the function's docstring).
        summary: its line in the group's `--help` (the first paragraph of its help).

    A plain class: `dataclasses` would cost `vero --help` a tenth of its start-up.
    """

    __slots__ = ("function", "group", "help_constant", "module", "name", "summary")

    def __init__(
        self, group: str, name: str, module: str, function: str | None, help_constant: str | None, summary: str
    ) -> None:
        self.group, self.name, self.module = group, name, module
        self.function, self.help_constant, self.summary = function, help_constant, summary

    def __repr__(self) -> str:
        return f"CommandEntry({self.group!r}, {self.name!r})"


def _harbor(name: str, module: str, function: str | None, help_constant: str | None, summary: str) -> CommandEntry:
    return CommandEntry("harbor", name, f"vero.commands.{module}", function, help_constant, summary)


def _agent(name: str, help_text: str) -> CommandEntry:
    """An agent command: `help_text` is its help in `vero.agent_cli.HELP` (not imported here: that
    module is most of what `vero harbor --help` would load)."""
    return _harbor(name, "agent", None, None, f"{help_text} (`vero harbor {name} --help` lists the options.)")


COMMANDS: tuple[CommandEntry, ...] = (
    _harbor(
        "build",
        "build",
        "build",
        None,
        "Compile build.yaml into a Harbor task (task.toml, instruction, main + eval-sidecar, verifier, oracle).",
    ),
    _harbor(
        "check",
        "check",
        "check",
        "CHECK_HELP",
        "Run every case directly with Harbor against the baseline and the reference, before an agent run is spent.",
    ),
    _harbor(
        "run",
        "run",
        "run",
        "RUN_HELP",
        "Compile the spec to a temporary task, run it with Harbor and print the reward(s).",
    ),
    _harbor(
        "serve",
        "sidecar",
        "serve_command",
        None,
        "Run the evaluation sidecar (FastAPI on uvicorn; OpenAPI at /openapi.json) until stopped.",
    ),
    _harbor(
        "seal",
        "sidecar",
        "seal_command",
        None,
        "Seal the running sidecar's session: close the entrance, drain, write the session archive.",
    ),
    _agent(
        "status",
        "Show what you may evaluate: partitions, their cases and disclosure, remaining budgets, how many "
        "evaluations you ran (per partition and state), the newest ones, and your submission.",
    ),
    _agent(
        "eval",
        "Start an evaluation of a version on a partition and print the job; use its `id` with "
        "`vero harbor result`. The version is captured and the budget (1 run plus one case per selected "
        "case) reserved before this returns: commit first, uncommitted changes are not evaluated. "
        "Without --wait it returns at once, with the job queued or running.",
    ),
    _agent(
        "result",
        "Show an evaluation job: its state and, once complete, the result its partition discloses "
        "(per-case results where the partition discloses them).",
    ),
    _agent(
        "submit",
        "Submit a version as your final candidate: the verifier scores it on the hidden partitions. Commit first.",
    ),
    _agent(
        "evaluations",
        "List your past evaluations, newest first, a page at a time (no per-case results: "
        "`vero harbor result <id>` has them). Pass the printed `next_cursor` as --before for the next page, "
        "or use --all.",
    ),
    _harbor(
        "verify",
        "verify",
        "verify_command",
        "VERIFY_HELP",
        "Verify a sealed session: check its digests, pick the candidate, score it on the hidden partitions "
        "with nested Harbor runs, write Harbor's reward.json and the operator artifacts (finalization.json, "
        "status.json, the session copy, experiment.html).",
    ),
    _harbor(
        "report",
        "report",
        "jobs_report_command",
        "JOBS_REPORT_HELP",
        "One table over every trial of one or several Harbor jobs of compiled vero tasks (the -k N trials of "
        "one task, several agents, several jobs): per trial the reward, the verifier's status, each target's "
        "verdict and lift over the baseline, the shipped candidate and what the trial spent; then, per task, "
        "agent and target, the mean lift over the trials with its interval across trials.",
    ),
    CommandEntry(
        "",
        "report",
        "vero.commands.verify",
        "report_command",
        "REPORT_HELP",
        "Render experiment.html from a sealed session archive: candidates, scores per partition over time, "
        "budget burn and, when a matching finalization.json is found, the final rewards.",
    ),
)
"""Every command, `vero harbor`'s in the order of its `--help`, then `vero`'s own."""


def entries(group: str) -> list[CommandEntry]:
    """The commands of `group` (`"harbor"` or `""`), in registration order."""
    return [entry for entry in COMMANDS if entry.group == group]
