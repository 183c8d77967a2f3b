"""vero: compile program-optimization specs into Harbor tasks with a trusted sidecar and verifier.

Public API: `load_spec`, `OptimizationSpec`, `compile_task`, `VeroError`. Importing `vero` loads no
third-party package at all (the agent's CLI starts on the standard library alone); each public name
imports its module on first use.
"""

from vero.errors import VeroError

__version__ = "0.1.0"

__all__ = ["OptimizationSpec", "VeroError", "__version__", "compile_task", "load_spec"]


def __getattr__(name: str):
    if name == "compile_task":
        from vero.compiler import compile_task

        return compile_task
    if name in ("OptimizationSpec", "load_spec"):
        import vero.spec

        return getattr(vero.spec, name)
    raise AttributeError(name)
