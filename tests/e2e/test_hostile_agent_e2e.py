"""A hostile coding agent in `main`, end to end on Docker: every attack fails closed, nothing escalates.

The agent (`agents/hostile_agent.py`) runs `tasks/minimal` through `vero harbor run` like any other
agent: it probes the admin surface, names the hidden partition, searches `main` for hidden cases,
writes to the disclosure volume, commits a reserved path and an escaping symlink, injects options
into the version, submits a tree id, plants hooks and fsmonitor in the repository the sidecar reads,
makes the program worse, and burns the budget. The sealed session and the reward must show that
only the legitimate evaluations counted.

It also commits a program that is right only if its checkout holds the committed bytes, once
without git attributes and once with attributes that would change them on checkout (`eol=crlf`,
`ident`, `export-ignore`); evaluated on a fresh slot and on a slot that held the first tree, and
scored by the verifier from the sealed session, it must score as the reference change every time.
And it leaves a process in `main` that keeps submitting after the agent has ended, straight over
HTTP, and holds a CLI submit and a CLI eval at a proxy of its own until it sees intake closed; it
holds every ephemeral port of `main` too, over connections opened before (so `main` can open no new
TCP connection, which is how an outside attacker kept the hook's `curl` from closing intake):
intake closes with the task's hook in `main`, every later attempt is refused with `intake_closed`
(the CLI with each kind's exit code), and nothing it sends after that is in the sealed session.
Holding the CLI calls makes the proof independent of load: after the close each costs a round trip,
not a CLI start, before Harbor stops `main`.
"""

from __future__ import annotations

import errno
from datetime import datetime
from pathlib import Path

import pytest

from vero.core.session import read_session
from vero.verifier.intake_window import trial_after_agent_end

from ._examples import start_run, wait_run

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]

AGENTS_DIR = Path(__file__).resolve().parent / "agents"


def _attacks(trial_dir: Path) -> dict[str, str]:
    text = (trial_dir / "agent" / "hostile.txt").read_text()
    report = text.split("\n--- stderr", 1)[0]
    return dict(line.split("=", 1) for line in report.splitlines() if "=" in line)


def test_hostile_agent_gets_nothing_it_should_not(tmp_path: Path) -> None:
    run = wait_run(
        start_run("minimal", "hostile_agent:HostileAgent", tmp_path, extra_env={"PYTHONPATH": str(AGENTS_DIR)})
    )
    assert run.returncode == 0, run.diagnostics()
    attacks = _attacks(run.trial_dir)
    expected = {
        "admin_export": "401",  # no token
        "admin_seal": "401",  # a guessed token
        "hidden_status": "403",  # the hidden partition by name
        "hidden_named": "no",  # ... and the refusal does not echo it
        "hidden_files": "0",  # no case of another partition in main's filesystem
        "trusted_paths": "0",  # no sidecar state or config in main
        "context_write": "no",  # the disclosure volume is read-only for the agent
        "reserved_exit": "9",  # a commit tracking .vero/ is rejected
        "symlink_exit": "9",  # a link to /etc/passwd is rejected
        "forged_submission": "400",  # a tree id is not a version
        "probe_plain_score": "1.0",  # the committed bytes, on a fresh slot
        "probe_attributes_score": "1.0",  # with the tree's attributes: the same bytes, fresh slot
        "probe_attributes_again_score": "1.0",  # ... and on the slot that held the first tree
        "probe_submit_exit": "0",
        "late_started": "yes",
        "eval_exit": "0",  # a plain evaluation still works despite planted hooks
        "eval_score": "0.0",  # and measures the worse program honestly
        "budget_exit": "4",  # the budget runs out (402), it is not bypassed
        "status_remaining_runs": "0",
    }
    assert {k: attacks.get(k) for k in expected} == expected, attacks
    assert attacks["injection_exit"] in {"2", "9"}, attacks  # refused locally or by the sidecar

    config = run.verifier_config
    session = read_session(
        run.session_archive,
        tmp_path / "session",
        spec_digest=config.spec_digest,
        baseline_commit=config.baseline_commit,
    )
    # Exactly the accepted evaluations were charged: the train budget (5 runs) is spent by them alone.
    train = [j for j in session.jobs if j.partition == "train"]
    assert len(train) == 5 and {j.state for j in train} <= {"complete", "cancelled", "failed"}
    assert {j.partition for j in session.jobs} <= {"train", "holdout"}
    (balance,) = [b for b in session.balances if b.partition == "train"]
    assert balance.settled_runs + balance.reserved_runs <= 5

    # Late intake: the agent's end, then what the process it left got for each attempt.
    agent_end = datetime.fromisoformat(run.result["agent_execution"]["finished_at"]).timestamp()
    attempts = _late_attempts(run.trial_dir)
    # It held every ephemeral port of main before the agent ended: no new TCP connection could leave
    # main (the close hook's old way). The hook closes intake over the sidecar's Unix socket instead.
    (probe,) = [a for a in attempts if a["via"] == "probe"]
    assert probe["exit"] == errno.EADDRNOTAVAIL, probe["message"]
    attempts = [a for a in attempts if a["via"] != "probe"]
    trial_log = (run.trial_dir / "trial.log").read_text()
    assert "Collect hook in service 'main' completed" in trial_log, trial_log
    refused = [a for a in attempts if a["code"] == "intake_closed"]
    assert refused, attempts  # intake closed while main still ran
    closed_seen = min(a["answered"] for a in refused)  # the first answer that said intake was closed
    # Each kind through the CLI, held until the close: refused with its own exit code, once each.
    cli_refused = [a for a in refused if a["via"] == "cli"]
    assert sorted((a["what"], a["exit"]) for a in cli_refused) == [("eval", 3), ("submit", 6)], attempts
    assert all(a["exit"] == 409 for a in refused if a["via"] == "http"), refused
    accepted = [a for a in attempts if a["exit"] in (0, 200, 201)]  # the CLI's 0, HTTP 201 or 200
    # Once refused, never accepted again (what the window before the hook let in is all there is).
    assert all(a["started"] < closed_seen for a in accepted), attempts
    assert all(a["code"] == "intake_closed" for a in attempts if a["started"] > closed_seen), attempts
    assert all(a["exit"] in (0, 3) for a in attempts if a["what"] == "eval"), attempts
    last_accepted = max((a["answered"] for a in accepted), default=agent_end)
    cli_done = max(a["answered"] for a in cli_refused)
    print(
        f"late intake: agent ended at {agent_end:.3f}; the last accepted attempt was answered "
        f"{last_accepted - agent_end:+.2f} s from it, the first refusal {closed_seen - agent_end:+.2f} s, "
        f"both CLI refusals by {cli_done - agent_end:+.2f} s, main's last logged answer "
        f"{max(a['answered'] for a in attempts) - agent_end:+.2f} s; "
        f"{len(refused)} refused, {len(accepted)} accepted in all"
    )
    late_jobs = [j for j in session.jobs if j.created_at.timestamp() > agent_end]
    assert all(j.created_at.timestamp() < closed_seen for j in late_jobs), late_jobs
    assert session.submission is not None
    assert session.submission.submitted_at.timestamp() < closed_seen
    # What the window let in is told to the operator: the intake record in finalization.json, set
    # against Harbor's agent end, counts exactly the session's late jobs and a late submission, and
    # `vero harbor run` warns of it.
    after = trial_after_agent_end(run.result, run.finalization)
    assert after is not None and after.closed_by == "agent_ended", run.finalization.get("intake")
    assert after.closed_after_sec is not None and after.closed_after_sec > 0
    assert after.evaluations == len(late_jobs)
    late_submission = session.submission.submitted_at.timestamp() > agent_end
    assert (after.submission_after_sec is not None) == late_submission
    assert ("the sidecar took work after the agent ended" in run.output) == after.late, run.output[-3000:]

    # Slot identity: the submitted tree (the probe's, or the late commit of the same tree) scores as
    # the reference change on the hidden case in the verifier too.
    final = run.finalization
    assert final["status"] == "scored" and final["chosen"]["is_baseline"] is False, final
    assert final["chosen"]["candidate"] in {attacks["probe_commit"], attacks["late_commit"]}, final["chosen"]
    assert run.reward == pytest.approx(final["rewards"]["reward"]) == pytest.approx(1.0)


def _late_attempts(trial_dir: Path) -> list[dict]:
    """`late.log` as Harbor collected it from main's `/logs/artifacts`: one attempt per line (how it
    was made, `cli` or straight over `http`, and what; when it started and was answered; the CLI's
    exit code or the HTTP status; the error text)."""
    (log,) = list((trial_dir / "artifacts").rglob("late.log"))
    attempts = []
    for line in log.read_text().splitlines():
        what, started, answered, code, *message = line.split(" ", 4)
        text = message[0] if message else ""
        via, kind = what.split("/")
        attempts.append(
            {
                "via": via,
                "what": kind,
                "started": float(started),
                "answered": float(answered),
                "exit": int(code),
                "code": "intake_closed" if "intake_closed" in text else None,
                "message": text,
            }
        )
    return attempts
