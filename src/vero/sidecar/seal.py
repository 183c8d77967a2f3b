"""Sealing: the persisted seal record and the admin call the `[[verifier.collect]]` hook makes.

The compiled task runs `vero harbor seal --output /export/vero` in the `eval-sidecar` container
(as root, via `sh -c`) after the agent stops. That command reads the admin token from the state
dir and asks the running service (`POST /admin/seal`) to close the agent entrance, drain, cancel
and refund stragglers, and write `session.tar.gz` + `.sha256` (`SidecarService.seal`). Sealing
runs inside the service because only the service knows which jobs are in flight; the command is
just the trusted trigger.

The seal is persisted as `<state dir>/seal.json` (`SealState`): a restarted service stays sealed,
and a repeated seal reuses `sealed_at`, so it writes the same archive bytes.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from vero.errors import SidecarUnavailable, VeroError
from vero.sidecar.models import SealRequest, SealResponse

__all__ = [
    "ADMIN_TOKEN_FILE",
    "DEFAULT_ADMIN_URL",
    "DEFAULT_SEAL_TIMEOUT_SEC",
    "SEAL_FILE",
    "SealState",
    "request_seal",
]

SEAL_FILE = "seal.json"
"""`<state dir>/seal.json`."""

DEFAULT_ADMIN_URL = "http://127.0.0.1:8000"
"""The service as the collect hook reaches it: same container, loopback."""

ADMIN_TOKEN_FILE = "admin-token"
"""`<state dir>/admin-token`: written by the service at each start (`vero.sidecar.auth`), read by
`request_seal`'s caller."""

DEFAULT_SEAL_TIMEOUT_SEC = 900.0
"""How long `request_seal` waits for the answer when the drain timeout is unknown, in seconds."""


class SealState(BaseModel):
    """The persisted seal; its `sealed_at` makes a repeated seal give the same archive bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: Literal[1] = 1
    sealed_at: datetime


def request_seal(
    output_dir: Path,
    *,
    token_file: Path,
    base_url: str = DEFAULT_ADMIN_URL,
    timeout_sec: float = DEFAULT_SEAL_TIMEOUT_SEC,
) -> SealResponse:
    """Ask the running sidecar to seal its session into `output_dir`.

    Args:
        output_dir: absolute directory receiving `session.tar.gz` and `session.tar.gz.sha256`.
        token_file: the admin token file (`<state dir>/admin-token`, root only).
        base_url: the service's base URL.
        timeout_sec: how long to wait for the answer, in seconds; sealing drains in-flight
            evaluations for up to `harbor.drain_timeout_sec` first, so keep it above that.

    Returns:
        What the service wrote.

    Raises:
        SidecarUnavailable: the token cannot be read, or the service cannot be reached or answered
            with a server error (a full disk: 507).
        VeroError: the service refused the request, as `vero.sidecar.client.error_from_response`
            maps its problem body (e.g. `Conflict` for 409; a plain `VeroError` for a wrong token, 401).
    """
    import httpx  # the client (httpx, tenacity) only for this call: the served sidecar never loads it

    from vero.sidecar.client import error_from_response

    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SidecarUnavailable(
            f"cannot read the admin token {token_file} ({type(exc).__name__}): is the sidecar running "
            "in this container, and is this command running as root?"
        ) from None
    body = SealRequest(output_dir=str(output_dir.absolute())).model_dump(mode="json")
    try:
        with httpx.Client(
            base_url=base_url, trust_env=False, timeout=httpx.Timeout(timeout_sec, connect=10.0)
        ) as client:
            response = client.post("/admin/seal", json=body, headers={"authorization": f"Bearer {token}"})
    except httpx.TransportError as exc:
        raise SidecarUnavailable(
            f"cannot reach the sidecar at {base_url} to seal the session ({type(exc).__name__})"
        ) from None
    if response.is_success:
        try:
            return SealResponse.model_validate_json(response.content)
        except ValidationError:
            raise VeroError(f"the sidecar at {base_url} answered the seal with an unexpected body") from None
    # The agent-side client's mapping, so a problem body means the same class everywhere.
    raise error_from_response(response, context="the sidecar refused to seal")
