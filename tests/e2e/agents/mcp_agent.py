"""A coding agent that speaks MCP from `main`, as Claude Code and Codex do, for the end-to-end test.

Run by the outer `harbor run` as the task's agent (`-a mcp_agent:McpAgent`, this directory on
`PYTHONPATH`). It declares MCP support, so Harbor hands it the task's `[[environment.mcp_servers]]`
entry; it uses that URL only. In `main`, as the task's `agent` user, a JSON-RPC client over
streamable HTTP (what Claude Code sends: `initialize`, `notifications/initialized`, `tools/list`,
`tools/call`, each a POST accepting JSON or SSE) runs the loop: `status`, commit the fix,
`start_evaluation`, `get_evaluation` until complete, `list_evaluations`, `submit`. Every request
and answer goes to `/logs/agent/mcp.json`, which the test reads.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from harbor.agents.base import BaseAgent
from harbor.agents.capabilities import AgentCapabilities
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

FIX = Path(__file__).resolve().parents[3] / "tasks" / "minimal" / "reference" / "textstats.py"

CLIENT = r"""
import json, sys, urllib.request

URL = sys.argv[1]
log, session = [], {}


def post(message, *, notify=False):
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2025-06-18"}
    if "id" in session:
        headers["mcp-session-id"] = session["id"]
    request = urllib.request.Request(URL, json.dumps(message).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            status, kind, body = response.status, response.headers.get("content-type", ""), response.read().decode()
            if response.headers.get("mcp-session-id"):
                session["id"] = response.headers["mcp-session-id"]
    except urllib.error.HTTPError as exc:
        status, kind, body = exc.code, exc.headers.get("content-type", ""), exc.read().decode()
    answer = None
    if body and "text/event-stream" in kind:
        data = [line[5:].strip() for line in body.splitlines() if line.startswith("data:")]
        answer = json.loads(data[-1]) if data else None
    elif body:
        answer = json.loads(body)
    log.append({"request": message, "status": status, "answer": answer})
    return answer


ids = iter(range(1, 1000))


def call(tool, arguments):
    answer = post({"jsonrpc": "2.0", "id": next(ids), "method": "tools/call",
                   "params": {"name": tool, "arguments": arguments}})
    result = (answer or {}).get("result") or {}
    if result.get("isError") or "structuredContent" not in result:
        raise SystemExit(f"{tool} failed: {answer}")
    return result["structuredContent"]


step = sys.argv[2]
if step == "start":
    post({"jsonrpc": "2.0", "id": next(ids), "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "vero-e2e-mcp-agent", "version": "1"}}})
    post({"jsonrpc": "2.0", "method": "notifications/initialized"}, notify=True)
    post({"jsonrpc": "2.0", "id": next(ids), "method": "tools/list"})
    call("status", {})
else:
    job = call("start_evaluation", {"partition": "train"})
    for _ in range(20):
        job = call("get_evaluation", {"job_id": job["id"], "wait_sec": 30})
        if job["state"] not in ("queued", "running"):
            break
    call("list_evaluations", {"limit": 5})
    call("submit", {"version": "HEAD"})
json.dump(log, open(sys.argv[3], "w"), indent=1)
"""


class McpAgent(BaseAgent):
    """Fixes `tasks/minimal`'s program and drives the sidecar through its MCP tools only."""

    capabilities = AgentCapabilities(mcp_servers=True, skills=True)

    @staticmethod
    def name() -> str:
        return "vero-mcp-client"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        (server,) = [s for s in self.mcp_servers if s.name == "vero"]
        await environment.upload_file(FIX, "/tmp/mcp-fix.py")
        (self.logs_dir / "client.py").write_text(CLIENT)
        await environment.upload_file(self.logs_dir / "client.py", "/tmp/mcp-client.py")
        url = shlex.quote(str(server.url))
        script = (
            "set -e\n"
            f"python3 /tmp/mcp-client.py {url} start /tmp/mcp-start.json\n"
            "cd /app && cp /tmp/mcp-fix.py textstats.py && git commit -qam 'the fix, evaluated over MCP'\n"
            f"python3 /tmp/mcp-client.py {url} loop /tmp/mcp-loop.json\n"
            'python3 -c \'import json; print(json.dumps(json.load(open("/tmp/mcp-start.json")) '
            '+ json.load(open("/tmp/mcp-loop.json"))))\' > /tmp/mcp.json\n'
            "git rev-parse HEAD > /tmp/mcp-head.txt\n"
        )
        result = await environment.exec(script, timeout_sec=900)
        (self.logs_dir / "exec.txt").write_text(f"{result.return_code}\n{result.stdout}\n--- stderr\n{result.stderr}")
        for name in ("mcp.json", "mcp-head.txt"):
            try:
                await environment.download_file(f"/tmp/{name}", self.logs_dir / name)
            except Exception:  # noqa: BLE001 - the test says what is missing
                pass
        context.metadata = {"mcp_exit": result.return_code}
