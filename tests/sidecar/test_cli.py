"""`vero harbor status|eval|result|submit` as the coding agent runs them: a real `vero` subprocess
with `VERO_SIDECAR_URL` pointing at the real sidecar app under uvicorn (stub backend, real repos)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from vero.sidecar.models import JobView, StatusResponse, SubmissionView
from vero.spec.models import CandidateLimits

from ._client_support import CountingApp, bound_port
from ._server import ServerThread, SidecarHarness, StubBackend, commit_file, make_harness

VERO = str(Path(sys.executable).with_name("vero"))


def vero(url: str, *args: str, timeout_sec: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VERO_SIDECAR_URL": url, "COLUMNS": "200"}
    return subprocess.run([VERO, "harbor", *args], env=env, capture_output=True, text=True, timeout=timeout_sec)


def error_of(proc: subprocess.CompletedProcess[str]) -> dict:
    """The JSON error document on stdout; its exit code must be the process's."""
    error = json.loads(proc.stdout)["error"]
    assert error["exit_code"] == proc.returncode
    assert error["message"] and error["message"] in proc.stderr
    return error


@contextmanager
def running(harness: SidecarHarness) -> Iterator[tuple[str, CountingApp]]:
    app = CountingApp(harness.create_app())
    with ServerThread(app) as server:
        yield server.url, app


@pytest.mark.timeout(120)
def test_agent_workflow_prints_json_and_wait_reaches_completion(tmp_path: Path) -> None:
    release = threading.Event()
    harness = make_harness(tmp_path, backend=StubBackend(block=release, scores={"t1": 1.0}))
    version = commit_file(harness.agent_repo, "solve.py", "print('v2')\n", "v2")
    with running(harness) as (url, app):
        proc = vero(url, "status")
        assert proc.returncode == 0, proc.stderr
        status = StatusResponse.model_validate_json(proc.stdout)
        assert {p.name for p in status.partitions} == {"train", "val", "blind"} and status.jobs == []

        def release_later() -> None:  # one second after the nested run started
            if harness.backend.started.acquire(timeout=60):
                release.wait(1.0)
            release.set()

        releaser = threading.Thread(target=release_later, daemon=True)
        releaser.start()
        proc = vero(
            url, "eval", "--partition", "train", "--case", "t1", "--case", "t2", "--wait", "--poll-interval-sec", "0.1"
        )
        releaser.join(60)
        assert proc.returncode == 0, proc.stderr
        job = JobView.model_validate_json(proc.stdout)
        assert job.state == "complete" and job.candidate == version and job.n_cases == 2
        assert job.result is not None and job.result.score == pytest.approx(0.75)
        # Progress went to stderr, naming the job and its states; stdout held only the JSON.
        assert f"job {job.id}" in proc.stderr and "complete" in proc.stderr
        # The admission's answer was the first look; then long polls the sidecar held until the job finished.
        assert 1 <= app.arrived("GET", f"/evaluations/{job.id}") <= 3

        proc = vero(url, "result", job.id)
        assert proc.returncode == 0, proc.stderr
        assert JobView.model_validate_json(proc.stdout) == job

        proc = vero(url, "result", job.id, "--text")
        assert proc.returncode == 0 and "score 0.75" in proc.stdout and "case t1: score 1" in proc.stdout

        proc = vero(url, "submit", "--version", version)
        assert proc.returncode == 0, proc.stderr
        assert SubmissionView.model_validate_json(proc.stdout).candidate == version

        proc = vero(url, "status", "--text")
        assert proc.returncode == 0
        assert "partition train: 6 cases, disclosure full, runs left 4/5, cases left 28/30" in proc.stdout
        assert (
            "partition val: 6 cases, disclosure aggregate (the whole partition or unions of its 2 blocks), "
            "runs left 3/3"
        ) in proc.stdout
        assert "  block 1: v4, v5, v6" in proc.stdout
        assert f"submission: version {version}" in proc.stdout

        proc = vero(url, "eval", "-p", "val", "--block", "1", "--wait", "--poll-interval-sec", "0.1")
        assert proc.returncode == 0, proc.stderr
        assert JobView.model_validate_json(proc.stdout).n_cases == 3
        assert harness.backend.runs[-1].case_names == ("v4", "v5", "v6")

        proc = vero(url, "eval", "-p", "train", "--json")  # without --wait: answered once admitted
        assert proc.returncode == 0
        assert JobView.model_validate_json(proc.stdout).state in ("queued", "running", "complete")


@pytest.mark.timeout(120)
def test_refusals_exit_with_their_codes_and_are_sent_once(tmp_path: Path) -> None:
    harness = make_harness(tmp_path)
    with running(harness) as (url, app):
        proc = vero(url, "eval", "--partition", "no-such-partition")
        assert proc.returncode == 3 and error_of(proc)["type"] == "PolicyDenied"
        assert "no-such-partition" not in proc.stdout  # the sidecar's wording is generic

        for _ in range(2):  # `blind` allows 2 runs
            assert vero(url, "eval", "-p", "blind").returncode == 0
        proc = vero(url, "eval", "-p", "blind")
        assert proc.returncode == 4 and error_of(proc)["type"] == "BudgetExhausted"

        proc = vero(url, "eval", "-p", "train", "--version", "no-such-branch")
        assert proc.returncode == 9 and error_of(proc)["type"] == "CandidateRejected"

        big = harness.agent_repo / "big.bin"
        big.write_bytes(b"\0" * (CandidateLimits().max_file_bytes + 1))
        commit_file(harness.agent_repo, "solve.py", "print('big')\n", "big")
        proc = vero(url, "eval", "-p", "train")
        assert proc.returncode == 9 and error_of(proc)["type"] == "CandidateTooLarge"
        assert "target.limits.max_file_bytes" in proc.stderr and "'big.bin'" in proc.stderr

        proc = vero(url, "result", "ev-0123456789abcdef")
        assert proc.returncode == 7 and error_of(proc)["type"] == "UnknownJob"

        proc = vero(url, "result", "ev-" + "0" * 100)  # refused by the server's schema (422)
        assert proc.returncode == 2 and error_of(proc)["type"] == "RequestInvalid"

        proc = vero(url, "eval", "-p", "")  # refused before sending
        assert proc.returncode == 2 and error_of(proc)["type"] == "RequestInvalid"

        proc = vero(url, "eval")  # typer: missing --partition
        assert proc.returncode == 2 and "--partition" in proc.stderr

    assert app.arrived("POST", "/evaluations") == 6  # 403, 202, 202, 402, 400, 413: no retries of 4xx
    assert app.arrived_prefix("GET", "/evaluations/") == 2


@pytest.mark.timeout(120)
def test_infrastructure_failure_exits_5(tmp_path: Path) -> None:
    harness = make_harness(tmp_path, backend=StubBackend(fail_with_infrastructure=True))
    with running(harness) as (url, _app):
        proc = vero(url, "eval", "-p", "train", "--wait", "--poll-interval-sec", "0.1")
        assert proc.returncode == 5, proc.stderr
        assert error_of(proc)["type"] == "InfrastructureFailure"
        assert "refunded" in proc.stderr and "docker" not in proc.stderr
        job_id = harness.backend.runs[0].evaluation_id
        proc = vero(url, "result", job_id)
        assert proc.returncode == 5 and error_of(proc)["type"] == "InfrastructureFailure"


@pytest.mark.timeout(120)
def test_unfinished_and_cancelled_jobs_exit_1_and_a_sealed_session_refuses(tmp_path: Path) -> None:
    harness = make_harness(tmp_path, backend=StubBackend(block=threading.Event()), drain_timeout_sec=0.2)
    with running(harness) as (url, _app):
        proc = vero(url, "eval", "-p", "train", "--wait", "--timeout-sec", "0.5", "--poll-interval-sec", "0.1")
        assert proc.returncode == 1, proc.stderr
        job = JobView.model_validate_json(proc.stdout)
        assert job.state in ("queued", "running")
        assert "keeps running" in proc.stderr and f"vero harbor result {job.id} --wait" in proc.stderr

        proc = vero(url, "result", job.id)  # not waiting: a running job is not a failure
        assert proc.returncode == 0 and JobView.model_validate_json(proc.stdout).state in ("queued", "running")

        sealed = httpx.post(
            f"{url}/admin/seal",
            headers=harness.admin_headers(),
            timeout=60,
            json={"output_dir": str(tmp_path / "export")},
        )
        assert sealed.status_code == 200 and sealed.json()["n_cancelled"] == 1

        proc = vero(url, "result", job.id, "--wait")
        assert proc.returncode == 1
        cancelled = JobView.model_validate_json(proc.stdout)
        assert (cancelled.state, cancelled.error) == ("cancelled", "sealed")

        proc = vero(url, "eval", "-p", "train")
        assert proc.returncode == 3 and error_of(proc)["type"] == "EvaluationsClosed"
        assert error_of(proc)["message"].startswith("intake_closed: the agent phase is over")
        proc = vero(url, "submit")
        assert proc.returncode == 6 and error_of(proc)["type"] == "SubmissionsClosed"


@pytest.mark.timeout(120)
def test_unreachable_sidecar_exits_8_with_a_clear_message() -> None:
    with bound_port() as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        proc = vero(url, "status")
    assert proc.returncode == 8
    assert error_of(proc)["type"] == "SidecarUnavailable"
    assert f"error: cannot reach the sidecar at {url}" in proc.stderr
    assert "VERO_SIDECAR_URL" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_every_option_of_the_agent_commands_is_documented_and_exit_codes_agree() -> None:
    from vero.agent_cli import _EXIT_CODES, _PROBLEM_EXIT_CODES, build_parser
    from vero.commands.exit_codes import EXIT_CODES, PROBLEM_EXIT_CODES

    assert all(EXIT_CODES[cls] == code for cls, code in _EXIT_CODES.items())
    assert _PROBLEM_EXIT_CODES == PROBLEM_EXIT_CODES
    parser = build_parser()
    subcommands = next(a for a in parser._actions if a.dest == "command").choices
    assert set(subcommands) == {"status", "eval", "result", "submit", "evaluations"}
    for name, command in subcommands.items():
        assert command.description and "Exit codes" in (command.epilog or "")
        for action in command._actions:
            assert action.help, f"vero harbor {name}: {action.dest} has no help"
    proc = subprocess.run(
        [VERO, "harbor", "eval", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0
    for option in (
        "--partition",
        "--version",
        "--case",
        "--block",
        "--wait",
        "--poll-interval-sec",
        "--timeout-sec",
        "--url",
        "--json",
        "--text",
        "Exit codes",
    ):
        assert option in proc.stdout
    listed = subprocess.run(
        [VERO, "harbor", "--help"], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"}
    )
    assert listed.returncode == 0 and "evaluations" in listed.stdout and "submit" in listed.stdout


@pytest.mark.timeout(120)
def test_agent_commands_load_only_the_standard_library(tmp_path: Path) -> None:
    harness = make_harness(tmp_path)
    probe = (
        "import json, sys\n"
        "sys.argv = ['vero', 'harbor', 'status', '--url', sys.argv[1]]\n"
        "from vero._entry import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    assert exc.code in (0, None), exc.code\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    )
    with running(harness) as (url, app):
        proc = subprocess.run([sys.executable, "-c", probe, url], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert StatusResponse.model_validate_json(proc.stdout).name == "demo"
    loaded = set(json.loads(proc.stderr.strip().splitlines()[-1]))
    third_party = {m.split(".")[0] for m in loaded} - set(sys.stdlib_module_names) - {"vero", "__main__"}
    assert third_party == set(), third_party
    # Nor the costlier parts of the standard library: a plain call is parsed without argparse (and
    # its gettext, locale, shutil), and an ASCII host is resolved without the IDNA codec.
    assert loaded & {"argparse", "gettext", "locale", "shutil", "typing", "encodings.idna", "http.client"} == set()
    assert app.arrived("GET", "/status") == 1


@pytest.mark.timeout(120)
def test_evaluations_are_listed_page_by_page(tmp_path: Path) -> None:
    harness = make_harness(tmp_path)
    with running(harness) as (url, _app):
        ids = [json.loads(vero(url, "eval", "-p", "train", "-c", f"t{i}").stdout)["id"] for i in (1, 2, 3)]
        newest_first = ids[::-1]
        first = vero(url, "evaluations", "--limit", "2")
        assert first.returncode == 0, first.stderr
        page = json.loads(first.stdout)
        assert [j["id"] for j in page["jobs"]] == newest_first[:2] and page["next_cursor"] == newest_first[1]
        assert all(j["result"] is None or j["result"]["cases"] is None for j in page["jobs"])
        second = json.loads(vero(url, "evaluations", "--limit", "2", "--before", page["next_cursor"]).stdout)
        assert [j["id"] for j in second["jobs"]] == newest_first[2:] and second["next_cursor"] is None
        everything = json.loads(vero(url, "evaluations", "--limit", "1", "--all").stdout)
        assert [j["id"] for j in everything["jobs"]] == newest_first
        text = vero(url, "evaluations", "--limit", "1", "--text").stdout
        assert f"job {newest_first[0]}" in text and f"--before {newest_first[0]}" in text
        assert json.loads(vero(url, "evaluations", "--partition", "val").stdout)["jobs"] == []
        proc = vero(url, "evaluations", "--before", "ev-0000000000000000")
        assert proc.returncode == 7 and error_of(proc)["type"] == "UnknownJob"
        assert vero(url, "evaluations", "--limit", "0").returncode == 2
        status = json.loads(vero(url, "status").stdout)
        assert status["n_jobs"] == 3 and sum(status["job_counts"]["train"].values()) == 3
