"""`GET /status`: what the agent may evaluate, its remaining budget (unless hidden), jobs, submission."""

from fastapi import APIRouter, Response

from vero.sidecar.deps import Principal, Service
from vero.sidecar.errors import PROBLEM_RESPONSES
from vero.sidecar.models import StatusResponse

router = APIRouter(tags=["agent"], responses=PROBLEM_RESPONSES)


@router.get(
    "/status",
    operation_id="status",
    summary="Partitions, budgets, jobs and submission",
    response_model=StatusResponse,
)
async def get_status(service: Service, principal: Principal) -> Response:
    """The partitions the agent may evaluate (with case names, the blocks an `aggregate` evaluation
    must select whole, the Ladder mode if any and, unless budget disclosure is off, remaining runs
    and cases), how many evaluations the agent ran per partition and state, the newest ones without
    per-case results (`GET /evaluations` lists the rest), the submission, and whether the entrance is
    still open."""
    # The bytes FastAPI would send for `service.status(principal)`, kept until the state changes.
    return Response(await service.status_body(principal), media_type="application/json")
