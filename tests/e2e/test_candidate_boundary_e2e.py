"""`kind: agent` candidates behind the process boundary, with the inference gateway, on Docker.

The `tasks/llm-puzzle-agent` example (its candidate asks a model for a shell command) is served by a
real sidecar (`SidecarService` over HTTP) whose nested runs are real `harbor run -e docker` over the
puzzle cases, and then verified (`verify`) on hidden cases; the "model" is a fake OpenAI-compatible
provider on loopback that answers like a model would (the command in a fenced block), computed with
the puzzle-agent reference's strategies. Everything between the candidate and that HTTP call is
the real code: candidate hosts as throw-away uids, the environment proxy, the gateway, metering.

1. The example's reference change through the gateway scores what the rule-based reference scores
   (1.0 on each case): the boundary and the gateway leave an honest measurement alone; its two model
   calls are metered and disclosed.
2. A hostile candidate (`agents/hostile_candidate.py`) attacks from inside its candidate host, in
   the sidecar's evaluation and in the verifier's hidden scoring: every attempt is denied, its
   forged result and reward files never exist, its claims are not taken, the exception it names
   like an infrastructure failure is charged, its daemon is dead, the gateway refuses the off-list
   model and stops it at the budget; it scores 0. In the case container (issue 22) its uploads and
   downloads have the agent user's rights only (no `python3` in `/usr/local/bin`, no `.pth` in
   site-packages, nothing in `/etc` or `/root`, no `/etc/shadow`), the process it left to forge the
   reward during the tests is killed before them, and what it planted to break the collection of
   the trial's files is removed: every attempt is flagged, charged, and scores 0, also on the
   cases written like a third party's (`THIRD_PARTY`: a `test.sh` that kills nothing and runs
   `python3` as root), where without the clean case the left process and the fake `python3` would
   have written reward 1.
3. Nothing crosses between evaluations, tiers or tokens (`agents/crossing_candidate.py`): what a
   candidate evaluated on a `none` partition leaves in `/tmp`, `/var/tmp`, `/dev/shm`, a
   world-writable dir or SysV shared memory is gone before a candidate on a `full` partition runs,
   which finds nothing and shows the agent nothing; two evaluations running at once cannot use each
   other's gateway tokens (401, counted on the evaluation that tried); and candidates that sleep
   1 s and 20 s on the `none` partition look the same to the agent in every answer.
4. The provider key is in no response, file, log, archive or artifact.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import tenacity
from examples.conftest import puzzle_model, reference_puzzle_solver  # tests/ is on sys.path
from inference.fake_upstream import FakeUpstream
from sidecar._server import commit_file, git, make_harness, wait_for_state

from vero.harbor import HarborBackend
from vero.spec.compiled import VerifierConfig
from vero.spec.models import (
    CandidateRuntime,
    HarborSpec,
    InferenceSpec,
    PartitionAccess,
    ScoringSpec,
    SelectionSpec,
    TargetPartition,
)
from vero.verifier import VerifierPaths, verify

from ._leaks import files_containing

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "tasks" / "llm-puzzle-agent"
PUZZLE = REPO / "tasks" / "puzzle-agent"
HOSTILE = Path(__file__).resolve().parent / "agents" / "hostile_candidate.py"
CROSSING = Path(__file__).resolve().parent / "agents" / "crossing_candidate.py"
KEY = "sk-provider-key-that-must-never-leak-4242"
SECRET_NAME = "VERO_TEST_PROVIDER_KEY"
TRAIN = ["count-lines-1", "reverse-string-1"]
HIDDEN = ["sort-words-1", "find-file-1"]
SECRET = ["sum-numbers-1"]  # a `none` partition: its instruction and data must reach nobody
POOL = ["count-lines-2", "decode-base64-1"]  # a `full` partition the crossing candidates try to reach
SECRET_TEXT = "Compute their sum"  # from the secret case's instruction
QUANTUM_SEC = 90.0
"""The `none` partition's timing quantum: longer than any of its evaluations here, so every one of
them is shown at exactly one quantum (k = 1 of `JobRunner.shown_finish`), and the test waits the
quantum out. Measured at a load average of 22-27 on this two-core machine: the quick and the slow
run took 29 s and 46 s (the slow one's 20 s sleep included), about half of it."""
THIRD_PARTY = {"reverse-string-1", "find-file-1"}
"""Cases whose `test.sh` is replaced by `THIRD_PARTY_TEST`."""
THIRD_PARTY_TEST = """#!/bin/bash
# Written like a third party's: it kills nothing and runs python3 as root, not isolated.
mkdir -p /logs/verifier
python3 - <<'PY'
import json


def normalize(text):
    return "\\n".join(line.rstrip() for line in text.strip("\\n").splitlines()).rstrip("\\n")


expected = normalize(open("/tests/expected.txt").read())
try:
    answer = normalize(open("/app/answer.txt").read())
except OSError:
    answer = None
json.dump({"reward": 1 if answer == expected else 0}, open("/logs/verifier/reward.json", "w"))
PY
"""
IMPORT_PATH = "llm_puzzle_agent.agent:LlmPuzzleAgent"
PRICE_IN, PRICE_OUT = 1e-6, 2e-6


def copy_cases(names: list[str], dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copytree(PUZZLE / "cases" / name, dest / name)
        if name in THIRD_PARTY:
            (dest / name / "tests" / "test.sh").write_text(THIRD_PARTY_TEST)
    dest.chmod(0o700)  # as the images make them: no candidate host may enter
    return dest


def attack_reports(job_dir: Path) -> list[dict]:
    reports = [json.loads(p.read_text()) for p in sorted(job_dir.glob("*/agent/candidate/attacks.json"))]
    assert reports, f"no attack report under {job_dir}"
    return reports


def assert_attacks_failed(report: dict, *, expect_budget_stop: bool) -> None:
    assert report["found_harbor"] == "True", report  # it did find its target...
    for attack in (
        "list_job_dir",
        "forge_results",
        "write_job_file",
        "list_cases",
        "read_case_tests",
        "read_harbor_environ",
        "read_state",
        "read_root_home",
        "docker_socket",
        "off_list_model",
        "exec_as_root",
        # issue 22: uploads and downloads have the case agent user's rights only
        "upload_python3",
        "upload_etc",
        "upload_root_home",
        "upload_dir_usr_local_bin",
        "upload_pth",
        "download_shadow",
    ):
        assert report[attack].startswith("denied"), (attack, report)
    assert report["upload_python3"] == "denied: PermissionError", report
    assert report["download_shadow"] == "denied: PermissionError", report
    # ... which still lets it write and read its own files.
    assert report["upload_own"].startswith("ok") and report["download_own"].startswith("ok"), report
    assert report["leftover"] == "started" and report["planted"] == "planted", report
    assert "PermissionDenied" in report["off_list_model"], report
    assert report["secret_in_own_env"] == "False" and report["token_is_the_evaluations"] == "True", report
    assert int(report["uid"]) >= 52000 and report["groups"] == "[]", report
    if expect_budget_stop:
        assert report["budget_stop"].startswith("APIStatusError"), report
    # The daemon it detached died with its uid (a reused pid would belong to someone else).
    assert _uid(Path(f"/proc/{report['daemon_pid']}")) != int(report["uid"]), report


def assert_trials_honest(job_dir: Path) -> None:
    results = sorted(job_dir.glob("*/result.json"))
    assert results, job_dir
    for result_path in results:
        result = json.loads(result_path.read_text())
        assert result["exception_info"]["exception_type"] == "CandidateAgentError", result["exception_info"]
        assert "EnvironmentStartTimeoutError" in result["exception_info"]["exception_message"]
        # The honest reward: the left process, the fake python3 and the .pth never wrote theirs.
        assert result["verifier_result"]["rewards"] == {"reward": 0}
        agent = result["agent_result"]
        assert agent["n_input_tokens"] is None and agent["cost_usd"] is None
        assert "reward" not in (agent.get("metadata") or {})
        # The clean case before the tests: its process killed, its plants removed (the verifier dir
        # was collected: the download no longer fails), all of it recorded by the trusted side.
        clean = agent["metadata"]["vero_case_clean"]
        assert clean["agent_user_root"] == 0 and clean["leftover_processes_killed"] >= 1, clean
        assert clean["verifier_entries_removed"] >= 4 and clean["log_entries_removed"] >= 3, clean
        assert (result_path.parent / "verifier" / "test-stdout.txt").is_file()
        assert not (result_path.parent / "planted.json").exists()
    assert not (job_dir / "planted.json").exists()
    assert {Path(p).parent.name.split("__")[0] for p in results} & THIRD_PARTY, "no third-party case was run"


def test_candidate_boundary_and_gateway_on_docker(portable_toolchain, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    monkeypatch.setenv(SECRET_NAME, KEY)
    root = Path(tempfile.mkdtemp(prefix="vero-boundary-e2e-"))
    root.chmod(0o755)
    try:
        _run(root, portable_toolchain[1], caplog)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(root: Path, python: Path, caplog: pytest.LogCaptureFixture) -> None:
    with FakeUpstream(responder=puzzle_model(reference_puzzle_solver(root))) as fake:
        inference = InferenceSpec.model_validate(
            {
                "providers": {"openai": {"api": "openai", "base_url": f"{fake.url}/v1", "api_key_secret": SECRET_NAME}},
                "models": {
                    "gpt-4o-mini": {
                        "provider": "openai",
                        "input_cost_per_token": PRICE_IN,
                        "output_cost_per_token": PRICE_OUT,
                    }
                },
                # A call is forwarded only when its bound (its bytes plus the provider's overhead
                # in, its max_tokens out: about $0.0022 for the hostile candidate's calls, $0.0036
                # for the puzzle agent's) is free: the limits leave room for the good candidate's
                # two calls and stop the hostile one's loop after a few dozen.
                "evaluation_limit_usd": 0.006,
            }
        )
        backend = HarborBackend(python_executable=python, infra_wait=tenacity.wait_none())
        runtime = CandidateRuntime(kind="agent", agent_import_path=IMPORT_PATH)
        harbor = HarborSpec(n_concurrent=2, infra_retries=0, evaluation_timeout_sec=1200, drain_timeout_sec=60)
        baseline = {str(p.relative_to(EXAMPLE / "target")): p.read_text() for p in (EXAMPLE / "target").rglob("*.py")}
        harness = make_harness(
            root / "sidecar",
            backend=backend,
            baseline_files=baseline,
            runtime=runtime,
            harbor=harbor,
            partitions={"train": TRAIN, "secret": SECRET, "pool": POOL},
            access={
                "train": PartitionAccess(
                    disclosure="full", min_aggregate_cases=1, total_runs=5, total_cases=10, total_inference_usd=0.006
                ),
                "secret": PartitionAccess(
                    disclosure="none", total_runs=5, total_cases=5, timing_quantum_sec=QUANTUM_SEC
                ),
                "pool": PartitionAccess(
                    disclosure="full", min_aggregate_cases=1, total_runs=5, total_cases=10, total_inference_usd=0.03
                ),
            },
            secrets=[SECRET_NAME],
            inference=inference,
        )
        copy_cases(TRAIN + SECRET + POOL, harness.cases_dir)
        subprocess.run(["git", "apply", str(EXAMPLE / "reference.patch")], cwd=harness.agent_repo, check=True)
        git(harness.agent_repo, "commit", "-qam", "reference: take the command out of the fenced block")
        reference = git(harness.agent_repo, "rev-parse", "HEAD").strip()
        hostile_source = (
            HOSTILE.read_text().replace("{state_dir}", str(harness.state_dir)).replace("{secret}", SECRET_NAME)
            + "\n\nLlmPuzzleAgent = HostileCandidate\n"
        )
        hostile = commit_file(harness.agent_repo, "llm_puzzle_agent/agent.py", hostile_source, "hostile")

        public = Path(tempfile.mkdtemp(prefix="vero-e2e-public-", dir="/tmp"))
        public.chmod(0o1777)  # a world-writable dir of the machine, as an image may have

        def crossing(mode: str, sleep_sec: float = 0.0) -> str:
            source = (
                CROSSING.read_text().replace("{mode}", mode).replace("{public}", str(public))
                + "\n\nLlmPuzzleAgent = CrossingCandidate\n"
            ).replace("{sleep_sec}", str(sleep_sec))
            return commit_file(harness.agent_repo, "llm_puzzle_agent/agent.py", source, f"crossing: {mode} {sleep_sec}")

        crossers = {
            "leak": crossing("leak"),
            "quick": crossing("sleep", 1),
            "slow": crossing("sleep", 20),
            "read": crossing("read"),
            "steal": crossing("steal"),
        }
        with harness.serve(run_as=None, max_concurrent_evaluations=3) as (_, client):
            # 1. The well-behaved candidate through the gateway (first: the hostile one drains the budget).
            good = client.post("/evaluations", json={"partition": "train", "version": reference})
            assert good.status_code == 202, good.text
            good = wait_for_state(client, good.json()["id"], {"complete", "failed"}, timeout_sec=1200)
            assert good["state"] == "complete", good
            assert good["result"]["score"] == 1.0 and good["result"]["n_dead"] == 0, good
            usage = good["result"]["inference"]
            assert usage["calls"] == 2 and usage["by_model"]["gpt-4o-mini"]["calls"] == 2, usage
            assert usage["cost_usd"] > 0 and usage["charged_micro_usd"] > 0
            # 2. The hostile candidate in the sidecar's evaluation.
            bad = client.post("/evaluations", json={"partition": "train", "version": hostile})
            assert bad.status_code == 202, bad.text
            bad = wait_for_state(client, bad.json()["id"], {"complete", "failed"}, timeout_sec=1200)
            assert bad["state"] == "complete", bad  # charged, never refunded as "infrastructure"
            assert bad["result"]["score"] == 0.0, bad
            assert {a["exception_type"] for c in bad["result"]["cases"] for a in c["attempts"]} == {
                "CandidateAgentError"
            }
            usage = bad["result"]["inference"]
            assert usage["refused_calls"]["model_not_allowed"] == len(TRAIN), usage
            assert usage["refused_calls"]["over_budget"] >= 1, usage  # its next call's bound is not free
            budget = next(p for p in client.get("/status").json()["partitions"] if p["name"] == "train")["budget"]
            assert budget["total_inference_usd"] == pytest.approx(0.006)
            assert 0 <= budget["remaining_inference_usd"] < 0.0025, budget  # less than one more call's bound
            crossed = _cross(client, harness, crossers)
            views = client.get("/status").text + json.dumps([good, bad])
            client.post("/submissions", json={"version": hostile}).raise_for_status()
            sealed = client.post(
                "/admin/seal", json={"output_dir": str(root / "export")}, headers=harness.admin_headers()
            )
            assert sealed.status_code == 200, sealed.text
        _check_crossings(harness, crossed, caplog)
        shutil.rmtree(public, ignore_errors=True)
        job_dir = harness.work_dir / "jobs" / bad["id"]
        for report in attack_reports(job_dir):
            assert_attacks_failed(report, expect_budget_stop=True)
        assert_trials_honest(job_dir)

        # The verifier scores the (hostile) submission on the hidden cases, with its own gateway.
        config = VerifierConfig(
            name=harness.config.name,
            spec_digest=harness.config.spec_digest,
            baseline_commit=harness.config.baseline_commit,
            runtime=runtime,
            scoring=ScoringSpec(),
            harbor=harbor,
            partitions={"train": TRAIN, "hidden": HIDDEN},
            secrets=[SECRET_NAME],
            inference=inference,
            selection=SelectionSpec(mode="submit", partition="train"),
            # The boundary is under test here, not the verdict: the candidate alone is scored.
            targets={"hidden": TargetPartition(score_baseline=False)},
            reward_keys={"hidden": "reward"},
            failure_values={"hidden": 0.0},
        )
        work = root / "verifier-work"
        final = asyncio.run(
            verify(
                config,
                VerifierPaths(
                    session_archive=root / "export" / "session.tar.gz",
                    cases_dir=copy_cases(HIDDEN, root / "verifier-cases"),
                    baseline_dir=harness.baseline_dir,
                    reward_path=root / "verifier" / "reward.json",
                    artifacts_dir=root / "verifier" / "artifacts",
                    work_dir=work,
                ),
                backend,
                # Nested Harbor runs as this test's user; the agent candidate itself runs in its own host
                # (a throw-away uid), which is the boundary under test.
                env={},
                run_as=None,
                allow_root_runs=True,
            )
        )
        assert final.rewards == {"reward": 0.0} and final.chosen.candidate == hostile, final
        (measurement,) = final.measurements
        assert measurement.score == 0.0 and measurement.inference is not None
        # Charged attempts at the honest reward, each flagged with what the clean case found.
        assert measurement.measured, measurement
        for flag in ("agent_leftover_processes_killed", "verifier_dir_planted", "log_entries_removed"):
            assert measurement.flags.get(flag) == len(HIDDEN), (flag, measurement.flags)
        assert measurement.inference.refused_calls["model_not_allowed"] == len(HIDDEN)
        assert measurement.inference.refused_calls["over_budget"] >= 1
        assert measurement.inference.charged_micro_usd <= 6000 and measurement.inference.overrun_usd == 0
        assert final.inference is not None and final.inference.calls == measurement.inference.calls
        verifier_jobs = next(work.glob("runs/*/jobs"))
        for report in attack_reports(verifier_jobs / measurement.evaluation_id):
            assert_attacks_failed(report, expect_budget_stop=True)
        assert_trials_honest(verifier_jobs / measurement.evaluation_id)
        finalization = json.loads((root / "verifier" / "artifacts" / "finalization.json").read_text())
        assert finalization["inference"]["calls"] == measurement.inference.calls
        report = (root / "verifier" / "artifacts" / "experiment.html").read_text()
        assert 'id="inference"' in report and measurement.evaluation_id in report

    # The provider key reached the provider and nothing else (4).
    assert all(r["headers"]["authorization"] == f"Bearer {KEY}" for r in fake.requests)
    assert KEY not in views and KEY not in caplog.text
    assert (root / "export" / "session.tar.gz").is_file()
    assert files_containing(root, KEY.encode()) == []


def _uid(proc: Path) -> int:
    try:
        return proc.stat().st_uid
    except OSError:
        return -1


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _cross(client, harness, versions: dict[str, str]) -> dict:
    """3. The crossing candidates: the `none` partition's three at once (the leak and the two
    sleepers), long-polled as the agent would; then, behind them (another partition), the reader
    and two thieves at once on the `full` partition. Returns every answer the agent got."""
    jobs = {}
    for name in ("leak", "quick", "slow"):
        answer = client.post("/evaluations", json={"partition": "secret", "version": versions[name]})
        assert answer.status_code == 202, answer.text
        jobs[name] = answer.json()
    polls: dict[str, tuple[float, dict]] = {}

    def long_poll(name: str) -> None:
        while True:
            # The sidecar holds the answer up to 60 s: the read timeout must be longer than that.
            body = client.get(f"/evaluations/{jobs[name]['id']}", params={"wait_sec": 60}, timeout=120).json()
            if body.get("state") != "running":
                polls[name] = (time.time(), body)
                return

    pollers = [threading.Thread(target=long_poll, args=(name,)) for name in ("quick", "slow")]
    for poller in pollers:
        poller.start()
    for name in ("read", "steal", "steal2"):
        answer = client.post("/evaluations", json={"partition": "pool", "version": versions[name.rstrip("2")]})
        assert answer.status_code == 202, answer.text
        jobs[name] = answer.json()
    time.sleep(QUANTUM_SEC * 2 / 3)  # the sleepers' runs are usually over by now; neither is shown so
    middle = {name: client.get(f"/evaluations/{jobs[name]['id']}").json() for name in ("quick", "slow")}
    middle_status = client.get("/status").json()
    for poller in pollers:
        poller.join(timeout=QUANTUM_SEC + 120)
    done = {
        name: wait_for_state(client, job["id"], {"complete", "failed"}, timeout_sec=1200) for name, job in jobs.items()
    }
    listed = client.get("/evaluations", params={"partition": "secret"}).json()["jobs"]
    export = {j["id"]: j for j in client.get("/admin/export", headers=harness.admin_headers()).json()["jobs"]}
    return {
        "jobs": jobs,
        "polls": polls,
        "middle": middle,
        "middle_status": middle_status,
        "done": done,
        "listed": listed,
        "export": export,
    }


def _trial_endings(job_dir: Path) -> list[dict]:
    """Each trial's exception and phase times from its `result.json` (for a failure's message)."""
    endings = []
    for path in sorted(job_dir.glob("*/result.json")):
        result = json.loads(path.read_text())
        endings.append(
            {
                "trial": path.parent.name,
                "exception": result.get("exception_info"),
                **{key: result.get(key) for key in ("started_at", "finished_at", "agent_execution")},
            }
        )
    return endings or [{"job_dir": sorted(p.name for p in job_dir.iterdir()) if job_dir.is_dir() else "absent"}]


_ADMITTED_ONLY = {"id", "version", "candidate", "created_at", "finished_at"}


def _admitted(view: dict) -> dict:
    return {k: v for k, v in view.items() if k not in _ADMITTED_ONLY}


def _check_crossings(harness, crossed: dict, caplog: pytest.LogCaptureFixture) -> None:
    jobs, done, export = crossed["jobs"], crossed["done"], crossed["export"]
    assert {name: view["state"] for name, view in done.items()} == dict.fromkeys(done, "complete"), done
    # The `none` partition's candidates ran as they chose (the trusted records keep the real times)...
    seconds = {
        name: _ts(export[jobs[name]["id"]]["result"]["finished_at"])
        - _ts(export[jobs[name]["id"]]["result"]["started_at"])
        for name in ("quick", "slow")
    }
    # (The slow one's record covers its 20 s sleep; how much longer than the quick one's it is
    # depends on the machine's load, which a test must not assert. Neither record is the quantum.)
    assert seconds["slow"] >= 20 and max(seconds.values()) < QUANTUM_SEC, seconds
    # ... and looked the same to the agent in every answer: while held, when done, in the long
    # poll (never answered before the time shown), in the list and in /status.
    for step in (
        [jobs["quick"], jobs["slow"]],
        [crossed["middle"]["quick"], crossed["middle"]["slow"]],
        [done["quick"], done["slow"]],
        [crossed["polls"]["quick"][1], crossed["polls"]["slow"][1]],
    ):
        assert _admitted(step[0]) == _admitted(step[1]), step
    assert crossed["middle"]["quick"]["state"] == "running"
    for name in ("leak", "quick", "slow"):
        view = done[name]
        assert _ts(view["finished_at"]) - _ts(view["created_at"]) == pytest.approx(QUANTUM_SEC, abs=1e-6), view
        assert view["result"]["disclosure"] == "none" and view["result"]["score"] is None
    for name in ("quick", "slow"):
        returned_at, body = crossed["polls"][name]
        assert returned_at >= _ts(body["finished_at"]), (name, returned_at, body)
    listed = {view["id"]: view for view in crossed["listed"]}
    assert _admitted(listed[jobs["quick"]["id"]]) == _admitted(listed[jobs["slow"]["id"]])
    held = {view["id"]: view for view in crossed["middle_status"]["jobs"]}
    assert _admitted(held[jobs["quick"]["id"]]) == _admitted(held[jobs["slow"]["id"]])
    assert crossed["middle_status"]["job_counts"]["secret"] == {"running": 3}
    # The reader and the thieves ran only after the `none` partition's candidates were gone.
    assert min(_ts(export[jobs[n]["id"]]["started_at"]) for n in ("read", "steal", "steal2")) >= max(
        _ts(done[n]["finished_at"]) for n in ("leak", "quick", "slow")
    )

    jobs_dir = harness.work_dir / "jobs"

    def reports(name: str) -> list[dict]:
        job_dir = jobs_dir / jobs[name]["id"]
        found = [json.loads(p.read_text()) for p in job_dir.glob("*/agent/candidate/report.json")]
        # Without a report, say what each trial ended with (its exception, its timing).
        assert found, (f"no report of the {name} candidate", _trial_endings(job_dir))
        return found

    # The leak happened: it wrote everywhere it could...
    (left,) = reports("leak")
    assert left["left"]["/tmp"] == "written" and int(left["left"]["shm"]) >= 0, left
    assert all(value == "written" for key, value in left["left"].items() if key != "shm"), left
    # ... and the full partition's candidate found none of it, so the agent saw none of it.
    for report in reports("read"):
        assert report["found"] == {}, report
    leaked = [p for p in harness.context_dir.rglob("*") if p.is_file() and SECRET_TEXT.encode() in p.read_bytes()]
    assert leaked == [] and files_containing(harness.context_dir, b"VERO-LEAK") == []
    assert (harness.context_dir / jobs["read"]["id"]).is_dir()  # its artifacts were disclosed
    # Tokens: each thief's own token worked, the other evaluation's did not (401), before and after.
    for name in ("steal", "steal2"):
        for report in reports(name):
            assert report["steal"] == {"own": 200, "found_foreign": True, "foreign": 401, "own_after": 200}, report
        usage = done[name]["result"]["inference"]
        assert usage["refused_calls"].get("foreign_token", 0) >= 1, usage  # counted on the one that tried
    assert "its gateway token was used by local uid" in caplog.text
