"""`HarborBackend`: measure a candidate with nested `harbor run`s (docs/architecture.md, "Nested runs").

One evaluation is one or more *rounds*; each round is one `harbor run` (job `<evaluation_id>` for
the first, `<evaluation_id>.retry-<n>` for retries, all in `run.jobs_dir`):

0. Checks that cannot be the candidate's fault: the evaluation id is a portable job name, (when
   switching users) `run_as` can read the checkout and the cases and write the jobs dir and its
   home, and every selected case can be run here (`vero.harbor.case_checks`, in a fresh process
   as `run_as` with the nested run's environment, once per case and process: a valid Harbor task,
   every host variable it requires available, its setup accepted by the environment). A failure
   is `InfrastructureFailure` (or `ValueError` for a bad id), or `CaseMisconfigured` naming the
   problem's code, so that a sidecar or case mistake is never charged to the candidate.
1. `kind: agent` only: a **pre-flight** starts a candidate host (`vero.harbor.boundary`: a child
   process as a throw-away user, with none of this process's environment) that imports and
   constructs the candidate's agent class the way Harbor's `AgentFactory.create_agent_from_config`
   does and checks it is a `BaseAgent`. A failure here is the candidate's: every selected case gets
   `n_attempts` dead attempts whose exception type is the root cause (a missing module reads
   `ModuleNotFoundError`, a hang past `preflight_timeout_sec` reads `AgentImportTimeoutError`); the
   result is returned and charged. Only what the host reports *before* any candidate code ran
   (Harbor not importable, checkout unreadable, no host could start) is an infrastructure failure.
2. Round: run Harbor over the cases still unmeasured, then read the job dir (`vero.harbor.results`).
   Scored and dead attempts are kept; infrastructure attempts are dropped. A case with at least one
   kept attempt is measured.
3. If cases remain unmeasured (no trial at all: engine unreachable, build failure, crash; or only
   infrastructure trials), the round is retried for those cases with back-off (tenacity; at most
   `harbor.infra_retries` retries; the wait is `HarborBackend(infra_wait=...)`). Still unmeasured
   afterwards: `InfrastructureFailure`, never a zero score (the caller refunds).
4. `kind: program`: a case where every attempt failed to install the candidate (`install_failed`)
   is judged by the baseline (`vero.harbor.install_witness`, with `NestedRun.baseline_dir`): if the
   baseline fails to install there too, `CaseMisconfigured` (`install_failed`), else the attempts
   stand as the candidate's.

Timeouts are the candidate's. Each round is limited to `harbor.evaluation_timeout_sec` (the compiler
checks that it fits the cases' own timeouts, `vero.compiler.time_fit`); past it the process group is
killed (Harbor cancels its trials: a trial cancelled after its candidate started reads as
`timed_out`), the Docker resources of the job's trials are removed, and the finished trials are
read. Then every attempt of the round that did not finish (no result, never started, killed) is a
`timed_out` dead attempt at the failure value, and the result stands: charged, like any other
measurement. Only a case whose trials this round were all shown to be infrastructure makes the
evaluation an `InfrastructureFailure` (no retry: the wall clock is spent). So a candidate that hangs
gets a complete, charged result; the caller cannot tell "hung" from "slow" by a refund.
Cancellation kills the group, removes the leftovers, and propagates.
Leftovers are found by the labels every round puts on its environments (`vero.session`,
`vero.job`: `vero.harbor.leftovers`) and by the trial dirs of its job dir. After `interrupt()` (the
process is stopping) the group is killed without a grace period and the removal is one quick pass.

Diagnostics and secrets: the last `tail_bytes` of Harbor's merged output, secret values scrubbed,
go to the trusted log `<jobs_dir>/<job_name>.harbor.log` (mode 0600) and the `vero.harbor` logger,
never into exception messages. The same tails, the case problems and each failed trial's exception
(`vero.harbor.causes`) travel as `RunDiagnostics` on the result (`EvaluationResult.diagnostics`)
or on the raised `InfrastructureFailure.diagnostics`: trusted records, never disclosed. After each
round every text file of the job dir is scrubbed of the values of `NestedRun.env` too (Harbor only
scrubs variables whose *name* looks sensitive). The environment itself is never logged. Messages
name no case, partition or secret.
The jobs dir is writable by `run_as`, so every file written there by this (possibly root) process
(job config, compose file, trusted log, scrubbed trial files) replaces whatever sits at its path
(`vero.core.storage.atomic_write_bytes`): a link planted by candidate code is never written through.

Process boundary (kind `agent`): Harbor imports only vero's trusted `CandidateAgent`
(`vero.harbor.boundary.agent`); the candidate's class runs in candidate hosts started by this
process's `CandidateLauncher` for the evaluation (socket reachable only by `run_as`), as throw-away
uids that cannot read the cases, the job dir or any trusted state, and whose processes are all
killed when their trial ends and when the evaluation ends. The candidate checkout is not on the
`harbor` process's `PYTHONPATH`. `NestedRun.candidate_env` (the inference gateway's URLs and token)
reaches the hosts only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import tenacity

from vero.core.diagnostics import CaseProblem
from vero.core.evaluation import AttemptOutcome, AttemptResult, CaseResult, EvaluationResult
from vero.core.run import NestedRun
from vero.core.storage import atomic_write_bytes, is_out_of_space
from vero.errors import CaseMisconfigured, InfrastructureFailure
from vero.harbor.boundary import CandidateLauncher
from vero.harbor.boundary.fence import FenceUnavailable, NetworkFence, endpoints_of
from vero.harbor.boundary.launcher import HostBinding
from vero.harbor.boundary.preflight import preflight_in_host
from vero.harbor.case_checks import CASE_CHECKS_MARK
from vero.harbor.case_route import case_route_compose
from vero.harbor.causes import CauseLog
from vero.harbor.command import (
    INSTALL_AGENT_IMPORT_PATH,
    AgentTimeoutPlan,
    HarborCommand,
    build_command,
    declared_agent_timeouts,
    find_harbor_executable,
    nested_env,
    plan_agent_timeout,
    scrub,
)
from vero.harbor.install_witness import WITNESS_JOB_SUFFIX, judge_install_failures
from vero.harbor.leftovers import (
    compose_labels,
    engine_reachable,
    modal_options,
    new_session_id,
    remove_docker_leftovers,
    terminate_modal_sandboxes,
)
from vero.harbor.process import ProcessOutcome, finish_uncancellable, run_process_group
from vero.harbor.results import JobCollation, collate_job, merge_outcomes

__all__ = ["EVALUATION_TIMEOUT_EXCEPTION", "PREFLIGHT_TIMEOUT_EXCEPTION", "HarborBackend"]

logger = logging.getLogger("vero.harbor")

PREFLIGHT_TIMEOUT_EXCEPTION = "AgentImportTimeoutError"
"""Exception type recorded on dead attempts when the candidate's agent class took longer than the
pre-flight limit to import and construct."""

EVALUATION_TIMEOUT_EXCEPTION = "EvaluationTimeoutError"
"""Exception type recorded on the `timed_out` attempts vero adds for trials that never finished
before `harbor.evaluation_timeout_sec` ran out."""

_CASE_CHECKS: dict[tuple, tuple[CaseProblem, ...]] = {}
"""Per process: (cases dir, case, environment, available names, uid) -> that case's problems.
Cases do not change under a running sidecar or verifier, so each is checked once."""

_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SCRUB_MAX_BYTES = 16 * 1024 * 1024


class _Unmeasured(Exception):
    """A round left cases without any kept attempt (internal; retried, then InfrastructureFailure)."""

    def __init__(self, n_unmeasured: int, reason: str):
        super().__init__(f"{n_unmeasured} case(s) unmeasured: {reason}")
        self.n_unmeasured = n_unmeasured
        self.reason = reason


def _now() -> datetime:
    return datetime.now(UTC)


def _dedupe(names: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(names))


class HarborBackend:
    """The real `EvaluationBackend`: nested `harbor run`s on the machine running the sidecar or verifier.

    Args:
        harbor_executable: the `harbor` to run; default `find_harbor_executable()` (the one next to
            `sys.executable`, else on `PATH`).
        python_executable: interpreter of the `kind: agent` candidate hosts; default the `python`
            next to `harbor_executable`, else `sys.executable` (it must see Harbor and vero, and be
            runnable by any uid: hosts run as throw-away users).
        infra_wait: tenacity wait strategy (any callable of the retry state returning seconds)
            between infrastructure retries; default exponential back-off of 5, 10, 20, ... seconds,
            at most 120 s. Tests pass `tenacity.wait_none()`.
        kill_grace_sec: seconds between SIGTERM and SIGKILL of the process group.
        preflight_timeout_sec: limit of the `kind: agent` pre-flight (import and construction).
        tail_bytes: how much of Harbor's output is kept for the trusted log.
        base_env: environment the allow-listed variables are inherited from (default `os.environ`).
        case_kit: the static case kit uploaded into every case (program cases: the candidate sandbox;
            agent cases: transfers as the agent user and the clean case); default found or built on
            the first evaluation (`vero.harbor.casekit.kit_binary`). Must be readable by `run_as`.
        session: labels the runs that name no `NestedRun.session` (default: a fresh `ses-` id;
            the verifier passes a `verify-` id).
        case_check_timeout_sec: limit of the case check process (`vero.harbor.case_checks`).
        check_cases: run that check before each evaluation (`vero harbor check` turns it off: it
            has checked the cases itself).
        program_agent: the Harbor agent of `kind: program` runs (`module:Class`): vero's install agent,
            or `vero harbor check --probe`'s probe agent (`vero.harbor.probe`).
        agent_kwargs: `kind: program`: further `--ak` arguments of `program_agent`; `kind: agent`:
            keyword arguments of the candidate's agent class (`CandidateAgent`'s `candidate_kwargs`:
            `vero harbor check --probe` gives its planted probe agent the reward key this way).
        isolate_candidates: `kind: agent`: run candidate hosts as throw-away uids (default: when this
            process is root; `vero.harbor.boundary.CandidateLauncher`). `vero harbor check` turns it
            off: it runs the operator's own baseline and reference, and the operator's interpreter
            need not be runnable by other users (one under `/root` is not).
    """

    def __init__(
        self,
        *,
        harbor_executable: Path | None = None,
        python_executable: Path | None = None,
        infra_wait: Callable[[tenacity.RetryCallState], float] | None = None,
        kill_grace_sec: float = 15.0,
        preflight_timeout_sec: float = 120.0,
        tail_bytes: int = 4096,
        base_env: Mapping[str, str] | None = None,
        case_kit: Path | None = None,
        session: str | None = None,
        case_check_timeout_sec: float = 180.0,
        check_cases: bool = True,
        program_agent: str = INSTALL_AGENT_IMPORT_PATH,
        agent_kwargs: Mapping[str, object] | None = None,
        isolate_candidates: bool | None = None,
    ) -> None:
        self._harbor_executable = harbor_executable
        self._python_executable = python_executable
        self.infra_wait = (
            infra_wait if infra_wait is not None else tenacity.wait_exponential(multiplier=5, min=5, max=120)
        )
        self.kill_grace_sec = kill_grace_sec
        self.preflight_timeout_sec = preflight_timeout_sec
        self.tail_bytes = tail_bytes
        self._base_env = base_env
        self._case_kit = case_kit
        self.session = session or new_session_id()
        self._interrupted = False
        self.case_check_timeout_sec = case_check_timeout_sec
        self.check_cases = check_cases
        self.program_agent = program_agent
        self.agent_kwargs = dict(agent_kwargs or {})
        self.isolate_candidates = isolate_candidates
        self.host_binding: HostBinding | None = None
        self.network_fence: NetworkFence | None = None

    def confine_candidates(self, fence: NetworkFence) -> None:
        """Run `kind: agent` candidate hosts behind `fence` (the composition roots `vero harbor
        serve` and `vero harbor verify` do): each evaluation's hosts reach its gateway listeners
        only, and an evaluation whose fence cannot be installed, or whose hosts would not run as
        throw-away uids, fails as an infrastructure failure before any candidate code runs
        (`vero.harbor.boundary.fence`). Without it hosts have this process's network."""
        self.network_fence = fence

    def bind_hosts_to(self, binding: HostBinding) -> None:
        """Tell `binding` (the process's inference gateway) which uids run each evaluation's
        candidate hosts, so that its token works for them only (docs/inference.md)."""
        self.host_binding = binding

    async def remove_leftovers(
        self, *, environment: str, env: Mapping[str, str], session: str, jobs: Iterable[str] | None = None
    ) -> int:
        """Remove what interrupted nested runs of `session` (of `jobs` only, if given) left: Docker
        containers, networks, volumes and built images, or Modal sandboxes (`vero.harbor.leftovers`).
        Call it when none of those runs can still be running (e.g. at a sidecar's start). Other
        environments have nothing vero can find; errors are logged, never raised.

        Args:
            environment: the nested runs' Harbor environment (`docker`, `modal`, ...).
            env: extra environment of the Docker client (e.g. `DOCKER_HOST`).
            session: the session the runs were labelled with.
            jobs: their evaluation ids (None: every run of the session).

        Returns:
            How many objects were removed.
        """
        if environment == "docker":
            base = os.environ if self._base_env is None else self._base_env
            return await remove_docker_leftovers({**base, **env}, session=session, jobs=jobs, settle_sec=None)
        if environment == "modal":
            if jobs is None:
                return await terminate_modal_sandboxes(session=session)
            return sum([await terminate_modal_sandboxes(session=session, job=job) for job in jobs])
        return 0

    def interrupt(self) -> None:
        """The calling process is stopping: from now on a cancelled or timed-out run's process group
        is killed at once (no grace period) and its leftovers are removed in one quick pass; what
        remains is the next start's to remove (`vero.harbor.leftovers`)."""
        self._interrupted = True

    @property
    def interrupted(self) -> bool:
        """Whether `interrupt` was called."""
        return self._interrupted

    @property
    def harbor_executable(self) -> Path:
        """The `harbor` executable in use.

        Raises:
            InfrastructureFailure: none was given and none is installed.
        """
        if self._harbor_executable is None:
            self._harbor_executable = find_harbor_executable()
        return self._harbor_executable

    async def case_kit(self) -> Path:
        """The static case kit (`vero.harbor.casekit`), found or built once.

        Raises:
            InfrastructureFailure: no kit exists and none can be built.
        """
        if self._case_kit is None:
            from vero.harbor.casekit import kit_binary

            self._case_kit = await asyncio.to_thread(kit_binary)
        return self._case_kit

    @property
    def python_executable(self) -> Path:
        """The interpreter of the pre-flight (see the class docstring)."""
        if self._python_executable is not None:
            return self._python_executable
        sibling = self.harbor_executable.parent / "python"
        return sibling if sibling.exists() else Path(sys.executable)

    async def evaluate(self, run: NestedRun) -> EvaluationResult:
        """Run the selected cases of `run` and return their scores.

        `kind: agent`: one `CandidateLauncher` serves the pre-flight and every round; closing it at
        the end (or on cancellation) kills every candidate host and all it spawned.

        Cancellation kills the whole process group, removes the job's containers, networks and
        volumes, and propagates `CancelledError`.

        Raises:
            CaseMisconfigured: a selected case cannot be measured whatever the candidate (invalid
                task, missing host variables, setup rejected, no value under the reward key);
                its `problems` name the cases and causes (refunded like any infrastructure failure).
            InfrastructureFailure: some case got no measurement for infrastructure reasons even after
                `harbor.infra_retries` retries with back-off (or, in a round cut by
                `harbor.evaluation_timeout_sec`, its only trials were infrastructure), the candidate
                checkout is missing, a selected case is not a valid Harbor task dir, `run_as` cannot
                use the run's paths, the case kit is unavailable, Harbor cannot be started, or
                (`confine_candidates`) the network fence cannot be installed, `FenceUnavailable` (the
                caller refunds).
            ValueError: `run.case_names` is empty or `run.evaluation_id` is not a portable name.
        """
        if run.runtime.kind != "agent":
            return await self._evaluate(run, None)
        agent_uid = run.run_as.uid if run.run_as is not None and os.geteuid() == 0 else None
        token, binding = run.candidate_env.get("VERO_INFERENCE_TOKEN"), self.host_binding
        on_host = None
        if token and binding is not None:

            def on_host(uid: int, alive: bool) -> None:
                (binding.bind_host if alive else binding.release_host)(token, uid)

        async with contextlib.AsyncExitStack() as stack:
            launcher = CandidateLauncher(
                self.python_executable,
                agent_uid=agent_uid,
                env=run.candidate_env,
                isolate=self.isolate_candidates,
                on_host=on_host,
            )
            if self.network_fence is not None:
                if not launcher.isolated:
                    raise FenceUnavailable(
                        "candidate hosts would run as this process's user, which the network fence does not "
                        "confine (the sidecar and the verifier run as root); kind: agent evaluations do not "
                        "run unconfined"
                    )
                await stack.enter_async_context(self.network_fence.admitting(endpoints_of(run.candidate_env)))
            await stack.enter_async_context(launcher)
            return await self._evaluate(run, launcher)

    async def _evaluate(self, run: NestedRun, launcher: CandidateLauncher | None) -> EvaluationResult:
        started_at = _now()
        case_names = _dedupe(run.case_names)
        if not case_names:
            raise ValueError("an evaluation needs at least one case")
        if not _JOB_NAME.match(run.evaluation_id):
            raise ValueError("evaluation_id must be a portable name ([A-Za-z0-9][A-Za-z0-9._-]*)")
        reward_key = run.reward_key or run.scoring.reward_key
        failure_value = run.failure_value if run.failure_value is not None else run.scoring.effective_failure_value()
        if not run.candidate_dir.is_dir():
            raise InfrastructureFailure("the candidate checkout is missing")
        env = nested_env(run, self._base_env)
        secrets = list(run.env.values())
        kit = await self.case_kit()
        await asyncio.to_thread(run.jobs_dir.mkdir, parents=True, exist_ok=True)
        if os.geteuid() == 0 or run.jobs_dir.stat().st_uid == os.geteuid():
            # Harbor's job dirs (trial results, case outputs) are the runner's alone: candidate hosts
            # of `kind: agent` targets run as other uids and must not even read them.
            await asyncio.to_thread(os.chmod, run.jobs_dir, 0o700)
        await self._check_access(run, env, kit)
        causes = CauseLog(secrets)
        if self.check_cases:
            await self._check_cases(run, case_names, causes)
        declared = await asyncio.to_thread(declared_agent_timeouts, run.cases_dir, case_names)
        plan = plan_agent_timeout(run.harbor.case_timeout_sec, declared)

        def result(attempts: Mapping[str, list[AttemptResult]], job_dir: Path | None, retries: int) -> EvaluationResult:
            cases = [CaseResult.from_attempts(name, attempts[name], failure_value) for name in case_names]
            diagnostics = causes.build()  # kept only when something failed: clean runs stay small
            return EvaluationResult.from_cases(
                partition=run.partition,
                candidate=run.candidate,
                reward_key=reward_key,
                cases=cases,
                started_at=started_at,
                finished_at=_now(),
                job_dir=str(job_dir) if job_dir is not None else None,
                infra_retries=retries,
                diagnostics=diagnostics if diagnostics.has_failures or retries else None,
            )

        if launcher is not None:
            failure_type = await self._preflight(run, launcher)
            if failure_type is not None:
                logger.info(
                    "evaluation %s: candidate agent failed its import pre-flight (%s)", run.evaluation_id, failure_type
                )
                dead = {
                    name: [
                        AttemptResult(
                            trial_name=f"{name}__preflight-{i}",
                            exception_type=failure_type,
                            outcome=AttemptOutcome.DEAD,
                        )
                        for i in range(run.harbor.n_attempts)
                    ]
                    for name in case_names
                }
                return result(dead, None, 0)

        attempts: dict[str, list[AttemptResult]] = {name: [] for name in case_names}
        install_messages: dict[str, str] = {}
        pending = list(case_names)
        rounds = 0
        first_job_dir = run.jobs_dir.absolute() / run.evaluation_id

        async def one_round() -> None:
            nonlocal pending, rounds
            job_name = run.evaluation_id if rounds == 0 else f"{run.evaluation_id}.retry-{rounds}"
            rounds += 1
            collation, timed_out = await self._run_round(
                run, job_name, pending, plan, env, secrets, reward_key, launcher, kit, causes
            )
            _raise_case_problems(collation, set(pending), reward_key, causes)
            for trial in collation.trials:
                if trial.case in pending and trial.outcome is AttemptOutcome.INSTALL_FAILED:
                    install_messages.setdefault(trial.case, trial.exception_message or "")
            before = {name: len(attempts[name]) for name in pending}
            n_infra = merge_outcomes(attempts, collation.trials, set(pending))
            n_timed_out = 0
            if timed_out:
                n_timed_out = _charge_unfinished(attempts, collation, pending, before, run.harbor.n_attempts)
            pending = [name for name in pending if not attempts[name]]
            logger.info(
                "evaluation %s: job %s read: %d trial(s), %d infrastructure, %d unfinished, "
                "%d attempt(s) timed out, %d case(s) unmeasured",
                run.evaluation_id,
                job_name,
                len(collation.trials),
                n_infra,
                collation.n_unfinished,
                n_timed_out,
                len(pending),
            )
            if pending and timed_out:
                raise InfrastructureFailure(
                    f"nested evaluation hit its wall clock ({run.harbor.evaluation_timeout_sec:g} s) with "
                    f"{len(pending)} of {len(case_names)} case(s) measured by infrastructure failures only",
                    diagnostics=causes.build(),
                )
            if pending:
                reason = "no trial result" if not collation.trials else "only infrastructure failures"
                raise _Unmeasured(len(pending), reason)

        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(run.harbor.infra_retries + 1),
            wait=self.infra_wait,
            retry=tenacity.retry_if_exception_type(_Unmeasured),
            reraise=True,
            before_sleep=lambda state: logger.warning(
                "evaluation %s: infrastructure failure (%s); retry %d of %d",
                run.evaluation_id,
                state.outcome.exception() if state.outcome else "?",
                state.attempt_number,
                run.harbor.infra_retries,
            ),
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await one_round()
        except _Unmeasured as exc:
            raise InfrastructureFailure(
                f"nested evaluation measured nothing for {exc.n_unmeasured} of {len(case_names)} case(s) "
                f"after {rounds} attempt(s): {exc.reason}",
                diagnostics=causes.build(),
            ) from None

        async def witness_round(witness: NestedRun, cases: list[str]) -> JobCollation:
            collation, _ = await self._run_round(
                witness,
                f"{run.evaluation_id}{WITNESS_JOB_SUFFIX}",
                cases,
                plan,
                env,
                secrets,
                reward_key,
                None,
                kit,
                causes,
                program_agent=INSTALL_AGENT_IMPORT_PATH,
                disable_verification=True,
            )
            return collation

        await judge_install_failures(
            run, attempts, install_messages, run_witness=witness_round, secrets=secrets, causes=causes
        )
        return result(attempts, first_job_dir, rounds - 1)

    async def _run_round(
        self,
        run: NestedRun,
        job_name: str,
        case_names: Sequence[str],
        plan: AgentTimeoutPlan,
        env: Mapping[str, str],
        secrets: Sequence[str],
        reward_key: str,
        launcher: CandidateLauncher | None,
        kit: Path | None,
        causes: CauseLog,
        *,
        program_agent: str | None = None,
        disable_verification: bool = False,
    ) -> tuple[JobCollation, bool]:
        """One `harbor run` of `case_names` (step 2 of the module docstring); `program_agent` (with
        no extra arguments) and `disable_verification` serve the install witness
        (`vero.harbor.install_witness`)."""
        session = run.session or self.session
        labels = options = route = None
        if run.harbor.environment == "docker":
            labels = await asyncio.to_thread(compose_labels, session, run.evaluation_id, run.cases_dir, case_names)
            if run.case_network is not None:
                route = await asyncio.to_thread(case_route_compose, run.case_network, run.cases_dir, case_names)
                if route is None:
                    logger.warning(
                        "evaluation %s: case services not routed to the gateway: a selected case's network "
                        "is not public",
                        run.evaluation_id,
                    )
        elif run.harbor.environment == "modal":
            options = modal_options(session, run.evaluation_id, run.harbor.evaluation_timeout_sec)
        command = build_command(
            run,
            job_name=job_name,
            case_names=case_names,
            timeout_plan=plan,
            harbor_executable=self.harbor_executable,
            base_env=self._base_env,
            launcher_socket=launcher.socket_path if launcher is not None else None,
            kit_path=kit,
            compose_labels=labels,
            case_route=route,
            environment_options=options,
            program_agent=program_agent or self.program_agent,
            agent_kwargs={} if program_agent else self.agent_kwargs,
            disable_verification=disable_verification,
        )
        try:
            await asyncio.to_thread(self._prepare_job_dir, command)
        except OSError as exc:
            if is_out_of_space(exc):
                logger.error(
                    "evaluation %s: the jobs dir %s is full (no space left on device)", run.evaluation_id, run.jobs_dir
                )
                raise InfrastructureFailure("the nested run's jobs dir is full (no space left on device)") from None
            raise
        try:
            outcome = await run_process_group(
                command.argv,
                env=command.env,
                cwd=command.cwd,
                run_as=run.run_as,
                timeout_sec=run.harbor.evaluation_timeout_sec,
                kill_grace_sec=self.kill_grace_sec,
                tail_bytes=self.tail_bytes,
                secrets=secrets,
                hurry=lambda: self._interrupted,
            )
        except asyncio.CancelledError:
            logger.warning("evaluation %s: cancelled; nested run killed", run.evaluation_id)
            await finish_uncancellable(self._cleanup(run, command.job_dir, env))
            raise
        except OSError as exc:
            logger.warning("evaluation %s: harbor could not be started (%s)", run.evaluation_id, type(exc).__name__)
            causes.add_round(
                job_name, returncode=None, output_tail=f"harbor could not be started ({type(exc).__name__})"
            )
            raise _Unmeasured(len(case_names), "harbor could not be started") from None
        await asyncio.to_thread(self._write_trusted_log, command.cwd / f"{job_name}.harbor.log", outcome)
        causes.add_round(
            job_name,
            returncode=outcome.returncode,
            timed_out=outcome.timed_out,
            duration_sec=outcome.duration_sec,
            output_tail=outcome.output_tail,
        )
        if secrets:
            await asyncio.to_thread(_scrub_tree, command.job_dir, secrets)
        collation = await asyncio.to_thread(collate_job, command.job_dir, reward_key, run.scoring.reward_range)
        collation = await self._excuse_unreachable_engine(run, env, collation)
        await asyncio.to_thread(causes.add_trials, command.job_dir, collation.trials)
        if outcome.timed_out or not collation.job_finished:
            # Harbor tears its environments down itself when it finishes; after a kill or a crash
            # the job's Compose projects may still be up.
            await finish_uncancellable(self._cleanup(run, command.job_dir, env))
        if outcome.timed_out:
            logger.warning(
                "evaluation %s: job %s killed after %.0f s (evaluation_timeout_sec)",
                run.evaluation_id,
                job_name,
                outcome.duration_sec,
            )
        return collation, outcome.timed_out

    async def _excuse_unreachable_engine(
        self, run: NestedRun, env: Mapping[str, str], collation: JobCollation
    ) -> JobCollation:
        """A trial whose verifier files Harbor could not collect (`verifier_download_failed`) ran
        candidate code first, so it is a dead attempt, charged: a candidate can make the download
        fail (a device node, a fifo, an unreadable or very deep tree under `/logs/verifier`) and
        must not get a free re-run. Only when the engine does not answer right after the round
        (`vero.harbor.leftovers.engine_reachable`) is it shown to be the engine's: infrastructure."""
        suspects = {
            t.trial_name
            for t in collation.trials
            if "verifier_download_failed" in t.flags and t.outcome is AttemptOutcome.DEAD
        }
        if not suspects or await engine_reachable(run.harbor.environment, env) is not False:
            return collation
        logger.warning(
            "evaluation %s: %d trial(s) could not collect their verifier files and the engine is "
            "unreachable: infrastructure",
            run.evaluation_id,
            len(suspects),
        )
        trials = tuple(
            dataclasses.replace(t, outcome=AttemptOutcome.INFRASTRUCTURE) if t.trial_name in suspects else t
            for t in collation.trials
        )
        return dataclasses.replace(collation, trials=trials)

    @staticmethod
    def _prepare_job_dir(command: HarborCommand) -> None:
        job_dir = command.job_dir
        if job_dir.exists() or job_dir.is_symlink():
            # Never resume a stale job of the same name (Harbor would skip its finished trials).
            job_dir.rename(job_dir.with_name(f"{job_dir.name}.stale-{time.time_ns()}"))
        for path, text in command.files():
            # The jobs dir is the runner's: whatever it planted at the path is replaced, not followed.
            atomic_write_bytes(path, text.encode(), mode=0o644)

    def _write_trusted_log(self, path: Path, outcome: ProcessOutcome) -> None:
        text = (
            f"returncode: {outcome.returncode}\ntimed_out: {outcome.timed_out}\n"
            f"duration_sec: {outcome.duration_sec:.1f}\n--- output tail ---\n{outcome.output_tail}\n"
        )
        try:
            atomic_write_bytes(path, text.encode(), mode=0o600)
        except OSError as exc:
            logger.warning("cannot write trusted log %s: %s", path, type(exc).__name__)
        if outcome.returncode != 0:
            logger.warning("harbor exited with %s; output tail in %s", outcome.returncode, path)
        logger.debug("harbor output tail (%s):\n%s", path.name, outcome.output_tail)

    async def _cleanup(self, run: NestedRun, job_dir: Path, env: Mapping[str, str]) -> None:
        """Remove what the run's environments left (`vero.harbor.leftovers`): by the run's labels
        and its trial dirs on Docker, by tags on Modal; one quick pass once interrupted."""
        session = run.session or self.session
        if run.harbor.environment == "docker":
            removed = await remove_docker_leftovers(
                env,
                session=session,
                jobs=[run.evaluation_id],
                job_dirs=[job_dir],
                settle_sec=0.2 if self._interrupted else 1.0,
                timeout_sec=5 if self._interrupted else 60,
            )
            kind = "docker object(s)"
        elif run.harbor.environment == "modal":
            removed = await terminate_modal_sandboxes(session=session, job=run.evaluation_id)
            kind = "modal sandbox(es)"
        else:
            return
        if removed:
            logger.info("evaluation %s: removed %d %s left by %s", run.evaluation_id, removed, kind, job_dir.name)

    async def _check_cases(self, run: NestedRun, case_names: Sequence[str], causes: CauseLog) -> None:
        """Refuse cases that cannot be measured whatever the candidate (`vero.harbor.case_checks`).

        Runs `python -I -m vero.harbor.case_checks` with the nested run's interpreter, user and
        environment (isolated mode: a `kind: agent` checkout on `PYTHONPATH` never shadows the
        checker), once per case and process. If the check itself cannot run, it is skipped with a
        warning (the run then reports what Harbor says).

        Raises:
            CaseMisconfigured: the problems of the selected cases (first problem's code).
        """
        env = dict(nested_env(run, self._base_env))
        uid = run.run_as.uid if run.run_as is not None else os.geteuid()
        cases_dir = str(run.cases_dir.resolve())
        available = frozenset(env)
        keys = {name: (cases_dir, name, run.harbor.environment, available, uid) for name in case_names}
        unchecked = [name for name in case_names if keys[name] not in _CASE_CHECKS]
        if unchecked:
            found = await self._run_case_checks(run, unchecked, env)
            if found is not None:
                for name in unchecked:
                    _CASE_CHECKS[keys[name]] = tuple(p for p in found if p.case == name)
        problems = [p for name in case_names for p in _CASE_CHECKS.get(keys[name], ())]
        if problems:
            causes.add_problems(problems)
            logger.warning(
                "evaluation %s: %d case problem(s): %s",
                run.evaluation_id,
                len(problems),
                "; ".join(f"{p.case}: {p.code}" for p in problems),
            )
            raise CaseMisconfigured(
                "; ".join(f"case {p.case!r}: {p.code}: {p.detail}" for p in problems),
                code=problems[0].code,
                problems=problems,
                diagnostics=causes.build(),
            )

    async def _run_case_checks(
        self, run: NestedRun, case_names: Sequence[str], env: Mapping[str, str]
    ) -> list[CaseProblem] | None:
        argv = [
            str(self.python_executable),
            "-I",
            "-m",
            "vero.harbor.case_checks",
            run.harbor.environment,
            str(run.cases_dir.absolute()),
            *case_names,
        ]
        try:
            outcome = await run_process_group(
                argv,
                env=env,
                cwd=Path("/"),
                run_as=run.run_as,
                timeout_sec=self.case_check_timeout_sec,
                kill_grace_sec=2.0,
                tail_bytes=256 * 1024,
            )
        except OSError as exc:
            logger.warning(
                "evaluation %s: the case check could not be started (%s); skipped",
                run.evaluation_id,
                type(exc).__name__,
            )
            return None
        answers = [line for line in outcome.output_tail.splitlines() if line.startswith(CASE_CHECKS_MARK)]
        try:
            if outcome.returncode != 0 or outcome.timed_out or not answers:
                raise ValueError("no answer")
            return [CaseProblem.model_validate(item) for item in json.loads(answers[-1][len(CASE_CHECKS_MARK) :])]
        except ValueError:
            logger.warning(
                "evaluation %s: the case check failed (exit %s); skipped; output tail:\n%s",
                run.evaluation_id,
                outcome.returncode,
                outcome.output_tail[-2000:],
            )
            return None

    async def _check_access(self, run: NestedRun, env: Mapping[str, str], kit: Path | None) -> None:
        """Fail as infrastructure, not as the candidate, when `run_as` cannot use the run's paths.

        Without this, an unreadable checkout would look like the candidate's own import or upload
        failure and be charged. Only needed when switching users (otherwise the caller's access is
        the run's).

        Raises:
            InfrastructureFailure: `run_as` cannot read the candidate checkout, the cases or the
                case kit, or cannot write the jobs dir or its home.
        """
        if run.run_as is None or os.geteuid() != 0:
            return
        cand, cases, jobs, home = (
            str(p.absolute()) for p in (run.candidate_dir, run.cases_dir, run.jobs_dir, run.run_as.home)
        )
        script = 'test -r "$1" -a -x "$1" -a -r "$2" -a -x "$2" -a -w "$3" -a -x "$3" -a -w "$4" -a -x "$4" -a -r "$5"'
        kit_arg = str(kit.absolute()) if kit is not None else "/dev/null"
        try:
            outcome = await run_process_group(
                ["/bin/sh", "-c", script, "vero-access", cand, cases, jobs, home, kit_arg],
                env=env,
                cwd=Path("/"),
                run_as=run.run_as,
                timeout_sec=30,
                kill_grace_sec=1.0,
            )
        except OSError as exc:
            raise InfrastructureFailure(
                f"cannot start a process as the nested run's user ({type(exc).__name__})"
            ) from None
        if outcome.returncode != 0:
            raise InfrastructureFailure(
                "the nested run's user cannot read the candidate checkout, the "
                "cases or the case kit, or cannot write the jobs dir or its home"
            )

    async def _preflight(self, run: NestedRun, launcher: CandidateLauncher) -> str | None:
        """Import and construct the candidate agent in a candidate host; the failure's type, or None.

        Raises:
            InfrastructureFailure: no host could be started, or the host reported (before any
                candidate code ran) that it cannot import Harbor or read the checkout.
        """
        try:
            return await asyncio.wait_for(preflight_in_host(launcher, run), self.preflight_timeout_sec)
        except TimeoutError:
            return PREFLIGHT_TIMEOUT_EXCEPTION


def _charge_unfinished(
    attempts: dict[str, list[AttemptResult]],
    collation: JobCollation,
    cases: Sequence[str],
    before: Mapping[str, int],
    n_attempts: int,
) -> int:
    """After a round cut by the wall clock: every attempt of `cases` that did not finish this round
    becomes a `timed_out` dead attempt. Returns how many were added.

    A case expects `n_attempts` trials per round; those that finished (kept in `attempts` since
    `before`) or were shown to be infrastructure count, the rest (killed without a result, or never
    started) did not finish.
    """
    infra: dict[str, int] = {}
    for trial in collation.trials:
        if trial.infrastructure:
            infra[trial.case] = infra.get(trial.case, 0) + 1
    added = 0
    for name in cases:
        finished = len(attempts[name]) - before[name]
        missing = n_attempts - finished - infra.get(name, 0)
        for index in range(max(missing, 0)):
            attempts[name].append(
                AttemptResult(
                    trial_name=f"{name}__unfinished-{index + 1}",
                    outcome=AttemptOutcome.TIMED_OUT,
                    exception_type=EVALUATION_TIMEOUT_EXCEPTION,
                )
            )
            added += 1
    return added


def _raise_case_problems(collation: JobCollation, cases: set[str], reward_key: str, causes: CauseLog) -> None:
    """Raise `CaseMisconfigured` when a trial of `cases` found its case broken, whatever the
    candidate: `kit_shadowed` (the install agent refused the case before its tests: the finding is
    the detail) or `reward_key_missing` (the verifier wrote rewards without `reward_key`: the keys
    found are the detail). One problem per case; the error's code is the first problem's."""
    found: dict[str, CaseProblem] = {}
    for trial in collation.trials:
        if trial.case not in cases or trial.case in found:
            continue
        if trial.outcome is AttemptOutcome.KIT_SHADOWED:
            found[trial.case] = CaseProblem(
                case=trial.case,
                code="kit_shadowed",
                detail=(trial.exception_message or "the case kit could be shadowed on the tests' PATH")[-2000:],
            )
        elif trial.reward_key_missing:
            keys = trial.reward_keys or ()
            found[trial.case] = CaseProblem(
                case=trial.case,
                code="reward_key_missing",
                detail=f"its verifier wrote rewards with the keys {', '.join(keys) or '(none)'} "
                f"but not {reward_key!r} (scoring.reward_key)",
            )
    if not found:
        return
    problems = [found[case] for case in sorted(found)]
    causes.add_problems(problems)
    raise CaseMisconfigured(
        "; ".join(f"case {p.case!r}: {p.code}: {p.detail}" for p in problems),
        code=problems[0].code,
        problems=problems,
        diagnostics=causes.build(),
    )


def _scrub_tree(root: Path, secrets: Sequence[str]) -> None:
    """Replace secret values in every text file under `root` (binary and huge files are skipped).

    Harbor scrubs trial dirs by variable *name* (`trial/trial.py` `_scrub_jobs_dir`); a secret whose
    name does not look sensitive, printed by a case or a candidate, would otherwise stay in trial
    logs that `full` disclosure may show the agent. The tree is the runner's, so a file is replaced
    (same mode), never written through: a link swapped in after the check is replaced too.
    """
    if not root.is_dir():
        return
    for path in root.rglob("*"):
        try:
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode) or info.st_size > _SCRUB_MAX_BYTES:
                continue
            data = path.read_bytes()
            if b"\0" in data[:8192]:
                continue
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        cleaned = scrub(text, secrets)
        if cleaned != text:
            try:
                atomic_write_bytes(path, cleaned.encode(), mode=stat.S_IMODE(info.st_mode))
            except OSError as exc:
                logger.warning("cannot scrub %s: %s", path, type(exc).__name__)
