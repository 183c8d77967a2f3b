"""Real Harbor task dirs (cases) for the tests: one writer, so that every test's case has the same
layout (`task.toml`, `instruction.md`, `environment/Dockerfile`, `tests/test.sh`, optionally
`environment/docker-compose.yaml`, `solution/solve.sh`, `steps/<name>/` and further files).

Every case is `FROM python:3.13-slim` (a local tag here) unless a test gives its own Dockerfile.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping
from pathlib import Path

__all__ = ["BASE_IMAGE", "reward_script", "write_case"]

BASE_IMAGE = "python:3.13-slim"


def reward_script(body: str) -> str:
    """A `tests/test.sh` running `body` (bash) with `set -u`."""
    return "#!/bin/bash\nset -u\n" + textwrap.dedent(body).strip() + "\n"


def write_case(
    root: Path,
    name: str,
    *,
    test_sh: str = "#!/bin/bash\nmkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt\n",
    agent_timeout_sec: float | None = 60,
    agent_user: str | None = None,
    verifier_timeout_sec: float = 60,
    build_timeout_sec: float | None = 300,
    dockerfile: str | None = None,
    instruction: str | None = None,
    solve_sh: str | None = None,
    steps: dict[str, str] | None = None,
    extra_toml: str = "",
    task_toml: str | None = None,
    compose: str | None = None,
    files: Mapping[str, str] | None = None,
) -> Path:
    """Write a Harbor task dir `root/name` and return it.

    Args:
        root: the cases dir (created).
        name: the case (task dir) name.
        test_sh: content of `tests/test.sh`, executable (ignored for multi-step cases); the default
            writes reward 1.
        agent_timeout_sec: `[agent].timeout_sec` (None: no limit).
        agent_user: `[agent].user`, if any.
        verifier_timeout_sec: `[verifier].timeout_sec`.
        build_timeout_sec: `[environment].build_timeout_sec` (None: no `[environment]` table).
        dockerfile: `environment/Dockerfile` (default: the base image with `WORKDIR /app`).
        instruction: `instruction.md` (default `Case <name>.`).
        solve_sh: `solution/solve.sh` for the oracle agent, if any.
        steps: multi-step case: step name -> that step's `tests/test.sh`.
        extra_toml: appended to `task.toml`.
        task_toml: the whole `task.toml`, written as given (the timeouts, steps and `extra_toml`
            are then not used).
        compose: `environment/docker-compose.yaml`, if any.
        files: further files, path relative to the case -> text (e.g. `tests/input.txt`).
    """
    case = root / name
    (case / "environment").mkdir(parents=True)
    if task_toml is None:
        agent = f"timeout_sec = {agent_timeout_sec}\n" if agent_timeout_sec is not None else ""
        if agent_user is not None:
            agent += f'user = "{agent_user}"\n'
        task_toml = f'schema_version = "1.4"\n\n[agent]\n{agent}\n[verifier]\ntimeout_sec = {verifier_timeout_sec}\n'
        if build_timeout_sec is not None:
            task_toml += f"\n[environment]\nbuild_timeout_sec = {build_timeout_sec}\n"
        for step in steps or ():
            task_toml += f'\n[[steps]]\nname = "{step}"\n'
        task_toml += extra_toml
    (case / "task.toml").write_text(task_toml)
    (case / "environment" / "Dockerfile").write_text(dockerfile or f"FROM {BASE_IMAGE}\nWORKDIR /app\n")
    if compose is not None:
        (case / "environment" / "docker-compose.yaml").write_text(compose)
    if steps:
        for step, script in steps.items():
            step_dir = case / "steps" / step
            (step_dir / "tests").mkdir(parents=True)
            (step_dir / "instruction.md").write_text(f"Step {step}.\n")
            _write_exec(step_dir / "tests" / "test.sh", script)
    else:
        (case / "instruction.md").write_text(instruction if instruction is not None else f"Case {name}.\n")
        (case / "tests").mkdir()
        _write_exec(case / "tests" / "test.sh", test_sh)
    if solve_sh is not None:
        (case / "solution").mkdir()
        _write_exec(case / "solution" / "solve.sh", solve_sh)
    for rel, text in (files or {}).items():
        path = case / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return case


def _write_exec(path: Path, text: str) -> None:
    path.write_text(text)
    os.chmod(path, 0o755)
