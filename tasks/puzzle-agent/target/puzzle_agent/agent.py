"""`PuzzleAgent`: recognize the kind of a terminal puzzle from its instruction and run a fixed strategy.

The agent never calls a model. It matches the instruction against each strategy's pattern in order;
the first strategy that matches builds one shell command from the paths and literals quoted in the
instruction (text in backticks), and the agent runs it in the task environment. An instruction no
strategy recognizes is left unsolved.

Contract of the puzzles (the evaluation cases): the instruction quotes the input path(s) first and the
answer file (conventionally `/app/answer.txt`) last; the answer is plain text, trailing whitespace
ignored.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import override

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

__all__ = ["STRATEGIES", "Puzzle", "PuzzleAgent", "Strategy", "parse_puzzle"]

COMMAND_TIMEOUT_SEC = 60
"""Wall-clock limit of the one command a strategy runs."""

_QUOTED = re.compile(r"`([^`\n]+)`")


@dataclass(frozen=True)
class Strategy:
    """One puzzle kind: how to recognize it and the shell command that solves it.

    Attributes:
        kind: a short name, recorded in the agent context's metadata.
        pattern: searched in the instruction (compiled with `re.I` to ignore case).
        command: builds the shell command from the parsed puzzle.
        n_inputs: quoted input paths the command needs besides the answer file.
        n_literals: quoted non-path texts the command needs.
    """

    kind: str
    pattern: re.Pattern[str]
    command: Callable[[Puzzle], str]
    n_inputs: int = 1
    n_literals: int = 0


@dataclass(frozen=True)
class Puzzle:
    """What the agent read from an instruction.

    Attributes:
        strategy: the first strategy that recognized the instruction.
        inputs: quoted absolute paths before the answer file, in order of appearance.
        literals: quoted texts that are not absolute paths (e.g. a string to search for).
        answer_path: the last quoted absolute path: where the answer goes.
    """

    strategy: Strategy
    inputs: tuple[str, ...]
    literals: tuple[str, ...]
    answer_path: str


def _python(code: str, *args: str) -> str:
    """A `python3 -c` command line with shell-quoted arguments."""
    return " ".join(["python3", "-c", shlex.quote(code), *map(shlex.quote, args)])


def _count_lines(p: Puzzle) -> str:
    return f"wc -l < {shlex.quote(p.inputs[0])} | tr -d ' ' > {shlex.quote(p.answer_path)}"


def _sum_numbers(p: Puzzle) -> str:
    code = "import sys; print(sum(int(w) for w in open(sys.argv[1]).read().split()))"
    return f"{_python(code, p.inputs[0])} > {shlex.quote(p.answer_path)}"


def _decode_base64(p: Puzzle) -> str:
    return f"base64 -d {shlex.quote(p.inputs[0])} > {shlex.quote(p.answer_path)}"


STRATEGIES: tuple[Strategy, ...] = (
    Strategy("count-lines", re.compile(r"\b(count|how many|number of)\b.*\blines\b", re.I | re.S), _count_lines),
    Strategy("sum-numbers", re.compile(r"\b(sum|add up|total)\b", re.I), _sum_numbers),
    Strategy("decode-base64", re.compile(r"\bbase64\b", re.I), _decode_base64),
)
"""Strategies in the order they are tried."""


def parse_puzzle(instruction: str, strategies: tuple[Strategy, ...] = STRATEGIES) -> Puzzle | None:
    """Recognize the puzzle in `instruction`.

    Returns:
        The puzzle for the first strategy whose pattern matches and whose quoted inputs are present,
        or None when no strategy applies (the agent then does nothing).
    """
    quoted = _QUOTED.findall(instruction)
    paths = [q for q in quoted if q.startswith("/")]
    literals = tuple(q for q in quoted if not q.startswith("/"))
    for strategy in strategies:
        # One more path than the inputs: the answer file comes last.
        if (
            strategy.pattern.search(instruction)
            and len(paths) > strategy.n_inputs
            and len(literals) >= strategy.n_literals
        ):
            return Puzzle(strategy, tuple(paths[:-1]), literals, paths[-1])
    return None


class PuzzleAgent(BaseAgent):
    """Solves one terminal puzzle per trial by running the matching strategy's shell command.

    Kwargs (`--ak`): none. It needs no model and no credentials; `environment.exec` runs as the task's
    agent user (Harbor 0.26 `agents/base.py`).
    """

    @staticmethod
    @override
    def name() -> str:
        return "puzzle-agent"

    @override
    def version(self) -> str:
        return "1.0.0"

    @override
    async def setup(self, environment: BaseEnvironment) -> None:
        return

    @override
    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        # A declared dependency (pyproject.toml), not in Harbor's closure: vero installs it for the
        # candidate's hosts. Imported here so that the strategy table can be read without it.
        import humanize

        puzzle = parse_puzzle(instruction)
        if puzzle is None:
            context.metadata = {"puzzle_kind": None}
            self.logger.info("puzzle-agent: no strategy recognizes this instruction")
            return
        kind = puzzle.strategy.kind
        command = puzzle.strategy.command(puzzle)
        context.metadata = {"puzzle_kind": kind, "command": command}
        result = await environment.exec(command, timeout_sec=COMMAND_TIMEOUT_SEC)
        context.metadata["return_code"] = result.return_code
        (self.logs_dir / "puzzle-agent.txt").write_text(
            f"kind: {kind}\ninstruction: {humanize.naturalsize(len(instruction))}\n"
            f"command: {command}\nreturn_code: {result.return_code}\n"
            f"stdout:\n{result.stdout or ''}\nstderr:\n{result.stderr or ''}\n",
            encoding="utf-8",
        )
