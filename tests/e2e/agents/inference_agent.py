"""`McpAgent` that first calls its own model through the sidecar's agent gateway, for the e2e test.

Run as the task's agent (`-a inference_agent:InferenceAgent`, this directory on `PYTHONPATH`) on a
spec with `inference.agent`. In `main`, as the task's `agent` user and with the environment Harbor
gives the agent's commands (`vero harbor run`'s `--ae`), a client with the standard library only
calls `OPENAI_BASE_URL` (chat completions) and `ANTHROPIC_BASE_URL` (messages, streamed) with the
key variables' value, then repeats a chat call until it is refused, and writes every exchange to
`/logs/agent/gateway.json`. Then, from the Harbor process on the host, it scans `main` as root
(every file, every process's environment and command line) and `eval-sidecar` (process
environments) for the provider key, handed to the scan on stdin (so the scan itself puts it
nowhere), into `/logs/agent/key-scan.json`. Then the MCP loop of `McpAgent`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time

from harbor.environments.base import BaseEnvironment
from harbor.environments.docker.docker import _sanitize_docker_compose_project_name
from harbor.models.agent.context import AgentContext
from mcp_agent import McpAgent

KEY_NAME = "E2E_AGENT_PROVIDER_KEY"
"""The provider key's secret name in the e2e spec (the Harbor process has its value)."""
MAX_CALLS = 12

CLIENT = r"""
import json, os, sys, urllib.error, urllib.request

log = {"env": {k: os.environ.get(k) for k in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL")},
       "keys_are_the_token": len({os.environ.get(k) for k in
                                  ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "VERO_AGENT_INFERENCE_TOKEN")}) == 1,
       "token_prefix": os.environ.get("OPENAI_API_KEY", "")[:8], "calls": []}


def call(url, headers, body):
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"content-type": "application/json", **headers}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, kind, text = response.status, response.headers.get("content-type", ""), response.read().decode()
    except urllib.error.HTTPError as exc:
        status, kind, text = exc.code, exc.headers.get("content-type", ""), exc.read().decode()
    log["calls"].append({"url": url, "stream": bool(body.get("stream")), "status": status, "type": kind,
                         "body": text[:4000]})
    return status


openai, anthropic = os.environ["OPENAI_BASE_URL"], os.environ["ANTHROPIC_BASE_URL"]
chat = {"model": "gpt-e2e", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
bearer = {"authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
call(openai + "/chat/completions", bearer, chat)
call(anthropic + "/v1/messages", {"x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01"},
     {"model": "claude-e2e", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
for _ in range(int(sys.argv[2])):
    if call(openai + "/chat/completions", bearer, chat) != 200:
        break
json.dump(log, open(sys.argv[1], "w"), indent=1)
"""

SCAN = r"""
import json, os, sys
needle = sys.stdin.buffer.read()
out = {"files": [], "environ": [], "scanned_files": 0}
if "files" in sys.argv[1:]:
    for root, dirs, names in os.walk("/"):
        if root == "/":
            dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
        for name in names:
            path = os.path.join(root, name)
            try:
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                with open(path, "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            out["scanned_files"] += 1
            if needle in data:
                out["files"].append(path)
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            data = handle.read()
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read()
    except OSError:
        continue
    if needle in data or needle in command:
        out["environ"].append(command.replace(b"\0", b" ").decode(errors="replace")[:160])
print(json.dumps(out))
"""


def _scan(project: str, service: str, modes: list[str], needle: bytes) -> dict:
    """Run `SCAN` as root in a service of the trial's compose project; the key on stdin only."""
    listed = subprocess.run(
        [
            "docker",
            "ps",
            "-q",
            "--filter",
            f"label=com.docker.compose.project={project}",
            "--filter",
            f"label=com.docker.compose.service={service}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    container = listed.stdout.split()[0] if listed.stdout.split() else None
    if container is None:
        return {"error": f"no running {service} in {project}: {listed.stderr[-500:]}"}
    done = subprocess.run(
        ["docker", "exec", "-i", "-u", "0", container, "python3", "-c", SCAN, *modes],
        input=needle,
        capture_output=True,
        timeout=600,
    )
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}"}
    return json.loads(done.stdout.decode())


class InferenceAgent(McpAgent):
    """`McpAgent` after its own model calls and the key scan (module docstring)."""

    @staticmethod
    def name() -> str:
        return "vero-inference-client"

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        started = time.monotonic()
        (self.logs_dir / "gateway-client.py").write_text(CLIENT)
        await environment.upload_file(self.logs_dir / "gateway-client.py", "/tmp/gateway-client.py")
        result = await environment.exec(
            f"python3 /tmp/gateway-client.py /tmp/gateway.json {MAX_CALLS}", timeout_sec=300
        )
        (self.logs_dir / "gateway-exec.txt").write_text(f"{result.return_code}\n{result.stdout}\n{result.stderr}")
        try:
            await environment.download_file("/tmp/gateway.json", self.logs_dir / "gateway.json")
        except Exception:  # noqa: BLE001 - the test says what is missing
            pass
        calls_sec = time.monotonic() - started
        project = _sanitize_docker_compose_project_name(environment.session_id)
        needle = os.environ[KEY_NAME].encode()
        scans = {
            "main": await asyncio.to_thread(_scan, project, "main", ["files"], needle),
            "sidecar": await asyncio.to_thread(_scan, project, "eval-sidecar", [], needle),
            # What this agent adds to the MCP run, for the test's printout.
            "seconds": {"calls": round(calls_sec, 1), "scans": round(time.monotonic() - started - calls_sec, 1)},
        }
        (self.logs_dir / "key-scan.json").write_text(json.dumps(scans, indent=1))
        await super().run(instruction, environment, context)
