"""What Harbor knows by name: its agents and the datasets of a JSON registry.

The compiler, the spec loader and `vero harbor run` ask here instead of importing Harbor themselves
(only `vero.harbor` and the compiler's task check import Harbor; `tests/core/test_imports.py`).
Harbor loads on the first call, never at import.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harbor.models.registry import DatasetSpec

__all__ = ["agent_class", "agent_names", "registry_datasets"]


def agent_names() -> list[str]:
    """The names of Harbor's built-in agents, sorted (Harbor 0.26 `models/agent/name.py`, `AgentName`)."""
    from harbor.models.agent.name import AgentName

    return sorted(a.value for a in AgentName)


def agent_class(name: str) -> Any:
    """The agent class Harbor resolves for `name` (a built-in name, `acp:<agent>` or `module:Class`).

    Resolution is Harbor's own (`agents/factory.py`, `AgentFactory.get_agent_class_from_config`), so a
    name accepted here is one `harbor run --agent` accepts. The caller's `sys.path` must already hold
    an imported module's directory.

    Raises:
        ValueError: Harbor does not know the name or cannot load the import path.
        Exception: anything an operator's agent module raises while it is imported.
    """
    # Harbor's agent modules import LiteLLM, which fetches a model cost map from the network at import
    # unless told not to (minutes of retries offline); reading a class attribute needs none of it.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from harbor.agents.factory import AgentFactory
    from harbor.models.trial.config import AgentConfig

    return AgentFactory.get_agent_class_from_config(AgentConfig(name=name))


def registry_datasets(rows: Any) -> list[DatasetSpec]:
    """The datasets of a parsed Harbor registry file (a JSON list; Harbor 0.26 `models/registry.py`).

    Raises:
        pydantic.ValidationError: a row is not one of Harbor's `DatasetSpec`s.
        TypeError: `rows` is not a list.
    """
    from harbor.models.registry import DatasetSpec

    return [DatasetSpec.model_validate(row) for row in rows]
