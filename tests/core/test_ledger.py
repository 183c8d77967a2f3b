"""Budget ledger in the state store: reserve/settle/refund, durability, restart, tampering, concurrency
and crashes."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vero.core.jobs import JobStore
from vero.core.ledger import BudgetLedger, BudgetTotals, Cost
from vero.core.state import StateStore
from vero.errors import (
    BudgetExhausted,
    Conflict,
    LedgerCorrupt,
    PolicyDenied,
    ReservationConflict,
    UnknownReservation,
    VeroError,
)

CHILD = Path(__file__).with_name("ledger_crash_child.py")


def assert_consistent(ledger: BudgetLedger) -> None:
    """A fresh open of the database agrees with the ledger, and the raw rows keep every invariant."""
    with StateStore.open(ledger.path) as fresh:
        assert BudgetLedger.open(fresh, {}).snapshot() == ledger.snapshot()
    check_raw_invariants(ledger.path)


def check_raw_invariants(path: Path) -> None:
    """Recompute every budget's figures from the reservation rows with plain SQL (independently)."""
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        ids = [rid for (rid,) in conn.execute("SELECT id FROM reservations")]
        assert len(ids) == len(set(ids)), "a reservation is recorded twice"
        for partition, principal, resource, total, settled, reserved in conn.execute(
            "SELECT partition, principal, resource, total, settled, reserved FROM budgets"
        ).fetchall():
            # What a closed reservation charges: `charged` where set, else all if settled, none if refunded.
            sums = dict(
                conn.execute(
                    "SELECT CASE WHEN r.state = 'reserved' THEN 'reserved' ELSE 'charged' END, "
                    "sum(CASE WHEN r.state = 'reserved' THEN c.amount "
                    "ELSE coalesce(c.charged, CASE WHEN r.state = 'settled' THEN c.amount ELSE 0 END) END) "
                    "FROM reservation_costs c JOIN reservations r ON r.id = c.reservation_id "
                    "WHERE r.partition = ? AND r.principal = ? AND c.resource = ? GROUP BY 1",
                    (partition, principal, resource),
                )
            )
            assert settled == sums.get("charged", 0) and reserved == sums.get("reserved", 0)
            remaining = total - settled - reserved
            assert remaining >= 0 and settled + reserved + remaining == total
    finally:
        conn.close()


def tamper(path: Path, *statements: str) -> None:
    """Edit the database as an attacker with the file would: constraints, foreign keys and triggers off
    (triggers are recreated afterwards from their own text, so the schema still matches)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        triggers = conn.execute("SELECT name, sql FROM sqlite_schema WHERE type = 'trigger'").fetchall()
        conn.execute("PRAGMA ignore_check_constraints = ON")
        conn.execute("PRAGMA foreign_keys = OFF")
        for name, _ in triggers:
            conn.execute(f"DROP TRIGGER {name}")
        for statement in statements:
            conn.execute(statement)
        for _, sql in triggers:
            conn.execute(sql)
    finally:
        conn.close()


# basic life cycle -----------------------------------------------------------------------------------


def test_open_creates_the_file_with_the_configured_totals(ledger, ledger_path):
    assert ledger_path.is_file()
    assert oct(ledger_path.stat().st_mode & 0o777) == "0o600"
    raw = ledger.state.export()
    assert raw["schema_version"] == 3 and raw["reservations"] == [] and raw["jobs"] == []
    assert [(b["partition"], b["resource"], b["total"]) for b in raw["budgets"]] == [
        ("train", "cases", 40),
        ("train", "runs", 10),
        ("val", "cases", 6),
        ("val", "runs", 3),
    ]
    assert sqlite3.connect(ledger_path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    balance = ledger.balance("train", "agent")
    figures = (balance.total_runs, balance.total_cases, balance.remaining_runs, balance.remaining_cases)
    assert figures == (10, 40, 10, 40)
    assert [(b.partition, b.principal) for b in ledger.balances()] == [("train", "agent"), ("val", "agent")]
    assert ledger.config_drift == []


async def test_reserve_settle_refund_move_the_figures(ledger):
    kept = await ledger.reserve("train", "agent", Cost.of_evaluation(4))
    released = await ledger.reserve("train", "agent", Cost.of_evaluation(3), reservation_id="ev-1")
    assert kept.state == released.state == "reserved" and released.id == "ev-1"
    assert kept.id.startswith("rs-") and kept.created_at.tzinfo is not None
    b = ledger.balance("train", "agent")
    assert (b.reserved_runs, b.reserved_cases, b.remaining_runs, b.remaining_cases) == (2, 7, 8, 33)

    settled = await ledger.settle(kept.id)
    assert settled.state == "settled" and settled.reason == "measured" and settled.closed_at is not None
    refunded = await ledger.refund("ev-1", "infrastructure")
    assert refunded.state == "refunded" and refunded.reason == "infrastructure"
    b = ledger.balance("train", "agent")
    assert (b.settled_runs, b.settled_cases, b.reserved_runs, b.reserved_cases) == (1, 4, 0, 0)
    assert (b.remaining_runs, b.remaining_cases) == (9, 36)
    assert ledger.open_reservations() == []
    assert [r.id for r in ledger.reservations()] == [kept.id, "ev-1"]
    assert_consistent(ledger)


async def test_settle_and_refund_are_idempotent_and_exclusive(ledger):
    a = await ledger.reserve("train", "agent", Cost.of_evaluation(2))
    b = await ledger.reserve("train", "agent", Cost.of_evaluation(2))
    await ledger.settle(a.id, "measured")
    again = await ledger.settle(a.id, "other")
    assert again.reason == "measured"  # the first decision stands
    await ledger.refund(b.id, "cancelled")
    await ledger.refund(b.id, "interrupted")
    assert ledger.reservation(b.id).reason == "cancelled"
    with pytest.raises(ReservationConflict):
        await ledger.refund(a.id, "cancelled")
    with pytest.raises(ReservationConflict):
        await ledger.settle(b.id)
    with pytest.raises(UnknownReservation):
        await ledger.settle("rs-unknown")
    with pytest.raises(UnknownReservation):
        await ledger.refund("rs-unknown", "cancelled")
    with pytest.raises(UnknownReservation) as raised:
        ledger.reservation("rs-unknown")
    # Vero's errors, and still the built-ins callers of a mapping expect.
    assert isinstance(raised.value, KeyError) and isinstance(raised.value, VeroError)
    assert str(raised.value) == "no budget reservation 'rs-unknown'"
    assert issubclass(ReservationConflict, ValueError) and issubclass(ReservationConflict, Conflict)
    b_figures = ledger.balance("train", "agent")
    assert (b_figures.settled_runs, b_figures.settled_cases, b_figures.reserved_runs) == (1, 2, 0)
    assert_consistent(ledger)


async def test_returned_reservations_are_copies(ledger):
    r = await ledger.reserve("train", "agent", Cost.of_evaluation(1))
    r.state = "refunded"
    ledger.reservation(r.id).state = "settled"
    assert ledger.reservation(r.id).state == "reserved"


async def test_unknown_entry_fails_closed_without_echo(ledger):
    hidden = "holdout-secret-zz9"
    with pytest.raises(PolicyDenied) as info:
        await ledger.reserve(hidden, "agent", Cost.of_evaluation(1))
    assert hidden not in str(info.value)
    with pytest.raises(PolicyDenied):
        await ledger.reserve("train", "stranger", Cost.of_evaluation(1))
    with pytest.raises(PolicyDenied):
        ledger.balance(hidden, "agent")
    assert ledger.reservations() == []


async def test_exhaustion_checks_runs_first_and_changes_nothing(ledger, ledger_path):
    # val: 3 runs, 6 cases
    await ledger.reserve("val", "agent", Cost.of_evaluation(5))
    before = ledger.state.export_bytes()
    with pytest.raises(BudgetExhausted) as info:
        await ledger.reserve("val", "agent", Cost.of_evaluation(2))
    assert (info.value.resource, info.value.requested, info.value.remaining) == ("cases", 2, 1)
    assert (info.value.partition, info.value.principal) == ("val", "agent")
    await ledger.reserve("val", "agent", Cost.of_evaluation(1))
    await ledger.reserve("val", "agent", Cost(runs=1, cases=0))
    with pytest.raises(BudgetExhausted) as info:
        await ledger.reserve("val", "agent", Cost.of_evaluation(7))  # both exceeded: runs reported
    assert (info.value.resource, info.value.requested, info.value.remaining) == ("runs", 1, 0)
    assert len(ledger.reservations()) == 3
    assert ledger.state.export_bytes() != before
    after = ledger.state.export_bytes()
    with pytest.raises(BudgetExhausted):
        await ledger.reserve("val", "agent", Cost.of_evaluation(1))
    assert ledger.state.export_bytes() == after  # a refused reservation writes nothing


async def test_duplicate_reservation_id_is_refused(ledger):
    await ledger.reserve("train", "agent", Cost.of_evaluation(1), reservation_id="ev-x")
    with pytest.raises(ReservationConflict):
        await ledger.reserve("val", "agent", Cost.of_evaluation(1), reservation_id="ev-x")
    assert ledger.balance("val", "agent").reserved_runs == 0


def test_cost_rejects_negative_figures():
    with pytest.raises(ValueError):
        Cost(runs=-1, cases=0)
    assert Cost.of_evaluation(3) == Cost(runs=1, cases=3)


# durability and failure -----------------------------------------------------------------------------


async def test_a_failed_transaction_changes_nothing(ledger):
    await ledger.reserve("train", "agent", Cost.of_evaluation(1), reservation_id="rs-kept")
    before = ledger.state.export_bytes()

    def reserve_then_fail(conn):
        ledger.reserve_in(conn, "train", "agent", Cost.of_evaluation(2), "rs-lost")
        ledger.close_in(conn, "rs-kept", "settled", "measured")
        raise OSError("disk full")

    with pytest.raises(OSError):
        await ledger.state.commit(reserve_then_fail)
    assert ledger.state.export_bytes() == before
    with pytest.raises(UnknownReservation):
        ledger.reservation("rs-lost")
    await ledger.reserve("train", "agent", Cost.of_evaluation(2))
    assert ledger.balance("train", "agent").reserved_runs == 2
    assert_consistent(ledger)


async def test_the_database_refuses_an_overspend_the_caller_did_not_check(ledger):
    """The CHECK constraint holds even if the Python check were wrong."""
    await ledger.reserve("val", "agent", Cost(runs=3, cases=0))

    def unchecked(conn):
        conn.execute(
            "INSERT INTO reservations (id, partition, principal, state, created_at) "
            "VALUES ('rs-x', 'val', 'agent', 'reserved', '2026-01-01T00:00:00Z')"
        )
        conn.execute("INSERT INTO reservation_costs VALUES ('rs-x', 'val', 'agent', 'runs', 1, NULL, 0)")

    with pytest.raises(sqlite3.IntegrityError):
        await ledger.state.commit(unchecked)
    assert ledger.balance("val", "agent").remaining_runs == 0
    assert_consistent(ledger)


@pytest.mark.timeout(60)
async def test_cancelled_callers_leave_memory_equal_to_disk(ledger_path):
    """Cancel reservations while their write is in flight: the write finishes, memory follows it."""
    ledger = BudgetLedger.open(ledger_path, {("train", "agent"): BudgetTotals(runs=10_000, cases=10_000)})
    landed_despite_cancel = 0
    for attempt in range(30):
        rid = f"cancel-{attempt}"
        task = asyncio.create_task(ledger.reserve("train", "agent", Cost.of_evaluation(1), reservation_id=rid))
        await asyncio.sleep(random.Random(attempt).uniform(0, 0.004))
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            if any(r.id == rid for r in ledger.reservations()):
                landed_despite_cancel += 1
                await ledger.refund(rid, "cancelled")  # the caller can clean up by its own id
        with StateStore.open(ledger_path) as fresh:
            assert BudgetLedger.open(fresh, {}).snapshot() == ledger.snapshot()
    assert landed_despite_cancel > 0, "no cancellation hit a write in flight; the test proved nothing"
    assert_consistent(ledger)


def test_usable_from_several_event_loops(ledger):
    """Each `asyncio.run` is a new loop; contention forces the lock to bind to the running loop."""

    async def burst() -> None:
        reservations = await asyncio.gather(
            *(ledger.reserve("train", "agent", Cost(runs=1, cases=1)) for _ in range(3))
        )
        await asyncio.gather(*(ledger.refund(r.id, "cancelled") for r in reservations))

    for _ in range(3):
        asyncio.run(burst())
    assert ledger.balance("train", "agent").reserved_runs == 0
    assert len(ledger.reservations()) == 9
    assert_consistent(ledger)


# concurrency ------------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
async def test_a_thousand_concurrent_reservations_grant_exactly_the_total(ledger_path):
    ledger = BudgetLedger.open(ledger_path, {("train", "agent"): BudgetTotals(runs=100, cases=100_000)})
    outcomes = await asyncio.gather(
        *(ledger.reserve("train", "agent", Cost.of_evaluation(3)) for _ in range(1000)), return_exceptions=True
    )
    granted = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(granted) == 100
    assert all(isinstance(e, BudgetExhausted) and e.resource == "runs" for e in refused)
    assert len({r.id for r in granted}) == 100
    balance = ledger.balance("train", "agent")
    assert (balance.reserved_runs, balance.reserved_cases, balance.remaining_runs) == (100, 300, 0)
    reopened = BudgetLedger.open(ledger_path, {("train", "agent"): BudgetTotals(runs=100, cases=100_000)})
    assert reopened.snapshot() == ledger.snapshot()
    assert reopened.balance("train", "agent") == balance
    assert_consistent(ledger)


@pytest.mark.timeout(120)
async def test_commits_at_once_share_one_transaction_and_each_fails_alone(ledger_path):
    """Group commit: changes queued together commit in one transaction; a change that raises undoes
    only its own statements, and one that makes SQLite fail gets that failure alone."""
    state = StateStore.open(ledger_path)

    def put(key: str, fail: str | None = None):
        def change(conn: sqlite3.Connection) -> str:
            conn.execute("INSERT INTO meta (key, value) VALUES (?, 'v')", (key,))
            if fail == "refuse":
                raise BudgetExhausted("train", "agent", "runs", 1, 0)
            if fail == "sqlite":
                conn.execute("SELECT * FROM no_such_table")
            return key

        return state.commit(change)

    before = state.generation
    outcomes = await asyncio.gather(
        *(put(f"a{i}", "refuse" if i == 5 else None) for i in range(20)), return_exceptions=True
    )
    assert state.generation - before <= 2  # one or two transactions for 20 changes, not 20
    assert isinstance(outcomes[5], BudgetExhausted)
    assert [o for i, o in enumerate(outcomes) if i != 5] == [f"a{i}" for i in range(20) if i != 5]
    outcomes = await asyncio.gather(
        *(put(f"b{i}", "sqlite" if i == 3 else None) for i in range(10)), return_exceptions=True
    )
    assert isinstance(outcomes[3], OSError) and "write failed" in str(outcomes[3])
    assert [o for i, o in enumerate(outcomes) if i != 3] == [f"b{i}" for i in range(10) if i != 3]
    keys = {k for (k,) in state.rows("SELECT key FROM meta WHERE key GLOB '[ab]*'")}
    assert keys == {f"a{i}" for i in range(20) if i != 5} | {f"b{i}" for i in range(10) if i != 3}


@pytest.mark.timeout(120)
async def test_concurrent_inference_reservations_take_what_is_left_and_charge_at_most_it(ledger_path):
    """Inference money is reserved up to its amount: 200 concurrent evaluations asking 0.3 USD of a
    10 USD budget get 33 full reservations, one of what was left and none after; closing them
    charges what each says its calls cost (never more than it reserved), refunds the rest, and the
    figures add up after a reopen."""
    totals = {("train", "agent"): BudgetTotals(runs=1_000, cases=1_000, inference_micro_usd=10_000_000)}
    ledger = BudgetLedger.open(ledger_path, totals)
    granted = await asyncio.gather(
        *(ledger.reserve("train", "agent", Cost.of_evaluation(1, inference_micro_usd=300_000)) for _ in range(200))
    )
    amounts = sorted((r.cost.inference_micro_usd for r in granted), reverse=True)
    assert amounts[:34] == [300_000] * 33 + [100_000] and set(amounts[34:]) == {0}
    assert ledger.balance("train", "agent").remaining_inference_micro_usd == 0

    def close(conn):
        for i, reservation in enumerate(granted):
            ledger.charge_in(conn, reservation.id, "inference_micro_usd", 10**9 if i % 3 == 0 else 1_000)
            ledger.close_in(conn, reservation.id, "settled" if i % 2 else "refunded", "measured")

    await ledger.state.commit(close)
    expected = sum(min(r.cost.inference_micro_usd, 10**9 if i % 3 == 0 else 1_000) for i, r in enumerate(granted))
    balance = BudgetLedger.open(ledger_path, totals).balance("train", "agent")
    assert balance.settled_inference_micro_usd == expected and balance.reserved_inference_micro_usd == 0
    assert balance.remaining_inference_micro_usd == 10_000_000 - expected
    with pytest.raises(ReservationConflict):  # a closed reservation's charge is final
        await ledger.state.commit(lambda conn: ledger.charge_in(conn, granted[0].id, "inference_micro_usd", 0))
    assert_consistent(ledger)
    # What was asked above a reservation is kept as its overrun: recorded, exported, never charged.
    over = [r for i, r in enumerate(granted) if i % 3 == 0 and i % 2]
    assert over and all(
        ledger.reservation(r.id).overrun == {"inference_micro_usd": 10**9 - r.cost.inference_micro_usd} for r in over
    )
    exported = {r["id"]: r for r in ledger.state.export()["reservations"]}
    assert exported[over[0].id]["overrun"] == ledger.reservation(over[0].id).overrun
    plain = next(r for i, r in enumerate(granted) if i % 3 and r.cost.inference_micro_usd >= 1_000)
    assert exported[plain.id]["overrun"] == {} and ledger.reservation(plain.id).overrun == {}


@pytest.mark.timeout(120)
async def test_concurrent_mixed_operations_never_overspend_cases(ledger_path):
    totals = {("train", "agent"): BudgetTotals(runs=10_000, cases=50)}
    ledger = BudgetLedger.open(ledger_path, totals)
    rng = random.Random(5)

    async def client(i: int) -> int:
        try:
            r = await ledger.reserve("train", "agent", Cost.of_evaluation(rng.randint(1, 4)))
        except BudgetExhausted as exc:
            assert exc.resource == "cases"
            return 0
        if i % 3 == 0:
            await ledger.refund(r.id, "cancelled")
            return 0
        await ledger.settle(r.id)
        return r.cost.cases

    charged = await asyncio.gather(*(client(i) for i in range(300)))
    balance = ledger.balance("train", "agent")
    assert sum(charged) == balance.settled_cases <= 50
    assert balance.reserved_cases == 0
    assert_consistent(ledger)


# restart and configuration drift --------------------------------------------------------------------


async def test_state_survives_reopen(ledger, ledger_path, small_totals):
    kept = await ledger.reserve("train", "agent", Cost.of_evaluation(4))
    released = await ledger.reserve("train", "agent", Cost.of_evaluation(2))
    pending = await ledger.reserve("val", "agent", Cost.of_evaluation(1))
    await ledger.settle(kept.id)
    await ledger.refund(released.id, "cancelled")

    reopened = BudgetLedger.open(ledger_path, small_totals)
    assert reopened.config_drift == []
    assert reopened.snapshot() == ledger.snapshot()
    assert reopened.reservation(kept.id).state == "settled"
    assert reopened.reservation(released.id).reason == "cancelled"
    assert [r.id for r in reopened.open_reservations()] == [pending.id]
    await reopened.settle(pending.id)
    again = BudgetLedger.open(ledger_path, small_totals)
    val = again.balance("val", "agent")
    assert (val.settled_runs, val.settled_cases, val.reserved_runs) == (1, 1, 0)
    train = again.balance("train", "agent")
    assert (train.settled_runs, train.settled_cases, train.remaining_runs, train.remaining_cases) == (1, 4, 9, 36)


async def test_persisted_totals_win_and_drift_is_reported(ledger, ledger_path):
    await ledger.reserve("train", "agent", Cost.of_evaluation(2))
    changed = {
        ("train", "agent"): BudgetTotals(runs=1000, cases=1000),  # operator raised the budget
        ("test", "agent"): BudgetTotals(runs=2, cases=4),  # newly accessible partition
        # ("val", "agent") no longer configured
    }
    reopened = BudgetLedger.open(ledger_path, changed)
    train = reopened.balance("train", "agent")
    assert (train.total_runs, train.total_cases, train.reserved_runs) == (10, 40, 1)  # never reset
    drift = "\n".join(reopened.config_drift)
    assert len(reopened.config_drift) == 3
    assert "'train'" in drift and "configured runs 1000" in drift and "keeps runs 10" in drift
    assert "'test'" in drift and "newly configured" in drift
    assert "'val'" in drift and "no longer configured" in drift
    assert reopened.balance("val", "agent").total_runs == 3  # kept as recorded
    test = reopened.balance("test", "agent")
    assert (test.total_runs, test.total_cases, test.remaining_runs) == (2, 4, 2)
    # The added entry is persisted, so it is there even when the config later forgets it.
    third = BudgetLedger.open(ledger_path, {})
    assert third.balance("test", "agent").total_runs == 2
    assert len(third.config_drift) == 3 and all("no longer configured" in line for line in third.config_drift)


def test_reopening_with_the_same_config_changes_nothing(ledger, ledger_path, small_totals):
    before = ledger.state.export_bytes()
    BudgetLedger.open(ledger_path, small_totals).state.close()
    BudgetLedger.open(ledger_path, {("train", "agent"): BudgetTotals(runs=1, cases=1)}).state.close()  # drift only
    assert ledger.state.export_bytes() == before


async def test_a_new_resource_of_a_known_budget_is_added_without_usage(ledger, ledger_path):
    """A further dimension (e.g. inference tokens) is new rows, not a new schema."""
    await ledger.reserve("train", "agent", Cost.of_evaluation(2))

    class Totals(BudgetTotals):
        tokens: int

    grown = BudgetLedger.open(ledger_path, {("train", "agent"): Totals(runs=10, cases=40, tokens=5000)})
    assert any("tokens newly configured" in line for line in grown.config_drift)
    rows = {(f.partition, f.resource): (f.total, f.settled, f.reserved) for f in grown.figures()}
    assert rows[("train", "tokens")] == (5000, 0, 0) and rows[("train", "runs")] == (10, 0, 1)
    grown.state.close()
    assert_consistent(ledger)


# tampering --------------------------------------------------------------------------------------------


async def _ledger_with_history(ledger) -> None:
    a = await ledger.reserve("train", "agent", Cost.of_evaluation(3), reservation_id="rs-a")
    await ledger.settle(a.id)
    b = await ledger.reserve("train", "agent", Cost.of_evaluation(2), reservation_id="rs-b")
    await ledger.refund(b.id, "cancelled")
    await ledger.reserve("val", "agent", Cost.of_evaluation(1), reservation_id="rs-c")


_TAMPERINGS = {
    "settled_over_total": ["UPDATE budgets SET settled = 11 WHERE partition = 'train' AND resource = 'runs'"],
    "negative_total": ["UPDATE budgets SET total = -1 WHERE partition = 'val' AND resource = 'cases'"],
    "figures_disagree": ["UPDATE budgets SET settled = settled + 1 WHERE partition = 'train' AND resource = 'cases'"],
    "raised_total_and_figures_hidden": ["UPDATE budgets SET settled = 0 WHERE partition = 'train'"],
    "refund_flipped_to_settled": ["UPDATE reservations SET state = 'settled' WHERE id = 'rs-b'"],
    "settled_reservation_deleted": [
        "DELETE FROM reservation_costs WHERE reservation_id = 'rs-a'",
        "DELETE FROM reservations WHERE id = 'rs-a'",
    ],
    "negative_overrun": ["UPDATE reservation_costs SET overrun = -1 WHERE reservation_id = 'rs-a'"],
    "cost_lowered": ["UPDATE reservation_costs SET amount = 0 WHERE reservation_id = 'rs-c'"],
    "reservation_moved": ["UPDATE reservations SET partition = 'val' WHERE id = 'rs-a'"],
    "open_but_closed": ["UPDATE reservations SET closed_at = created_at WHERE id = 'rs-c'"],
    "bad_state": ["UPDATE reservations SET state = 'spent' WHERE id = 'rs-a'"],
    "trigger_dropped": ["SELECT 1"],  # replaced below: the trigger stays dropped
    "schema_version": ["PRAGMA user_version = 99"],
    "extra_table": ["CREATE TABLE notes (x TEXT)"],
}


@pytest.mark.parametrize("name", sorted(_TAMPERINGS))
async def test_a_tampered_database_refuses_to_open(ledger, ledger_path, small_totals, name):
    await _ledger_with_history(ledger)
    ledger.state.close()
    if name == "trigger_dropped":
        sqlite3.connect(ledger_path, isolation_level=None).execute("DROP TRIGGER reservation_closes")
    else:
        tamper(ledger_path, *_TAMPERINGS[name])
    data = ledger_path.read_bytes()
    with pytest.raises(LedgerCorrupt) as info:
        BudgetLedger.open(ledger_path, small_totals)
    assert str(ledger_path) in str(info.value) and "refusing to start" in str(info.value)
    assert ledger_path.read_bytes() == data  # never reset


async def test_an_old_reservation_edited_by_hand_opens_and_is_refused_by_the_full_check_at_seal(
    ledger, ledger_path, small_totals, tmp_path, monkeypatch
):
    """The open-time check reads only the newest `RECENT_ROWS` rows (here 2 of 5 reservations): a
    refund of the oldest turned into a settle, with every figure edited to match, keeps the budgets
    equal to their running totals, so the store opens. The full check (`StateStore.verify`) sums
    every reservation: it refuses the store, and so does the seal (`write_session_archive`), before
    writing anything. The same edit within the newest rows is refused at open."""
    from vero.core import state as state_module
    from vero.core.session import SealHeader, write_session_archive

    old = await ledger.reserve("train", "agent", Cost.of_evaluation(2), reservation_id="rs-old")
    await ledger.refund(old.id, "cancelled")
    for _ in range(4):
        await ledger.settle((await ledger.reserve("train", "agent", Cost.of_evaluation(1))).id)
    ledger.state.close()
    tamper(ledger_path, "UPDATE reservations SET state = 'settled' WHERE id = 'rs-old'")
    data = ledger_path.read_bytes()

    with pytest.raises(LedgerCorrupt, match="refusing to start"):
        StateStore.open(ledger_path)  # all five reservations are recent by default
    monkeypatch.setattr(state_module, "RECENT_ROWS", 2)
    with StateStore.open(ledger_path) as state:
        with pytest.raises(LedgerCorrupt, match="sum of its reservations") as info:
            state.verify()
        assert "full check" in str(info.value)
        with pytest.raises(LedgerCorrupt, match="sum of its reservations"):
            write_session_archive(
                ledger_path.parent,
                tmp_path / "sealed" / "session.tar.gz",
                SealHeader(
                    name="t", spec_digest="sha256:" + "0" * 64, baseline_commit="0" * 40, sealed_at=datetime.now(UTC)
                ),
                state=state,
            )
    assert not (tmp_path / "sealed" / "session.tar.gz").exists()
    assert ledger_path.read_bytes() == data


@pytest.mark.parametrize("name", ["figures_disagree", "raised_total_and_figures_hidden", "cost_lowered"])
async def test_a_budget_edited_by_hand_is_refused_at_open_whatever_its_age(
    ledger, ledger_path, small_totals, monkeypatch, name
):
    """A budget's figures (or an open reservation's cost) are checked at open against the running
    totals and the open reservations, not only within the newest rows: with none of the rows
    recent, these edits are still refused before anything is admitted."""
    from vero.core import state as state_module

    await _ledger_with_history(ledger)
    ledger.state.close()
    tamper(ledger_path, *_TAMPERINGS[name])
    monkeypatch.setattr(state_module, "RECENT_ROWS", 0)
    with pytest.raises(LedgerCorrupt, match="refusing to start"):
        StateStore.open(ledger_path)


async def test_the_full_check_passes_an_untouched_store(ledger):
    await _ledger_with_history(ledger)
    ledger.state.verify()


def test_an_empty_file_left_by_a_crash_during_creation_is_initialized(ledger_path, small_totals):
    ledger_path.parent.mkdir(parents=True)
    ledger_path.touch(mode=0o600)  # created, then killed before the schema was committed
    ledger = BudgetLedger.open(ledger_path, small_totals)
    assert ledger.balance("val", "agent").total_runs == 3
    assert_consistent(ledger)


@pytest.mark.parametrize(
    "content",
    [b"\x00\xff\xfe garbage \x89PNG" * 300, b"SQLite format 3\x00" + b"\x00" * 80, b'{"schema_version": 1}'],
    ids=["garbage", "truncated", "json"],
)
def test_unreadable_content_refuses_to_start(ledger_path, small_totals, content):
    ledger_path.parent.mkdir(parents=True)
    ledger_path.write_bytes(content)
    with pytest.raises(LedgerCorrupt) as info:
        BudgetLedger.open(ledger_path, small_totals)
    assert str(ledger_path) in str(info.value)
    assert ledger_path.read_bytes() == content


def test_another_sqlite_database_refuses_to_start(ledger_path, small_totals):
    ledger_path.parent.mkdir(parents=True)
    other = sqlite3.connect(ledger_path)
    other.execute("CREATE TABLE budgets (x)")
    other.commit()
    other.close()
    with pytest.raises(LedgerCorrupt, match="not a vero state database"):
        BudgetLedger.open(ledger_path, small_totals)


def test_unreadable_path_refuses_to_start(tmp_path, small_totals):
    as_dir = tmp_path / "state.db"
    as_dir.mkdir()
    with pytest.raises(LedgerCorrupt, match="not a regular file"):
        BudgetLedger.open(as_dir, small_totals)
    dangling = tmp_path / "dangling.db"
    dangling.symlink_to(tmp_path / "missing.db")
    with pytest.raises(LedgerCorrupt):
        BudgetLedger.open(dangling, small_totals)
    assert not (tmp_path / "missing.db").exists()


# properties -------------------------------------------------------------------------------------------

_op = st.tuples(
    st.sampled_from(["reserve", "settle", "refund"]),
    st.sampled_from(["train", "val"]),
    st.integers(0, 6),
    st.integers(0, 50),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, max_size=25))
def test_any_operation_sequence_keeps_the_invariants(tmp_path_factory, ops):
    path = tmp_path_factory.mktemp("prop") / "ledger.json"
    totals = {("train", "agent"): BudgetTotals(runs=6, cases=15), ("val", "agent"): BudgetTotals(runs=2, cases=3)}
    ledger = BudgetLedger.open(path, totals)
    model = {key: [0, 0, 0, 0] for key in totals}  # settled runs/cases, reserved runs/cases

    async def run() -> None:
        for name, partition, n_cases, pick in ops:
            key = (partition, "agent")
            if name == "reserve":
                cost = Cost.of_evaluation(n_cases)
                s_runs, s_cases, r_runs, r_cases = model[key]
                fits = s_runs + r_runs + 1 <= totals[key].runs and s_cases + r_cases + n_cases <= totals[key].cases
                try:
                    await ledger.reserve(partition, "agent", cost)
                except BudgetExhausted:
                    assert not fits
                else:
                    assert fits
                    model[key][2] += 1
                    model[key][3] += n_cases
                continue
            existing = ledger.reservations()
            if not existing:
                continue
            target = existing[pick % len(existing)]
            k = (target.partition, target.principal)
            try:
                if name == "settle":
                    await ledger.settle(target.id)
                else:
                    await ledger.refund(target.id, "cancelled")
            except ValueError:
                assert target.state != "reserved"
                continue
            if target.state == "reserved":
                model[k][2] -= target.cost.runs
                model[k][3] -= target.cost.cases
                if name == "settle":
                    model[k][0] += target.cost.runs
                    model[k][1] += target.cost.cases

    asyncio.run(run())
    for key, (s_runs, s_cases, r_runs, r_cases) in model.items():
        b = ledger.balance(*key)
        figures = (b.settled_runs, b.settled_cases, b.reserved_runs, b.reserved_cases)
        assert figures == (s_runs, s_cases, r_runs, r_cases)
        assert b.remaining_runs >= 0 and b.remaining_cases >= 0
    assert BudgetLedger.open(path, totals).snapshot() == ledger.snapshot()
    assert_consistent(ledger)


# crash safety -----------------------------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_sigkill_at_random_moments_never_breaks_the_ledger(tmp_path):
    """Kill a reserving/settling/refunding child with SIGKILL 55 times; every reopen passes the
    open-time check, agrees with every operation the child acknowledged before it died, and finds
    every job's state matching its reservation's (queued/reserved, complete/settled,
    failed/cancelled/refunded) and its inference money charged as acknowledged (never more than was
    reserved, never more reserved than the entry's total).

    The moments are chosen by the child's progress (a random number of acknowledged operations,
    then a short random sleep), not by wall time alone, so a busy machine changes how long the test
    takes, never what it checks."""
    path = tmp_path / "state.db"
    rng = random.Random(20261129)
    acknowledged: dict[str, str] = {}  # reservation id -> last acknowledged state
    charged: dict[str, int] = {}  # job reservation id -> inference money acknowledged as charged
    kills = 0
    in_flight_kills = 0  # kills that hit a transaction between its start and its acknowledgement
    jobs_seen: set[str] = set()  # reservation ids of the jobs found in the database
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    while kills < 55:
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(path), str(kills)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        seen: list[bytes] = []
        try:
            if rng.random() < 0.15:
                time.sleep(rng.uniform(0.0, 0.4))  # sometimes during start-up and open
            else:
                assert child.stdout.readline() == b"ready\n"
                wanted = rng.randint(0, 16)  # acknowledged operations before the kill window opens
                # Every third child also ends a job first: the job worker is one of three, and on a
                # busy machine it may otherwise end too few jobs for the money checks to mean anything.
                job_end = kills % 3 == 0
                while sum(line[:2] in (b"R ", b"S ", b"F ") for line in seen) < wanted or (
                    job_end and not any(line[:2] in (b"S ", b"F ") and len(line.split()) == 3 for line in seen)
                ):
                    line = child.stdout.readline()
                    assert line, "the child stopped before it was killed"
                    seen.append(line)
                time.sleep(rng.uniform(0.0, 0.05))
            child.send_signal(signal.SIGKILL)
            out, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        out = b"".join(seen) + out
        assert child.returncode == -signal.SIGKILL, err.decode(errors="replace")[-2000:]
        kills += 1
        lines = out.decode().splitlines()
        if lines and lines[-1].startswith("B "):
            in_flight_kills += 1
        for line in lines:
            if line.startswith(("R ", "S ", "F ")):
                op, rid, *spent = line.split()
                if spent:
                    charged[rid] = int(spent[0])
                if op == "R":
                    acknowledged.setdefault(rid, "reserved")
                else:
                    acknowledged[rid] = {"S": "settled", "F": "refunded"}[op]

        if not path.exists():
            continue  # killed before the database was first created
        with StateStore.open(path) as state:  # raises LedgerCorrupt if a kill tore anything
            fresh = BudgetLedger.open(state, {})
            check_raw_invariants(path)
            reservations = {r.id: r for r in fresh.reservations()}
            states = {rid: r.state for rid, r in reservations.items()}
            for job in JobStore(fresh).list():  # a job's end and its settle or refund: both or neither
                closed = states[job.reservation_id]
                assert (job.state, closed) in (
                    ("queued", "reserved"),
                    ("complete", "settled"),
                    ("failed", "refunded"),
                    ("cancelled", "refunded"),
                )
                jobs_seen.add(job.reservation_id)
                reservation = reservations[job.reservation_id]
                assert 0 <= reservation.cost.inference_micro_usd <= 400_000
                if job.reservation_id in charged:  # its end was acknowledged with what it charged
                    assert reservation.charged == {"inference_micro_usd": charged[job.reservation_id]}
            for rid, state_name in acknowledged.items():
                assert rid in states, "an acknowledged reservation was lost"
                if state_name != "reserved":
                    assert states[rid] == state_name, "an acknowledged settle/refund was lost"
            jobs_budget = (
                fresh.balance("jobs", "agent") if any(b.partition == "jobs" for b in fresh.balances()) else None
            )
            if jobs_budget is not None:  # the money settled is exactly what the ended jobs charged
                ended = [r for r in reservations.values() if r.partition == "jobs" and r.state != "reserved"]
                assert jobs_budget.settled_inference_micro_usd == sum(
                    r.charged.get("inference_micro_usd", 0) for r in ended
                )
                assert 0 <= jobs_budget.remaining_inference_micro_usd <= 3_000_000
            for balance in fresh.balances():
                assert balance.settled_runs + balance.reserved_runs + balance.remaining_runs == balance.total_runs
                assert balance.settled_cases + balance.reserved_cases + balance.remaining_cases == balance.total_cases
                assert balance.remaining_runs >= 0 and balance.remaining_cases >= 0
    assert len(acknowledged) > 100, "the children did too little work for the test to mean anything"
    assert sum(acknowledged.get(rid) in ("settled", "refunded") for rid in jobs_seen) > 10, "too few jobs ended"
    assert sum(1 for v in charged.values() if v > 0) > 5, "too few jobs charged inference money"
    assert in_flight_kills > 0, "no kill hit a transaction in flight"
    with StateStore.open(path) as state:
        assert any(r.state == "reserved" for r in BudgetLedger.open(state, {}).reservations())
