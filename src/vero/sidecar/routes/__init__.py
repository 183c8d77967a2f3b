"""One `APIRouter` per resource; `vero.sidecar.app.create_app` includes them in this order."""

from vero.sidecar.routes import admin, evaluations, health, intake, status, submissions

__all__ = ["AGENT_ROUTERS", "ROUTERS"]

AGENT_ROUTERS = (health.router, status.router, evaluations.router, submissions.router)
"""The agent surface (also exposed as MCP tools)."""

ROUTERS = (*AGENT_ROUTERS, intake.router, admin.router)
"""Every router; `intake` is the task's hook's (the agent surface's guard applies; not an MCP tool)."""
