"""The MCP endpoint exposes the agent routes as tools that go through the same service and checks."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
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
                out["output_schemas"] = {name: tool.outputSchema for name, tool in tools.items()}
                block = await mcp.call_tool("start_evaluation", {"partition": "val", "blocks": [1]})
                out["block_job"] = block.structured_content
                second = await mcp.call_tool("start_evaluation", {"partition": "train", "cases": ["t1"]})
                first_page = await mcp.call_tool("list_evaluations", {"limit": 1})
                out["pages"] = [
                    first_page.structured_content,
                    (
                        await mcp.call_tool(
                            "list_evaluations", {"limit": 1, "before": first_page.structured_content["next_cursor"]}
                        )
                    ).structured_content,
                ]
                out["second"] = second.structured_content
                with pytest.raises(ToolError) as bad_cursor:
                    await mcp.call_tool("list_evaluations", {"before": "ev-0000000000000000"})
                out["bad_cursor"] = str(bad_cursor.value)
            return out

        out = asyncio.run(session())
        for name, key in (("start_evaluation", "job"), ("submit", "submission"), ("status", "status")):
            jsonschema.validate(out[key], out["output_schemas"][name])
        assert out["tools"] == ["get_evaluation", "health", "list_evaluations", "start_evaluation", "status", "submit"]
        # the listing tool pages newest first through the same route
        first, last = out["pages"]
        assert [j["id"] for j in first["jobs"]] == [out["second"]["id"]]
        assert [j["id"] for j in last["jobs"]] == [out["block_job"]["id"]]
        assert last["next_cursor"] == out["block_job"]["id"]  # the first job is still older
        assert "not_found" in out["bad_cursor"]
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


def test_mcp_tools_explain_themselves_to_a_model(tmp_path):
    """A model that never read the task's instruction learns the loop from the server's instructions
    and each tool's description: every agent route is a tool with vero's own description, naming
    every disclosure tier where results are disclosed and the problem `code` of every error its
    route documents (read from the app's OpenAPI document), and every input has a description."""
    from typing import get_args

    from vero.sidecar.errors import _CODES, PROBLEM_RESPONSES
    from vero.sidecar.mcp import SERVER_INSTRUCTIONS, TOOL_DESCRIPTIONS
    from vero.spec.models import Disclosure

    harness = make_harness(tmp_path)
    with harness.serve() as (server, client):

        async def session():
            async with Client(server.url + "/mcp") as mcp:
                return mcp.instructions, await mcp.list_tools()

        instructions, tools = asyncio.run(session())
        openapi = client.get("/openapi.json").json()

    assert instructions == SERVER_INSTRUCTIONS
    assert {tool.name for tool in tools} == set(TOOL_DESCRIPTIONS), "every agent tool needs a TOOL_DESCRIPTIONS entry"
    routes = {op["operationId"]: op for path in openapi["paths"].values() for op in path.values()}
    for tool in tools:
        # Valid JSON Schemas (the draft MCP names), so that a client that validates arguments and
        # structured results before using them (as Claude Code and Codex do) accepts every tool.
        jsonschema.Draft202012Validator.check_schema(tool.inputSchema)
        assert tool.inputSchema.get("type") == "object", tool.name
        assert tool.outputSchema is not None, f"{tool.name} has no output schema"
        jsonschema.Draft202012Validator.check_schema(tool.outputSchema)
        description = tool.description
        assert description == TOOL_DESCRIPTIONS[tool.name]
        for name, schema in tool.input_schema["properties"].items():
            assert schema.get("description"), f"{tool.name}.{name} has no description"
        documented = {int(status) for status in routes[tool.name]["responses"] if status.isdigit()}
        for status in sorted(documented - set(PROBLEM_RESPONSES)):
            if status >= 400:
                # A route whose answer has its own code names it in the response's description.
                named = re.search(r"`code` `(\w+)`", routes[tool.name]["responses"][str(status)]["description"])
                code = named.group(1) if named else _CODES[status]
                assert f"`{code}`" in description, f"{tool.name} does not explain HTTP {status}"
    for name in ("status", "get_evaluation", "list_evaluations"):
        for tier in get_args(Disclosure):
            assert f"`{tier}`" in TOOL_DESCRIPTIONS[name], f"{name} does not say what tier {tier} returns"
    for name in ("start_evaluation", "submit"):
        assert "commit" in TOOL_DESCRIPTIONS[name], f"{name} does not say that versions must be committed"


def _mcp_as(app, client_address: tuple[str, int]):
    """A fastmcp client reaching `app` in process as if from `client_address` (no socket)."""
    import httpx2
    from fastmcp.client.transports import StreamableHttpTransport

    def factory(**options):
        return httpx2.AsyncClient(transport=httpx2.ASGITransport(app, client=client_address), **options)

    return Client(StreamableHttpTransport("http://eval-sidecar:8000/mcp", httpx_client_factory=factory))


def test_mcp_tools_answer_main_under_the_local_caller_guard(tmp_path):
    """`vero harbor serve` guards the agent surface; an MCP tool call is an in-process request that
    must carry the real caller. From `main` (another host's address) every tool answers as its HTTP
    route does; a caller inside the sidecar (loopback, or the address the request came to) is
    refused at `/mcp`, and a tool call whose caller is unknown keeps loopback and is refused."""
    import httpx2

    from vero.sidecar.mcp import _as_mcp_caller

    harness = make_harness(tmp_path)
    app = harness.create_app(refuse_local_agent_calls=True)

    async def session() -> dict:
        out: dict = {}
        async with app.router.lifespan_context(app):
            async with _mcp_as(app, ("10.9.8.7", 40312)) as mcp:
                out["status"] = (await mcp.call_tool("status", {})).structured_content
                job = (
                    await mcp.call_tool("start_evaluation", {"partition": "train", "cases": ["t1"]})
                ).structured_content
                out["done"] = (
                    await mcp.call_tool("get_evaluation", {"job_id": job["id"], "wait_sec": 30})
                ).structured_content
                out["listed"] = (await mcp.call_tool("list_evaluations", {})).structured_content
                out["submitted"] = (await mcp.call_tool("submit", {"version": "HEAD"})).structured_content
            for local in (("127.0.0.1", 50000), ("::1", 50000)):
                async with httpx2.AsyncClient(
                    transport=httpx2.ASGITransport(app, client=local), base_url="http://eval-sidecar:8000"
                ) as raw:
                    answer = await raw.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
                    out.setdefault("local", []).append(answer.status_code)
            # The inner request without a known caller (no MCP request being served) keeps
            # the transport's loopback address: the guard refuses it.
            async with httpx2.AsyncClient(
                transport=httpx2.ASGITransport(_as_mcp_caller(app)), base_url="http://eval-sidecar:8000"
            ) as inner:
                out["unknown_caller"] = (await inner.get("/status")).status_code
        return out

    out = asyncio.run(session())
    assert {p["name"] for p in out["status"]["partitions"]} >= {"train"}
    assert out["done"]["state"] == "complete" and out["done"]["result"]["n_cases"] == 1
    assert [j["id"] for j in out["listed"]["jobs"]] == [out["done"]["id"]]
    assert out["submitted"]["candidate"] == harness.config.baseline_commit
    assert out["local"] == [403, 403]
    assert out["unknown_caller"] == 403
