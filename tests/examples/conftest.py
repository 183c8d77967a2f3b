"""Helpers of the example tests (`tasks/c-matmul`, `tasks/puzzle-agent`): load the examples, apply
their reference change the way the oracle does, and run real `harbor run` jobs over their cases.
The end-to-end tests (`tests/e2e/_examples.py`) take the example list, paths and process helpers
from here too.

Rewards come from each trial's `result.json` (`verifier_result.rewards`), never from Harbor's exit
code or output (HARBOR-NOTES §2: the exit code is 0 even when every trial errored).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
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
    return dict(os.environ, HARBOR_TELEMETRY="0", LITELLM_LOCAL_MODEL_COST_MAP="True",
                PYTHONDONTWRITEBYTECODE="1", **(extra or {}))


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """Kill a process started with `start_new_session=True` and everything it started."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


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


@dataclass(frozen=True)
class TrialOutcome:
    """One trial of a job, read from its `result.json`.

    Attributes:
        reward: `verifier_result.rewards["reward"]`, or None when the trial has no valid reward.
        exception_type: `exception_info.exception_type`, or None.
        trial_dir: the trial directory (for diagnostics).
    """

    reward: float | None
    exception_type: str | None
    trial_dir: Path


def read_job(job_dir: Path) -> dict[str, TrialOutcome]:
    """Task name -> outcome for every trial directory of a finished job."""
    outcomes: dict[str, TrialOutcome] = {}
    for result_path in sorted(job_dir.glob("*/result.json")):
        result = json.loads(result_path.read_text(encoding="utf-8"))
        rewards = (result.get("verifier_result") or {}).get("rewards") or {}
        exception = result.get("exception_info") or {}
        outcomes[result["task_name"]] = TrialOutcome(
            rewards.get("reward"), exception.get("exception_type"), result_path.parent
        )
    return outcomes


def start_harbor(cases: Path, agent: str, jobs_dir: Path, job_name: str, *,
                 pythonpath: Path | None = None, n_concurrent: int = 2) -> subprocess.Popen[bytes]:
    """Start `harbor run -y -q` over every task dir in `cases` on Docker, in its own process group.

    Args:
        cases: a task dir or a folder of task dirs (`-p`).
        agent: `oracle` or a `module:Class` import path (`-a`).
        pythonpath: put on `PYTHONPATH` so that Harbor can import a custom agent.
    """
    env = harbor_env({"PYTHONPATH": str(pythonpath)} if pythonpath is not None else None)
    command = [HARBOR, "run", "-y", "-q", "-p", str(cases), "-a", agent, "-e", "docker",
               "-n", str(n_concurrent), "-o", str(jobs_dir), "--job-name", job_name]
    jobs_dir.mkdir(parents=True, exist_ok=True)
    # The child keeps its own copy of the descriptor; the parent's closes with the block.
    with open(jobs_dir / f"{job_name}.log", "wb") as log:
        return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait_harbor(process: subprocess.Popen[bytes], jobs_dir: Path, job_name: str, *,
                timeout_sec: float) -> dict[str, TrialOutcome]:
    """Wait for a job started by `start_harbor` and read its trials.

    Raises:
        AssertionError: the job did not finish within `timeout_sec` (its process group is killed).
    """
    try:
        process.wait(timeout=timeout_sec)
    except subprocess.TimeoutExpired:
        kill_group(process)
        raise AssertionError(f"harbor job {job_name} did not finish in {timeout_sec} s") from None
    return read_job(jobs_dir / job_name)
