"""`GET /health`: liveness for Compose healthchecks and the agent CLI."""

from fastapi import APIRouter

from vero.sidecar.errors import PROBLEM_RESPONSES
from vero.sidecar.models import HealthResponse

router = APIRouter(tags=["agent"], responses=PROBLEM_RESPONSES)


@router.get("/health", operation_id="health", summary="Is the sidecar up?")
async def health() -> HealthResponse:
    """Answers `{"status": "ok"}` once the sidecar has started."""
    return HealthResponse()
