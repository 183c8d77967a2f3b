"""One `APIRouter` per resource; `vero.sidecar.app.create_app` includes them in this order."""

from vero.sidecar.routes import admin, evaluations, health, status, submissions

__all__ = ["AGENT_ROUTERS", "ROUTERS"]

AGENT_ROUTERS = (health.router, status.router, evaluations.router, submissions.router)
"""The agent surface (also exposed as MCP tools)."""

ROUTERS = (*AGENT_ROUTERS, admin.router)
