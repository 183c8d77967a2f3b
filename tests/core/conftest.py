"""Shared fixtures of the trusted-core tests (policy, ledger, jobs): real files under `tmp_path`.

`async def` tests here run in a fresh event loop each (`asyncio.run`), without a pytest plugin; the
stores must work across loops anyway, so a new loop per test is what they should face.
"""

from __future__ import annotations

import asyncio
import inspect
from datetime import UTC, datetime

import pytest

from vero.core.jobs import EvaluationJob, JobStore
from vero.core.ledger import BudgetLedger, BudgetTotals


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**arguments))
    return True


def make_job(
    reservation_id: str,
    *,
    principal: str = "agent",
    partition: str = "train",
    cases: list[str] | None = None,
    state: str = "queued",
    job_id: str | None = None,
) -> EvaluationJob:
    """A valid job record for tests (the candidate is a syntactically valid commit id)."""
    cases = cases or ["c1", "c2"]
    return EvaluationJob(
        id=job_id or JobStore.new_id(),
        principal=principal,
        partition=partition,
        cases=cases,
        full_partition=False,
        version="HEAD",
        candidate="a" * 40,
        disclosure="aggregate",
        reservation_id=reservation_id,
        state=state,
        created_at=datetime.now(UTC),
    )


@pytest.fixture(name="make_job")
def make_job_fixture():
    return make_job


@pytest.fixture
def ledger_path(tmp_path):
    return tmp_path / "state" / "state.db"


@pytest.fixture
def small_totals():
    return {("train", "agent"): BudgetTotals(runs=10, cases=40), ("val", "agent"): BudgetTotals(runs=3, cases=6)}


@pytest.fixture
def ledger(ledger_path, small_totals) -> BudgetLedger:
    return BudgetLedger.open(ledger_path, small_totals)
