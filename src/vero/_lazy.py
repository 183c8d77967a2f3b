"""Package attributes imported from their modules on first use (PEP 562 module `__getattr__`).

A package whose `__init__` imports its modules makes every importer pay for all of them; candidate
hosts (`python -m vero.harbor.boundary.host`) import `vero.harbor` and `vero.harbor.boundary` first
and need neither package's modules.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, module_of: Mapping[str, str]) -> Callable[[str], object]:
    """The `__getattr__` for `package`: each name in `module_of` (name -> module path) is imported
    from its module when first read, then kept in the package's namespace.

    Raises (from the returned function):
        AttributeError: the name is not one of `module_of`.
    """

    def __getattr__(name: str) -> object:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
