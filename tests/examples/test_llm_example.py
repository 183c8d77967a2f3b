"""`tasks/llm-puzzle-agent`: an agent example whose candidate calls a model through the gateway.

It reuses the puzzle-agent cases; the Docker run of both of its candidates (baseline and reference)
through a real sidecar, gateway and verifier is `tests/e2e/test_candidate_boundary_e2e.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vero.compiler import compile_task
from vero.inference.pricing import price_of
from vero.spec import load_spec
from vero.spec.compiled import SidecarConfig, VerifierConfig

pytestmark = pytest.mark.timeout(300)

EXAMPLE = Path(__file__).resolve().parents[2] / "tasks" / "llm-puzzle-agent"
KEY = "sk-example-key-never-written-0042"


def test_llm_example_compiles_with_its_gateway_and_no_key(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("VERO_EXAMPLE_OPENAI_BASE_URL", raising=False)
    spec = load_spec(EXAMPLE / "build.yaml")
    assert spec.target.kind == "agent" and spec.inference is not None
    assert spec.inference.providers["openai"].base_url == "https://api.openai.com/v1"
    assert price_of("gpt-4o-mini", spec.inference.models["gpt-4o-mini"]).input_usd_per_token > 0  # LiteLLM's map
    assert set(spec.cases.partitions["hidden"]).isdisjoint(spec.cases.partitions["train"])
    result = compile_task(spec, tmp_path / "task")
    task = Path(result.task_dir)
    sidecar = SidecarConfig.model_validate_json((task / "environment" / "sidecar" / "config.json").read_text())
    verifier = VerifierConfig.model_validate_json((task / "tests" / "config.json").read_text())
    assert sidecar.inference == verifier.inference == spec.inference
    assert sidecar.agent_access["train"].total_inference_usd == 2.0
    assert "OPENAI_API_KEY" in sidecar.secrets
    for path in task.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_llm_example_reference_extracts_the_command_from_a_fenced_reply(tmp_path):
    target = tmp_path / "target"
    subprocess.run(["cp", "-r", str(EXAMPLE / "target"), str(target)], check=True)
    subprocess.run(["git", "apply", str(EXAMPLE / "reference.patch")], cwd=target, check=True)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from llm_puzzle_agent.agent import extract_command; "
        "print(repr(extract_command('```bash\\nwc -l < /app/data.txt > /app/answer.txt\\n```')))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().replace("'", '"')) == "wc -l < /app/data.txt > /app/answer.txt"
