"""`vero harbor run`: compile a spec and run the compiled task with Harbor, end to end.

Steps: check the agent name and find the `harbor` command; load the env file into the environment
Harbor gets (secrets are needed at build time, and they reach Harbor by environment, never on its
command line); load the spec and check the execution target (Docker engine reachable, or Modal
credentials present); only then compile the spec to a temporary directory; run the pinned Harbor
with its own progress output; then read the trial's `result.json` (never the exit code: Harbor
exits 0 when every trial errored, docs/harbor-notes.md §2) and the verifier's `finalization.json` from the
trial's collected artifacts.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vero.errors import InfrastructureFailure, SpecError
from vero.spec.models import OptimizationSpec

__all__ = [
    "PreparedTask",
    "TaskRunOutcome",
    "check_agent_name",
    "check_execution_target",
    "load_run_spec",
    "prepare_task",
    "run_task",
]


@dataclass
class TaskRunOutcome:
    """What one `vero harbor run` produced.

    Attributes:
        job_dir: Harbor's job directory on the host.
        trial_dir: the (single) trial's directory, if one was created.
        rewards: Harbor's rewards of the trial (`verifier_result.rewards`), empty when none.
        exception_type: the trial's exception type, if it errored.
        finalization: the verifier's `finalization.json`, if collected.
        artifacts_dir: where the operator artifacts landed on the host, if any.
        task_dir: the compiled task directory.
    """

    job_dir: Path
    task_dir: Path
    trial_dir: Path | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    exception_type: str | None = None
    finalization: dict | None = None
    artifacts_dir: Path | None = None

    @property
    def ok(self) -> bool:
        """True when the trial finished without an exception and produced a reward."""
        return self.trial_dir is not None and self.exception_type is None and bool(self.rewards)


def load_env_file(path: Path) -> dict[str, str]:
    """Variables of a dotenv file (python-dotenv syntax), without touching `os.environ`.

    Raises:
        SpecError: the file does not exist.
    """
    from dotenv import dotenv_values

    if not path.is_file():
        raise SpecError.at("--env-file", f"env file not found: {path}")
    return {k: v for k, v in dotenv_values(path).items() if v is not None}


def check_execution_target(environment: str, env: Mapping[str, str]) -> None:
    """Fail fast, before anything is built, when the execution target cannot work.

    `docker`: `docker info` must answer (and the Compose v2 plugin exist). `modal`: Harbor's modal
    extra must be installed and `MODAL_TOKEN_ID`/`MODAL_TOKEN_SECRET` set (or `~/.modal.toml`).

    Raises:
        InfrastructureFailure: with what is missing and how to fix it.
    """
    if environment == "docker":
        for argv, what in (
            (["docker", "info"], "the Docker engine"),
            (["docker", "compose", "version"], "the Docker Compose v2 plugin"),
        ):
            try:
                ok = subprocess.run(argv, capture_output=True, timeout=60, env=dict(env)).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            if not ok:
                raise InfrastructureFailure(
                    f"{what} is not reachable (`{' '.join(argv)}` failed); start Docker first "
                    "(on these machines: ../shared/ci/docker-up.sh)"
                )
    elif environment == "modal":
        try:
            import modal  # noqa: F401
        except ImportError:
            raise InfrastructureFailure(
                "environment modal needs Harbor's modal extra: pip install 'vero[modal]'"
            ) from None
        has_tokens = env.get("MODAL_TOKEN_ID") and env.get("MODAL_TOKEN_SECRET")
        if not has_tokens and not (Path.home() / ".modal.toml").is_file():
            raise InfrastructureFailure(
                "environment modal needs MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (e.g. in --env-file) "
                "or ~/.modal.toml (`modal token new`)"
            )


def _read_outcome(job_dir: Path, task_dir: Path) -> TaskRunOutcome:
    outcome = TaskRunOutcome(job_dir=job_dir, task_dir=task_dir)
    trials = sorted(p.parent for p in job_dir.glob("*/result.json"))
    if not trials:
        return outcome
    trial = trials[-1]
    outcome.trial_dir = trial
    try:
        result = json.loads((trial / "result.json").read_text())
    except (OSError, ValueError):
        outcome.exception_type = "UnreadableTrialResult"
        return outcome
    rewards = (result.get("verifier_result") or {}).get("rewards") or {}
    outcome.rewards = {k: float(v) for k, v in rewards.items() if isinstance(v, (int, float))}
    outcome.exception_type = (result.get("exception_info") or {}).get("exception_type")
    # A separate verifier's /logs/verifier is downloaded to <trial>/verifier (docs/harbor-notes.md §1).
    final = trial / "verifier" / "artifacts" / "finalization.json"
    if final.is_file():
        outcome.artifacts_dir = final.parent
        try:
            outcome.finalization = json.loads(final.read_text())
        except (OSError, ValueError):
            outcome.finalization = None
    return outcome


@dataclass
class PreparedTask:
    """A spec compiled for one run.

    Attributes:
        spec: the validated spec, with the environment override applied.
        task_dir: the compiled task directory (kept after the run, for inspection).
        env: the environment Harbor runs with (this process's plus the env file; holds secrets).
        warnings: the build's warnings (`CompileResult.warnings`).
    """

    spec: OptimizationSpec
    task_dir: Path
    env: dict[str, str] = field(repr=False)
    warnings: tuple[str, ...] = ()


def check_agent_name(agent: str) -> None:
    """Refuse an agent Harbor cannot resolve, before anything is built.

    `module:Class` paths are left to Harbor (they are imported in its process); plain names must be
    one of Harbor's agents (`harbor.models.agent.name.AgentName`) or an `acp:<agent>` bridge.

    Raises:
        SpecError: at `--agent`, listing a few valid names.
    """
    if ":" in agent:
        return
    from vero.harbor.catalog import agent_names

    names = agent_names()
    if agent not in names:
        close = [n for n in names if n[:3] == agent[:3]] or ["oracle", "nop", "claude-code", "codex"]
        raise SpecError.at(
            "--agent", f"unknown Harbor agent {agent!r}; e.g. {', '.join(close[:6])}, or a module:Class path"
        )


def load_run_spec(
    config: Path, *, environment: str | None = None, env_file: Path | None = None
) -> tuple[OptimizationSpec, dict[str, str]]:
    """The spec and the environment Harbor will run with, the execution target checked.

    Args:
        config: the spec (`build.yaml`).
        environment: overrides `harbor.environment` (switching to `modal` also adds Harbor's
            `modal` extra to an exact `harbor==X` requirement).
        env_file: dotenv file whose variables (secrets, provider keys) join the environment.

    Returns:
        `(spec, env)`: `env` is this process's environment plus the env file, with Harbor's
        telemetry off and LiteLLM's local cost map on unless set (it holds secrets: never log it).

    Raises:
        SpecError: the spec is invalid or the env file is missing.
        InfrastructureFailure: the execution target is not reachable.
    """
    from vero.spec import load_spec
    from vero.spec.validation import check_spec

    env = dict(os.environ)
    if env_file is not None:
        env.update(load_env_file(env_file))
    env.setdefault("HARBOR_TELEMETRY", "0")
    env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    spec = load_spec(config, env=env)
    if environment is not None and environment != spec.harbor.environment:
        harbor = spec.harbor.model_copy(update={"environment": environment})
        if environment == "modal" and harbor.requirement.startswith("harbor=="):
            harbor = harbor.model_copy(update={"requirement": "harbor[modal]" + harbor.requirement[len("harbor") :]})
        spec = check_spec(spec.model_copy(update={"harbor": harbor}), source=str(config))
    check_execution_target(spec.harbor.environment, env)
    return spec, env


def prepare_task(
    config: Path,
    *,
    environment: str | None = None,
    env_file: Path | None = None,
    work_dir: Path | None = None,
    agent: str | None = None,
) -> PreparedTask:
    """Load the spec, check the execution target, and compile the task into a fresh directory.

    Args:
        config: the spec (`build.yaml`).
        environment: overrides `harbor.environment` (switching to `modal` also adds Harbor's
            `modal` extra to an exact `harbor==X` requirement).
        env_file: dotenv file whose variables (secrets, provider keys) join the environment.
        work_dir: parent of the compiled task (default: a new temporary directory).
        agent: the Harbor agent the task is compiled for (`compile_task`'s `agent`): what it
            cannot take is not declared, what it needs is installed in main.

    Raises:
        SpecError: the spec is invalid, the env file is missing, or a secret is unset.
        InfrastructureFailure: the execution target is not reachable (checked before compiling).
    """
    from vero.compiler import compile_task

    spec, env = load_run_spec(config, environment=environment, env_file=env_file)
    work = work_dir or Path(tempfile.mkdtemp(prefix=f"vero-{spec.name}-"))
    task_dir = work / spec.name
    # Secrets are checked in `env` at build time; only their names are written.
    compiled = compile_task(spec, task_dir, tarball=work / f"{spec.name}.tar.gz", env=env, agent=agent)
    return PreparedTask(spec=spec, task_dir=task_dir, env=env, warnings=compiled.warnings)


def run_task(
    config: Path,
    *,
    agent: str = "oracle",
    model: str | None = None,
    environment: str | None = None,
    env_file: Path | None = None,
    jobs_dir: Path = Path("jobs"),
    job_name: str | None = None,
    extra_args: list[str] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> TaskRunOutcome:
    """Compile `config` and run it with Harbor; return what the trial produced.

    Args:
        config: the spec (`build.yaml`).
        agent: Harbor agent for `main`: a name (`oracle`, `nop`, `claude-code`, `codex`, ...) or
            `module:Class`.
        model: model name for the agent (`-m`), if it needs one.
        environment: overrides `harbor.environment` of the spec (`docker`, `modal`).
        env_file: dotenv file with secrets (and provider keys); loaded into the Harbor process's
            environment, never passed as arguments.
        jobs_dir: Harbor's jobs directory on the host.
        job_name: Harbor job name (default: `vero-<spec name>-<random>`).
        extra_args: further `harbor run` arguments, passed through.
        on_warning: called with each build warning, before Harbor starts.

    Raises:
        SpecError: the agent name is unknown, the spec is invalid, a secret is missing, or
            `jobs_dir` cannot be created.
        InfrastructureFailure: the `harbor` command is missing or the execution target is not
            reachable (both checked before compiling), or Harbor could not start.
    """
    check_agent_name(agent)
    from vero.harbor.command import find_harbor_executable

    jobs_dir = jobs_dir.absolute()
    harbor = str(find_harbor_executable())
    prepared = prepare_task(config, environment=environment, env_file=env_file, agent=agent)
    if on_warning is not None:
        for warning in prepared.warnings:
            on_warning(warning)
    spec = prepared.spec
    job_name = job_name or f"vero-{spec.name}-{uuid.uuid4().hex[:8]}"
    argv = [
        harbor,
        "run",
        "-y",
        "-p",
        str(prepared.task_dir),
        "-a",
        agent,
        "-e",
        spec.harbor.environment,
        "-o",
        str(jobs_dir),
        "--job-name",
        job_name,
    ]
    if model:
        argv += ["-m", model]
    argv += list(extra_args or [])
    try:
        jobs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError.at("--jobs-dir", f"cannot create {jobs_dir}: {exc.strerror or type(exc).__name__}") from None
    try:
        # Harbor's own progress display streams to the terminal.
        subprocess.run(argv, env=prepared.env, stdin=subprocess.DEVNULL, check=False)
    except OSError as exc:
        raise InfrastructureFailure(f"could not start harbor ({type(exc).__name__})") from None
    return _read_outcome(jobs_dir / job_name, prepared.task_dir)
