"""A coding agent that uses only MCP, from `main`, end to end on Docker.

`agents/mcp_agent.py` takes the MCP server Harbor hands it from the compiled `task.toml`
(`vero`, streamable HTTP at `http://eval-sidecar:8000/mcp`) and speaks JSON-RPC over HTTP to it
as Claude Code does: it initializes, lists the tools, calls `status`, commits the fix of
`tasks/minimal`, calls `start_evaluation`, `get_evaluation` (long poll) until the job is done,
`list_evaluations` and `submit`. The sidecar guards its agent surface against callers inside its own
container (`LocalCallerGuard`); a tool call is an in-process request that must carry the real
caller, `main`. What must hold: every call is answered (no 403), the evaluation measures the fix
(score 1.0 on train), and the verifier ships the submission the agent made over MCP.

The same run is the coding agent's producer scope (`inference.agent`, issue 25): the spec is a copy
of `tasks/minimal` with an `inference` section whose providers are a fake OpenAI- and
Anthropic-compatible server on the host (`tests/inference/fake_upstream.py`), and the agent is
`agents/inference_agent.py`, which first calls its model from `main` through `OPENAI_BASE_URL` and
`ANTHROPIC_BASE_URL` (a streamed Anthropic call included) until it is refused. What must hold:
`main` got the sidecar's URLs and a `vero-ag-` token (never the key), the calls reached the fake
provider with the key, from the sidecar; they were metered and capped (a 402 in OpenAI's error
shape before the provider was called, spend within `total_usd`); the spend shows in `/status` (the
MCP `status` tool), in `finalization.json` and in `experiment.html`; and the key is in no file,
no process environment and no command line of `main`, while the same scan finds it in
`eval-sidecar`'s environment.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from inference.fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS, FakeUpstream  # tests/ is on sys.path

from ._examples import TASKS_DIR, start_run, wait_run
from .test_case_route_e2e import bridge_address

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]

AGENTS_DIR = Path(__file__).resolve().parent / "agents"
TOOLS = ["get_evaluation", "health", "list_evaluations", "start_evaluation", "status", "submit"]
KEY_NAME = "E2E_AGENT_PROVIDER_KEY"  # agents/inference_agent.py reads it in the Harbor process
KEY = "sk-e2e-agent-scope-provider-key-27182818"
PRICE_IN, PRICE_OUT = 1e-6, 1e-4
TOTAL_USD = 0.01
"""Room for a few calls of `max_tokens: 50` (each held about 0.0072 USD, charged 0.000711)."""
SIDECAR_INFERENCE = "http://eval-sidecar:8000/inference"


def write_spec(root: Path, provider: str) -> Path:
    """`tasks/minimal` with a gateway whose providers are the fake at `provider`, and the agent's scope."""
    shutil.copytree(TASKS_DIR / "minimal", root)
    spec = yaml.safe_load((root / "build.yaml").read_text())
    price = {"upstream_model": "fake-ok", "input_cost_per_token": PRICE_IN, "output_cost_per_token": PRICE_OUT}
    spec["secrets"] = [KEY_NAME]
    spec["inference"] = {
        "providers": {
            "fake-openai": {"api": "openai", "base_url": f"{provider}/v1", "api_key_secret": KEY_NAME},
            "fake-anthropic": {"api": "anthropic", "base_url": provider, "api_key_secret": KEY_NAME},
        },
        "models": {
            "gpt-e2e": {"provider": "fake-openai", **price},
            "claude-e2e": {"provider": "fake-anthropic", **price},
        },
        "agent": {"models": ["gpt-e2e", "claude-e2e"], "total_usd": TOTAL_USD},
    }
    (root / "build.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return root / "build.yaml"


def test_an_mcp_client_in_main_evaluates_and_submits_through_the_tools(tmp_path: Path) -> None:
    host = bridge_address()
    with FakeUpstream(host=host) as fake:
        spec = write_spec(tmp_path / "spec", f"http://{host}:{fake.port}")
        run = wait_run(
            start_run(
                "minimal",
                "inference_agent:InferenceAgent",
                tmp_path / "run",
                extra_env={"PYTHONPATH": str(AGENTS_DIR), KEY_NAME: KEY},
                spec=spec,
            )
        )
        provider_requests = list(fake.requests)
    print(f"\n[e2e] mcp + agent inference: {run.phases()}")
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

    _check_the_agents_own_calls(run, agent_dir, status, provider_requests, where)


def _check_the_agents_own_calls(run, agent_dir: Path, status: dict, provider_requests: list[dict], where: str) -> None:
    """The producer scope's part of the run (module docstring)."""
    gateway = json.loads((agent_dir / "gateway.json").read_text())
    assert gateway["env"] == {
        "OPENAI_BASE_URL": f"{SIDECAR_INFERENCE}/openai/v1",
        "ANTHROPIC_BASE_URL": f"{SIDECAR_INFERENCE}/anthropic",
    }, where
    assert gateway["keys_are_the_token"] and gateway["token_prefix"] == "vero-ag-", gateway
    calls = gateway["calls"]
    answered = [c for c in calls if c["status"] == 200]
    streamed = [c for c in answered if c["stream"]]
    assert len(streamed) == 1 and "text/event-stream" in streamed[0]["type"], calls
    assert "message_stop" in streamed[0]["body"], streamed[0]
    # Capped: the last call was refused with 402 before the provider, in OpenAI's error shape.
    refused = calls[-1]
    assert refused["status"] == 402, calls
    error = json.loads(refused["body"])["error"]
    assert error["type"] == "budget_exhausted" and "coding agent's inference budget" in error["message"], error
    assert 3 <= len(answered) == len(calls) - 1, calls
    # Metered: every answered call reached the provider once, with the key, from the sidecar.
    assert len(provider_requests) == len(answered), provider_requests
    for request in provider_requests:
        sent = request["headers"].get("authorization") or request["headers"].get("x-api-key")
        assert sent in (f"Bearer {KEY}", KEY), request["headers"]
    spent = len(answered) * (INPUT_TOKENS * PRICE_IN + OUTPUT_TOKENS * PRICE_OUT)
    shown = status.get("agent_inference")
    assert shown is not None and shown["calls"] == len(answered), status
    assert shown["spent_usd"] == pytest.approx(spent) and shown["total_usd"] == pytest.approx(TOTAL_USD), shown
    assert shown["overrun_usd"] == 0, shown
    recorded = run.finalization["agent_inference"]
    assert recorded == {
        "total_usd": pytest.approx(TOTAL_USD),
        "spent_usd": pytest.approx(spent),
        "overrun_usd": 0.0,
        "calls": len(answered),
        "interrupted_calls": 0,
    }, recorded
    assert recorded["spent_usd"] <= TOTAL_USD
    report = (run.trial_dir / "verifier" / "artifacts" / "experiment.html").read_text()
    assert 'id="agent-inference"' in report, where
    # The key is nowhere in main, and the same scan finds it in the sidecar's environment.
    scans = json.loads((agent_dir / "key-scan.json").read_text())
    print(f"[e2e] the agent's own calls and the key scans took {scans['seconds']} s of the run")
    main, sidecar = scans["main"], scans["sidecar"]
    assert "error" not in main and main["scanned_files"] > 1000, main
    assert main["files"] == [] and main["environ"] == [], main
    assert any("vero" in command for command in sidecar.get("environ", [])), sidecar
