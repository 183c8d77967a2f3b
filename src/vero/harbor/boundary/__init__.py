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

from typing import TYPE_CHECKING

from vero._lazy import lazy_exports

if TYPE_CHECKING:
    from vero.harbor.boundary.launcher import CandidateHostProcess, CandidateLauncher
    from vero.harbor.command import CANDIDATE_AGENT_IMPORT_PATH

_MODULE_OF = {
    "CANDIDATE_AGENT_IMPORT_PATH": "vero.harbor.command",
    "CandidateHostProcess": "vero.harbor.boundary.launcher",
    "CandidateLauncher": "vero.harbor.boundary.launcher",
}

__all__ = ["CANDIDATE_AGENT_IMPORT_PATH", "CandidateHostProcess", "CandidateLauncher"]


__getattr__ = lazy_exports(__name__, _MODULE_OF)
