"""A real agent loop, end to end on Docker, with no model provider: Harbor's `terminus-2` agent,
driven by a scripted OpenAI-compatible model (`scripted_model.py`), works `tasks/minimal` through
`vero harbor run` like a coding agent would.

The script is the loop the vero skill teaches: inspect the repository (and the skill and the MCP
server terminus-2 was told about), apply the spec's reference change, commit, `vero harbor eval
--wait`, read the result, `vero harbor submit`, stop. Alongside, Harbor's `oracle` agent runs the
same task (the two runs share the image cache and run concurrently). What must hold:

1. terminus-2 found the sidecar by itself: its first prompt lists the MCP server declared in the
   compiled `task.toml` and the vero skill from `skills_dir`, and the script reached both from `main`;
2. every step succeeded (exit code 0), and the agent read a disclosed score;
3. the verifier scored the agent's own submission, a commit with the oracle's tree, and its reward
   equals the oracle's;
4. the main image compiled for terminus-2 has what it needs (tmux), so Harbor's setup need not
   install it; the oracle's, compiled for another agent, does not.

The transcript (every prompt the model was shown, i.e. the terminal with the sidecar's answers, and
every reply with the commands it typed) and terminus-2's trajectory are kept under
`tests/artifacts/agent-loop/` (git-ignored), also when the run fails or hangs.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import shutil
import uuid
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from sidecar._server import ServerThread  # tests/ is on sys.path

from vero.compiler import TaskLayout
from vero.spec import load_spec

from ._examples import TASKS_DIR, compose_build, harbor_env, list_image, remove_images, start_run, wait_run
from .scripted_model import MODEL_NAME, Script, ScriptedModel, Step

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]

EXAMPLE = "minimal"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "agent-loop"
MCP_URL = "http://eval-sidecar:8000/mcp"
"""What the compiled task.toml declares (checked against Harbor's model in tests/compiler)."""
SKILL_PATH = "/opt/vero/skills/vero-optimize/SKILL.md"
_JOB_ID = re.compile(r'"id":\s*"(ev-[0-9a-f]{16})"')


def _available_skills(prompt: str) -> dict[str, str]:
    """Skill name -> location from the `<available_skills>` block terminus-2 appends to its prompt."""
    found = re.search(r"<available_skills>.*?</available_skills>", prompt, re.S)
    if found is None:
        return {}
    root = ElementTree.fromstring(found.group(0))
    return {skill.findtext("name", ""): skill.findtext("location", "") for skill in root.iter("skill")}


def _mcp_url(prompt: str) -> str | None:
    """The URL of the MCP server named `vero` in terminus-2's `MCP Servers:` prompt section."""
    found = re.search(r"^- vero: streamable-http transport, url: (\S+)$", prompt, re.M)
    return found.group(1) if found else None


def _reference_commands(reference: Path) -> list[tuple[str, float]]:
    """Keystrokes that apply the spec's reference change in /app (files base64-encoded, one line each)."""
    if reference.is_file():
        data = base64.b64encode(reference.read_bytes()).decode()
        return [(f"printf %s {data} | base64 -d | git apply --whitespace=nowarn\n", 0.5)]
    commands = []
    for path in sorted(p for p in reference.rglob("*") if p.is_file()):
        rel = path.relative_to(reference).as_posix()
        data = base64.b64encode(path.read_bytes()).decode()
        commands.append(
            (f'mkdir -p "$(dirname {shlex.quote(rel)})" && printf %s {data} | base64 -d > {shlex.quote(rel)}\n', 0.3)
        )
    return commands


def _steps(reference: Path, partition: str) -> list[Step]:
    def inspect(script: Script) -> list[tuple[str, float]]:
        skill = _available_skills(script.first_prompt).get("vero-optimize", "/nonexistent/SKILL.md")
        mcp = _mcp_url(script.first_prompt) or "http://nonexistent.invalid/mcp"
        tools_list = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        names = (
            "import json,sys; print('mcp tools:', sorted(t['name'] for t in json.load(sys.stdin)['result']['tools']))"
        )
        return [
            (
                "cd /app && git log --oneline && ls && head -n 4 "
                + shlex.quote(skill)
                + " && vero harbor status > /tmp/status.json"
                ' && python3 -c \'import json; s=json.load(open("/tmp/status.json"));'
                ' print("partitions:", [(p["name"], p["disclosure"]) for p in s["partitions"]])\''
                + f" && curl -fsS -X POST {shlex.quote(mcp)} -H 'content-type: application/json'"
                " -H 'accept: application/json, text/event-stream' -d "
                + shlex.quote(tools_list)
                + " | python3 -c "
                + shlex.quote(names)
                + "\n",
                2.0,
            )
        ]

    def apply(_: Script) -> list[tuple[str, float]]:
        return _reference_commands(reference)

    def commit(_: Script) -> list[tuple[str, float]]:
        return [("git add -A && git commit -qm 'apply the reference change' && git log --oneline -n 2\n", 0.5)]

    def evaluate(_: Script) -> list[tuple[str, float]]:
        return [
            (
                f"vero harbor eval --partition {partition} --wait > /tmp/eval.json; rc=$?; "
                "cat /tmp/eval.json; echo; (exit $rc)\n",
                20.0,
            )
        ]

    def read(script: Script) -> list[tuple[str, float]]:
        ids = _JOB_ID.findall(script.everything())
        job = ids[-1] if ids else "ev-0000000000000000"
        show = (
            "import json,sys; j=json.load(sys.stdin); r=j['result']; "
            "print('job', j['id'], j['state'], 'score', r['score'], 'cases', r['n_cases'])"
        )
        return [(f"vero harbor result {job} | python3 -c {shlex.quote(show)}\n", 1.0)]

    def submit(_: Script) -> list[tuple[str, float]]:
        return [("vero harbor submit\n", 1.0)]

    return [
        Step("inspect", "look at the repository, the vero skill, the partitions and the MCP tools", inspect),
        Step("apply", "apply the reference change", apply),
        Step("commit", "commit it: only committed versions are evaluated", commit),
        Step("evaluate", f"evaluate HEAD on {partition} and wait for the result", evaluate, 20.0),
        Step("read", "read the disclosed result of that job", read),
        Step("submit", "submit HEAD for the final score", submit),
    ]


def _keep_transcript(model: ScriptedModel, trial_dir: Path | None) -> Path:
    """Write the transcript (JSON and a readable Markdown) and terminus-2's trajectory (when the run
    left a trial) to ARTIFACTS."""
    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    ARTIFACTS.mkdir(parents=True)
    (ARTIFACTS / "transcript.json").write_text(
        json.dumps({"outcome": model.outcome, "steps": model.step_results, "exchanges": model.transcript}, indent=2)
    )
    lines = [f"# terminus-2 on tasks/{EXAMPLE}, scripted model\n", f"outcome: {model.outcome}\n"]
    for exchange in model.transcript:
        lines.append(f"## exchange {exchange['n']}\n\n### shown to the model\n\n```\n{exchange['shown']}\n```\n")
        keys = [c["keystrokes"] for c in exchange["reply"]["commands"] if c["keystrokes"]]
        lines.append("### typed\n\n```\n" + ("".join(keys) or "(wait)\n") + "```\n")
    (ARTIFACTS / "transcript.md").write_text("\n".join(lines))
    for name in ("trajectory.json",):
        source = trial_dir / "agent" / name if trial_dir is not None else None
        if source is not None and source.is_file():
            shutil.copyfile(source, ARTIFACTS / name)
    return ARTIFACTS


def test_terminus_2_finds_the_sidecar_and_matches_the_oracle(tmp_path: Path) -> None:
    spec = load_spec(TASKS_DIR / EXAMPLE / "build.yaml")
    assert spec.target.reference is not None and spec.selection.partition is not None
    model = ScriptedModel(_steps(spec.target.reference, spec.selection.partition))
    agent_trial: list[Path] = []
    try:
        with ServerThread(model.app) as server:
            env = {"OPENAI_BASE_URL": f"{server.url}/v1", "OPENAI_API_KEY": "scripted-no-key"}
            agent_run = start_run(
                EXAMPLE,
                "terminus-2",
                tmp_path / "terminus-2",
                extra_env=env,
                extra_args=["--model", f"openai/{MODEL_NAME}"],
            )
            oracle_run = start_run(EXAMPLE, "oracle", tmp_path / "oracle")
            try:
                agent = wait_run(agent_run)
                agent_trial.append(agent.trial_dir)
            finally:
                oracle = wait_run(oracle_run)  # never left running, whatever happened to the agent's run
    finally:
        # Kept whatever happened: a failed or hung run is when the transcript is needed most.
        kept = _keep_transcript(model, agent_trial[0] if agent_trial else None)
    where = f"{agent.diagnostics()}\ntranscript: {kept}"

    # 1. The agent was told about the MCP server and the skill, and reached both from main.
    first = model.transcript[0]["shown"]
    assert _mcp_url(first) == MCP_URL, where
    assert _available_skills(first).get("vero-optimize") == SKILL_PATH, where
    shown = "\n".join(exchange["shown"] for exchange in model.transcript)
    assert "name: vero-optimize" in shown, where  # the skill's front matter, read in main
    assert re.search(r"mcp tools: \[.*'start_evaluation'.*'submit'.*\]", shown), where

    # 2. Every step of the loop succeeded; the agent saw the score its partition discloses.
    assert model.outcome == "completed", where
    assert model.step_results == {step.name: 0 for step in model.steps}, where
    score = re.search(r"job (ev-[0-9a-f]{16}) complete score ([0-9.eE+-]+) cases 1", shown)
    assert score is not None, where

    # 3. The verifier scored the agent's submission: the reference tree, rewarded as the oracle is.
    assert agent.result.get("exception_info") is None, where
    chosen, oracle_chosen = agent.finalization["chosen"], oracle.finalization["chosen"]
    assert agent.finalization["selection"]["method"] == "submission", where
    assert not chosen["is_baseline"] and chosen["subject"] == "apply the reference change", where
    assert chosen["tree"] == oracle_chosen["tree"], where
    assert agent.reward == oracle.reward, f"{where}\n{oracle.diagnostics()}"

    # 4. The main image compiled for terminus-2 carries tmux and the skill; the oracle's has the
    #    skill but not tmux (the base image lacks it, so the package comes from the agent selection).
    listings = {}
    for name, run in (("terminus-2", agent), ("oracle", oracle)):
        project = f"vero-e2e-loop-{name}-{uuid.uuid4().hex[:8]}"
        image = f"{project}-main"
        try:
            compose_build(TaskLayout(run.task_dir).compose_path, project, harbor_env(), timeout_sec=1200)
            listings[name] = list_image(image).paths
        finally:
            remove_images([image, f"{project}-eval-sidecar"])
    skill = SKILL_PATH.lstrip("/")
    assert "usr/bin/tmux" in listings["terminus-2"] and skill in listings["terminus-2"], where
    assert "usr/bin/tmux" not in listings["oracle"] and skill in listings["oracle"], where
