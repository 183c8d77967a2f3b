"""A coding agent that uses only MCP, from `main`, end to end on Docker.

`agents/mcp_agent.py` takes the MCP server Harbor hands it from the compiled `task.toml`
(`vero`, streamable HTTP at `http://eval-sidecar:8000/mcp`) and speaks JSON-RPC over HTTP to it
as Claude Code does: it initializes, lists the tools, calls `status`, commits the fix of
`tasks/minimal`, calls `start_evaluation`, `get_evaluation` (long poll) until the job is done,
`list_evaluations` and `submit`. The sidecar guards its agent surface against callers inside its own
container (`LocalCallerGuard`); a tool call is an in-process request that must carry the real
caller, `main`. What must hold: every call is answered (no 403), the evaluation measures the fix
(score 1.0 on train), and the verifier ships the submission the agent made over MCP.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ._examples import start_run, wait_run

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]

AGENTS_DIR = Path(__file__).resolve().parent / "agents"
TOOLS = ["get_evaluation", "health", "list_evaluations", "start_evaluation", "status", "submit"]


def test_an_mcp_client_in_main_evaluates_and_submits_through_the_tools(tmp_path: Path) -> None:
    run = wait_run(start_run("minimal", "mcp_agent:McpAgent", tmp_path, extra_env={"PYTHONPATH": str(AGENTS_DIR)}))
    agent_dir = run.trial_dir / "agent"
    where = f"{run.diagnostics()}\n--- agent exec:\n" + (
        (agent_dir / "exec.txt").read_text() if (agent_dir / "exec.txt").is_file() else "(none)"
    )
    assert run.returncode == 0, where
    assert (agent_dir / "mcp.json").is_file(), where
    exchanges = json.loads((agent_dir / "mcp.json").read_text())
    for exchange in exchanges:
        assert exchange["status"] in (200, 202), (exchange, where)  # never the guard's 403
    by_method = {}
    for exchange in exchanges:
        request = exchange["request"]
        name = request["params"]["name"] if request["method"] == "tools/call" else request["method"]
        by_method.setdefault(name, []).append(exchange)

    initialized = by_method["initialize"][0]["answer"]["result"]
    assert initialized["serverInfo"]["name"] == "vero-sidecar" and initialized["instructions"]
    listed = sorted(tool["name"] for tool in by_method["tools/list"][0]["answer"]["result"]["tools"])
    assert listed == TOOLS, listed
    results = {name: [e["answer"]["result"] for e in found] for name, found in by_method.items() if "/" not in name}
    for name in ("status", "start_evaluation", "get_evaluation", "list_evaluations", "submit"):
        assert results[name] and not any(r.get("isError") for r in results[name]), (name, results.get(name))
    status = results["status"][0]["structuredContent"]
    assert {p["name"] for p in status["partitions"]} == {"train", "holdout"}
    job = results["get_evaluation"][-1]["structuredContent"]
    assert job["state"] == "complete" and job["result"]["score"] == 1.0, job
    listed_jobs = results["list_evaluations"][0]["structuredContent"]["jobs"]
    assert [j["id"] for j in listed_jobs] == [job["id"]]
    head = (agent_dir / "mcp-head.txt").read_text().strip()
    submitted = results["submit"][0]["structuredContent"]
    assert submitted["candidate"] == head == job["candidate"]

    # The verifier shipped what the agent submitted over MCP, and it scores as the oracle's fix does.
    final = run.finalization
    assert final["status"] == "scored" and final["selection"]["method"] == "submission", final
    assert final["chosen"]["candidate"] == head and not final["chosen"]["is_baseline"]
    assert run.reward == 1.0
