"""One module per Harbor environment kind vero's nested runs use (`docker`, `modal`), behind
`NestedEnvironment` (`base`): what differs between them, so that no caller compares environment
names. `nested_environment` chooses the module by name, as Harbor's `environments/factory.py`
does; an environment vero has no module for gets the base (nothing labelled or removed).
"""

from __future__ import annotations

from vero.harbor.environments.base import NestedEnvironment
from vero.harbor.environments.docker import DockerEnvironment
from vero.harbor.environments.modal import ModalEnvironment

__all__ = ["DockerEnvironment", "ModalEnvironment", "NestedEnvironment", "nested_environment"]

_KINDS: dict[str, type[NestedEnvironment]] = {"docker": DockerEnvironment, "modal": ModalEnvironment}


def nested_environment(name: str) -> NestedEnvironment:
    """The environment `name` (`harbor.environment`) as vero's nested runs use it."""
    return _KINDS.get(name, NestedEnvironment)(name)
