"""The admin bearer token: generated at startup, kept where the agent cannot read it, checked in
constant time.

The token file lives in the sidecar's state dir (root, 0700) with mode 0400, so only root in the
sidecar container (the `[[verifier.collect]]` hook running `vero harbor seal`) can read it; the
coding agent in `main` never shares that filesystem, and the unprivileged `vero-runner` user cannot
traverse the state dir. The comparison uses `hmac.compare_digest`, as Harbor 0.26's
`server/app.py` does for its API key.
"""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from vero.core.storage import atomic_write_bytes
from vero.sidecar.seal import ADMIN_TOKEN_FILE

__all__ = ["generate_admin_token", "require_admin"]

_bearer = HTTPBearer(auto_error=False, description="The admin token from `<state dir>/admin-token`.")


def generate_admin_token(state_dir: Path) -> str:
    """Write a fresh token to `state_dir/admin-token` (mode 0400) and return it.

    A new token per start: a token that leaked from an earlier run is worthless afterwards.

    Raises:
        OSError: the state dir is not writable.
    """
    token = secrets.token_urlsafe(32)
    atomic_write_bytes(state_dir / ADMIN_TOKEN_FILE, token.encode() + b"\n", mode=0o400)
    return token


async def require_admin(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Router dependency of the admin surface.

    Raises:
        starlette.exceptions.HTTPException: 401 when the bearer token is missing or wrong (rendered
            as a generic problem by `vero.sidecar.errors`).
    """
    expected: str | None = getattr(request.app.state.service, "admin_token", None)
    given = credentials.credentials if credentials is not None else ""
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(401, headers={"WWW-Authenticate": "Bearer"})
