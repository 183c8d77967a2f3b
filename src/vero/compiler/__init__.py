"""The task compiler: optimization spec -> Harbor task tree -> canonical tarball (docs/operating.md).

`compile_task` is the one entry point (`vero harbor build` calls it); `TaskLayout` names every file
of a compiled task.
"""

from vero.compiler.build import CompileResult, compile_task
from vero.compiler.layout import TaskLayout

__all__ = ["CompileResult", "TaskLayout", "compile_task"]
