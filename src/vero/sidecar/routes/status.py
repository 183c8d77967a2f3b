"""`GET /status`: what the agent may evaluate, its remaining budget (unless hidden), jobs, submission."""

from fastapi import APIRouter

from vero.sidecar.deps import Principal, Service
from vero.sidecar.errors import PROBLEM_RESPONSES
from vero.sidecar.models import StatusResponse

router = APIRouter(tags=["agent"], responses=PROBLEM_RESPONSES)


@router.get("/status", operation_id="status", summary="Partitions, budgets, jobs and submission")
async def get_status(service: Service, principal: Principal) -> StatusResponse:
    """The partitions the agent may evaluate (with case names, the blocks an `aggregate` evaluation
    must select whole, the Ladder mode if any and, unless budget disclosure is off, remaining runs
    and cases), how many evaluations the agent ran per partition and state, the newest ones without
    per-case results (`GET /evaluations` lists the rest), the submission, and whether the entrance is
    still open."""
    return await service.status(principal)
