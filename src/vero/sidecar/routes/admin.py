"""The admin surface (`/admin/...`): bearer token on the whole router, never reachable by the agent."""

from pathlib import Path

from fastapi import APIRouter, Depends

from vero.sidecar.auth import require_admin
from vero.sidecar.deps import Service
from vero.sidecar.errors import PROBLEM_RESPONSES, STORAGE_FULL_RESPONSE, problem_doc
from vero.sidecar.models import SealRequest, SealResponse
from vero.sidecar.records import ExportResponse

router = APIRouter(
    prefix="/admin",
    tags=["admin"],
    dependencies=[Depends(require_admin)],
    responses={**PROBLEM_RESPONSES, 401: problem_doc("Missing or wrong admin bearer token.")},
)


@router.post(
    "/seal",
    operation_id="seal",
    summary="Seal the session and write its archive",
    responses={
        400: problem_doc("The body is not valid JSON."),
        422: problem_doc(
            "The body does not match the schema, `output_dir` lies inside the sidecar's own "
            "directories, or the archive cannot be written there (RFC 9457 problem)."
        ),
        **STORAGE_FULL_RESPONSE,
    },
)
async def seal(body: SealRequest, service: Service) -> SealResponse:
    """Closes the agent entrance, waits for in-flight jobs up to the drain timeout, cancels and
    refunds the rest, and writes `session.tar.gz` (+ `.sha256`) into `output_dir`. Idempotent."""
    return await service.seal(Path(body.output_dir))


@router.get("/export", operation_id="export", summary="Every trusted record")
async def export(service: Service) -> ExportResponse:
    """Jobs with their trusted results, ledger balances and reservations, candidates, submission."""
    return service.export()
