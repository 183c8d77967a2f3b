"""`POST /intake/close`: the agent phase is over (`vero.sidecar.intake`)."""

from fastapi import APIRouter

from vero.sidecar.deps import Service
from vero.sidecar.errors import PROBLEM_RESPONSES, STORAGE_FULL_RESPONSE
from vero.sidecar.models import IntakeView

router = APIRouter(prefix="/intake", tags=["agent"], responses=PROBLEM_RESPONSES)


@router.post(
    "/close",
    operation_id="close_intake",
    summary="End the agent phase: no further evaluation or submission",
    responses={**STORAGE_FULL_RESPONSE},
)
async def close_intake(service: Service) -> IntakeView:
    """Called by the compiled task's hook in `main` as soon as Harbor has ended the agent (an agent
    may call it itself to end its session early). Idempotent: a second call answers the first
    close. Every later `POST /evaluations` answers 403 and `POST /submissions` 409, with problem
    code `intake_closed`."""
    return await service.close_intake("agent_ended")
