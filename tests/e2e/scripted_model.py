"""A scripted, OpenAI-compatible model server: drives Harbor's `terminus-2` agent with no provider.

`ScriptedModel` is a FastAPI app with one route, `POST /v1/chat/completions` (the Chat Completions
shape LiteLLM sends and reads). Instead of sampling, it replays a fixed list of `Step`s in the reply
format of terminus-2's JSON parser (`harbor/agents/terminus_2/templates/terminus-json-plain.txt`:
`analysis`, `plan`, `commands[{keystrokes, duration}]`, `task_complete`). Every step's last command
prints a sentinel (`vero-step-<name>-done rc=<exit code>`) typed so that the typed text itself does
not contain it (`printf 'vero-step-%s-done ...' <name>`); the server moves to the next step only
once the sentinel shows in the terminal output terminus-2 sends back, and otherwise answers with an
empty command (wait and look again). So the sequence is fixed, but its timing follows the task's
real speed. A step whose exit code is not 0 ends the script early (the test then fails on the
transcript). After the last step it answers `task_complete` twice (terminus-2 asks to confirm).

A step's commands may depend on what the agent has seen so far (`Script.seen`): the first prompt
(the instruction, plus the MCP servers and `<available_skills>` terminus-2 appends) and every
terminal output since. `transcript` keeps every exchange: what the model was shown and what it
answered.

The server runs on loopback (`tests/sidecar/_server.py::ServerThread`): terminus-2 calls its model
from the Harbor process on the host, not from a container.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request

__all__ = ["Script", "ScriptedModel", "Step", "sentinel_command"]

MODEL_NAME = "vero-scripted"
WAIT_SEC = 5.0
"""How long terminus-2 waits before looking again while a step's sentinel has not shown."""
MAX_WAITS_PER_STEP = 240
"""Waits before a step counts as hung (about 20 minutes at `WAIT_SEC`); the script then stops."""


def sentinel_command(step: str) -> str:
    """Keystrokes that print `vero-step-<step>-done rc=<exit code of the previous command>`."""
    return f"printf 'vero-step-%s-done rc=%s\\n' {step} $?\n"


def _sentinel(step: str) -> re.Pattern[str]:
    return re.compile(rf"vero-step-{re.escape(step)}-done rc=(\d+)")


@dataclass
class Script:
    """What the scripted agent has seen so far (the first prompt, then each terminal output)."""

    seen: list[str] = field(default_factory=list)

    @property
    def first_prompt(self) -> str:
        return self.seen[0] if self.seen else ""

    def everything(self) -> str:
        return "\n".join(self.seen)


@dataclass(frozen=True)
class Step:
    """One step of the script.

    Attributes:
        name: unique; the sentinel names it.
        plan: the reply's `plan` (kept in the transcript).
        commands: (script so far) -> list of (keystrokes, duration in seconds); the sentinel command
            is appended.
        first_wait_sec: how long terminus-2 waits after the last command before looking.
    """

    name: str
    plan: str
    commands: Callable[[Script], list[tuple[str, float]]]
    first_wait_sec: float = 1.0


class ScriptedModel:
    """The model server's state and its FastAPI `app`.

    Attributes:
        steps: the script, in order.
        transcript: one entry per request: `{"n", "shown", "reply"}` (`shown`: the last user message).
        outcome: `completed` after the last step, `failed:<step> rc=<n>` or `hung:<step>` when the
            script stopped early, None while running.
        step_results: step name -> exit code of its commands.
    """

    def __init__(self, steps: list[Step]) -> None:
        self.steps = steps
        self.transcript: list[dict[str, Any]] = []
        self.outcome: str | None = None
        self.step_results: dict[str, int] = {}
        self._script = Script()
        self._index = 0
        self._sent = False
        self._waits = 0
        self._completions = 0
        self._lock = threading.Lock()
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self._chat_completions)

    async def _chat_completions(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        messages = body.get("messages") or []
        shown = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
        with self._lock:
            reply = self._next(shown)
            self.transcript.append({"n": len(self.transcript) + 1, "at": time.time(), "shown": shown, "reply": reply})
        content = json.dumps(reply)
        return {
            "id": f"chatcmpl-scripted-{len(self.transcript)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", MODEL_NAME),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {
                "prompt_tokens": len(shown) // 4,
                "completion_tokens": len(content) // 4,
                "total_tokens": (len(shown) + len(content)) // 4,
            },
        }

    def _reply(self, plan: str, commands: list[tuple[str, float]], *, complete: bool = False) -> dict[str, Any]:
        return {
            "analysis": f"step {self._index + 1} of {len(self.steps)}",
            "plan": plan,
            "commands": [{"keystrokes": keys, "duration": duration} for keys, duration in commands],
            "task_complete": complete,
        }

    def _finish(self, outcome: str) -> dict[str, Any]:
        if self.outcome is None:
            self.outcome = outcome
        self._completions += 1
        return self._reply(f"stop ({self.outcome})", [], complete=True)

    def _next(self, shown: str) -> dict[str, Any]:
        self._script.seen.append(shown)
        if self.outcome is not None or self._index >= len(self.steps):
            return self._finish("completed")
        step = self.steps[self._index]
        if self._sent:
            found = _sentinel(step.name).search(shown)
            if found is None:
                self._waits += 1
                if self._waits > MAX_WAITS_PER_STEP:
                    return self._finish(f"hung:{step.name}")
                return self._reply(f"wait for {step.name}", [("", WAIT_SEC)])
            rc = int(found.group(1))
            self.step_results[step.name] = rc
            if rc != 0:
                return self._finish(f"failed:{step.name} rc={rc}")
            self._index += 1
            self._sent = False
            self._waits = 0
            if self._index >= len(self.steps):
                return self._finish("completed")
            step = self.steps[self._index]
        commands = [*step.commands(self._script), (sentinel_command(step.name), step.first_wait_sec)]
        self._sent = True
        return self._reply(step.plan, commands)


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""
