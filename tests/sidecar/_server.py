"""Test harness for the sidecar server: a real app under uvicorn on a loopback port, real git repos,
real state dirs, and a stub `EvaluationBackend` (the real one needs Docker; see the docker tests).

Other test modules (e.g. the client's) may import from here:

    from ._server import SidecarHarness, StubBackend, make_harness

`python -m tests.sidecar._server <harness.json>` serves a harness in a child process (used to
kill a sidecar mid-evaluation); see `serve_child`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from vero.core.baseline import commit_baseline
from vero.core.diagnostics import CaseProblem, RoundLog, RunDiagnostics
from vero.core.evaluation import AttemptOutcome, AttemptResult, CaseResult, EvaluationResult
from vero.core.run import NestedRun
from vero.errors import CaseMisconfigured, InfrastructureFailure
from vero.spec.compiled import SidecarConfig
from vero.spec.models import (
    CandidateLimits,
    CandidateRuntime,
    HarborSpec,
    InferenceSpec,
    PartitionAccess,
    ScoringSpec,
)

try:  # the tests' one set of git helpers: tests/ is on sys.path under pytest
    from _support.git import commit_file, git
except ModuleNotFoundError:  # `python -m tests.sidecar._server` (a child sidecar) runs from the repository root
    from tests._support.git import commit_file, git

__all__ = [
    "ServerThread",
    "SidecarHarness",
    "StubBackend",
    "commit_file",
    "git",
    "make_config",
    "make_harness",
]

DEFAULT_PARTITIONS = {
    "train": [f"t{i}" for i in range(1, 7)],
    "val": [f"v{i}" for i in range(1, 7)],
    "blind": ["b1", "b2", "b3"],
}
DEFAULT_ACCESS = {
    "train": PartitionAccess(disclosure="full", min_aggregate_cases=1, total_runs=5, total_cases=30),
    "val": PartitionAccess(
        disclosure="aggregate",
        min_aggregate_cases=3,
        blocks=[["v1", "v2", "v3"], ["v4", "v5", "v6"]],
        total_runs=3,
        total_cases=18,
    ),
    # Shown finished 0.2 s after admission, whatever the run did (`timing_quantum_sec`).
    "blind": PartitionAccess(
        disclosure="none", min_aggregate_cases=1, total_runs=2, total_cases=6, timing_quantum_sec=0.2
    ),
}


def make_config(
    baseline_commit: str,
    *,
    partitions: dict[str, list[str]] | None = None,
    access: dict[str, PartitionAccess] | None = None,
    disclose_budget: bool = True,
    submit_enabled: bool = True,
    drain_timeout_sec: float = 5.0,
    secrets: list[str] | None = None,
    runtime: CandidateRuntime | None = None,
    name: str = "demo",
    harbor: HarborSpec | None = None,
    scoring: ScoringSpec | None = None,
    candidate_limits: CandidateLimits | None = None,
    inference: InferenceSpec | None = None,
) -> SidecarConfig:
    """A served config. Partition names must be agent-accessible; hidden ones are simply absent (as
    the compiler redacts them)."""
    partitions = partitions or DEFAULT_PARTITIONS
    access = access or DEFAULT_ACCESS
    return SidecarConfig(
        name=name,
        spec_digest="sha256:" + "0" * 64,
        baseline_commit=baseline_commit,
        runtime=runtime or CandidateRuntime(kind="program", install_path="/opt/candidate"),
        scoring=scoring or ScoringSpec(),
        harbor=harbor or HarborSpec(drain_timeout_sec=drain_timeout_sec, infra_retries=0),
        secrets=secrets or [],
        partitions={name: cases for name, cases in partitions.items() if name in access},
        agent_access=access,
        disclose_budget=disclose_budget,
        submit_enabled=submit_enabled,
        candidate_limits=candidate_limits or CandidateLimits(),
        inference=inference,
    )


@dataclass
class StubBackend:
    """An `EvaluationBackend` that answers at once, or when released, with per-case scores.

    Attributes:
        scores: case name -> reward (default 0.5); None makes a dead attempt.
        timed_out: cases the candidate left unfinished at the wall clock (a `timed_out` dead attempt,
            as `HarborBackend` reports them).
        block: while set to a `threading.Event`, `evaluate` waits until it is set (cancellable).
        fail_with_infrastructure: raise `InfrastructureFailure` instead of returning.
        infrastructure_cases: raise `InfrastructureFailure` for a run that selects any of these cases.
        broken_cases: case -> problem code: a run selecting any raises `CaseMisconfigured` (with
            the problems and the causes, as the real backend does).
        write_job_dir: write a Harbor-like job dir (trial dirs with agent/verifier files, the
            trial's own config/result files and an oversized file).
        outside_secret_file: also plant links to this file outside the job dir in every trial: a
            symlink to it, a symlink to its directory and a hard link to it.
        runs: every `NestedRun` received, with a snapshot of the checkout's file names.
        unmeasured: cases left out of the result, as a partial result would leave them.
    """

    scores: dict[str, float | None] = field(default_factory=dict)
    block: threading.Event | None = None
    fail_with_infrastructure: bool = False
    infrastructure_cases: frozenset[str] = frozenset()
    broken_cases: dict[str, str] = field(default_factory=dict)
    write_job_dir: bool = True
    outside_secret_file: Path | None = None
    unmeasured: set[str] = field(default_factory=set)
    timed_out: frozenset[str] = frozenset()
    runs: list[NestedRun] = field(default_factory=list)
    checkout_files: list[list[str]] = field(default_factory=list)
    started: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    running: int = 0
    max_running: int = 0

    async def evaluate(self, run: NestedRun) -> EvaluationResult:
        self.runs.append(run)
        self.checkout_files.append(sorted(p.name for p in run.candidate_dir.iterdir()))
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.started.release()
        try:
            started_at = datetime.now(UTC)
            while self.block is not None and not self.block.is_set():
                await asyncio.sleep(0.02)
            if self.fail_with_infrastructure or self.infrastructure_cases.intersection(run.case_names):
                raise InfrastructureFailure("docker daemon at /secret/path/docker.sock is unreachable")
            broken = [
                CaseProblem(
                    case=case,
                    code=self.broken_cases[case],
                    detail=f"/secret/path: {case} needs ZQ_SECRET_NAME in [environment.env]",
                )
                for case in run.case_names
                if case in self.broken_cases
            ]
            if broken:
                diagnostics = RunDiagnostics(
                    problems=broken,
                    rounds=[
                        RoundLog(
                            job_name=run.evaluation_id,
                            returncode=1,
                            output_tail="harbor: Missing Environment Variables",
                        )
                    ],
                )
                raise CaseMisconfigured(
                    "; ".join(p.detail for p in broken), code=broken[0].code, problems=broken, diagnostics=diagnostics
                )
            job_dir = run.jobs_dir / run.evaluation_id
            cases = []
            for case in run.case_names:
                if case in self.unmeasured:
                    continue
                trial = f"{case}__abc123"
                reward = self.scores.get(case, 0.5)
                if self.write_job_dir:
                    self._write_trial(job_dir / trial, case, reward)
                if case in self.timed_out:
                    attempt = AttemptResult(
                        trial_name=trial, outcome=AttemptOutcome.TIMED_OUT, exception_type="EvaluationTimeoutError"
                    )
                else:
                    attempt = AttemptResult(
                        trial_name=trial,
                        reward=reward,
                        exception_type=None if reward is not None else "RewardFileNotFoundError",
                    )
                cases.append(
                    CaseResult.from_attempts(
                        case,
                        [attempt],
                        run.failure_value if run.failure_value is not None else run.scoring.effective_failure_value(),
                    )
                )
            return EvaluationResult.from_cases(
                partition=run.partition,
                candidate=run.candidate,
                reward_key="reward",
                cases=cases,
                started_at=started_at,
                finished_at=datetime.now(UTC),
                job_dir=str(job_dir),
            )
        finally:
            self.running -= 1

    def _write_trial(self, trial: Path, case: str, reward: float | None) -> None:
        (trial / "agent").mkdir(parents=True, exist_ok=True)
        (trial / "verifier").mkdir(parents=True, exist_ok=True)
        (trial / "agent" / "install.log").write_text(f"installed candidate for {case}\n")
        (trial / "verifier" / "test-stdout.txt").write_text(f"{case}: tests ran, reward {reward}\n")
        (trial / "verifier" / "reward.json").write_text(json.dumps({"reward": reward}))
        (trial / "config.json").write_text(json.dumps({"jobs_dir": "/var/tmp/vero-work/jobs"}))
        (trial / "result.json").write_text(json.dumps({"trial_uri": "file:///var/tmp/vero-work"}))
        (trial / "agent" / "huge.bin").write_bytes(b"x" * (2 * 1024 * 1024))
        if self.outside_secret_file is not None:
            (trial / "agent" / "leak").symlink_to(self.outside_secret_file)
            (trial / "verifier" / "dirlink").symlink_to(self.outside_secret_file.parent, target_is_directory=True)
            os.link(self.outside_secret_file, trial / "agent" / "hardlink.txt")


class ServerThread:
    """Run an ASGI app under uvicorn in a daemon thread on 127.0.0.1 and an ephemeral port."""

    def __init__(self, app, *, startup_timeout_sec: float = 60.0) -> None:
        self.app = app
        from vero.sidecar.app import SidecarServer

        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, lifespan="on", log_level="warning", timeout_graceful_shutdown=30
        )
        service = getattr(app.state, "service", None)
        # A sidecar gets the production server class (it interrupts jobs before waiting for open
        # connections); other apps served in tests (a scripted model) a plain one.
        self.server = SidecarServer(config, service) if service is not None else uvicorn.Server(config)
        self.startup_timeout_sec = startup_timeout_sec
        self.thread: threading.Thread | None = None
        self.url = ""

    def __enter__(self) -> ServerThread:
        def run() -> None:
            try:
                self.server.run()
            except SystemExit:
                pass  # uvicorn exits the thread when the lifespan startup fails

        self.thread = threading.Thread(target=run, name="sidecar-under-test", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout_sec
        while not self.server.started:
            if not self.thread.is_alive():
                error = getattr(self.app.state, "startup_error", None)
                raise RuntimeError(f"the sidecar did not start: {error!r}")
            if time.monotonic() > deadline:
                raise TimeoutError("the sidecar did not start in time")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(60)


@dataclass
class SidecarHarness:
    """Everything one sidecar under test uses; `serve()` starts a fresh app over the same dirs."""

    root: Path
    baseline_dir: Path
    agent_repo: Path
    state_dir: Path
    context_dir: Path
    work_dir: Path
    cases_dir: Path
    config: SidecarConfig
    backend: Any
    max_concurrent_evaluations: int | None = 2
    nested_env: dict[str, str] = field(default_factory=dict)

    def service(self, **overrides):
        """A `SidecarService` on this harness's dirs (not started); `overrides` may name any field
        of `SidecarPaths` or any option of `SidecarService`."""
        import dataclasses

        from vero.sidecar.paths import SidecarPaths
        from vero.sidecar.service import SidecarService

        path_fields = {f.name for f in dataclasses.fields(SidecarPaths)}
        paths = {
            "state_dir": self.state_dir,
            "agent_repo": self.agent_repo,
            "context_dir": self.context_dir,
            "cases_dir": self.cases_dir,
            "baseline_dir": self.baseline_dir,
            "work_dir": self.work_dir,
        }
        paths.update({k: overrides.pop(k) for k in list(overrides) if k in path_fields})
        options = {
            "run_as": None,
            "max_concurrent_evaluations": self.max_concurrent_evaluations,
            "nested_env": self.nested_env,
            **overrides,
        }
        backend = options.pop("backend", self.backend)
        return SidecarService(self.config, SidecarPaths(**paths), backend, **options)

    def create_app(self, **overrides):
        """The app around a service on this harness's dirs; `overrides` may name any field of
        `SidecarPaths`, any option of `SidecarService` or of `create_app`."""
        from vero.sidecar.app import create_app

        app_names = ("max_request_bytes", "refuse_local_agent_calls", "agent_uid")
        app_options = {k: overrides.pop(k) for k in app_names if k in overrides}
        return create_app(self.service(**overrides), **app_options)

    @contextmanager
    def serve(self, **overrides) -> Iterator[tuple[ServerThread, httpx.Client]]:
        app = self.create_app(**overrides)
        with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60, trust_env=False) as client:
            yield server, client

    def admin_headers(self) -> dict[str, str]:
        token = (self.state_dir / "admin-token").read_text().strip()
        return {"authorization": f"Bearer {token}"}

    def write_spec(self, path: Path, **backend: Any) -> Path:
        """Write a JSON description of this harness for `serve_child` (`backend`: its backend options)."""
        path.write_text(
            json.dumps(
                {
                    "config": self.config.model_dump(mode="json"),
                    "dirs": {
                        name: str(getattr(self, name))
                        for name in ("baseline_dir", "agent_repo", "state_dir", "context_dir", "work_dir", "cases_dir")
                    },
                    **backend,
                }
            )
        )
        return path


def make_harness(
    root: Path, *, backend=None, baseline_files: dict[str, str] | None = None, **config_options
) -> SidecarHarness:
    """Real baseline files, an agent repo whose first commit is the baseline, empty state dirs.

    Args:
        root: directory holding everything (created).
        backend: the evaluation backend (default a fresh `StubBackend`).
        baseline_files: relative path -> text of the baseline (default a tiny `solve.py` + README).
        config_options: passed to `make_config`.
    """
    baseline = root / "baseline"
    baseline.mkdir(parents=True)
    files = baseline_files or {"solve.py": "print('baseline')\n", "README.md": "the target\n"}
    for name, text in files.items():
        (baseline / name).parent.mkdir(parents=True, exist_ok=True)
        (baseline / name).write_text(text)
    scratch = root / "baseline-commit"
    shutil.copytree(baseline, scratch)
    baseline_commit = commit_baseline(scratch)
    shutil.rmtree(scratch)
    agent_repo = root / "app"
    shutil.copytree(baseline, agent_repo)
    assert commit_baseline(agent_repo) == baseline_commit
    cases = root / "cases"
    cases.mkdir()
    return SidecarHarness(
        root=root,
        baseline_dir=baseline,
        agent_repo=agent_repo,
        state_dir=root / "state",
        context_dir=root / "context",
        work_dir=root / "work",
        cases_dir=cases,
        config=make_config(baseline_commit, **config_options),
        backend=backend or StubBackend(),
    )


def wait_for_state(client: httpx.Client, job_id: str, states: set[str], timeout_sec: float = 30.0) -> dict:
    """Poll `GET /evaluations/{id}` until the job's state is in `states`; returns the last body
    (a problem body when the answer is 502)."""
    deadline = time.monotonic() + timeout_sec
    while True:
        response = client.get(f"/evaluations/{job_id}")
        body = response.json()
        if response.status_code == 502 or body.get("state") in states:
            return body
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {body.get('state')}")
        time.sleep(0.05)


def serve_child(spec_path: Path, port_file: Path) -> None:
    """Serve a harness described by `SidecarHarness.write_spec` the way `vero harbor serve` does
    (`SidecarServer`, its graceful-shutdown limit, signal handling); writes the port to `port_file`.

    The backend never finishes (so the parent can kill or stop this process mid-evaluation): the
    stub, or with `"harbor_executable"` in the spec the real `HarborBackend` running that
    executable (and `"kill_grace_sec"`, `"harbor_env"` for its process group and environment).
    """
    from vero.sidecar.app import GRACEFUL_SHUTDOWN_SEC, SidecarServer

    spec = json.loads(spec_path.read_text())
    if spec.get("debug_log"):
        import logging

        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("vero.sidecar").setLevel(logging.DEBUG)
    if spec.get("harbor_executable"):
        from vero.harbor import HarborBackend

        backend = HarborBackend(
            harbor_executable=Path(spec["harbor_executable"]),
            kill_grace_sec=spec.get("kill_grace_sec", 15.0),
            base_env={**os.environ, **spec.get("harbor_env", {})},
        )
    else:
        backend = StubBackend(block=threading.Event())
    harness = SidecarHarness(
        root=spec_path.parent,
        config=SidecarConfig.model_validate(spec["config"]),
        backend=backend,
        **{name: Path(value) for name, value in spec["dirs"].items()},
    )
    app = harness.create_app()
    server = SidecarServer(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            lifespan="on",
            log_level="warning",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SEC,
        ),
        app.state.service,
    )

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                return
            await asyncio.sleep(0.02)
        port_file.write_text(str(server.servers[0].sockets[0].getsockname()[1]))
        await task

    asyncio.run(main())


if __name__ == "__main__":
    serve_child(Path(sys.argv[1]), Path(sys.argv[2]))
