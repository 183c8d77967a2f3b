"""Tiny real Harbor task dirs for the nested-run tests (and the fixture generator).

Every case is `FROM python:3.13-slim` (a local tag here) with a `tests/test.sh` that writes
`/logs/verifier/reward.json` (or deliberately nothing).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from vero.core.run import NestedRun, RunAs
from vero.spec.models import CandidateRuntime, HarborSpec, ScoringSpec

BASE_IMAGE = "python:3.13-slim"


def reward_script(body: str) -> str:
    """A `tests/test.sh` running `body` (bash) with `set -u`."""
    return "#!/bin/bash\nset -u\n" + textwrap.dedent(body).strip() + "\n"


def write_case(
    root: Path,
    name: str,
    *,
    test_sh: str,
    agent_timeout_sec: float | None = 60,
    agent_user: str | None = None,
    verifier_timeout_sec: float = 60,
    build_timeout_sec: float = 300,
    dockerfile: str | None = None,
    solve_sh: str | None = None,
    steps: dict[str, str] | None = None,
    extra_toml: str = "",
) -> Path:
    """Write a Harbor task dir `root/name` and return it.

    Args:
        root: the cases dir.
        name: the case (task dir) name.
        test_sh: content of `tests/test.sh` (ignored for multi-step cases).
        agent_timeout_sec: `[agent].timeout_sec` (None: no limit).
        agent_user: `[agent].user`, if any.
        verifier_timeout_sec: `[verifier].timeout_sec`.
        build_timeout_sec: `[environment].build_timeout_sec`.
        dockerfile: `environment/Dockerfile` (default: the base image with `WORKDIR /app`).
        solve_sh: `solution/solve.sh` for the oracle agent, if any.
        steps: multi-step case: step name -> that step's `tests/test.sh`.
        extra_toml: appended to `task.toml`.
    """
    case = root / name
    (case / "environment").mkdir(parents=True)
    agent = f"timeout_sec = {agent_timeout_sec}\n" if agent_timeout_sec is not None else ""
    if agent_user is not None:
        agent += f'user = "{agent_user}"\n'
    toml = (
        f'schema_version = "1.4"\n\n[agent]\n{agent}\n[verifier]\ntimeout_sec = {verifier_timeout_sec}\n\n'
        f"[environment]\nbuild_timeout_sec = {build_timeout_sec}\n"
    )
    if steps:
        for step in steps:
            toml += f'\n[[steps]]\nname = "{step}"\n'
    (case / "task.toml").write_text(toml + extra_toml)
    (case / "environment" / "Dockerfile").write_text(dockerfile or f"FROM {BASE_IMAGE}\nWORKDIR /app\n")
    if steps:
        for step, script in steps.items():
            step_dir = case / "steps" / step
            (step_dir / "tests").mkdir(parents=True)
            (step_dir / "instruction.md").write_text(f"Step {step}.\n")
            _write_exec(step_dir / "tests" / "test.sh", script)
    else:
        (case / "instruction.md").write_text(f"Case {name}.\n")
        (case / "tests").mkdir()
        _write_exec(case / "tests" / "test.sh", test_sh)
    if solve_sh is not None:
        (case / "solution").mkdir()
        _write_exec(case / "solution" / "solve.sh", solve_sh)
    return case


def _write_exec(path: Path, text: str) -> None:
    path.write_text(text)
    os.chmod(path, 0o755)


ECHO_AGENT = '''
"""A tiny candidate agent: writes a line to /app/out.txt in the case environment."""

from harbor.agents.base import BaseAgent


class EchoAgent(BaseAgent):
    @staticmethod
    def name() -> str:
        return "echo-candidate"

    def version(self) -> str:
        return "0.0.1"

    async def setup(self, environment) -> None:
        return

    async def run(self, instruction, environment, context) -> None:
        result = await environment.exec("echo 'hello from candidate' > /app/out.txt")
        if result.return_code != 0:
            raise RuntimeError("echo failed")
'''


FIXTURE_JOBS = Path(__file__).resolve().parent / "fixtures" / "jobs"
RUN_AS_UID = 1001


def make_run(**overrides) -> NestedRun:
    """A `NestedRun` with harmless defaults; keyword arguments override fields (and `harbor.*` via `harbor=`)."""
    defaults = dict(
        evaluation_id="ev-test",
        partition="train",
        candidate="0" * 40,
        candidate_dir=Path("/nonexistent/candidate"),
        cases_dir=Path("/nonexistent/cases"),
        case_names=("a",),
        jobs_dir=Path("/nonexistent/jobs"),
        runtime=CandidateRuntime(kind="program", install_path="/opt/cand"),
        harbor=HarborSpec(),
        scoring=ScoringSpec(),
    )
    defaults.update(overrides)
    return NestedRun(**defaults)


def docker_objects(prefix: str) -> list[str]:
    """Names of containers, networks and volumes whose Compose project starts with `prefix`."""
    import docker

    client = docker.from_env()
    try:
        found = []
        label = "com.docker.compose.project"
        for c in client.containers.list(all=True, filters={"label": label}, ignore_removed=True):
            if c.labels.get(label, "").startswith(prefix):
                found.append(f"container {c.name}")
        for n in client.networks.list(filters={"label": label}):
            if (n.attrs.get("Labels") or {}).get(label, "").startswith(prefix):
                found.append(f"network {n.name}")
        for v in client.volumes.list(filters={"label": label}):
            if (v.attrs.get("Labels") or {}).get(label, "").startswith(prefix):
                found.append(f"volume {v.name}")
        return found
    finally:
        client.close()


def socket_gid() -> int:
    return os.stat("/var/run/docker.sock").st_gid


def run_as_identity(shared_root) -> RunAs:
    home = shared_root / "home-1001"
    home.mkdir(exist_ok=True)
    os.chown(home, RUN_AS_UID, RUN_AS_UID)
    return RunAs(uid=RUN_AS_UID, gid=RUN_AS_UID, extra_groups=(socket_gid(),), home=home)
