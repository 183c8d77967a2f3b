"""The process boundary between a `kind: agent` candidate and the harness that measures it.

- `launcher`: starts candidate host processes as throw-away users and ends them with all they spawned;
- `host`: the candidate host (the candidate's class, behind a proxy of Harbor's environment API);
- `agent`: `CandidateAgent`, the trusted class nested runs import instead of the candidate's;
- `wire`: the frames on the pipe between them.

Importing this package imports neither Harbor nor the candidate (`agent` imports Harbor).
"""

from vero.harbor.boundary.launcher import CandidateHostProcess, CandidateLauncher
from vero.harbor.command import CANDIDATE_AGENT_IMPORT_PATH

__all__ = ["CANDIDATE_AGENT_IMPORT_PATH", "CandidateHostProcess", "CandidateLauncher"]
