"""`LlmPuzzleAgent`: ask a model for one shell command that solves a terminal puzzle, then run it.

The model is reached through vero's inference gateway, which the OpenAI SDK finds in the
environment the harness gives the agent: `OPENAI_BASE_URL` (the gateway's OpenAI-compatible root)
and `OPENAI_API_KEY` (this evaluation's token; never a provider key). The gateway allows only the
spec's models and meters every call against the evaluation's budget; a refused call (an unknown
model, an exhausted budget) raises in the SDK and leaves the puzzle unsolved.
"""

from __future__ import annotations

from typing import override

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

__all__ = ["MODEL", "LlmPuzzleAgent", "ask_for_command"]

MODEL = "gpt-4o-mini"
COMMAND_TIMEOUT_SEC = 60

PROMPT = "Solve this task with one shell command. Reply with the command only.\n\n{instruction}"


def ask_for_command(instruction: str) -> str:
    """The first line of the model's reply (OpenAI chat completions through the gateway)."""
    from openai import OpenAI

    client = OpenAI(max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model=MODEL, max_tokens=300, temperature=0,
        messages=[{"role": "user", "content": PROMPT.format(instruction=instruction)}])
    return (reply.choices[0].message.content or "").strip().splitlines()[0]


class LlmPuzzleAgent(BaseAgent):
    """Solves one terminal puzzle per trial with a command a model proposes."""

    @staticmethod
    @override
    def name() -> str:
        return "llm-puzzle-agent"

    @override
    def version(self) -> str:
        return "1.0.0"

    @override
    async def setup(self, environment: BaseEnvironment) -> None:
        return

    @override
    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        import asyncio

        command = await asyncio.to_thread(ask_for_command, instruction)
        context.metadata = {"command": command}
        result = await environment.exec(command, timeout_sec=COMMAND_TIMEOUT_SEC)
        (self.logs_dir / "llm-puzzle-agent.txt").write_text(
            f"command: {command}\nreturn_code: {result.return_code}\n", encoding="utf-8")
