"""The process boundary between a `kind: agent` candidate and the harness that measures it.

- `launcher`: starts candidate host processes as throw-away users and ends them with all they spawned;
- `host`: the candidate host (the candidate's class, behind a proxy of Harbor's environment API);
- `agent`: `CandidateAgent`, the trusted class nested runs import instead of the candidate's;
- `wire`: the frames on the pipe between them.

Importing this package imports neither Harbor nor the candidate (`agent` imports Harbor), nor any of
its modules: each public name loads its module on first use (PEP 562), so that a candidate host
(`python -m vero.harbor.boundary.host`) loads only the host and the wire.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vero.harbor.boundary.launcher import CandidateHostProcess, CandidateLauncher
    from vero.harbor.command import CANDIDATE_AGENT_IMPORT_PATH

_MODULE_OF = {
    "CANDIDATE_AGENT_IMPORT_PATH": "vero.harbor.command",
    "CandidateHostProcess": "vero.harbor.boundary.launcher",
    "CandidateLauncher": "vero.harbor.boundary.launcher",
}

__all__ = ["CANDIDATE_AGENT_IMPORT_PATH", "CandidateHostProcess", "CandidateLauncher"]


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first use (then cached in this module).

    Raises:
        AttributeError: `name` is not one of `__all__`.
    """
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
