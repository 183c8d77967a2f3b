"""Intake: whether the sidecar still takes evaluations and submissions, and since when it does not.

Intake closes at the earliest point vero can know the agent phase is over. In Harbor 0.26 that is
the first `[[verifier.collect]]` hook in service `main` (`harbor/trial/single_step.py`: after the
agent's `run` returns or times out, Harbor downloads `/logs/agent`, uploads it back, runs the
hooks of `main`, downloads `main`'s artifacts, stops `main` and only then runs the hooks of other
services, i.e. the seal). The compiled task's hook in `main` calls `POST /intake/close` as root
over the sidecar's intake socket (`vero.sidecar.intake_socket`: a Unix socket on a volume both
services mount, root-only), not over TCP: a process the agent left in `main` can hold every
ephemeral port there, and a TCP call then fails at once. The route needs no credential (closing
only ends the agent's own session; the agent may call it over TCP too, and the agent surface
refuses callers in the sidecar's own container, so a candidate host cannot close it). From then on every
`POST /evaluations` is refused with 403 and every `POST /submissions` with 409, both with problem
code `intake_closed`; the seal closes intake too if the hook did not. What remains is the time
between the agent's end and that call (Harbor's log download and upload, then the hook's
`docker compose exec`), which docs/operating.md gives as measured; after `main` is stopped nothing of the
agent's can call at all. Harbor gives the separate verifier nothing of the agent's end it could
trust (the trial's `result.json` stays on the host; `main`'s `/logs` are the agent's to write), so
the sidecar's refusal is the boundary.

The state is persisted as `<state dir>/intake.json` (`IntakeState`): a restarted service keeps
intake closed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["INTAKE_FILE", "IntakeState"]

INTAKE_FILE = "intake.json"
"""`<state dir>/intake.json`."""


class IntakeState(BaseModel):
    """The persisted close of intake: when, and who said the agent phase was over."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: Literal[1] = 1
    closed_at: datetime
    reason: Literal["agent_ended", "sealed"]
