"""`vero.verifier.intake_window`: the sidecar's intake record set against Harbor's agent end."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from vero.verifier.intake_window import IntakeRecord, after_agent_end, agent_finished_at, trial_after_agent_end

END = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return END + timedelta(seconds=seconds)


def test_only_what_came_after_the_end_counts_and_the_close_is_given_relative_to_it() -> None:
    record = IntakeRecord(
        closed_at=_at(2.5), closed_by="agent_ended", submitted_at=_at(-1), admitted_at=[_at(-9), _at(0), _at(0.4)]
    )
    after = after_agent_end(record, END)
    # An admission at the very instant of the end is not after it; the submission before it is not late.
    assert (after.evaluations, after.submission_after_sec, after.closed_after_sec) == (1, None, 2.5)
    assert after.late
    assert after.summary() == "taken after the agent's end: 1 evaluation; intake closed +2.50 s after it (main's hook)"


def test_a_session_with_nothing_late_and_one_closed_by_the_seal_say_so() -> None:
    timely = after_agent_end(IntakeRecord(closed_at=_at(1), closed_by="agent_ended", admitted_at=[_at(-3)]), END)
    assert not timely.late
    assert timely.summary() == "nothing taken after the agent's end; intake closed +1.00 s after it (main's hook)"
    sealed = after_agent_end(IntakeRecord(closed_at=_at(40), closed_by="sealed", submitted_at=_at(12)), END)
    assert sealed.late and sealed.submission_after_sec == pytest.approx(12)
    assert sealed.summary().endswith("intake closed +40.00 s after it (the seal: main's hook never came)")
    unknown = after_agent_end(IntakeRecord(), END)
    assert not unknown.late and unknown.summary().endswith("the session does not say when intake closed")


@pytest.mark.parametrize(
    "result",
    [
        {},
        {"agent_execution": None},
        {"agent_execution": {"finished_at": None}},
        {"agent_execution": {"finished_at": "not a time"}},
        {"agent_execution": {"finished_at": "2026-12-02T12:00:00"}},  # no timezone: not comparable
        {"agent_execution": "finished"},
    ],
)
def test_an_agent_end_that_is_missing_or_unusable_gives_nothing(result: dict) -> None:
    assert agent_finished_at(result) is None
    assert trial_after_agent_end(result, {"intake": IntakeRecord(closed_at=_at(1)).model_dump(mode="json")}) is None


def test_a_finalization_without_a_readable_intake_record_gives_nothing() -> None:
    result = {"agent_execution": {"started_at": "2026-12-02T11:00:00Z", "finished_at": "2026-12-02T12:00:00Z"}}
    assert agent_finished_at(result) == END
    assert trial_after_agent_end(result, None) is None
    assert trial_after_agent_end(result, {"intake": None}) is None
    assert trial_after_agent_end(result, {"intake": {"closed_at": "soon"}}) is None
    found = trial_after_agent_end(result, {"intake": {"closed_at": "2026-12-02T12:00:03Z", "closed_by": "agent_ended"}})
    assert found is not None and found.closed_after_sec == pytest.approx(3)
