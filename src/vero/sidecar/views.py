"""The agent's views of the session, built from its records by the pure rules of
`vero.sidecar.disclosure`: `JobViews` (one job, cached per record snapshot) and `status_view`
(`GET /status`).
"""

from __future__ import annotations

from collections.abc import Iterator

from vero.core.jobs import EvaluationJob
from vero.core.policy import AccessPolicy, DisclosureRule
from vero.errors import CASE_PROBLEM_CODES, InfrastructureFailure, UnknownJob
from vero.sidecar.agent_inference import agent_inference_view
from vero.sidecar.disclosure import (
    broken_cases,
    budget_view,
    case_problem,
    disclose,
    job_view,
    submission_view,
    summary_view,
)
from vero.sidecar.models import DisclosedResult, JobView, LadderView, PartitionStatus, StatusResponse
from vero.sidecar.paths import SidecarPaths
from vero.sidecar.records import SessionRecords
from vero.spec.compiled import SidecarConfig

__all__ = ["INFRA_ERROR", "MAX_PAGE_SIZE", "RECENT_JOBS_IN_STATUS", "RECENT_JOBS_MAX_BYTES", "JobViews", "status_view"]

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

INFRA_ERROR = "infrastructure"
"""The `error` of a job that failed for infrastructure reasons (refunded)."""


class JobViews:
    """What the agent sees of each job, under the rule the policy gives it now.

    Args:
        policy: the process's access policy (fixed for its lifetime).
        paths: where a `full` job's artifacts are written (`SidecarPaths.artifacts_dir`).
    """

    def __init__(self, policy: AccessPolicy, paths: SidecarPaths) -> None:
        self.policy = policy
        self.paths = paths
        self._cache: dict[str, tuple[EvaluationJob, JobView]] = {}  # job id -> (snapshot, its view)

    def rule(self, job: EvaluationJob) -> DisclosureRule:
        """The job's narrowed tier and the Ladder in force (`AccessPolicy.rule_for`)."""
        return self.policy.rule_for(job.disclosure, job.principal, job.partition)

    def _artifacts_path(self, job: EvaluationJob, rule: DisclosureRule) -> str | None:
        """Where `main` finds the job's artifacts, once they are written (`full` only)."""
        if rule.tier != "full" or not (self.paths.artifacts_dir(job.id) / "result.json").is_file():
            return None
        return str(self.paths.artifacts_path_in_main(job.id))

    def disclose(self, job: EvaluationJob) -> DisclosedResult | None:
        """What the agent may see of a finished job (`vero.sidecar.disclosure.disclose`)."""
        rule = self.rule(job)
        return disclose(job, rule, self._artifacts_path(job, rule))

    def view(self, job: EvaluationJob) -> JobView:
        """The agent's view of a job (`vero.sidecar.disclosure.job_view`).

        Built once per job snapshot: `JobStore` returns the same object while a job's record is
        unchanged, and the view depends only on the snapshot, the policy (fixed for the process)
        and the artifacts, which are written before the job turns `complete`. The cache is bounded.
        """
        cached = self._cache.get(job.id)
        if cached is not None and cached[0] is job:
            return cached[1]
        rule = self.rule(job)
        view = job_view(job, rule, self._artifacts_path(job, rule))
        self._cache[job.id] = (job, view)
        while len(self._cache) > _VIEW_CACHE_SIZE:
            del self._cache[next(iter(self._cache))]
        return view

    def answerable(self, job: EvaluationJob, principal: str) -> EvaluationJob:
        """`job`, when `principal` may be answered about it.

        Raises:
            UnknownJob: another principal's job (answered as if there were none).
            InfrastructureFailure: the job failed for infrastructure reasons (refunded; 502).
            CaseMisconfigured: the job failed on a broken case (refunded; 502 with the problem's
                code, the cases only where the tier shows them: `case_problem`).
        """
        if job.principal != principal:
            raise UnknownJob("no evaluation job with this id")
        if job.state == "failed" and job.error == INFRA_ERROR:
            raise InfrastructureFailure("the evaluation failed for infrastructure reasons; refunded")
        if job.state == "failed" and job.error in CASE_PROBLEM_CODES:
            raise case_problem(self.rule(job), job.error, broken_cases(job))
        return job

    def summary(self, job: EvaluationJob) -> JobView:
        """`view` without per-case results (lists: `GET /status`, `GET /evaluations`)."""
        return summary_view(self.view(job))


def _partitions(
    config: SidecarConfig, policy: AccessPolicy, records: SessionRecords, principal: str
) -> Iterator[PartitionStatus]:
    for name, access in policy.visible(principal).items():
        blocks = policy.blocks(principal, name)
        ladder = policy.ladder(principal, name)
        budget = None
        if config.disclose_budget:
            balance = records.ledger.balance(name, principal)
            budget = budget_view(balance, access, metered=config.inference is not None, ladder=ladder)
        yield PartitionStatus(
            name=name,
            disclosure=access.disclosure,
            min_aggregate_cases=access.min_aggregate_cases,
            cases=list(policy.cases(principal, name)),
            blocks=[list(block) for block in blocks] if blocks else None,
            ladder=None if ladder is None else LadderView(margin=ladder.margin, precision=ladder.effective_precision),
            budget=budget,
        )


def _newest_that_fit(views: list[JobView]) -> list[JobView]:
    """The longest prefix of `views` (newest first) whose JSON fits in `RECENT_JOBS_MAX_BYTES`."""
    used = 0
    for n, view in enumerate(views):
        used += len(view.model_dump_json().encode())
        if used > RECENT_JOBS_MAX_BYTES:
            return views[:n]
    return views


def status_view(
    config: SidecarConfig, views: JobViews, records: SessionRecords, principal: str, *, entrance_open: bool
) -> StatusResponse:
    """`GET /status` for `principal`: partitions, budgets (unless hidden), job counts per partition
    and state, the newest jobs (at most `RECENT_JOBS_IN_STATUS` and `RECENT_JOBS_MAX_BYTES` of
    them, without per-case results), the submission. Call it inside one read of the state store.

    What the history adds is bounded whatever it holds: the jobs' bytes, one submission (a
    256-character version) and a count per visible partition and state; the rest is the spec's
    (partitions, their cases and blocks).
    """
    counts = records.jobs.counts(principal)
    recent = records.jobs.page(principal, limit=RECENT_JOBS_IN_STATUS)
    return StatusResponse(
        name=config.name,
        entrance_open=entrance_open,
        submit_enabled=config.submit_enabled,
        partitions=list(_partitions(config, views.policy, records, principal)),
        n_jobs=sum(n for states in counts.values() for n in states.values()),
        job_counts=counts,
        jobs=_newest_that_fit([views.summary(job) for job in recent.jobs]),
        submission=None if records.submission is None else submission_view(records.submission),
        agent_inference=agent_inference_view(records.ledger, principal) if config.disclose_budget else None,
    )
