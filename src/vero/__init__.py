"""vero: compile program-optimization specs into Harbor tasks with a trusted sidecar and verifier.

Public API: `load_spec`, `OptimizationSpec`, `compile_task`, `VeroError`. Importing `vero` loads no
web framework and no Harbor; the heavy parts import on demand.
"""

from vero.errors import VeroError
from vero.spec import OptimizationSpec, load_spec

__version__ = "0.1.0"

__all__ = ["OptimizationSpec", "VeroError", "__version__", "compile_task", "load_spec"]


def __getattr__(name: str):
    if name == "compile_task":
        from vero.compiler import compile_task

        return compile_task
    raise AttributeError(name)
