"""Helpers of the example tests (`tasks/c-matmul`, `tasks/puzzle-agent`): load the examples and
apply their reference change the way the oracle does. The end-to-end tests
(`tests/e2e/_examples.py`) take the example list, paths and process helpers from here too.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from vero.spec import load_spec
from vero.spec.models import OptimizationSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
TASKS_DIR = REPO_ROOT / "tasks"
EXAMPLES = ("c-matmul", "puzzle-agent")
HARBOR = str(Path(sys.executable).with_name("harbor"))
"""The venv's `harbor` console script (Harbor 0.26.0)."""


def harbor_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a `harbor` (or `vero`) child: no telemetry, no cost-map fetch,
    no bytecode written into the cases; `extra` on top."""
    return dict(
        os.environ,
        HARBOR_TELEMETRY="0",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        PYTHONDONTWRITEBYTECODE="1",
        **(extra or {}),
    )


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """Kill a process started with `start_new_session=True` and everything it started."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


MATMUL_TEST_PROFILE = {"MATMUL_ROUNDS": "3", "MATMUL_REPS": "2"}
"""`tasks/c-matmul`'s test-sized workload (its README, "Test-sized profile"): 3 rounds of 2
multiplies per binary instead of 5 of 5, about a quarter of each case's CPU."""


def matmul_test_sized(dest: Path) -> Path:
    """Copy `tasks/c-matmul` to `dest/c-matmul` with `MATMUL_TEST_PROFILE` in every case's
    `[verifier.env]` (the knobs its `tests/test.sh` reads); returns the copy's `build.yaml`."""
    root = dest / "c-matmul"
    shutil.copytree(TASKS_DIR / "c-matmul", root)
    lines = "".join(f'{name} = "{value}"\n' for name, value in MATMUL_TEST_PROFILE.items())
    for toml in sorted((root / "cases").glob("*/task.toml")):
        text = toml.read_text(encoding="utf-8")
        assert text.count("[verifier.env]\n") == 1 and not any(name in text for name in MATMUL_TEST_PROFILE), toml
        toml.write_text(text.replace("[verifier.env]\n", "[verifier.env]\n" + lines), encoding="utf-8")
    return root / "build.yaml"


def load_example(name: str) -> OptimizationSpec:
    """The validated spec of `tasks/<name>/build.yaml` (absolute paths, partitions merged)."""
    return load_spec(TASKS_DIR / name / "build.yaml")


def case_dir(spec: OptimizationSpec, case: str) -> Path:
    assert spec.cases.path is not None
    return spec.cases.path / case


def visible_partitions(spec: OptimizationSpec) -> list[str]:
    """Partitions the coding agent may evaluate (listed in `agent_access`)."""
    return sorted(spec.agent_access)


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def apply_reference(spec: OptimizationSpec, dest: Path, *, check_only: bool = False) -> Path:
    """Copy the target to `dest` and apply its reference change as the oracle does.

    A patch file is applied with `git apply` in a fresh Git repository holding the target's files;
    a directory is overlaid onto the copy. The `.git` directory is removed afterwards.

    Args:
        check_only: for a patch, only run `git apply --check` (the copy stays the baseline).

    Returns:
        `dest`.

    Raises:
        AssertionError: the spec has no reference, or `git` rejects the patch (with git's message).
    """
    reference = spec.target.reference
    assert reference is not None, "the example has no target.reference"
    shutil.copytree(spec.target.path, dest, ignore=shutil.ignore_patterns("__pycache__"))
    if reference.is_dir():
        if not check_only:
            shutil.copytree(reference, dest, dirs_exist_ok=True)
        return dest
    for args in (("init", "-q"), ("apply", "--check", str(reference))) + (
        () if check_only else (("apply", str(reference)),)
    ):
        result = _git(dest, *args)
        assert result.returncode == 0, f"git {' '.join(args)} failed: {result.stderr}"
    shutil.rmtree(dest / ".git")
    return dest


def reference_puzzle_solver(root: Path):
    """`parse_puzzle` of the puzzle-agent example with its reference change applied (copied under `root`)."""
    target = root / "puzzle-reference"
    shutil.copytree(TASKS_DIR / "puzzle-agent" / "target", target)
    subprocess.run(
        ["git", "apply", str(TASKS_DIR / "puzzle-agent" / "reference.patch")], cwd=target, check=True, timeout=60
    )
    spec = importlib.util.spec_from_file_location("reference_puzzle_agent", target / "puzzle_agent" / "agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module.parse_puzzle


def puzzle_model(parse_puzzle):
    """A fake provider's responder (`tests/inference/fake_upstream.py`) for `tasks/llm-puzzle-agent`:
    answers like a model would, the solving command (the puzzle-agent reference's) in a fenced block."""

    def reply(body: dict) -> str:
        prompt = body["messages"][-1]["content"]
        puzzle = parse_puzzle(prompt)
        command = puzzle.strategy.command(puzzle) if puzzle else "true"
        return f"```bash\n{command}\n```"

    return reply
