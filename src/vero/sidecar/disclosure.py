"""What the agent may see of a job: pure functions of the job's record and its disclosure rule.

The rule (`vero.core.policy.DisclosureRule`: the narrowed tier and, on `aggregate`, the Ladder in
force) comes from one call to the policy (`AccessPolicy.rule_for`); everything here reads only the
record and the rule (and, for `full`, whether the job's artifacts were written, which the caller
says), so the rule a tier applies is read, and tested, in one place. `vero.sidecar.service` caches
the views and serves them.
"""

from __future__ import annotations

from vero.core.evaluation import EvaluationResult
from vero.core.jobs import EvaluationJob
from vero.core.ledger import BudgetBalance
from vero.core.policy import DisclosureRule, money_step_micro_usd
from vero.core.submission import Submission
from vero.errors import CASE_PROBLEM_CODES, CaseMisconfigured
from vero.sidecar.models import AttemptView, BudgetView, CaseView, DisclosedResult, JobView, SubmissionView
from vero.spec.models import LadderSpec, PartitionAccess

__all__ = [
    "broken_cases",
    "budget_view",
    "case_problem",
    "covers_granted_cases",
    "disclose",
    "job_view",
    "submission_view",
    "summary_view",
]


def covers_granted_cases(job: EvaluationJob, result: EvaluationResult) -> bool:
    """Whether `result` measured exactly the job's cases: an aggregate over any other set (e.g. with
    unmeasured cases left out) may not be a union of blocks, so its score is never disclosed."""
    return sorted(case.case for case in result.cases) == sorted(job.cases)


def disclose(job: EvaluationJob, rule: DisclosureRule, artifacts_path: str | None = None) -> DisclosedResult | None:
    """What the agent may see of a finished job under `rule`; None while it is not complete.

    `aggregate` shows the score and counts and, of the model calls, only what they were charged
    (`inference_usd`: the money `/status`'s `remaining_inference_usd` already moves by), rounded up
    to the rule's `money_step_micro_usd` (a hundredth of the partition's money): never a
    count of calls (made, refused, failed), which a candidate chooses for free and could set to
    what it read in a hidden case. Except: a job judged by the Ladder shows only its
    recorded Ladder answer (rounded score, `improved`) and the case count (attempt counts could
    carry what the Ladder withholds); a job completed without a Ladder answer on a partition now
    in Ladder mode shows no score; a result that does not cover exactly the granted cases (a
    set that may not be a union of blocks) shows no score. `full` adds the cases, their attempts
    and `artifacts_path` (the job's artifacts in `main`, when they were written; else None).
    """
    if job.state != "complete" or job.result is None:
        return None
    result = job.result
    if rule.tier == "none":
        return DisclosedResult(disclosure="none")
    if rule.tier == "aggregate":
        if job.ladder is not None:
            return DisclosedResult(
                disclosure="aggregate", score=job.ladder.score, improved=job.ladder.improved, n_cases=len(job.cases)
            )
        if rule.ladder is not None or not covers_granted_cases(job, result):
            return DisclosedResult(disclosure="aggregate", n_cases=len(job.cases))
    counts = {
        "score": result.score,
        "n_cases": result.n_cases,
        "n_attempts": result.n_attempts,
        "n_dead": result.n_dead,
    }
    spent_usd = result.inference.charged_micro_usd / 1e6 if result.inference is not None else None
    if rule.tier == "aggregate":
        if result.inference is not None:
            step = rule.money_step_micro_usd
            spent_usd = -(-result.inference.charged_micro_usd // step) * step / 1e6
        return DisclosedResult(disclosure="aggregate", inference_usd=spent_usd, **counts)
    return DisclosedResult(
        disclosure="full",
        **counts,
        inference_usd=spent_usd,
        inference=result.inference,
        cases=[
            CaseView(
                case=case.case,
                score=case.score,
                attempts=[
                    AttemptView(reward=a.reward, exception_type=a.exception_type, outcome=a.kind.value)
                    for a in case.attempts
                ],
            )
            for case in result.cases
        ],
        artifacts_path=artifacts_path,
    )


def broken_cases(job: EvaluationJob) -> list[str]:
    """The job's own cases its recorded case problems name (sorted, once each)."""
    if job.diagnostics is None:
        return []
    return sorted({p.case for p in job.diagnostics.problems if p.case in job.cases})


def case_problem(rule: DisclosureRule, code: str, cases: list[str]) -> CaseMisconfigured:
    """The error the agent gets for broken `cases`: the code always, the case names only where
    the tier discloses per-case results (`full`)."""
    return CaseMisconfigured(
        f"{code}: a selected case cannot be measured; nothing was charged",
        code=code,
        cases=sorted(cases) if rule.tier == "full" else [],
    )


def job_view(job: EvaluationJob, rule: DisclosureRule, artifacts_path: str | None = None) -> JobView:
    """The agent's view of a job (no job dirs, no host paths, no trusted-only fields): its result
    as `disclose` shows it, and for a job failed by a case problem the broken cases on `full` only."""
    broken = None
    if job.state == "failed" and job.error in CASE_PROBLEM_CODES and rule.tier == "full":
        broken = broken_cases(job)
    return JobView(
        id=job.id,
        state=job.state,
        partition=job.partition,
        n_cases=len(job.cases),
        version=job.version,
        candidate=job.candidate,
        created_at=job.created_at,
        finished_at=job.finished_at,
        error=job.error,
        broken_cases=broken,
        result=disclose(job, rule, artifacts_path),
    )


def summary_view(view: JobView) -> JobView:
    """`view` without per-case results (lists: `GET /status`, `GET /evaluations`)."""
    if view.result is None or view.result.cases is None:
        return view
    return view.model_copy(update={"result": view.result.model_copy(update={"cases": None})})


def submission_view(submission: Submission) -> SubmissionView:
    """The agent's view of the submission."""
    return SubmissionView(
        candidate=submission.candidate, version=submission.version, submitted_at=submission.submitted_at
    )


def budget_view(
    balance: BudgetBalance, access: PartitionAccess, *, metered: bool, ladder: LadderSpec | None
) -> BudgetView:
    """What `GET /status` shows of a partition's budget (where budgets are disclosed at all).

    Runs and cases always; the inference money only with a gateway (`metered`), and what is left of
    it only where the tier shows scores without the Ladder: what is left moves with what the
    candidates spent, which they choose, so on a `none` partition or under the Ladder it would
    disclose what the tier withholds. On `aggregate` it is rounded down to the step the jobs'
    money is shown in (`vero.core.policy.money_step_micro_usd`).
    """
    spend_disclosed = access.disclosure != "none" and ladder is None
    remaining = balance.remaining_inference_micro_usd
    if access.disclosure == "aggregate":
        step = money_step_micro_usd(access)
        remaining = remaining // step * step
    return BudgetView(
        total_runs=balance.total_runs,
        total_cases=balance.total_cases,
        remaining_runs=balance.remaining_runs,
        remaining_cases=balance.remaining_cases,
        total_inference_usd=balance.total_inference_micro_usd / 1e6 if metered else None,
        remaining_inference_usd=remaining / 1e6 if metered and spend_disclosed else None,
    )
