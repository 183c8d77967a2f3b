"""The sidecar's orchestration: the only place that calls `vero.core` and the evaluation backend.

Route handlers and MCP tools call one method each; every check lives here, in this order
(docs/agent-api.md):

```
POST /evaluations: entrance open -> policy (partition, cases, blocks) -> no quarantined case
                   -> candidate import -> entrance still open
                   -> budget reservation + job record (one transaction) -> 202
job task:          wait for an evaluation slot -> running -> slot's work tree to the candidate
                   -> nested run -> complete + settle (one transaction; zero scores and dead
                   attempts stay charged; in Ladder mode the Ladder answer is decided under one lock
                   and recorded in that transaction) | failed/infrastructure + refund |
                   failed/<case problem code> + refund + the case quarantined |
                   cancelled/sealed or failed/interrupted + refund (each one transaction)
```

A case an evaluation found broken whatever the candidate (`CaseMisconfigured`: invalid task,
missing variables, setup rejected, reward key missing) is quarantined: every later request that
selects it is refused (502 with the problem's code) before anything is charged or run, so a broken
case is never refunded without end. The quarantine is rebuilt from the failed jobs' recorded
problems at start. Failed jobs keep their causes (`EvaluationJob.diagnostics`).

State changes go through the state store (`vero.core.state`): a job's terminal state and its
settle or refund commit together, so no reader ever sees one without the other, and a crash leaves
either both or neither. `vero.core.jobs.recover_interrupted` fails and refunds at the next start
what was still queued or running.

Startup (`start`): state dir 0700, the state store (refused when tampered), ledger (persisted figures
win over the config; drift is logged), the Ladder's bests (rebuilt from the job records), candidate
store, submission, seal state, recovery of interrupted jobs, the baseline commit (rebuilt from the
baseline files and checked against the config, unless the store already holds it), a fresh admin
token (0400), and the runner's work dir (outside the root-only state dir) with one persistent work
tree per evaluation slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vero.core.candidates import CandidateRecord, CandidateStore
from vero.core.diagnostics import CaseProblem, RunDiagnostics
from vero.core.evaluation import EvaluationResult
from vero.core.jobs import TERMINAL_STATES, EvaluationJob, JobStore, recover_interrupted
from vero.core.ladder import LadderBoard, LadderKey
from vero.core.ledger import BudgetBalance, BudgetLedger, BudgetTotals, Cost, Reservation, balances_of
from vero.core.policy import AccessPolicy, DisclosureRule
from vero.core.run import (
    EvaluationBackend,
    EvaluationLease,
    EvaluationRuntime,
    NestedRun,
    RunAs,
    nested_secret_env,
    provider_key_names,
)
from vero.core.session import SessionState, write_session_archive
from vero.core.state import STATE_FILE, StateStore
from vero.core.storage import atomic_write_model, is_out_of_space, remove_tree
from vero.core.submission import Submission, read_submission, record_submission
from vero.errors import (
    CASE_PROBLEM_CODES,
    CaseMisconfigured,
    Conflict,
    EvaluationsClosed,
    GitFailed,
    InfrastructureFailure,
    LedgerCorrupt,
    RequestInvalid,
    SpecError,
    StorageFull,
    SubmissionsClosed,
    UnknownJob,
)
from vero.harbor.process import finish_uncancellable, runner_identity
from vero.inference.pricing import to_micro_usd
from vero.sidecar.artifacts import ArtifactLimits, copy_trial_artifacts
from vero.sidecar.auth import generate_admin_token
from vero.sidecar.disclosure import (
    broken_cases,
    case_problem,
    covers_granted_cases,
    disclose,
    job_view,
    submission_view,
    summary_view,
)
from vero.sidecar.gate import PartitionGate
from vero.sidecar.intake import INTAKE_FILE, IntakeState
from vero.sidecar.models import (
    BudgetView,
    DisclosedResult,
    EvaluationPage,
    EvaluationRequest,
    IntakeView,
    JobView,
    LadderView,
    PartitionStatus,
    SealResponse,
    StatusResponse,
    SubmissionView,
)
from vero.sidecar.seal import SEAL_FILE, SealState
from vero.spec.compiled import AGENT_PRINCIPAL, CONTAINER_PATHS, SidecarConfig
from vero.spec.models import timing_quantum_sec

if TYPE_CHECKING:
    from vero.inference.gateway import InferenceGateway

__all__ = ["DEFAULT_WORK_DIR", "ExportResponse", "SidecarPaths", "SidecarService"]

_logger = logging.getLogger("vero.sidecar")

DEFAULT_WORK_DIR = Path("/var/tmp/vero-work")
"""Runner-writable scratch space (checkouts, nested Harbor job dirs), outside the state dir."""

_INFRA_ERROR = "infrastructure"

_INTAKE_CLOSED_TEXT = "intake_closed: the agent phase is over"

RECENT_JOBS_IN_STATUS = 10
"""How many of the newest jobs `GET /status` lists at most (older ones: `GET /evaluations`)."""

RECENT_JOBS_MAX_BYTES = 8 * 1024
"""At most this many bytes of job summaries (their JSON) in `GET /status`: the newest jobs that fit.
A summary is a few hundred bytes, but the agent chooses its versions' names (256 characters, up to
4 bytes each) and a broken partition's cases can be many, so the count alone would not bound what
the history adds to `/status`."""

MAX_PAGE_SIZE = 100
"""Most jobs one `GET /evaluations` page holds."""

_VIEW_CACHE_SIZE = 4096


def _now() -> datetime:
    return datetime.now(UTC)


class ExportResponse(BaseModel):
    """`GET /admin/export`: the full trusted records (never served to the agent)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    spec_digest: str
    baseline_commit: str
    entrance_open: bool
    sealed_at: datetime | None = None
    jobs: list[EvaluationJob] = Field(description="Every job with its trusted full result, in creation order.")
    balances: list[BudgetBalance]
    reservations: list[Reservation]
    candidates: list[CandidateRecord]
    submission: Submission | None = None


def _make_file_readable(path: str) -> None:
    info = os.lstat(path)
    if stat.S_ISREG(info.st_mode):
        extra = 0o555 if info.st_mode & stat.S_IXUSR else 0o444
        if stat.S_IMODE(info.st_mode) | extra != stat.S_IMODE(info.st_mode):
            os.chmod(path, stat.S_IMODE(info.st_mode) | extra)


def _make_readable(root: Path, changed: tuple[str, ...] | None = None) -> None:
    """Dirs 0755, files a+r (a+rx where the owner may execute); symlinks untouched.

    With `changed` (tree-relative paths), only those files and their directories are visited.
    """
    if changed is None:
        for dirpath, _dirnames, filenames in os.walk(root):
            os.chmod(dirpath, 0o755)
            for name in filenames:
                _make_file_readable(os.path.join(dirpath, name))
        return
    directories = {root}
    for rel in changed:
        path = root / rel
        directories.update(parent for parent in path.parents if parent.is_relative_to(root))
        if os.path.lexists(path):
            _make_file_readable(str(path))
    for directory in directories:
        if directory.is_dir() and not directory.is_symlink():
            os.chmod(directory, 0o755)


def _ladder_key(job: EvaluationJob) -> LadderKey:
    return (job.principal, job.partition, tuple(job.cases))


def _remove_tree(path: Path) -> None:
    # Never follows symlinks (a planted link cannot redirect it), whatever the tree's depth.
    remove_tree(path)


@dataclass(frozen=True)
class SidecarPaths:
    """Where one sidecar reads and writes (the container's paths: `vero.spec.compiled.CONTAINER_PATHS`).

    Attributes:
        state_dir: root-only durable state (ledger, jobs, candidate store, submission, seal, token).
        agent_repo: the agent's checkout (read-only), where versions are resolved.
        context_dir: agent-readable dir receiving `full`-tier artifacts, `<context_dir>/<job id>/`.
        cases_dir: directory of the case task dirs this sidecar may run.
        baseline_dir: the baseline files; None skips rebuilding and importing the baseline.
        work_dir: runner-writable scratch dir for checkouts and nested job dirs, outside `state_dir`.
        seal_root: sealing writes only below this directory (None: anywhere outside the sidecar's
            own directories).
        context_path_in_main: where `context_dir` appears in `main` (for `artifacts_path`).

    The paths derived from them are properties and methods (`seal_path`, `checkouts_dir`,
    `slot_tree`, ...); strings given for a field are taken as paths.
    """

    state_dir: Path
    agent_repo: Path
    context_dir: Path
    cases_dir: Path = Path(CONTAINER_PATHS.cases)
    baseline_dir: Path | None = None
    work_dir: Path = DEFAULT_WORK_DIR
    seal_root: Path | None = None
    context_path_in_main: PurePosixPath = CONTAINER_PATHS.context

    def __post_init__(self) -> None:
        for name in ("state_dir", "agent_repo", "context_dir", "cases_dir", "baseline_dir", "work_dir", "seal_root"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))
        object.__setattr__(self, "context_path_in_main", PurePosixPath(self.context_path_in_main))

    @property
    def seal_path(self) -> Path:
        """The seal record (`sealed_at`), beside the state."""
        return self.state_dir / SEAL_FILE

    @property
    def intake_path(self) -> Path:
        """The intake record (`IntakeState`: closed, when and why), beside the state."""
        return self.state_dir / INTAKE_FILE

    @property
    def state_path(self) -> Path:
        """The SQLite state store."""
        return self.state_dir / STATE_FILE

    @property
    def checkouts_dir(self) -> Path:
        """Runner-readable persistent work trees, one per evaluation slot (`slot-<n>`)."""
        return self.work_dir / "checkouts"

    def slot_tree(self, slot: int) -> Path:
        """The work tree of evaluation slot `slot`."""
        return self.checkouts_dir / f"slot-{slot}"

    def slot_index(self, slot: int) -> Path:
        """What the slot's work tree holds (git's index): root-only, beside the state."""
        return self.state_dir / "checkouts" / f"slot-{slot}.index"

    @property
    def nested_jobs_dir(self) -> Path:
        """The nested runs' Harbor job dirs (runner-writable)."""
        return self.work_dir / "jobs"

    def artifacts_dir(self, job_id: str) -> Path:
        """Where a `full` job's artifacts are written (agent-readable)."""
        return self.context_dir / job_id

    def artifacts_path_in_main(self, job_id: str) -> PurePosixPath:
        """`artifacts_dir(job_id)` as `main` sees it."""
        return self.context_path_in_main / job_id

    def own_dirs(self) -> list[Path]:
        """Every directory of the sidecar's (a seal may write into none of them)."""
        own = [self.state_dir, self.work_dir, self.context_dir, self.agent_repo, self.cases_dir]
        return own if self.baseline_dir is None else [*own, self.baseline_dir]


class SidecarService:
    """State and actions of one sidecar process.

    Create it, `await start()` (in the app's lifespan, `vero.sidecar.app.create_app`), serve,
    `await stop()`.

    Args:
        config: the served config.
        paths: where it reads and writes.
        backend: runs nested evaluations (`vero harbor serve`: `vero.harbor.HarborBackend`, nested
            `harbor run`; chosen by the composition root, `vero.sidecar.app.serve`).
        run_as: identity of nested runs; "auto" resolves `vero-runner` when root (see
            `vero.harbor.process.runner_identity`), None runs as this process.
        max_concurrent_evaluations: nested runs at once, each in its own checkout slot; further
            jobs stay `queued`. Default: the config's `harbor.max_concurrent_evaluations`.
        nested_env: extra trusted environment for every nested run (e.g. `DOCKER_HOST`).
        artifact_limits: caps on copied trial artifacts.
        principal: the principal of the agent surface.
        gateway_host: interface of the inference gateway (with `config.inference`): loopback, so
            only processes of this container (candidate hosts) reach it.

    Raises:
        ValueError: `max_concurrent_evaluations` is below 1.
    """

    def __init__(
        self,
        config: SidecarConfig,
        paths: SidecarPaths,
        backend: EvaluationBackend,
        *,
        run_as: RunAs | Literal["auto"] | None = "auto",
        max_concurrent_evaluations: int | None = None,
        nested_env: Mapping[str, str] | None = None,
        artifact_limits: ArtifactLimits | None = None,
        principal: str = AGENT_PRINCIPAL,
        gateway_host: str = "127.0.0.1",
    ) -> None:
        self.max_concurrent_evaluations = (
            config.harbor.max_concurrent_evaluations
            if max_concurrent_evaluations is None
            else max_concurrent_evaluations
        )
        if self.max_concurrent_evaluations < 1:
            raise ValueError("max_concurrent_evaluations must be at least 1")
        self.config = config
        self.paths = paths
        self.backend = backend
        self._run_as_setting = run_as
        self.run_as: RunAs | None = None
        self.nested_env = dict(nested_env or {})
        self.artifact_limits = artifact_limits or ArtifactLimits()
        self.principal = principal
        self.policy = AccessPolicy(config.agent_access, config.partitions, principals=(principal,))

        self.state: StateStore
        self.ledger: BudgetLedger
        self.jobs: JobStore
        self.candidates: CandidateStore
        self.admin_token: str | None = None
        self.submission: Submission | None = None
        self.sealed_at: datetime | None = None
        self.intake: IntakeState | None = None
        """Set once the agent phase is over (`close_intake`, or the seal): nothing more is taken."""
        self.entrance_open = True

        self.session_id: str | None = None
        self._stopping: asyncio.Event | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._views: dict[str, tuple[EvaluationJob, JobView]] = {}  # job id -> (snapshot, its view)
        self._cancel_reasons: dict[str, str] = {}
        self._slots: asyncio.Queue[int] | None = None
        self._gate: PartitionGate | None = None
        self._submit_lock: asyncio.Lock | None = None
        self._seal_lock: asyncio.Lock | None = None
        self._ladder_lock: asyncio.Lock | None = None
        self.ladders: LadderBoard
        self._admissions = 0
        self._admissions_idle: asyncio.Event | None = None
        self.gateway_host = gateway_host
        self.gateway: InferenceGateway | None = None
        self._runtime = EvaluationRuntime()
        """Each job's lease of the gateway and the case routes (`_start_gateway`)."""
        self._resources = contextlib.AsyncExitStack()
        """What `stop` closes: the gateway's server."""
        self._broken_cases: dict[str, str] = {}
        """Quarantined cases: case -> the problem code that broke it (rebuilt from the job records)."""

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the durable state, recover interrupted jobs, rebuild the baseline, write the token.

        Raises:
            LedgerCorrupt: the ledger, a job record, the submission or the seal record is unreadable.
            SpecError: the baseline files do not rebuild `config.baseline_commit`.
            InfrastructureFailure: running as root without the runner user.
            OSError: the state, work or context dir cannot be prepared.
        """
        self._slots = asyncio.Queue()
        for slot in range(self.max_concurrent_evaluations):
            self._slots.put_nowait(slot)
        self._gate = PartitionGate()
        self._submit_lock = asyncio.Lock()
        self._seal_lock = asyncio.Lock()
        self._ladder_lock = asyncio.Lock()
        self._admissions_idle = asyncio.Event()
        self._admissions_idle.set()
        self._stopping = asyncio.Event()
        self.run_as = runner_identity() if self._run_as_setting == "auto" else self._run_as_setting
        await asyncio.to_thread(self._open_state)
        self.session_id = self.state.session_id
        recovered = await recover_interrupted(self.jobs)
        for job in recovered:
            _logger.warning("job %s was interrupted by a restart: failed and refunded", job.id)
        await self._remove_leftovers()
        if self.paths.baseline_dir is not None:
            await asyncio.to_thread(self._import_baseline)
        self.admin_token = await asyncio.to_thread(generate_admin_token, self.paths.state_dir)
        if self.config.inference is not None:
            await self._start_gateway()
        _logger.info(
            "sidecar %s started (intake %s)",
            self.config.name,
            "open" if self.entrance_open else "closed: " + ("sealed" if self.sealed_at else "the agent phase is over"),
        )

    def _open_state(self) -> None:
        self.paths.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Root-only: the admin token and the trusted records must not be readable by the runner.
        if os.geteuid() == 0:
            os.chown(self.paths.state_dir, 0, 0)
        os.chmod(self.paths.state_dir, 0o700)
        totals = {
            (partition, self.principal): BudgetTotals(
                runs=access.total_runs,
                cases=access.total_cases,
                inference_micro_usd=to_micro_usd(access.total_inference_usd) if self.config.inference else 0,
            )
            for partition, access in self.config.agent_access.items()
        }
        self.state = StateStore.open(self.paths.state_path)
        self.ledger = BudgetLedger.open(self.state, totals)
        for line in self.ledger.config_drift:
            _logger.warning("budget ledger differs from the config (persisted figures kept): %s", line)
        self.jobs = JobStore(self.ledger)
        # What the Ladder disclosed is on the job records: a restart restores every best, never resets it.
        self.ladders = LadderBoard.rebuild(
            ((_ladder_key(job), job.ladder) for job in self.jobs.with_field("ladder") if job.ladder is not None),
            self.config.scoring.direction,
        )
        # A broken case stays quarantined across restarts: its failed jobs carry the problems.
        self._broken_cases = {}
        for job in self.jobs.with_field("diagnostics"):
            if job.state == "failed" and job.error in CASE_PROBLEM_CODES and job.diagnostics is not None:
                self._quarantine(job.diagnostics.problems)
        self.candidates = CandidateStore.open(self.paths.state_dir, self.state, limits=self.config.candidate_limits)
        # A crash mid-import can leave refs/vero/tmp/*; nothing imports yet, so removing them is safe.
        stale = self.candidates.remove_stale_temporary_refs()
        if stale:
            _logger.warning("removed %d temporary ref(s) left by an interrupted import", stale)
        self.submission = read_submission(self.state)
        try:
            seal = SealState.model_validate_json(self.paths.seal_path.read_bytes())
        except FileNotFoundError:
            seal = None
        except (OSError, ValidationError):
            raise LedgerCorrupt("the seal record is unreadable") from None
        if seal is not None:
            self.sealed_at = seal.sealed_at
            self.entrance_open = False
        try:
            self.intake = IntakeState.model_validate_json((self.paths.intake_path).read_bytes())
        except FileNotFoundError:
            self.intake = None
        except (OSError, ValidationError):
            raise LedgerCorrupt("the intake record is unreadable") from None
        if self.intake is not None:
            self.entrance_open = False
        self.paths.context_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.paths.context_dir, 0o755)  # the agent user in `main` reads it
        self.paths.work_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.paths.work_dir, 0o755)
        # Slot work trees persist (each update writes only what changed); anything else there is a
        # leftover of an older layout.
        self.paths.checkouts_dir.mkdir(mode=0o755, exist_ok=True)
        os.chmod(self.paths.checkouts_dir, 0o755)
        slots = {self.paths.slot_tree(slot).name for slot in range(self.max_concurrent_evaluations)}
        for entry in os.scandir(self.paths.checkouts_dir):
            if entry.name not in slots:
                if entry.is_dir(follow_symlinks=False):
                    _remove_tree(Path(entry.path))
                else:
                    os.unlink(entry.path)
        self.paths.slot_index(0).parent.mkdir(mode=0o700, exist_ok=True)
        self.paths.nested_jobs_dir.mkdir(exist_ok=True, mode=0o700)
        if self.run_as is not None:
            os.chown(self.paths.nested_jobs_dir, self.run_as.uid, self.run_as.gid)

    async def _start_gateway(self) -> None:
        """Serve the inference gateway; each job's token spends its own reservation of the ledger's
        `inference_micro_usd` (`_admission_cost`)."""
        from vero.harbor.case_route import case_router_for
        from vero.inference.gateway import GatewayServer, InferenceGateway

        assert self.config.inference is not None
        keys = {name: os.environ[name] for name in self.config.secrets if os.environ.get(name)}
        gateway = InferenceGateway(self.config.inference, keys)
        await self._resources.enter_async_context(GatewayServer(gateway, host=self.gateway_host))
        self.gateway = gateway
        bind = getattr(self.backend, "bind_hosts_to", None)
        if bind is not None:
            bind(gateway)  # each evaluation's token works from its own candidate hosts only
        _logger.info("inference gateway listening on %s", gateway.base_url)
        router = case_router_for(
            self.config.inference,
            self.config.harbor.environment,
            gateway,
            {**os.environ, **self.nested_env},
            self.session_id,
        )
        self._runtime = EvaluationRuntime(gateway, router, self.config.inference.evaluation_limit_usd)

    async def _remove_leftovers(self) -> None:
        """Remove whatever nested runs of this session left behind (containers, networks, volumes,
        sandboxes): nothing of the session runs yet, so everything labelled with it is a leftover of
        a job an earlier process did not finish (killed, or stopped before its cleanup ended)."""
        remove = getattr(self.backend, "remove_leftovers", None)
        if remove is None:
            return
        assert self.session_id is not None
        removed = await remove(
            environment=self.config.harbor.environment,
            env=self._nested_env(),
            session=self.session_id,
            options=self.config.harbor.environment_options,
        )
        if removed:
            _logger.warning("removed %d leftover(s) of earlier nested runs of this session", removed)

    def _import_baseline(self) -> None:
        from vero.core.baseline import commit_baseline

        assert self.paths.baseline_dir is not None
        if self.candidates.contains(self.config.baseline_commit):
            # Checked against the baseline files when it was first imported; the store is trusted.
            _logger.info("baseline %s already in the candidate store", self.config.baseline_commit)
            return
        if not self.paths.baseline_dir.is_dir():
            raise SpecError.at("baseline_commit", "the baseline files are missing from the sidecar image")
        with tempfile.TemporaryDirectory(prefix="vero-baseline-") as tmp:
            work_tree = Path(tmp) / "baseline"
            shutil.copytree(self.paths.baseline_dir, work_tree, symlinks=True)
            commit = commit_baseline(work_tree)
            if commit != self.config.baseline_commit:
                raise SpecError.at(
                    "baseline_commit",
                    f"the baseline files rebuild commit {commit}, not the configured {self.config.baseline_commit}",
                )
            self.candidates.import_commit_from_store(work_tree / ".git", commit)
        _logger.info("baseline %s imported", commit)

    async def begin_stop(self) -> None:
        """The process is stopping (SIGTERM): interrupt every unfinished job at once. Idempotent.

        In this order: the backend is told (`interrupt`: no kill grace from now on), every job task
        is cancelled (its nested run is killed and its leftovers removed), every unfinished job is
        failed `interrupted` and refunded in one transaction, and then held long polls are
        answered (they see the job failed). `vero.sidecar.app.serve` calls it as soon as uvicorn
        begins to shut down, before it waits for open connections.
        """
        if self._stopping is None or self._stopping.is_set():
            return
        interrupt = getattr(self.backend, "interrupt", None)
        if interrupt is not None:
            interrupt()
        for job_id, task in self._tasks.items():
            if not task.done():
                self._cancel_reasons.setdefault(job_id, "interrupted")
                task.cancel()
        try:
            # Only jobs: an open reservation without a job is not this method's to close.
            recovered = await recover_interrupted(self.jobs, reconcile_reservations=False)
            if recovered:
                _logger.warning("stopping: %d job(s) failed as interrupted and refunded", len(recovered))
        except OSError as exc:
            _logger.error(
                "stopping: interrupted jobs not recorded (%s); the next start refunds them", type(exc).__name__
            )
        finally:
            self._stopping.set()

    async def stop(self, cleanup_timeout_sec: float = 30.0) -> None:
        """`begin_stop`, then wait for the job tasks' cleanup (at most `cleanup_timeout_sec`), then
        close the store. What a cleanup cut short leaves, the next start removes."""
        await self.begin_stop()
        # A request already being answered when the stop began may have admitted a job since.
        for job_id, task in self._tasks.items():
            if not task.done():
                self._cancel_reasons.setdefault(job_id, "interrupted")
                task.cancel()
        pending = [task for task in self._tasks.values() if not task.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=cleanup_timeout_sec)
            if late:
                _logger.warning(
                    "stopping: %d job(s) still cleaning up; the next start removes what they leave", len(late)
                )
        await self._resources.aclose()
        if hasattr(self, "state"):
            self.state.close()

    # -- views -----------------------------------------------------------------------------------

    def _rule(self, job: EvaluationJob) -> DisclosureRule:
        return self.policy.rule_for(job.disclosure, job.principal, job.partition)

    def _artifacts_path(self, job: EvaluationJob) -> str | None:
        """Where `main` finds the job's artifacts, once they are written (`full` only)."""
        if not (self.paths.artifacts_dir(job.id) / "result.json").is_file():
            return None
        return str(self.paths.artifacts_path_in_main(job.id))

    def disclose(self, job: EvaluationJob) -> DisclosedResult | None:
        """What the agent may see of a finished job (`vero.sidecar.disclosure.disclose` under the
        job's rule now)."""
        rule = self._rule(job)
        return disclose(job, rule, self._artifacts_path(job) if rule.tier == "full" else None)

    def _quarantine(self, problems: list[CaseProblem]) -> None:
        for problem in problems:
            self._broken_cases.setdefault(problem.case, problem.code)

    def view(self, job: EvaluationJob) -> JobView:
        """The agent's view of a job (`vero.sidecar.disclosure.job_view` under the job's rule now).

        Built once per job snapshot: `JobStore` returns the same object while a job's record is
        unchanged, and the view depends only on the snapshot, the policy (fixed for the process)
        and the artifacts, which are written before the job turns `complete`. The cache is bounded.
        """
        cached = self._views.get(job.id)
        if cached is not None and cached[0] is job:
            return cached[1]
        rule = self._rule(job)
        view = job_view(job, rule, self._artifacts_path(job) if rule.tier == "full" else None)
        self._views[job.id] = (job, view)
        while len(self._views) > _VIEW_CACHE_SIZE:
            del self._views[next(iter(self._views))]
        return view

    def summary(self, job: EvaluationJob) -> JobView:
        """`view` without per-case results (lists: `GET /status`, `GET /evaluations`)."""
        return summary_view(self.view(job))

    def status(self, principal: str) -> StatusResponse:
        """`GET /status` for `principal`, in one read of the state store: partitions, budgets (unless
        hidden), job counts per partition and state, the newest jobs (at most `RECENT_JOBS_IN_STATUS`
        and `RECENT_JOBS_MAX_BYTES` of them, without per-case results), the submission.

        What the history adds is bounded whatever it holds: the jobs' bytes, one submission (a
        256-character version) and a count per visible partition and state; the rest is the spec's
        (partitions, their cases and blocks).
        """

        def read(_conn: object) -> StatusResponse:
            partitions = []
            for name, access in self.policy.visible(principal).items():
                budget = None
                if self.config.disclose_budget:
                    balance = self.ledger.balance(name, principal)
                    metered = self.config.inference is not None
                    # What is left moves with what the candidates spent, which they choose: on a
                    # `none` partition, or under the Ladder, it would disclose what the tier withholds.
                    spend_disclosed = access.disclosure != "none" and self.policy.ladder(principal, name) is None
                    budget = BudgetView(
                        total_runs=balance.total_runs,
                        total_cases=balance.total_cases,
                        remaining_runs=balance.remaining_runs,
                        remaining_cases=balance.remaining_cases,
                        total_inference_usd=balance.total_inference_micro_usd / 1e6 if metered else None,
                        remaining_inference_usd=balance.remaining_inference_micro_usd / 1e6
                        if metered and spend_disclosed
                        else None,
                    )
                blocks = self.policy.blocks(principal, name)
                ladder = self.policy.ladder(principal, name)
                partitions.append(
                    PartitionStatus(
                        name=name,
                        disclosure=access.disclosure,
                        min_aggregate_cases=access.min_aggregate_cases,
                        cases=list(self.policy.cases(principal, name)),
                        blocks=[list(block) for block in blocks] if blocks else None,
                        ladder=None
                        if ladder is None
                        else LadderView(margin=ladder.margin, precision=ladder.effective_precision),
                        budget=budget,
                    )
                )
            counts = self.jobs.counts(principal)
            recent = self.jobs.page(principal, limit=RECENT_JOBS_IN_STATUS)
            return StatusResponse(
                name=self.config.name,
                entrance_open=self.entrance_open,
                submit_enabled=self.config.submit_enabled,
                partitions=partitions,
                n_jobs=sum(n for states in counts.values() for n in states.values()),
                job_counts=counts,
                jobs=self._newest_that_fit([self.summary(job) for job in recent.jobs]),
                submission=None if self.submission is None else submission_view(self.submission),
            )

        return self.state.read(read)

    @staticmethod
    def _newest_that_fit(views: list[JobView]) -> list[JobView]:
        """The longest prefix of `views` (newest first) whose JSON fits in `RECENT_JOBS_MAX_BYTES`."""
        used = 0
        for n, view in enumerate(views):
            used += len(view.model_dump_json().encode())
            if used > RECENT_JOBS_MAX_BYTES:
                return views[:n]
        return views

    def evaluations(
        self,
        principal: str,
        *,
        limit: int,
        before: str | None = None,
        partition: str | None = None,
        state: str | None = None,
    ) -> EvaluationPage:
        """`GET /evaluations`: `principal`'s jobs newest first, one page (without per-case results).

        Args:
            limit: page size, 1..`MAX_PAGE_SIZE`.
            before: the previous page's `next_cursor` (a job id); None starts at the newest.
            partition, state: optional filters.

        Raises:
            UnknownJob: `before` is not one of `principal`'s jobs.
        """
        page = self.jobs.page(
            principal, limit=min(limit, MAX_PAGE_SIZE), before=before, partition=partition, state=state
        )
        return EvaluationPage(jobs=[self.summary(job) for job in page.jobs], next_cursor=page.next_cursor)

    def evaluation(self, principal: str, job_id: str) -> JobView:
        """`GET /evaluations/{id}`.

        Raises:
            UnknownJob: no such job, or another principal's.
            InfrastructureFailure: the job failed for infrastructure reasons (refunded); the route
                answers 502 so the client raises the same class.
            CaseMisconfigured: the job failed on a broken case (refunded; 502 with the problem's code).
        """
        return self.view(self._answerable_job(principal, job_id))

    def _answerable_job(self, principal: str, job_id: str) -> EvaluationJob:
        job = self.jobs.get(job_id)
        if job.principal != principal:
            raise UnknownJob("no evaluation job with this id")
        if job.state == "failed" and job.error == _INFRA_ERROR:
            raise InfrastructureFailure("the evaluation failed for infrastructure reasons; refunded")
        if job.state == "failed" and job.error in CASE_PROBLEM_CODES:
            raise case_problem(
                self.policy.rule_for(job.disclosure, principal, job.partition), job.error, broken_cases(job)
            )
        return job

    async def wait_evaluation(self, principal: str, job_id: str, wait_sec: float) -> JobView:
        """`GET /evaluations/{id}?wait_sec=N`: like `evaluation`, after waiting up to `wait_sec`
        seconds for the job to finish (a long poll: the agent learns of completion at once
        instead of at its next poll), or until the sidecar stops. The job itself is never affected
        by the wait ending.

        Raises:
            UnknownJob, InfrastructureFailure: as `evaluation` (checked before and after waiting).
        """
        self._answerable_job(principal, job_id)
        task = self._tasks.get(job_id)
        if task is not None and wait_sec > 0 and self._stopping is not None and not self._stopping.is_set():
            # Answered at once when the sidecar stops (the job is then failed `interrupted`).
            _logger.debug("job %s: long poll for up to %g s", job_id, wait_sec)
            stopping = asyncio.ensure_future(self._stopping.wait())
            try:
                await asyncio.wait({task, stopping}, timeout=wait_sec, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
        return self.evaluation(principal, job_id)

    # -- evaluations -----------------------------------------------------------------------------

    def _check_entrance(self) -> None:
        if not self.entrance_open:
            raise EvaluationsClosed(_INTAKE_CLOSED_TEXT + ": no further evaluation")

    async def start_evaluation(self, principal: str, request: EvaluationRequest) -> JobView:
        """Admit an evaluation and start it detached.

        Order: entrance -> policy -> candidate import -> entrance again -> reservation and job record
        (one transaction). Nothing is charged unless every earlier step passed.

        Raises:
            EvaluationsClosed: intake is closed (the agent phase is over, or the session is sealed).
            PolicyDenied: unknown, hidden or non-accessible partition; bad case
                or block selection; an `aggregate` selection that is not a union of whole blocks.
            CaseMisconfigured: the selection holds a quarantined case (a case an earlier evaluation
                found broken whatever the candidate): refused before anything is charged or run.
            CandidateRejected: the version cannot be imported.
            BudgetExhausted: the partition's runs or cases are used up.
        """
        self._check_entrance()
        grant = self.policy.authorize(principal, request.partition, request.cases, request.blocks)
        broken = [case for case in grant.cases if case in self._broken_cases]
        if broken:
            rule = self.policy.rule_for(grant.disclosure, principal, grant.partition)
            raise case_problem(rule, self._broken_cases[broken[0]], broken)
        assert self._admissions_idle is not None
        self._admissions += 1
        self._admissions_idle.clear()
        try:
            record = await self.candidates.import_version(self.paths.agent_repo, request.version)
            # Sealing may have begun during the import; it waits for admissions, which stop here.
            self._check_entrance()
            job_id = JobStore.new_id()
            job = EvaluationJob(
                id=job_id,
                principal=principal,
                partition=grant.partition,
                cases=list(grant.cases),
                full_partition=grant.full_partition,
                version=request.version,
                candidate=record.id,
                disclosure=grant.disclosure,
                reservation_id=job_id,
                created_at=_now(),
            )
            # One transaction: a job never exists without its reservation, nor a reservation without it.
            job, _ = await self.jobs.admit(job, self._admission_cost(len(grant.cases)))
            self._tasks[job.id] = asyncio.create_task(self._run_job(job.id), name=f"vero-job-{job.id}")
            _logger.info("job %s admitted: %d case(s), candidate %s", job.id, len(job.cases), record.id)
            return self.view(job)
        finally:
            self._admissions -= 1
            if self._admissions == 0:
                self._admissions_idle.set()

    def _nested_env(self) -> dict[str, str]:
        """The trusted `nested_env` and the secrets by name for nested runs, except the provider
        keys only the gateway holds (`vero.core.run.nested_secret_env`); the lease adds the case
        route's variables."""
        gateway_keys = provider_key_names(self.config.inference)
        for name in self.config.secrets:
            if name not in gateway_keys and name not in os.environ:
                _logger.warning("secret %s is not set in the sidecar's environment", name)
        # Client settings are optional, unlike secrets: passed only when set (`vero.spec.environments`).
        settings = {name: os.environ[name] for name in self.config.settings if os.environ.get(name)}
        return {
            **self.nested_env,
            **nested_secret_env(self.config.secrets, os.environ, self.config.inference),
            **settings,
        }

    def _secret_values(self) -> list[str]:
        return [os.environ[name] for name in self.config.secrets if os.environ.get(name)]

    def _checkout(self, candidate: str, slot: int) -> Path:
        """The slot's persistent work tree, brought to `candidate` (only changed files written)."""
        update = self.candidates.update_worktree(candidate, self.paths.slot_tree(slot), self.paths.slot_index(slot))
        _make_readable(update.path, update.changed)
        return update.path

    def _nested_run(self, job: EvaluationJob, checkout: Path) -> NestedRun:
        """The nested run of `job` over its slot's `checkout` (the lease adds the gateway's part)."""
        return NestedRun(
            evaluation_id=job.id,
            partition=job.partition,
            candidate=job.candidate,
            candidate_dir=checkout,
            cases_dir=self.paths.cases_dir,
            case_names=tuple(job.cases),
            jobs_dir=self.paths.nested_jobs_dir,
            runtime=self.config.runtime,
            harbor=self.config.harbor,
            scoring=self.config.scoring,
            env=self._nested_env(),
            run_as=self.run_as,
            session=self.session_id,
            # The judge of a case where the candidate cannot be installed: the baseline (the
            # baseline itself is judged by its own attempts).
            baseline_dir=checkout if job.candidate == self.config.baseline_commit else self.paths.baseline_dir,
            # Its model calls spend its own reservation of the partition's inference money.
            inference_budget_micro_usd=self.ledger.reservation(job.reservation_id).cost.inference_micro_usd,
        )

    def _admission_cost(self, n_cases: int) -> Cost:
        """What admitting an evaluation of `n_cases` reserves: a run, its cases and, with a gateway,
        up to `evaluation_limit_usd` of inference money (all that is left without one; the ledger
        takes what is left when that is less: `vero.core.ledger.UP_TO_RESOURCES`)."""
        inference = self.config.inference
        if inference is None:
            return Cost.of_evaluation(n_cases)
        limit = inference.evaluation_limit_usd
        wanted = to_micro_usd(limit) if limit is not None else 2**62  # everything that is left
        return Cost.of_evaluation(n_cases, inference_micro_usd=wanted)

    async def _run_job(self, job_id: str) -> None:
        lease: EvaluationLease | None = None

        def spent_by_calls() -> int:
            # What a cancelled job's model calls were charged stays charged (the provider billed
            # them; refunding would let an agent spend its inference money again by cancelling).
            return lease.usage.charged_micro_usd if lease is not None and lease.usage is not None else 0

        shown_at: datetime | None = None  # `none` tier: when the job is shown finished
        measured: EvaluationResult | None = None
        turn_at: datetime | None = None  # when it got its gate and slot (its creation if it did not wait)

        async def hold_until_shown(admitted: EvaluationJob) -> None:
            # On a `none` partition the job stays `running`, in its slot and its gate, until a time
            # that does not depend on what the candidate did (`_shown_finish`).
            nonlocal shown_at
            shown_at = self._shown_finish(admitted, turn_at or admitted.created_at)
            if shown_at is not None:
                await asyncio.sleep(max(0.0, (shown_at - _now()).total_seconds()))

        try:
            assert self._slots is not None and self._gate is not None
            admitted = self.jobs.get(job_id)
            exclusive = self.config.runtime.kind == "agent"  # candidate hosts share this container
            # Whether it will wait for its turn (nothing can change before the acquisitions below
            # run: neither waits when it need not, so no other task runs in between).
            waits = (exclusive and self._gate.would_wait(admitted.partition)) or self._slots.empty()
            async with self._gate.enter(admitted.partition) if exclusive else contextlib.nullcontext():
                slot = await self._slots.get()
                turn_at = _now() if waits else admitted.created_at
                try:
                    try:
                        job = await self.jobs.update(job_id, state="running", started_at=_now())
                        checkout = await asyncio.to_thread(self._checkout, job.candidate, slot)
                        lease = self._runtime.lease(self._nested_run(job, checkout))
                        async with lease as run:
                            result = await self.backend.evaluate(run)
                        # Model calls that never reached their provider: infrastructure, refunded.
                        measured = result = lease.settle(result)
                    except Exception:
                        await hold_until_shown(admitted)  # a failure is shown at the same time
                        raise
                    await hold_until_shown(admitted)
                finally:
                    self._slots.put_nowait(slot)
                await self._complete(job, result, finished_at=shown_at)
        except asyncio.CancelledError:
            reason = self._cancel_reasons.pop(job_id, "interrupted")
            # A job already complete was settled with its result: a measurement stays charged.
            state_now = self.jobs.get(job_id).state
            if measured is not None and state_now not in TERMINAL_STATES:
                # Measured (a `none` job held until its time): the measurement stands, charged.
                try:
                    await finish_uncancellable(self._complete(self.jobs.get(job_id), measured))
                except Conflict:
                    _logger.info("job %s had already been ended by the stop", job_id)
            elif state_now not in TERMINAL_STATES:
                state: Literal["failed", "cancelled"] = "cancelled" if reason in ("sealed", "cancelled") else "failed"
                await self._close_unmeasured(job_id, state, reason, inference_charged_micro_usd=spent_by_calls())
            raise
        except CaseMisconfigured as exc:
            # Broken whatever the candidate: refunded, and quarantined so it is not refunded without end.
            self._quarantine(exc.problems)
            _logger.warning(
                "job %s: case problem %s (%s); refunded and quarantined",
                job_id,
                exc.code,
                ", ".join(sorted({p.case for p in exc.problems})),
            )
            await self._close_unmeasured(job_id, "failed", exc.code, _diagnostics_of(exc), finished_at=shown_at)
        except InfrastructureFailure as exc:
            _logger.warning("job %s: infrastructure failure; refunded", job_id)
            await self._close_unmeasured(job_id, "failed", _INFRA_ERROR, _diagnostics_of(exc), finished_at=shown_at)
        except Exception as exc:
            # Nothing was measured: treat as infrastructure (refunded), keep the details in the log only.
            _logger.error("job %s failed unexpectedly (%s); refunded", job_id, type(exc).__name__, exc_info=exc)
            await self._close_unmeasured(job_id, "failed", _INFRA_ERROR, finished_at=shown_at)
        finally:
            self._tasks.pop(job_id, None)

    def timing_quantum_sec(self, partition: str) -> float | None:
        """The timing quantum of a `none` partition in seconds (`vero.spec.models.timing_quantum_sec`);
        None on other tiers."""
        access = self.config.agent_access.get(partition)
        return None if access is None else timing_quantum_sec(access, self.config.harbor)

    def _shown_finish(self, job: EvaluationJob, turn_at: datetime) -> datetime | None:
        """When a job of a `none` partition is shown finished: `turn_at + k * quantum` for the least
        k >= 1 not before now (a run longer than a quantum shows at the next multiple); None on
        other tiers (shown when it ends).

        `turn_at` is its admission (`created_at`) when it got a slot (and, for `kind: agent`, its
        partition's gate) at once, else the moment it got them: a time the agent sees anyway (the
        end of the job it waited for), so that how long the run took never combines with how long
        the job waited (k would otherwise tell whether the run took longer than a threshold the
        agent chose by timing its request)."""
        if self._rule(job).tier != "none":
            return None
        quantum = self.timing_quantum_sec(job.partition)
        if quantum is None:
            return None
        elapsed = (_now() - turn_at).total_seconds()
        k = max(1, math.ceil(elapsed / quantum))
        return turn_at + timedelta(seconds=k * quantum)

    async def _complete(
        self, job: EvaluationJob, result: EvaluationResult, *, finished_at: datetime | None = None
    ) -> None:
        disclosure = self._rule(job)
        if disclosure.tier == "full":
            await self._write_artifacts(job, result)
        rule = disclosure.ladder
        if rule is None or not covers_granted_cases(job, result):
            # Not judged by the Ladder (`disclose` shows no score for it on a Ladder partition). One
            # transaction: the result, the terminal state and the settle.
            job = await self.jobs.finish(job.id, "complete", result=result, finished_at=finished_at)
        else:
            assert self._ladder_lock is not None
            # Decide, record durably with the terminal state and the settle, then move the best: under
            # one lock, so two evaluations finishing at once are judged one after the other, never
            # against a stale best.
            async with self._ladder_lock:
                key = _ladder_key(job)
                decision = self.ladders.decide(key, result.score, rule)
                try:
                    job = await self.jobs.finish(job.id, "complete", result=result, ladder=decision)
                finally:
                    # A cancelled caller may still have landed the transaction (it runs to completion):
                    # follow the store, never the intention.
                    landed = self.jobs.get(job.id).ladder
                    if landed is not None:
                        self.ladders.record(key, landed)
        _logger.info(
            "job %s complete: score %s over %d case(s)%s",
            job.id,
            result.score,
            result.n_cases,
            "" if job.ladder is None else f" (ladder: improved={job.ladder.improved})",
        )

    async def _write_artifacts(self, job: EvaluationJob, result: EvaluationResult) -> None:
        preview = job.model_copy(update={"state": "complete", "result": result})
        disclosed = self.disclose(preview)
        payload = {
            "job": job.id,
            "partition": job.partition,
            "candidate": job.candidate,
            "result": disclosed.model_dump(mode="json", exclude={"artifacts_path"}) if disclosed else None,
        }
        try:
            await asyncio.to_thread(
                copy_trial_artifacts,
                result,
                payload,
                self.paths.artifacts_dir(job.id),
                secret_values=self._secret_values(),
                limits=self.artifact_limits,
            )
        except OSError as exc:
            _logger.error("job %s: trial artifacts not copied (%s)", job.id, type(exc).__name__)

    async def _close_unmeasured(
        self,
        job_id: str,
        state: Literal["failed", "cancelled"],
        error: str,
        diagnostics: RunDiagnostics | None = None,
        *,
        finished_at: datetime | None = None,
        **recorded: Any,
    ) -> None:
        """End a job that measured nothing and refund it, in one transaction (no-op if already ended);
        `diagnostics` (the causes, for the operator) and `recorded` (further job fields, e.g.
        `inference_charged_micro_usd`: the inference money that stays charged; unset: its model
        calls are given back, as for an infrastructure failure) are recorded with the end."""
        try:
            fields: dict[str, Any] = {"diagnostics": diagnostics} if diagnostics is not None else {}
            fields.update(recorded)
            await self.jobs.finish(job_id, state, error=error, finished_at=finished_at, **fields)
        except Conflict:
            _logger.info("job %s had already finished", job_id)

    # -- submissions -----------------------------------------------------------------------------

    async def submit(self, principal: str, version: str) -> tuple[SubmissionView, bool]:
        """Record `version` (imported as a candidate first) as the one the verifier scores.

        Returns:
            The submission and whether it changed (False when the same candidate was already submitted).

        Raises:
            Conflict: submissions are disabled (`auto_best`).
            SubmissionsClosed: intake is closed (the agent phase is over, or the session is sealed).
            CandidateRejected: the version cannot be imported.
        """
        if not self.config.submit_enabled:
            raise Conflict("submissions are disabled for this task: the verifier selects the best evaluated candidate")
        if not self.entrance_open:
            raise SubmissionsClosed(_INTAKE_CLOSED_TEXT + ": no further submission")
        assert self._submit_lock is not None
        async with self._submit_lock:
            record = await self.candidates.import_version(self.paths.agent_repo, version)
            if not self.entrance_open:
                raise SubmissionsClosed(_INTAKE_CLOSED_TEXT + ": no further submission")
            if self.submission is not None and self.submission.candidate == record.id:
                return submission_view(self.submission), False
            submission = Submission(candidate=record.id, version=version, submitted_at=_now())
            await record_submission(self.state, submission)
            self.submission = submission
            _logger.info("submission recorded: candidate %s", record.id)
            return submission_view(submission), True

    # -- intake ----------------------------------------------------------------------------------

    async def close_intake(self, reason: Literal["agent_ended", "sealed"]) -> IntakeView:
        """The agent phase is over: take no further evaluation or submission (`vero.sidecar.intake`).

        Closes the entrance at once, waits for admissions and a submission already past their
        last check (so every job and the submission predate `closed_at`), then records the close
        durably. Idempotent: a later call answers the first close. Running jobs go on (the seal
        drains them).

        Raises:
            StorageFull: the record could not be written (the entrance stays closed; a retry writes it).
        """
        assert self._admissions_idle is not None and self._submit_lock is not None
        if self.intake is None:
            self.entrance_open = False
            await self._admissions_idle.wait()
            async with self._submit_lock:
                pass
            if self.intake is None:  # a concurrent call may have recorded it meanwhile
                closed = IntakeState(closed_at=_now(), reason=reason)
                try:
                    await asyncio.to_thread(atomic_write_model, self.paths.intake_path, closed)
                except OSError as exc:
                    if is_out_of_space(exc):
                        raise StorageFull("the intake record could not be written: a file system is full") from None
                    raise
                self.intake = closed
                _logger.info("intake closed (%s): no further evaluation or submission", reason)
        return IntakeView(closed_at=self.intake.closed_at, reason=self.intake.reason)

    # -- admin -----------------------------------------------------------------------------------

    async def seal(self, output_dir: Path) -> SealResponse:
        """Close the entrance, drain, cancel and refund stragglers, write the session archive.

        Idempotent: a second call skips the drain and writes the same bytes (the persisted
        `sealed_at` is reused and nothing changes after the first seal).

        Raises:
            RequestInvalid: `output_dir` lies outside `seal_root` or inside one of the sidecar's own
                directories (checked before anything changes), or the archive cannot be written there (permissions, a
                read-only file system, a file in the way); the session stays sealed and a retry with
                another directory writes it.
            StorageFull: a file system is full (the seal record, the staging dir or `output_dir`);
                a retry once there is room writes the archive.
            GitFailed: git could not bundle the candidate store.
        """
        assert self._seal_lock is not None and self._admissions_idle is not None
        self._check_seal_output(Path(output_dir))
        async with self._seal_lock:
            n_cancelled = 0
            if self.sealed_at is None:
                await self.close_intake("sealed")
                pending = [task for task in self._tasks.values() if not task.done()]
                if pending:
                    _logger.info(
                        "sealing: draining %d job(s) for up to %ss", len(pending), self.config.harbor.drain_timeout_sec
                    )
                    _, still = await asyncio.wait(pending, timeout=self.config.harbor.drain_timeout_sec)
                    for job_id, task in list(self._tasks.items()):
                        if task in still:
                            self._cancel_reasons[job_id] = "sealed"
                            task.cancel()
                            n_cancelled += 1
                    if still:
                        await asyncio.gather(*still, return_exceptions=True)
                sealed_at = _now()
                await asyncio.to_thread(atomic_write_model, self.paths.seal_path, SealState(sealed_at=sealed_at))
                self.sealed_at = sealed_at
                _logger.info("session sealed (%d job(s) cancelled and refunded)", n_cancelled)
            archive = Path(output_dir) / "session.tar.gz"
            try:
                digest = await asyncio.to_thread(
                    write_session_archive,
                    self.paths.state_dir,
                    archive,
                    name=self.config.name,
                    spec_digest=self.config.spec_digest,
                    baseline_commit=self.config.baseline_commit,
                    sealed_at=self.sealed_at,
                    state=self.state,
                )
            except (OSError, GitFailed) as exc:
                if is_out_of_space(exc):
                    raise StorageFull("the session archive could not be written: a file system is full") from None
                if isinstance(exc, OSError):
                    raise RequestInvalid(
                        "invalid request: output_dir: the session archive cannot be written "
                        f"there ({exc.strerror or type(exc).__name__})"
                    ) from None
                raise
            return SealResponse(archive=str(archive), sha256=digest, sealed_at=self.sealed_at, n_cancelled=n_cancelled)

    def _check_seal_output(self, output_dir: Path) -> None:
        """Refuse an `output_dir` outside `seal_root` or inside the sidecar's own directories
        (symlinks resolved): the
        archive holds every trusted record and must never land where the agent or a candidate
        reads (context dir, agent repository, work dir) or inside the state it describes."""
        target = Path(os.path.realpath(output_dir))
        if self.paths.seal_root is not None and not target.is_relative_to(os.path.realpath(self.paths.seal_root)):
            raise RequestInvalid(f"invalid request: output_dir: must be inside {self.paths.seal_root}")
        for directory in self.paths.own_dirs():
            if target.is_relative_to(os.path.realpath(directory)):
                raise RequestInvalid(
                    "invalid request: output_dir: must not be inside the sidecar's own "
                    "directories (state, work, context, cases, agent repository)"
                )

    def export(self) -> ExportResponse:
        """Every trusted record, for operators, from one snapshot of the state store."""
        state = SessionState.model_validate(self.state.export())
        return ExportResponse(
            name=self.config.name,
            spec_digest=self.config.spec_digest,
            baseline_commit=self.config.baseline_commit,
            entrance_open=self.entrance_open,
            sealed_at=self.sealed_at,
            jobs=state.jobs,
            balances=balances_of(state.budgets),
            reservations=state.reservations,
            candidates=state.candidates,
            submission=state.submission,
        )


def _diagnostics_of(error: InfrastructureFailure) -> RunDiagnostics | None:
    """The causes an `InfrastructureFailure` carries (`vero.harbor.causes`), if any."""
    return error.diagnostics if isinstance(error.diagnostics, RunDiagnostics) else None
