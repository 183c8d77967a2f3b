"""The MCP endpoint exposes the agent routes as tools that go through the same service and checks."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError

from ._server import make_harness, wait_for_state

pytestmark = pytest.mark.timeout(120)


def test_mcp_tools_share_the_http_checks_and_budget(tmp_path):
    harness = make_harness(tmp_path)
    with harness.serve() as (server, client):
        async def session() -> dict:
            out: dict = {}
            async with Client(server.url + "/mcp") as mcp:
                out["tools"] = sorted(tool.name for tool in await mcp.list_tools())
                started = await mcp.call_tool("start_evaluation", {"partition": "val"})
                out["job"] = started.structured_content
                with pytest.raises(ToolError) as denied:
                    await mcp.call_tool("start_evaluation", {"partition": "holdout-zq9"})
                out["denied"] = str(denied.value)
                with pytest.raises(ToolError) as floor:
                    await mcp.call_tool("start_evaluation", {"partition": "val", "cases": ["v1"]})
                out["floor"] = str(floor.value)
                with pytest.raises(ToolError) as unknown:
                    await mcp.call_tool("get_evaluation", {"job_id": "ev-0000000000000000"})
                out["unknown"] = str(unknown.value)
                submitted = await mcp.call_tool("submit", {"version": "HEAD"})
                out["submission"] = submitted.structured_content
                status = await mcp.call_tool("status", {})
                out["status"] = status.structured_content
                tools = {tool.name: tool for tool in await mcp.list_tools()}
                out["start_schema"] = tools["start_evaluation"].inputSchema
                block = await mcp.call_tool("start_evaluation", {"partition": "val", "blocks": [1]})
                out["block_job"] = block.structured_content
            return out

        out = asyncio.run(session())
        assert out["tools"] == ["get_evaluation", "health", "start_evaluation", "status", "submit"]
        assert out["job"]["state"] == "queued" and out["job"]["partition"] == "val"
        assert '"code":"denied"' in out["denied"].replace(" ", "") and "holdout-zq9" not in out["denied"]
        assert "fixed blocks" in out["floor"]
        assert "not_found" in out["unknown"]
        assert out["submission"]["candidate"] == harness.config.baseline_commit
        val = next(p for p in out["status"]["partitions"] if p["name"] == "val")
        assert val["budget"]["remaining_runs"] == 2  # the MCP call spent the same budget as HTTP would
        assert val["blocks"] == [["v1", "v2", "v3"], ["v4", "v5", "v6"]] and val["ladder"] is None
        assert "blocks" in json.dumps(out["start_schema"])
        assert out["block_job"]["n_cases"] == 3
        done = wait_for_state(client, out["job"]["id"], {"complete"})
        assert done["result"]["disclosure"] == "aggregate" and done["result"]["cases"] is None
        # admin routes are never tools, and the agent's HTTP view matches
        assert "seal" not in json.dumps(out["tools"]) and "export" not in json.dumps(out["tools"])
        assert client.get("/status").json()["submission"] == out["submission"]
