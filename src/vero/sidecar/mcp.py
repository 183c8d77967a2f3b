"""The MCP endpoint (`/mcp`): the agent surface's routes as MCP tools.

Built the way Harbor 0.26 builds its own (`harbor/server/mcp.py`): FastMCP generates one tool per
agent route from the app's OpenAPI document, and each tool call is an in-process HTTP request to
that same route through `httpx2.ASGITransport`. A tool therefore goes through exactly the same
schema validation, service checks, budget ledger and error mapping as an HTTP call; an error
answer becomes a tool error carrying the (generic) problem body. Admin routes are never tools.

Tools: `health`, `status`, `start_evaluation`, `get_evaluation`, `submit`. Their schemas are the
wire models', so `status` lists an `aggregate` partition's blocks and Ladder mode,
`start_evaluation` takes `blocks` as well as `cases`, and `get_evaluation` marks a Ladder answer
with `improved`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from vero.sidecar.errors import problem_response

__all__ = ["MCP_PATH", "SidecarMCP"]

MCP_PATH = "/mcp"

_TOOL_ROUTES = r"^/(health|status|evaluations|evaluations/\{job_id\}|submissions)$"


class SidecarMCP:
    """An ASGI app serving MCP (streamable HTTP, stateless, JSON responses) over the agent routes.

    Args:
        app: the sidecar's FastAPI app (its OpenAPI document defines the tools).
    """

    def __init__(self, app: FastAPI) -> None:
        self.api_app = app
        self._mcp_app = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Build the MCP server and run its lifespan; call inside the app's lifespan."""
        import httpx2
        from fastmcp import FastMCP
        from fastmcp.exceptions import ToolError
        from fastmcp.server.providers.openapi import MCPType, RouteMap

        async def public_errors(response: httpx2.Response) -> None:
            if response.is_error:
                await response.aread()
                raise ToolError(response.text)

        async with httpx2.AsyncClient(
            transport=httpx2.ASGITransport(self.api_app, raise_app_exceptions=False),
            base_url="http://sidecar",
            timeout=None,
            event_hooks={"response": [public_errors]},
        ) as client:
            server = FastMCP.from_openapi(
                openapi_spec=self.api_app.openapi(),
                client=client,
                name="vero-sidecar",
                route_maps=[
                    RouteMap(methods=["GET", "POST"], pattern=_TOOL_ROUTES, mcp_type=MCPType.TOOL),
                    RouteMap(mcp_type=MCPType.EXCLUDE),
                ],
                mask_error_details=True,
                strict_input_validation=True,
            )
            mcp_app = server.http_app(path=MCP_PATH, stateless_http=True, json_response=True,
                                      host_origin_protection=False)
            async with mcp_app.lifespan(mcp_app):
                self._mcp_app = mcp_app
                try:
                    yield
                finally:
                    self._mcp_app = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._mcp_app is None:
            await problem_response(500)(scope, receive, send)
            return
        await self._mcp_app(scope, receive, send)
