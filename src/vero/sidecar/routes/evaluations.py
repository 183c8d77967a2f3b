"""`POST /evaluations` (start a detached evaluation) and `GET /evaluations/{id}` (its state)."""

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from vero.sidecar.deps import Principal, Service
from vero.sidecar.errors import PROBLEM_RESPONSES, problem_doc
from vero.sidecar.models import EvaluationRequest, JobView

router = APIRouter(prefix="/evaluations", tags=["agent"], responses=PROBLEM_RESPONSES)

JobId = Annotated[str, Path(max_length=64, description="The job id returned by `POST /evaluations`.")]
WaitSec = Annotated[float, Query(ge=0, le=60, description=(
    "Long poll: wait up to this many seconds for the job to finish before answering (0: answer at once)."))]


@router.post(
    "",
    operation_id="start_evaluation",
    summary="Start an evaluation of a version on a partition",
    status_code=202,
    responses={
        400: problem_doc("The version cannot be imported (malformed, unknown, unsafe tree)."),
        402: problem_doc("The partition's budget (runs or cases) is exhausted."),
        403: problem_doc("Denied by the policy (partition; a case or block selection that is not a union of "
                         "whole blocks of an `aggregate` partition) or the entrance is closed."),
    },
)
async def start_evaluation(body: EvaluationRequest, service: Service, principal: Principal,
                           response: Response) -> JobView:
    """Checks the policy, imports the version as a candidate and reserves the budget, then answers
    202 with the queued job; the nested run goes on in the background. Poll `GET /evaluations/{id}`.
    On an `aggregate` partition, select the whole partition or whole blocks (`blocks` positions or
    their `cases`, as listed by `GET /status`)."""
    job = await service.start_evaluation(principal, body)
    response.headers["Location"] = f"/evaluations/{job.id}"
    return job


@router.get(
    "/{job_id}",
    operation_id="get_evaluation",
    summary="State and disclosed result of an evaluation",
    responses={
        404: problem_doc("No evaluation job with this id."),
        502: problem_doc("The evaluation failed for infrastructure reasons; its budget was refunded."),
    },
)
async def get_evaluation(job_id: JobId, service: Service, principal: Principal, wait_sec: WaitSec = 0) -> JobView:
    """The job's state and, once complete, what its disclosure tier allows: `full` (score, counts,
    per-case results, `artifacts_path`), `aggregate` (score and counts; in Ladder mode the score
    only when it beat the best disclosed before by the margin, else that best with `improved: false`),
    `none` (state only).
    A job that failed for infrastructure reasons answers 502 (problem code `infrastructure`).
    With `wait_sec`, answers as soon as the job finishes, or after `wait_sec` seconds."""
    return await service.wait_evaluation(principal, job_id, wait_sec)
