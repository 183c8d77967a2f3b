"""What `vero harbor run` gives the coding agent and the sidecar for `inference.agent`
(`vero.inference.agent_access`): the token under every key name in `main` (as a placeholder Harbor
resolves, so it is on no command line), the sidecar's URLs, the provider key names blanked; only
the token's SHA-256 for the sidecar; nothing for agents that call their model from the host."""

from __future__ import annotations

import hashlib

import pytest

from vero.inference.agent_access import AGENT_TOKEN_ENV, agent_access_for
from vero.spec.compiled import AGENT_TOKEN_DIGEST_ENV
from vero.spec.models import InferenceSpec

pytestmark = pytest.mark.timeout(60)

SIDECAR = "http://eval-sidecar:8000"


def spec(agent: bool = True) -> InferenceSpec:
    return InferenceSpec.model_validate(
        {
            "providers": {"a": {"api": "anthropic", "base_url": "https://example.invalid", "api_key_secret": "MY_KEY"}},
            "models": {"m": {"provider": "a", "input_cost_per_token": 1e-6, "output_cost_per_token": 1e-6}},
            **({"agent": {"models": ["m"], "total_usd": 1.0}} if agent else {}),
        }
    )


def test_main_gets_urls_and_a_token_placeholder_the_sidecar_its_digest():
    access = agent_access_for(spec(), SIDECAR, "claude-code")
    assert access is not None and access.token.startswith("vero-ag-") and len(access.token) > 40
    placeholder = "${" + AGENT_TOKEN_ENV + "}"
    env = access.agent_env
    assert env["ANTHROPIC_BASE_URL"] == "http://eval-sidecar:8000/inference/anthropic"
    assert env["OPENAI_BASE_URL"] == env["OPENAI_API_BASE"] == "http://eval-sidecar:8000/inference/openai/v1"
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "CODEX_API_KEY", AGENT_TOKEN_ENV):
        assert env[name] == placeholder
    assert env["MY_KEY"] == env["ANTHROPIC_AUTH_TOKEN"] == env["CLAUDE_CODE_OAUTH_TOKEN"] == ""
    assert access.token not in " ".join(access.harbor_args())  # never on Harbor's command line
    assert access.harbor_args()[:2] == ["--ae", "ANTHROPIC_API_KEY=" + placeholder]
    assert access.harbor_env() == {
        AGENT_TOKEN_ENV: access.token,
        AGENT_TOKEN_DIGEST_ENV: hashlib.sha256(access.token.encode()).hexdigest(),
    }
    assert agent_access_for(spec(), SIDECAR, "codex").token != access.token  # one per run


def test_no_access_without_the_section_or_for_agents_that_call_from_the_host():
    assert agent_access_for(None, SIDECAR, "claude-code") is None
    assert agent_access_for(spec(agent=False), SIDECAR, "claude-code") is None
    for agent in ("terminus-2", "oracle", "nop"):
        assert agent_access_for(spec(), SIDECAR, agent) is None
    assert agent_access_for(spec(), SIDECAR, "my_agents:Agent") is not None
