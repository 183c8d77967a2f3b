"""`Annotated` dependency aliases for route handlers; each reads `app.state` (no module singletons)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from vero.sidecar.service import SidecarService

__all__ = ["Principal", "Service"]


def get_service(request: Request) -> SidecarService:
    """The `SidecarService` that `create_app` stored on `app.state`."""
    return request.app.state.service


def get_principal(request: Request) -> str:
    """The principal of the agent surface (`agent`): every unauthenticated caller is the coding agent."""
    return request.app.state.service.principal


Service = Annotated[SidecarService, Depends(get_service)]
Principal = Annotated[str, Depends(get_principal)]
