"""`vero.core.watchdog`: one thread runs every armed action at its deadline, unless disarmed."""

from __future__ import annotations

import threading

import pytest

from vero.core.watchdog import Watchdog

pytestmark = pytest.mark.timeout(60)


def test_actions_run_in_deadline_order_and_a_disarmed_one_never_runs():
    watchdog = Watchdog()
    ran: list[str] = []
    last = threading.Event()

    def record(name: str, done: threading.Event | None = None):
        def action() -> None:
            ran.append(name)
            if done is not None:
                done.set()

        return action

    watchdog.arm(0.6, record("late", last))
    watchdog.arm(0.2, record("early"))  # armed after a later one: the thread wakes for it
    cancelled = watchdog.arm(0.1, record("disarmed"))
    watchdog.arm(0.4, record("middle"))
    watchdog.disarm(cancelled)
    assert last.wait(10)  # the last deadline: a disarmed action would have run before it
    assert ran == ["early", "middle", "late"]


def test_a_failing_action_leaves_the_later_ones_running_and_disarm_after_a_run_is_harmless():
    watchdog = Watchdog()
    done = threading.Event()

    def fail() -> None:
        raise RuntimeError("the process was gone")

    failed = watchdog.arm(0.05, fail)
    watchdog.arm(0.1, done.set)
    assert done.wait(10)
    watchdog.disarm(failed)  # ran (and failed) already: nothing to cancel
    again = threading.Event()
    watchdog.arm(0.05, again.set)  # the thread is still there for new deadlines
    assert again.wait(10)
