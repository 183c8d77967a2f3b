"""How `vero harbor run` gives the coding agent its gateway (`inference.agent`, docs/inference.md).

The token is minted here, on the host, per `vero harbor run`: `main` gets it through Harbor's
agent environment (`--ae NAME=${VERO_AGENT_INFERENCE_TOKEN}`: Harbor resolves the placeholder from
its own environment, `harbor/agents/factory.py`, so the token is on no command line; it puts an
agent's `extra_env` into every command it runs in `main`, and that wins over the host's variables
when an installed agent resolves its key, `harbor/agents/installed/base.py` `_env_sources`), the
sidecar gets only its SHA-256
(`vero.spec.compiled.AGENT_TOKEN_DIGEST_ENV`, by name through the compose file). The provider keys
stay where they were: the sidecar's environment.

Agents that call their model from the Harbor process on the host (`terminus-*`, through LiteLLM)
are not wired: `main`'s sidecar address is not reachable from the host, and their calls do not
pass the gateway (not metered, not capped).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

from vero.inference.gateway import AGENT_TOKEN_PREFIX
from vero.spec.compiled import AGENT_INFERENCE_PATH, AGENT_TOKEN_DIGEST_ENV
from vero.spec.models import InferenceSpec

__all__ = ["AGENT_TOKEN_ENV", "AgentAccess", "agent_access_for", "calls_model_from_host"]

AGENT_TOKEN_ENV = "VERO_AGENT_INFERENCE_TOKEN"
"""The token's variable: in the Harbor process (for `--ae` placeholders) and in `main`."""

HOST_SIDE_AGENTS = ("oracle", "nop")
"""Harbor agents that call no model at all."""
_TOKEN_NAMES = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "CODEX_API_KEY")
"""Variables the agents read their key from: set to the agent's token (they refuse to start
without one)."""
_MASKED_NAMES = ("ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")
"""Other credentials Harbor's installed agents would take from the host: set empty."""


def calls_model_from_host(agent: str) -> bool:
    """Whether Harbor's `agent` calls no model or calls it from the Harbor process, not from
    `main` (so the agent gateway, reachable from `main` only, is not wired for it)."""
    return agent in HOST_SIDE_AGENTS or agent.startswith("terminus")


@dataclass(frozen=True)
class AgentAccess:
    """One run's agent token and what goes where.

    Attributes:
        token: the agent's token (`vero-ag-...`, 256 random bits): only `main` gets it.
        token_sha256: its SHA-256, hex: only the sidecar gets it.
        agent_env: Harbor's agent environment (`--ae KEY=VALUE`): the gateway's URLs as `main`
            reaches them and the token (as a `${VERO_AGENT_INFERENCE_TOKEN}` placeholder) under
            every key name the agents read; the spec's provider key names set empty (a host
            variable of that name never reaches `main`).
    """

    token: str = field(repr=False)
    token_sha256: str
    agent_env: dict[str, str]

    def harbor_env(self) -> dict[str, str]:
        """What the Harbor process's environment gets: the token (resolving `agent_env`'s
        placeholders) and its digest (the sidecar's compose entry)."""
        return {AGENT_TOKEN_ENV: self.token, AGENT_TOKEN_DIGEST_ENV: self.token_sha256}

    def harbor_args(self) -> list[str]:
        """`--ae KEY=VALUE` for each of `agent_env`, sorted."""
        return [arg for key, value in sorted(self.agent_env.items()) for arg in ("--ae", f"{key}={value}")]


def agent_access_for(inference: InferenceSpec | None, sidecar_url: str, agent: str) -> AgentAccess | None:
    """A fresh `AgentAccess` for a run of `agent` (None: no `inference.agent`, or an agent that
    calls its model from the host, `calls_model_from_host`).

    Args:
        inference: the spec's `inference` section.
        sidecar_url: the sidecar's API as `main` reaches it (`http://eval-sidecar:8000`).
        agent: Harbor's `-a`.
    """
    if inference is None or inference.agent is None or calls_model_from_host(agent):
        return None
    token = AGENT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    base = sidecar_url.rstrip("/") + AGENT_INFERENCE_PATH
    keys = (provider.api_key_secret for provider in inference.providers.values() if provider.api_key_secret)
    placeholder = "${" + AGENT_TOKEN_ENV + "}"
    env = _masked(keys) | dict.fromkeys(_MASKED_NAMES, "")
    env |= dict.fromkeys((*_TOKEN_NAMES, AGENT_TOKEN_ENV), placeholder)
    env |= {
        "OPENAI_BASE_URL": f"{base}/openai/v1",
        "OPENAI_API_BASE": f"{base}/openai/v1",
        "ANTHROPIC_BASE_URL": f"{base}/anthropic",
    }
    return AgentAccess(token=token, token_sha256=hashlib.sha256(token.encode()).hexdigest(), agent_env=env)


def _masked(names: Iterable[str]) -> dict[str, str]:
    return dict.fromkeys(sorted(set(names)), "")
