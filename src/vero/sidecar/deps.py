"""`Annotated` dependency aliases for route handlers; each reads `app.state` (no module singletons).

The dependencies are `async def`: FastAPI runs a plain `def` dependency in its thread pool, two
hops per request that cost more than the rest of a `GET /status` (issue 28); these only read an
attribute, so they run on the event loop."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from vero.sidecar.service import SidecarService

__all__ = ["Principal", "Service"]


async def get_service(request: Request) -> SidecarService:
    """The `SidecarService` that `create_app` stored on `app.state`."""
    return request.app.state.service


async def get_principal(request: Request) -> str:
    """The principal of the agent surface (`agent`): every unauthenticated caller is the coding agent."""
    return request.app.state.service.principal


Service = Annotated[SidecarService, Depends(get_service)]
Principal = Annotated[str, Depends(get_principal)]
