"""`POST /submissions`: record the version the verifier scores."""

from fastapi import APIRouter, Response

from vero.sidecar.deps import Principal, Service
from vero.sidecar.errors import PROBLEM_RESPONSES, STORAGE_FULL_RESPONSE, problem_doc
from vero.sidecar.models import SubmissionRequest, SubmissionView

router = APIRouter(prefix="/submissions", tags=["agent"], responses=PROBLEM_RESPONSES)


@router.post(
    "",
    operation_id="submit",
    summary="Submit a version for final scoring",
    status_code=201,
    responses={
        200: {"model": SubmissionView, "description": "The same candidate was already submitted."},
        400: problem_doc(
            "The version cannot be imported (malformed, unknown, unsafe tree), or the body is not valid JSON."
        ),
        413: problem_doc(
            "The version's tree is over a size limit of the spec (`code` "
            "`candidate_too_large`; the detail names the limit and the figure)."
        ),
        409: problem_doc("Submissions are disabled (`auto_best` selection) or the session is sealed."),
        **STORAGE_FULL_RESPONSE,
    },
)
async def submit(body: SubmissionRequest, service: Service, principal: Principal, response: Response) -> SubmissionView:
    """Imports the version as a candidate and records it as the submission (the last one wins).
    201 when recorded, 200 when that candidate was already the submission."""
    view, created = await service.submit(principal, body.version)
    if not created:
        response.status_code = 200
    return view
