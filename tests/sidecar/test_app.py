"""The sidecar's HTTP surface, driven over a real loopback socket (uvicorn in a thread) with real git
repos and state dirs; only the evaluation backend is a stub (the real one needs Docker, see
`test_app_docker.py`)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from vero.core.jobs import JobStore
from vero.core.ledger import BudgetLedger
from vero.core.state import StateStore
from vero.core.submission import read_submission
from vero.sidecar.artifacts import ArtifactLimits
from vero.spec.models import CandidateLimits, PartitionAccess

from ._server import StubBackend, commit_file, git, make_harness, wait_for_state

pytestmark = pytest.mark.timeout(120)

HIDDEN = "holdout-secret-zq"


def budget_of(client: httpx.Client, partition: str) -> dict:
    status = client.get("/status").json()
    return next(p for p in status["partitions"] if p["name"] == partition)["budget"]


def assert_problem(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status and body["code"] == code
    return body


@pytest.fixture
def harness(tmp_path):
    return make_harness(tmp_path)


def test_health_status_and_openapi(harness):
    with harness.serve() as (_, client):
        assert client.get("/health").json() == {"status": "ok"}
        status = client.get("/status").json()
        assert status["name"] == "demo" and status["entrance_open"] is True and status["submit_enabled"] is True
        train = next(p for p in status["partitions"] if p["name"] == "train")
        assert train["disclosure"] == "full" and train["cases"] == [f"t{i}" for i in range(1, 7)]
        assert train["budget"] == {
            "total_runs": 5,
            "total_cases": 30,
            "remaining_runs": 5,
            "remaining_cases": 30,
            "total_inference_usd": None,
            "remaining_inference_usd": None,
        }
        assert status["jobs"] == [] and status["submission"] is None
        spec = client.get("/openapi.json").json()
        assert {
            "/health",
            "/status",
            "/evaluations",
            "/evaluations/{job_id}",
            "/submissions",
            "/admin/seal",
            "/admin/export",
        } <= set(spec["paths"])
        schemas = spec["components"]["schemas"]
        assert schemas["JobView"]["description"] and schemas["EvaluationRequest"]["description"]
        assert "402" in spec["paths"]["/evaluations"]["post"]["responses"]
        assert spec["paths"]["/evaluations"]["post"]["description"]


def test_status_answers_what_a_fresh_view_says_after_every_change(harness):
    """`GET /status` sends kept bytes while the state is unchanged (`SidecarService.status_body`);
    after an admission, a completion, a submission and the close of the entrance they are built
    again: once the sidecar is idle, the answer equals a view built from the state at that moment."""
    from vero.sidecar.service import _STATUS_JSON

    with harness.serve() as (server, client):
        service = server.app.state.service

        def answered_and_fresh() -> dict:
            body = client.get("/status").content
            assert body == _STATUS_JSON.dump_json(service._status_view("agent"), by_alias=True)
            return json.loads(body)

        first = answered_and_fresh()
        assert client.get("/status").content == json.dumps(first, separators=(",", ":")).encode()
        job = client.post("/evaluations", json={"partition": "train", "cases": ["t1"]}).json()
        # The job moves on in the background meanwhile: only its count is compared here.
        assert client.get("/status").json()["n_jobs"] == 1
        wait_for_state(client, job["id"], {"complete"})
        done = answered_and_fresh()
        assert done["jobs"][0]["state"] == "complete" and done["jobs"][0]["result"]["score"] is not None
        assert client.post("/submissions", json={}).status_code in (200, 201)
        assert answered_and_fresh()["submission"]["candidate"] == harness.config.baseline_commit
        service.entrance_open = False  # what sealing and intake set, outside the state store
        assert answered_and_fresh()["entrance_open"] is False


def test_evaluation_full_tier_discloses_cases_and_copies_artifacts_safely(tmp_path):
    secret_dir = tmp_path / "outside"
    secret_dir.mkdir()
    (secret_dir / "admin-token").write_text("TOPSECRET-token-value")
    harness = make_harness(
        tmp_path / "h",
        backend=StubBackend(scores={"t1": 1.0, "t2": 0.0}, outside_secret_file=secret_dir / "admin-token"),
        secrets=["VERO_TEST_API_KEY"],
    )
    os.environ["VERO_TEST_API_KEY"] = "sk-live-0123456789"
    try:
        with harness.serve(artifact_limits=ArtifactLimits(max_file_bytes=1024 * 1024)) as (_, client):
            response = client.post("/evaluations", json={"partition": "train", "cases": ["t2", "t1"]})
            assert response.status_code == 202, response.text
            job = response.json()
            assert response.headers["location"] == f"/evaluations/{job['id']}"
            assert job["state"] == "queued" and job["n_cases"] == 2 and job["version"] == "HEAD"
            assert job["candidate"] == harness.config.baseline_commit and job["result"] is None
            done = wait_for_state(client, job["id"], {"complete"})
            result = done["result"]
            assert result["disclosure"] == "full" and result["score"] == 0.5
            assert [c["case"] for c in result["cases"]] == ["t1", "t2"]
            assert result["cases"][0]["attempts"] == [{"reward": 1.0, "exception_type": None, "outcome": "scored"}]
            assert result["artifacts_path"] == f"/vero/context/{job['id']}"
            # budget: one run and two cases, settled
            assert budget_of(client, "train") == {
                "total_runs": 5,
                "total_cases": 30,
                "remaining_runs": 4,
                "remaining_cases": 28,
                "total_inference_usd": None,
                "remaining_inference_usd": None,
            }
            # the secret reached the nested run by name, and nothing else of the environment
            run = harness.backend.runs[0]
            assert run.env == {"VERO_TEST_API_KEY": "sk-live-0123456789"}
            assert run.case_names == ("t1", "t2") and run.run_as is None
            assert "solve.py" in harness.backend.checkout_files[0]
            # the checkout is the slot's persistent work tree: files only, no history, no state
            assert run.candidate_dir in {harness.work_dir / "checkouts" / f"slot-{n}" for n in (0, 1)}
            assert sorted(p.name for p in run.candidate_dir.iterdir()) == ["README.md", "solve.py"]
            assert harness.work_dir in run.jobs_dir.parents and harness.state_dir not in run.jobs_dir.parents
    finally:
        del os.environ["VERO_TEST_API_KEY"]

    out = harness.context_dir / job["id"]
    copied = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert "trials/t1__abc123/verifier/test-stdout.txt" in copied
    assert "trials/t1__abc123/agent/install.log" in copied
    # no symlink followed, no trial config/result (host paths), no oversized file
    for name in copied:
        assert not (out / name).is_symlink()
        assert not name.endswith(("leak", "dirlink", "hardlink.txt", "config.json")) and "huge.bin" not in name
        assert not name.startswith("trials/") or not name.endswith("__abc123/result.json")
        mode = stat.S_IMODE((out / name).stat().st_mode)
        assert mode == (0o755 if (out / name).is_dir() else 0o644), name
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    text = "".join((out / n).read_text(errors="replace") for n in copied if (out / n).is_file())
    assert "TOPSECRET" not in text and "sk-live" not in text and "/var/tmp" not in text
    disclosed = json.loads((out / "result.json").read_text())
    assert disclosed["trials"] == {"t1": ["t1__abc123"], "t2": ["t2__abc123"]}
    assert "trials/t1__abc123/agent/huge.bin" in disclosed["omitted"]
    assert disclosed["result"]["score"] == 0.5


def test_aggregate_and_none_tiers_disclose_less(harness):
    with harness.serve() as (_, client):
        val = client.post("/evaluations", json={"partition": "val", "cases": ["v1", "v2", "v3"]}).json()
        blind = client.post("/evaluations", json={"partition": "blind"}).json()
        val_done = wait_for_state(client, val["id"], {"complete"})
        blind_done = wait_for_state(client, blind["id"], {"complete"})
        assert val_done["result"] == {
            "disclosure": "aggregate",
            "score": 0.5,
            "n_cases": 3,
            "n_attempts": 3,
            "n_dead": 0,
            "improved": None,
            "cases": None,
            "artifacts_path": None,
            "inference": None,
            "inference_usd": None,  # no gateway here: no money to show
        }
        assert blind_done["result"] == {
            "disclosure": "none",
            "score": None,
            "n_cases": None,
            "n_attempts": None,
            "n_dead": None,
            "improved": None,
            "cases": None,
            "artifacts_path": None,
            "inference": None,
            "inference_usd": None,  # no gateway here: no money to show
        }
        # the status listing discloses the same
        listed = {j["id"]: j for j in client.get("/status").json()["jobs"]}
        assert listed[val["id"]]["result"] == val_done["result"]
        assert listed[blind["id"]]["result"] == blind_done["result"]
        assert "test-stdout" not in client.get(f"/evaluations/{val['id']}").text
        # A result that left a case out is not an aggregate over whole blocks: no score, no counts.
        harness.backend.unmeasured = {"v2"}
        partial = client.post("/evaluations", json={"partition": "val", "blocks": [0]}).json()
        assert wait_for_state(client, partial["id"], {"complete"})["result"] == {
            "disclosure": "aggregate",
            "score": None,
            "n_cases": 3,
            "n_attempts": None,
            "n_dead": None,
            "improved": None,
            "cases": None,
            "artifacts_path": None,
            "inference": None,
            "inference_usd": None,  # no gateway here: no money to show
        }
    assert not (harness.context_dir / val["id"]).exists() and not (harness.context_dir / blind["id"]).exists()


def test_hidden_or_unknown_partition_is_403_without_echo(harness):
    with harness.serve() as (_, client):
        before = budget_of(client, "train")
        for name in (HIDDEN, "TRAIN", "train/../val", "a" * 100):
            body = assert_problem(client.post("/evaluations", json={"partition": name}), 403, "denied")
            assert name not in json.dumps(body) and HIDDEN not in json.dumps(body)
        assert budget_of(client, "train") == before
        assert harness.backend.runs == []


def test_a_selection_that_is_not_a_union_of_blocks_is_refused_before_any_budget_moves(harness):
    with harness.serve() as (_, client):
        val = next(p for p in client.get("/status").json()["partitions"] if p["name"] == "val")
        assert val["blocks"] == [["v1", "v2", "v3"], ["v4", "v5", "v6"]] and val["ladder"] is None
        before = budget_of(client, "val")
        for selection in (
            {"cases": ["v1", "v2"]},
            {"cases": ["v1", "v2", "v4"]},
            {"cases": ["v1", "v2", "v3", "v4"]},
            {"blocks": [2]},
            {"blocks": [0], "cases": ["v1", "v2", "v3"]},
        ):
            body = assert_problem(client.post("/evaluations", json={"partition": "val", **selection}), 403, "denied")
            assert "v1" not in body["detail"] and "v4" not in body["detail"]
        assert budget_of(client, "val") == before and harness.backend.runs == []
        # whole blocks, by cases or by position, and the whole partition are allowed
        by_cases = client.post("/evaluations", json={"partition": "val", "cases": ["v3", "v1", "v2"]})
        by_position = client.post("/evaluations", json={"partition": "val", "blocks": [1]})
        assert by_cases.status_code == by_position.status_code == 202
        assert wait_for_state(client, by_position.json()["id"], {"complete"})["n_cases"] == 3
        assert [run.case_names for run in harness.backend.runs if run.case_names[0] == "v4"] == [("v4", "v5", "v6")]
        assert client.post("/evaluations", json={"partition": "val"}).status_code == 202


def test_the_differencing_sequence_is_refused_at_its_second_request(tmp_path):
    """Issue 10: four aggregate cases with a floor of 3. Whole (0.25), [a, b, c] (0.333) and [d, b, c] (0.0)
    used to give every case's result; now the second request is refused and nothing is charged."""
    access = {"holdout": PartitionAccess(disclosure="aggregate", min_aggregate_cases=3, total_runs=5, total_cases=20)}
    harness = make_harness(
        tmp_path,
        partitions={"holdout": ["a", "b", "c", "d"]},
        access=access,
        backend=StubBackend(scores={"a": 0.0, "b": 0.0, "c": 1.0, "d": 0.0}),
    )
    with harness.serve() as (_, client):
        first = client.post("/evaluations", json={"partition": "holdout"})
        assert first.status_code == 202
        assert wait_for_state(client, first.json()["id"], {"complete"})["result"]["score"] == 0.25
        before = budget_of(client, "holdout")
        for cases in (["a", "b", "c"], ["d", "b", "c"]):
            assert_problem(client.post("/evaluations", json={"partition": "holdout", "cases": cases}), 403, "denied")
        assert (
            budget_of(client, "holdout")
            == before
            == {
                "total_runs": 5,
                "total_cases": 20,
                "remaining_runs": 4,
                "remaining_cases": 16,
                "total_inference_usd": None,
                "remaining_inference_usd": None,
            }
        )
        assert len(harness.backend.runs) == 1


def test_case_selection_with_traversal_names_is_denied(harness):
    with harness.serve() as (_, client):
        for cases in (["../t1"], ["t1", "../../etc/passwd"], ["t1/.."], [], ["t1", "t1"]):
            body = assert_problem(
                client.post("/evaluations", json={"partition": "train", "cases": cases}), 403, "denied"
            )
            assert "passwd" not in json.dumps(body) and ".." not in json.dumps(body)
        assert harness.backend.runs == []
        assert budget_of(client, "train")["remaining_runs"] == 5


def test_budget_exhausted_after_exactly_the_configured_runs(harness):
    with harness.serve() as (_, client):
        for _ in range(2):
            job = client.post("/evaluations", json={"partition": "blind", "cases": ["b1"]})
            assert job.status_code == 202
            wait_for_state(client, job.json()["id"], {"complete"})
        body = assert_problem(
            client.post("/evaluations", json={"partition": "blind", "cases": ["b1"]}), 402, "payment_required"
        )
        assert "runs" in body["detail"]
        assert budget_of(client, "blind") == {
            "total_runs": 2,
            "total_cases": 6,
            "remaining_runs": 0,
            "remaining_cases": 4,
            "total_inference_usd": None,
            "remaining_inference_usd": None,
        }
        # other partitions keep their own budget
        assert client.post("/evaluations", json={"partition": "train", "cases": ["t1"]}).status_code == 202


def test_concurrent_requests_never_overspend(tmp_path):
    access = {"train": PartitionAccess(disclosure="full", min_aggregate_cases=1, total_runs=3, total_cases=30)}
    harness = make_harness(tmp_path, access=access, backend=StubBackend(block=threading.Event()))
    with harness.serve() as (_, client):

        def post(_):
            with httpx.Client(base_url=client.base_url, timeout=60, trust_env=False) as own:
                return own.post("/evaluations", json={"partition": "train", "cases": ["t1"]}).status_code

        with ThreadPoolExecutor(10) as pool:
            codes = sorted(pool.map(post, range(10)))
        assert codes == [202] * 3 + [402] * 7
        assert budget_of(client, "train")["remaining_runs"] == 0
        harness.backend.block.set()


def test_hidden_budget_figures(tmp_path):
    access = {"train": PartitionAccess(disclosure="full", min_aggregate_cases=1, total_runs=1, total_cases=30)}
    harness = make_harness(tmp_path, access=access, disclose_budget=False)
    with harness.serve() as (_, client):
        status = client.get("/status").json()
        assert status["partitions"][0]["budget"] is None
        assert client.post("/evaluations", json={"partition": "train", "cases": ["t1"]}).status_code == 202
        body = assert_problem(
            client.post("/evaluations", json={"partition": "train", "cases": ["t1"]}), 402, "payment_required"
        )
        assert not any(ch.isdigit() for ch in body["detail"]) and "remaining" not in body["detail"]
        assert all(p["budget"] is None for p in client.get("/status").json()["partitions"])


def test_versions_are_resolved_and_weird_ones_rejected_with_400(harness):
    with harness.serve() as (_, client):
        commit = commit_file(harness.agent_repo, "solve.py", "print('faster')\n", "faster")
        job = client.post("/evaluations", json={"partition": "train", "cases": ["t1"], "version": commit[:12]})
        assert job.status_code == 202 and job.json()["candidate"] == commit
        before = budget_of(client, "train")
        for version in (
            "--upload-pack=touch /tmp/pwned",
            "no-such-branch",
            "HEAD~99",
            "HEAD\x00x",
            "a b",
            "../../etc/passwd",
            "-",
            "refs/heads/main:evil",
        ):
            body = assert_problem(
                client.post("/evaluations", json={"partition": "train", "cases": ["t1"], "version": version}),
                400,
                "bad_request",
            )
            assert "fatal" not in body["detail"] and "/" not in body["detail"]
        assert budget_of(client, "train") == before
        assert not Path("/tmp/pwned").exists()


def test_a_candidate_over_a_size_limit_is_413_naming_the_limit_and_changes_nothing(tmp_path):
    limits = CandidateLimits(max_files=50, max_total_bytes=100_000, max_file_bytes=20_000)
    harness = make_harness(tmp_path, candidate_limits=limits)
    with harness.serve() as (_, client):
        accepted = commit_file(harness.agent_repo, "solve.py", "print('fine')\n", "fine")
        job = client.post("/evaluations", json={"partition": "train", "version": accepted})
        assert job.status_code == 202
        wait_for_state(client, job.json()["id"], {"complete"})
        before_budget, before_jobs = budget_of(client, "train"), client.get("/evaluations").json()
        store = harness.state_dir / "candidates.git"
        before_refs, before_objects = git(store, "for-each-ref"), git(store, "count-objects", "-v")
        over = (
            ("big.bin", "x" * 20_001, 1, "max_file_bytes"),
            ("more/f{}.txt", "y", 60, "max_files"),
            ("parts/p{}.bin", "z" * 19_000, 6, "max_total_bytes"),  # each file under the largest-file limit
        )
        for name, content, copies, limit in over:
            for i in range(copies):
                path = harness.agent_repo / name.format(i)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
            version = commit_file(harness.agent_repo, "solve.py", f"print('{limit}')\n", limit)
            for route, body in (
                ("/evaluations", {"partition": "train", "version": version}),
                ("/submissions", {"version": version}),
            ):
                problem = assert_problem(client.post(route, json=body), 413, "candidate_too_large")
                assert f"target.limits.{limit}" in problem["detail"]
            git(harness.agent_repo, "reset", "-q", "--hard", accepted)
        assert budget_of(client, "train") == before_budget
        assert client.get("/evaluations").json() == before_jobs
        assert client.get("/status").json()["submission"] is None
        assert git(store, "for-each-ref") == before_refs
        assert git(store, "count-objects", "-v") == before_objects  # nothing was fetched
        documented = client.get("/openapi.json").json()["paths"]
        assert "413" in documented["/evaluations"]["post"]["responses"]
        assert "413" in documented["/submissions"]["post"]["responses"]


def test_versions_submitted_for_free_fill_the_store_only_to_its_quota_then_413_and_nothing_is_charged(tmp_path):
    """An outside attack: `submit` imports before anything is charged, so a loop of new 60 MB
    versions grew the store (and the sealed session) without bound. Now the store's quota
    (`max_store_bytes`) refuses the version that does not fit; what was imported stays usable."""
    limits = CandidateLimits(max_files=50, max_total_bytes=100_000, max_file_bytes=20_000, max_store_bytes=250_000)
    harness = make_harness(tmp_path, candidate_limits=limits)
    rng = random.Random(7)
    with harness.serve() as (_, client):
        before_budget = budget_of(client, "train")
        submitted: list[str] = []
        for step in range(20):
            for part in range(3):
                (harness.agent_repo / f"noise{part}.bin").write_bytes(rng.randbytes(19_000))
            version = commit_file(harness.agent_repo, "solve.py", f"print({step})\n", f"step {step}")
            answer = client.post("/submissions", json={"version": version})
            if answer.status_code != 201:
                break
            submitted.append(version)
        problem = assert_problem(answer, 413, "candidate_too_large")
        assert "target.limits.max_store_bytes" in problem["detail"] and "/" not in problem["detail"]
        assert 1 <= len(submitted) < 20
        pack_dir = harness.state_dir / "candidates.git" / "objects" / "pack"
        assert sum(p.stat().st_size for p in pack_dir.iterdir()) <= limits.max_store_bytes
        assert budget_of(client, "train") == before_budget
        job = client.post("/evaluations", json={"partition": "train", "version": submitted[-1]})
        assert job.status_code == 202  # imported before the store was full: still evaluable
        wait_for_state(client, job.json()["id"], {"complete"})


def test_schema_errors_are_422_and_huge_bodies_413(harness):
    with harness.serve() as (_, client):
        cases = [
            {"partition": "train", "extra": 1},
            {"partition": 5},
            {},
            {"partition": "train", "cases": "t1"},
            {"partition": "x" * 129},
            {"partition": "train", "version": "v" * 257},
        ]
        for body in cases:
            problem = assert_problem(client.post("/evaluations", json=body), 422, "invalid")
            assert "x" * 129 not in problem["detail"]
        assert_problem(
            client.post("/evaluations", content=b"{not json", headers={"content-type": "application/json"}),
            422,
            "invalid",
        )
        assert_problem(client.post("/submissions", json={"version": "HEAD", "note": "x"}), 422, "invalid")
        unknown = assert_problem(client.post("/evaluations", json={"partition": "train", HIDDEN: 1}), 422, "invalid")
        assert HIDDEN not in json.dumps(unknown) and "unknown field" in unknown["detail"]
        huge = json.dumps({"partition": "train", "cases": ["t1"] * 400_000}).encode()
        assert_problem(
            client.post("/evaluations", content=huge, headers={"content-type": "application/json"}), 413, "too_large"
        )

        def chunks():
            yield b'{"partition": "train", "cases": ['
            for _ in range(300):
                yield b'"t1",' * 2000
            yield b'"t1"]}'

        assert_problem(
            client.post("/evaluations", content=chunks(), headers={"content-type": "application/json"}),
            413,
            "too_large",
        )
        assert harness.backend.runs == []


def test_unknown_job_is_404(harness):
    with harness.serve() as (_, client):
        for job_id in ("ev-0000000000000000", "nope", "..%2F..%2Fledger.json", "x" * 64):
            assert_problem(client.get(f"/evaluations/{job_id}"), 404, "not_found")
        assert_problem(client.get("/no-such-route"), 404, "not_found")


def test_infrastructure_failure_is_502_and_refunded(tmp_path):
    harness = make_harness(tmp_path, backend=StubBackend(fail_with_infrastructure=True))
    with harness.serve() as (_, client):
        before = budget_of(client, "train")
        job = client.post("/evaluations", json={"partition": "train", "cases": ["t1", "t2"]}).json()
        body = wait_for_state(client, job["id"], {"failed"})
        response = client.get(f"/evaluations/{job['id']}")
        problem = assert_problem(response, 502, "infrastructure")
        assert problem == body and problem["instance"] == f"/evaluations/{job['id']}"
        assert "docker" not in response.text and "/secret" not in response.text
        assert budget_of(client, "train") == before
        listed = client.get("/status").json()["jobs"][0]
        assert listed["state"] == "failed" and listed["error"] == "infrastructure" and listed["result"] is None


def test_a_candidate_that_hangs_is_charged_and_answered_like_any_other(tmp_path):
    """Timeouts are the candidate's: the job completes, its budget stays spent, and on a `none`
    partition the answer is the same acknowledgement as for a candidate that finished."""
    harness = make_harness(tmp_path, backend=StubBackend(timed_out=frozenset({"b1", "t2"})))
    with harness.serve() as (_, client):
        before = {p: budget_of(client, p) for p in ("train", "blind")}
        hung = client.post("/evaluations", json={"partition": "blind", "cases": ["b1"]}).json()
        fine = client.post("/evaluations", json={"partition": "blind", "cases": ["b2"]}).json()
        train = client.post("/evaluations", json={"partition": "train", "cases": ["t1", "t2"]}).json()
        done = {job["id"]: wait_for_state(client, job["id"], {"complete"}) for job in (hung, fine, train)}
        assert done[hung["id"]]["result"] == done[fine["id"]]["result"]
        assert done[hung["id"]]["result"]["disclosure"] == "none"
        assert {value for key, value in done[hung["id"]]["result"].items() if key != "disclosure"} == {None}
        assert client.get(f"/evaluations/{hung['id']}").status_code == 200
        after = {p: budget_of(client, p) for p in ("train", "blind")}
        assert after["blind"]["remaining_runs"] == before["blind"]["remaining_runs"] - 2
        assert after["train"]["remaining_cases"] == before["train"]["remaining_cases"] - 2
        cases = {c["case"]: c for c in done[train["id"]]["result"]["cases"]}
        assert cases["t2"]["score"] == 0.0 and cases["t2"]["attempts"] == [
            {"reward": None, "exception_type": "EvaluationTimeoutError", "outcome": "timed_out"}
        ]
        assert cases["t1"]["attempts"][0]["outcome"] == "scored"


def test_unexpected_error_is_a_generic_500(harness, monkeypatch):
    async def disk_full(*_args, **_kwargs):
        raise OSError(f"state database {harness.state_dir}/state.db: write failed (SQLITE_FULL)")

    # The state store cannot write: the OSError becomes a generic 500 naming nothing.
    monkeypatch.setattr("vero.sidecar.service.record_submission", disk_full)
    with harness.serve() as (_, client):
        response = client.post("/submissions", json={"version": "HEAD"})
        body = assert_problem(response, 500, "internal")
        assert body["detail"] == "an unexpected error occurred"
        assert "submission" not in response.text and str(harness.state_dir) not in response.text


def test_submissions(harness):
    with harness.serve() as (_, client):
        first = client.post("/submissions", json={})
        assert first.status_code == 201 and first.json()["candidate"] == harness.config.baseline_commit
        assert client.post("/submissions", json={"version": "HEAD"}).status_code == 200
        commit = commit_file(harness.agent_repo, "solve.py", "print(2)\n")
        second = client.post("/submissions", json={"version": "main"})
        assert second.status_code == 201 and second.json()["candidate"] == commit
        assert second.json()["version"] == "main"
        assert client.get("/status").json()["submission"] == second.json()
        assert_problem(client.post("/submissions", json={"version": "nope"}), 400, "bad_request")
        assert client.get("/status").json()["submission"] == second.json()
    with StateStore.open(harness.state_dir / "state.db") as state:
        assert read_submission(state).candidate == commit


def test_submit_disabled_is_409(tmp_path):
    harness = make_harness(tmp_path, submit_enabled=False)
    with harness.serve() as (_, client):
        assert client.get("/status").json()["submit_enabled"] is False
        assert_problem(client.post("/submissions", json={}), 409, "conflict")
    with StateStore.open(harness.state_dir / "state.db") as state:
        assert read_submission(state) is None


def test_admin_requires_the_token(harness):
    with harness.serve() as (_, client):
        for headers in (
            {},
            {"authorization": "Bearer wrong"},
            {"authorization": "Basic abc"},
            {"authorization": "Bearer"},
        ):
            response = client.get("/admin/export", headers=headers)
            assert_problem(response, 401, "unauthorized")
            assert response.headers["www-authenticate"] == "Bearer"
            assert_problem(
                client.post("/admin/seal", json={"output_dir": "/tmp/x"}, headers=headers), 401, "unauthorized"
            )
        token_file = harness.state_dir / "admin-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o400
        assert stat.S_IMODE(harness.state_dir.stat().st_mode) == 0o700
        job = client.post("/evaluations", json={"partition": "val"}).json()
        wait_for_state(client, job["id"], {"complete"})
        export = client.get("/admin/export", headers=harness.admin_headers())
        assert export.status_code == 200
        records = export.json()
        # the trusted record has what the agent does not see: per-case results of an aggregate job
        assert records["jobs"][0]["result"]["cases"][0]["case"] == "v1"
        assert {b["partition"] for b in records["balances"]} == {"train", "val", "blind"}
        assert {c["id"] for c in records["candidates"]} == {harness.config.baseline_commit}
        assert records["entrance_open"] is True and records["sealed_at"] is None
        assert not any(r["state"] == "reserved" for r in records["reservations"])


def test_restart_keeps_ledger_jobs_and_submission_and_a_new_token(harness):
    with harness.serve() as (_, client):
        job = client.post("/evaluations", json={"partition": "train", "cases": ["t1", "t2"]}).json()
        wait_for_state(client, job["id"], {"complete"})
        submission = client.post("/submissions", json={}).json()
        budget = budget_of(client, "train")
        first_token = harness.admin_headers()
    with harness.serve() as (_, client):
        assert (
            budget_of(client, "train")
            == budget
            == {
                "total_runs": 5,
                "total_cases": 30,
                "remaining_runs": 4,
                "remaining_cases": 28,
                "total_inference_usd": None,
                "remaining_inference_usd": None,
            }
        )
        again = client.get(f"/evaluations/{job['id']}").json()
        assert again["state"] == "complete" and again["result"]["score"] == 0.5
        assert client.get("/status").json()["submission"] == submission
        assert harness.admin_headers() != first_token
        assert client.get("/admin/export", headers=first_token).status_code == 401


def test_config_drift_keeps_persisted_totals(harness, caplog):
    with harness.serve() as (_, client):
        client.post("/evaluations", json={"partition": "blind", "cases": ["b1"]})
    access = dict(harness.config.agent_access)
    access["blind"] = PartitionAccess(disclosure="none", min_aggregate_cases=1, total_runs=50, total_cases=60)
    harness.config = harness.config.model_copy(update={"agent_access": access})
    with caplog.at_level("WARNING", logger="vero.sidecar"), harness.serve() as (_, client):
        assert budget_of(client, "blind")["total_runs"] == 2
    assert any("differs from the config" in r.getMessage() for r in caplog.records)


@dataclass
class SweepingBackend(StubBackend):
    """A stub backend whose removal of leftovers (the start's sweep) ends only when released."""

    sweep_may_end: threading.Event = field(default_factory=threading.Event)
    sweeps: list[str] = field(default_factory=list)

    async def remove_leftovers(self, **_options: object) -> int:
        self.sweeps.append("started")
        await asyncio.to_thread(self.sweep_may_end.wait, 100)
        self.sweeps.append("ended")
        return 0


@pytest.mark.timeout(120)
def test_the_leftover_sweep_goes_on_beside_health_and_the_first_admission_waits_for_it(tmp_path):
    """The start's sweep (it imports the Docker SDK) no longer holds `/health` back; it removes
    whatever is labelled with the session, so an admission must not go on before it ends: one
    sent meanwhile is answered only after the sweep is released, and its run follows it."""
    backend = SweepingBackend()
    harness = make_harness(tmp_path, backend=backend)
    with harness.serve() as (_, client), ThreadPoolExecutor(1) as pool:
        assert client.get("/health").json() == {"status": "ok"}
        assert backend.sweeps in (["started"], [])  # begun, or about to: never over while held
        admission = pool.submit(client.post, "/evaluations", json={"partition": "train", "cases": ["t1"]})
        done, _ = wait([admission], timeout=5)  # an admission that did not wait for the sweep ends here
        assert not done and backend.runs == []
        backend.sweep_may_end.set()
        assert admission.result().status_code == 202
        assert backend.sweeps == ["started", "ended"]
        job = wait_for_state(client, admission.result().json()["id"], {"complete"})
        assert job["state"] == "complete" and len(backend.runs) == 1


def test_corrupt_state_refuses_to_start(harness):
    with harness.serve():
        pass
    (harness.state_dir / "state.db").write_bytes(b"{ corrupt")
    for suffix in ("-wal", "-shm"):
        (harness.state_dir / f"state.db{suffix}").unlink(missing_ok=True)
    app = harness.create_app()
    from ._server import ServerThread

    with pytest.raises(RuntimeError, match="LedgerCorrupt"), ServerThread(app):
        pass
    assert (harness.state_dir / "state.db").read_bytes() == b"{ corrupt"


@pytest.mark.parametrize("record", ["seal.json", "intake.json"])
def test_an_unreadable_seal_or_intake_record_refuses_to_start_and_resets_nothing(harness, record):
    """The sidecar must not reopen intake because its close can no longer be read; once the record
    reads again, the same state opens (the refused start left the state store closed, not half open)."""
    from vero.errors import LedgerCorrupt

    with harness.serve() as (_, client):
        assert client.post("/intake/close").is_success
        if record == "seal.json":
            assert client.post(
                "/admin/seal",
                json={"output_dir": str(harness.root / "sealed")},
                headers=harness.admin_headers(),
            ).is_success
    path = harness.state_dir / record
    good = path.read_bytes()
    path.write_bytes(b"{ corrupt")

    async def start_and_stop() -> bool:
        service = harness.service()
        try:
            await service.start()
            return service.entrance_open
        finally:
            await service.stop()

    with pytest.raises(LedgerCorrupt, match=record.split(".")[0]):
        asyncio.run(start_and_stop())
    assert path.read_bytes() == b"{ corrupt"
    path.write_bytes(good)
    assert asyncio.run(start_and_stop()) is False


def test_baseline_mismatch_refuses_to_start(harness):
    (harness.baseline_dir / "solve.py").write_text("tampered\n")
    from ._server import ServerThread

    with pytest.raises(RuntimeError, match="SpecError"), ServerThread(harness.create_app()):
        pass


def test_baseline_is_imported_as_a_candidate(harness):
    with harness.serve() as (_, client):
        records = client.get("/admin/export", headers=harness.admin_headers()).json()
        assert [c["id"] for c in records["candidates"]] == [harness.config.baseline_commit]


def test_concurrency_limit_keeps_extra_jobs_queued(tmp_path):
    harness = make_harness(tmp_path, backend=StubBackend(block=threading.Event()))
    harness.max_concurrent_evaluations = 2
    with harness.serve() as (_, client):
        ids = [
            client.post("/evaluations", json={"partition": "train", "cases": [f"t{i}"]}).json()["id"] for i in (1, 2, 3)
        ]
        for _ in range(2):
            assert harness.backend.started.acquire(timeout=30)
        states = [client.get(f"/evaluations/{i}").json()["state"] for i in ids]
        assert sorted(states) == ["queued", "running", "running"]
        assert not harness.backend.started.acquire(timeout=0.5)
        harness.backend.block.set()
        for job_id in ids:
            assert wait_for_state(client, job_id, {"complete"})["state"] == "complete"
        assert harness.backend.max_running == 2


def test_the_configs_max_concurrent_evaluations_sets_the_slots(tmp_path):
    """`harbor.max_concurrent_evaluations` of the compiled config (not a fixed 2): 3 jobs run at
    once, the 4th waits `queued`, and there are 3 checkout slots."""
    harness = make_harness(tmp_path, backend=StubBackend(block=threading.Event()))
    harbor = harness.config.harbor.model_copy(update={"max_concurrent_evaluations": 3})
    harness.config = harness.config.model_copy(update={"harbor": harbor})
    harness.max_concurrent_evaluations = None  # as `vero harbor serve` builds it: from the config
    with harness.serve() as (_, client):
        ids = [
            client.post("/evaluations", json={"partition": "train", "cases": [f"t{i % 2 + 1}"]}).json()["id"]
            for i in range(4)
        ]
        for _ in range(3):
            assert harness.backend.started.acquire(timeout=30)
        assert not harness.backend.started.acquire(timeout=0.5)
        states = [client.get(f"/evaluations/{i}").json()["state"] for i in ids]
        assert sorted(states) == ["queued", "running", "running", "running"]
        harness.backend.block.set()
        for job_id in ids:
            assert wait_for_state(client, job_id, {"complete"})["state"] == "complete"
        assert harness.backend.max_running == 3
    slots = sorted(p.name for p in (harness.work_dir / "checkouts").iterdir())
    assert slots == ["slot-0", "slot-1", "slot-2"]


def test_status_lists_the_newest_jobs_that_fit_whatever_the_history(tmp_path):
    """What the history adds to `/status` is bounded: at most 10 jobs and 8 KiB of them, however long
    the agent's version names (256 characters of 4-byte UTF-8 here), plus one submission and counts."""
    access = {"train": PartitionAccess(disclosure="full", min_aggregate_cases=1, total_runs=100, total_cases=100)}
    harness = make_harness(tmp_path, access=access, partitions={"train": ["t1", "t2"]})
    # The longest branch name a version may be: 256 characters, components within 255 bytes.
    long_name = "/".join(["\U0001f600" * 63] * 3 + ["\U0001f600" * 62]) + "/x"
    assert len(long_name) == 256
    git(harness.agent_repo, "branch", long_name)

    def evaluate(client: httpx.Client, version: str) -> str:
        job = client.post("/evaluations", json={"partition": "train", "cases": ["t1"], "version": version})
        assert job.status_code == 202, job.text
        wait_for_state(client, job.json()["id"], {"complete"})
        return job.json()["id"]

    with harness.serve() as (_, client):
        empty = len(client.get("/status").content)
        long_ids = [evaluate(client, long_name) for _ in range(12)]
        assert client.post("/submissions", json={"version": long_name}).status_code == 201
        status = client.get("/status")
        listed = status.json()["jobs"]
        assert status.json()["n_jobs"] == 12 and status.json()["job_counts"] == {"train": {"complete": 12}}
        assert 1 <= len(listed) < 10 and [j["id"] for j in listed] == long_ids[::-1][: len(listed)]
        assert all(j["version"] == long_name and j["result"]["cases"] is None for j in listed)
        assert sum(len(json.dumps(j, ensure_ascii=False).encode()) for j in listed) <= 8 * 1024
        assert len(status.content) - empty <= 8 * 1024 + 2 * 1024
        # short versions: the count is the limit
        short_ids = [evaluate(client, "HEAD") for _ in range(11)]
        assert [j["id"] for j in client.get("/status").json()["jobs"]] == short_ids[::-1][:10]


@pytest.mark.timeout(240)
def test_terminal_state_and_settle_or_refund_are_never_seen_apart(tmp_path):
    """Hammer completions and infrastructure failures concurrently while observers read over HTTP:
    no terminal job with an open reservation, and no closed reservation of an unfinished job, in one
    snapshot (`/admin/export`) or across two reads in either order."""
    access = {"train": PartitionAccess(disclosure="full", min_aggregate_cases=1, total_runs=500, total_cases=500)}
    harness = make_harness(
        tmp_path,
        access=access,
        partitions={"train": ["t1", "t2"]},
        backend=StubBackend(infrastructure_cases=frozenset({"t2"}), write_job_dir=False),
    )
    harness.max_concurrent_evaluations = 4
    admin = None
    violations: list[str] = []
    stop = threading.Event()

    def reservations_and_jobs(client: httpx.Client) -> tuple[dict, dict]:
        records = client.get("/admin/export", headers=admin).json()
        return {r["id"]: r for r in records["reservations"]}, {j["id"]: j for j in records["jobs"]}

    def observe(url: str, ids: list[str]) -> int:
        seen = 0
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as client:
            while not stop.is_set():
                reservations, jobs = reservations_and_jobs(client)
                for job in jobs.values():
                    closed = reservations[job["reservation_id"]]["state"]
                    if (job["state"] in ("complete", "failed", "cancelled")) != (closed != "reserved") or (
                        job["state"] == "complete"
                    ) != (closed == "settled"):
                        violations.append(f"snapshot: job {job['state']}, reservation {closed}")
                for job_id in list(ids):
                    # job first: once terminal, its reservation must already be closed
                    answer = client.get(f"/evaluations/{job_id}")
                    terminal = answer.status_code == 502 or answer.json()["state"] in ("complete", "cancelled")
                    reservations, _ = reservations_and_jobs(client)
                    if terminal and reservations[job_id]["state"] == "reserved":
                        violations.append("a terminal job was seen before its settle or refund")
                    # reservation first: once closed, its job must already be terminal
                    closed = reservations_and_jobs(client)[0][job_id]["state"] != "reserved"
                    answer = client.get(f"/evaluations/{job_id}")
                    if closed and answer.status_code != 502 and answer.json()["state"] in ("queued", "running"):
                        violations.append("a closed reservation was seen before its job finished")
                    seen += 1
        return seen

    with harness.serve() as (server, client):
        admin = harness.admin_headers()
        ids: list[str] = []
        with ThreadPoolExecutor(max_workers=6) as pool:
            observers = [pool.submit(observe, server.url, ids) for _ in range(2)]

            def start(i: int) -> str:
                with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as own:
                    job = own.post("/evaluations", json={"partition": "train", "cases": [f"t{1 + i % 2}"]}).json()
                ids.append(job["id"])
                return job["id"]

            started = list(pool.map(start, range(60)))
            for job_id in started:
                wait_for_state(client, job_id, {"complete"}, timeout_sec=120)
            stop.set()
            observed = sum(f.result() for f in observers)
        reservations, jobs = reservations_and_jobs(client)
    assert violations == []
    assert observed > 0
    assert sorted(j["state"] for j in jobs.values()) == ["complete"] * 30 + ["failed"] * 30
    assert {r["state"] for r in reservations.values()} == {"settled", "refunded"}


def test_shutdown_fails_and_refunds_running_jobs(tmp_path):
    harness = make_harness(tmp_path, backend=StubBackend(block=threading.Event()))
    with harness.serve() as (_, client):
        job = client.post("/evaluations", json={"partition": "train", "cases": ["t1"]}).json()
        assert harness.backend.started.acquire(timeout=30)
    ledger = BudgetLedger.open(harness.state_dir / "state.db", {})
    stored = JobStore(ledger).get(job["id"])
    assert stored.state == "failed" and stored.error == "interrupted"
    assert ledger.reservation(stored.reservation_id).state == "refunded"
    assert ledger.balance("train", "agent").remaining_runs == 5
    ledger.state.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="run_as applies only when the sidecar runs as root")
def test_nested_runs_get_the_unprivileged_identity_and_a_readable_checkout(tmp_path):
    from vero.errors import InfrastructureFailure
    from vero.harbor.process import runner_identity

    # what `vero harbor serve` resolves: a missing runner refuses the start, never runs as root
    with pytest.raises(InfrastructureFailure, match="does not exist"):
        runner_identity("no-such-user-vero")
    run_as = runner_identity("nobody", docker_socket=tmp_path / "missing.sock")
    assert run_as.uid == 65534 and run_as.extra_groups == ()
    socket_like = tmp_path / "docker.sock"
    socket_like.touch()
    os.chown(socket_like, 0, 4242)
    assert runner_identity("nobody", docker_socket=socket_like).extra_groups == (4242,)

    seen: list[tuple[int, int]] = []

    class CheckingBackend(StubBackend):
        async def evaluate(self, run):
            for path in [run.candidate_dir, *run.candidate_dir.rglob("*")]:
                if not path.is_symlink():
                    mode = path.stat().st_mode
                    seen.append((mode & 0o005, stat.S_ISDIR(mode)))
            assert run.jobs_dir.stat().st_uid == 65534 and stat.S_IMODE(run.jobs_dir.stat().st_mode) == 0o700
            return await super().evaluate(run)

    harness = make_harness(tmp_path / "h", backend=CheckingBackend())
    with harness.serve(run_as=run_as) as (_, client):
        job = client.post("/evaluations", json={"partition": "val"}).json()
        assert wait_for_state(client, job["id"], {"complete"})["state"] == "complete"
    assert harness.backend.runs[0].run_as == run_as
    assert seen and all(bits == (0o005 if is_dir else 0o004) or bits == 0o005 for bits, is_dir in seen)
    # the runner cannot enter the state dir (admin token, ledger)
    assert stat.S_IMODE(harness.state_dir.stat().st_mode) == 0o700 and harness.state_dir.stat().st_uid == 0


def test_start_removes_temporary_refs_left_by_a_crashed_import(harness):
    with harness.serve():
        pass
    store = harness.state_dir / "candidates.git"
    head = git(store, "for-each-ref", "--format=%(objectname)", "refs/vero/candidates/").split()[0]
    git(store, "update-ref", "refs/vero/tmp/left-by-crash", head)
    with harness.serve() as (_, client):
        assert client.get("/health").status_code == 200
    assert git(store, "for-each-ref", "refs/vero/tmp/") == ""


def test_long_poll_answers_when_the_job_finishes(harness):
    release = threading.Event()
    harness.backend.block = release
    with harness.serve() as (_, client):
        job = client.post("/evaluations", json={"partition": "train", "cases": ["t1", "t2"]}).json()
        timer = threading.Timer(1.0, release.set)
        timer.start()
        started = time.monotonic()
        answer = client.get(f"/evaluations/{job['id']}", params={"wait_sec": 30}, timeout=60)
        waited = time.monotonic() - started
        timer.join()
    assert answer.status_code == 200 and answer.json()["state"] == "complete"
    assert 0.8 < waited < 20  # held until the job finished, not for the full 30 s


def test_long_poll_returns_the_running_job_after_wait_sec(harness):
    harness.backend.block = threading.Event()
    with harness.serve() as (_, client):
        job = client.post("/evaluations", json={"partition": "train", "cases": ["t1", "t2"]}).json()
        started = time.monotonic()
        answer = client.get(f"/evaluations/{job['id']}", params={"wait_sec": 0.5})
        assert time.monotonic() - started >= 0.45
        assert answer.json()["state"] in {"queued", "running"}
        assert client.get(f"/evaluations/{job['id']}", params={"wait_sec": 61}).status_code == 422
        harness.backend.block.set()


def test_the_agent_surface_refuses_callers_inside_the_sidecar(harness):
    """`vero harbor serve` guards the agent surface: a candidate host beside the sidecar calling
    it over loopback (the ASGI client here is 127.0.0.1) gets 403; health and admin stay open."""
    with harness.serve(refuse_local_agent_calls=True) as (_, client):
        assert client.get("/health").status_code == 200
        for response in (
            client.get("/status"),
            client.post("/evaluations", json={"partition": "train"}),
            client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        ):
            assert response.status_code == 403, response.text
        assert client.get("/admin/export", headers=harness.admin_headers()).status_code == 200
        assert client.get("/admin/export").status_code == 401


CALL_SIDECAR = """
import json, sys, urllib.error, urllib.request
base = sys.argv[1]
answers = []
for path, body in (("/status", None), ("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "status", "arguments": {}}})):
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"content-type": "application/json",
                                       "accept": "application/json, text/event-stream"}
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, data=data, headers=headers), timeout=30) as r:
            text = r.read().decode()
            reply = json.loads(text) if path == "/mcp" else {}
            failed = path == "/mcp" and ("error" in reply or reply.get("result", {}).get("isError", True))
            answers.append([r.status, failed])
    except urllib.error.HTTPError as error:
        answers.append([error.code, True])
print(json.dumps(answers))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="callers of other uids need root")
def test_under_host_networking_main_reaches_the_agent_surface_from_loopback(harness, portable_toolchain):
    """Harbor's Modal gVisor runtime gives every service the host's network (`main` calls the
    sidecar at 127.0.0.1). The guard tells `main` by the uid the kernel lists for the calling
    socket: the agent's uid (1001) gets the agent surface and the MCP tools (real processes, real
    loopback connections); this process (root), a candidate host's uid and any other get 403."""
    import subprocess

    from vero.harbor.boundary.launcher import CANDIDATE_UID_RANGE
    from vero.spec.compiled import AGENT_UID

    assert AGENT_UID not in CANDIDATE_UID_RANGE  # no candidate host can pass for main
    python = str(portable_toolchain[1])

    def call_as(uid: int, base: str) -> list:
        done = subprocess.run(
            [python, "-I", "-c", CALL_SIDECAR, base],
            user=uid,
            group=uid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    with harness.serve(refuse_local_agent_calls=True) as (server, client):
        assert server.url.startswith("http://127.0.0.1:")
        assert call_as(AGENT_UID, server.url) == [[200, False], [200, False]]
        for uid in (CANDIDATE_UID_RANGE.start + 7, 1002):
            assert call_as(uid, server.url) == [[403, True], [403, True]], uid
        assert client.get("/status").status_code == 403  # root, in this process
    # Without the agent's uid, every local caller is refused (the bridge network's rule).
    with harness.serve(refuse_local_agent_calls=True, agent_uid=None) as (server, _):
        assert call_as(AGENT_UID, server.url) == [[403, True], [403, True]]


def test_an_oversized_body_gets_a_readable_413_and_the_connection_stays_usable(harness):
    """A 413 sent before the body was read closes the connection with unread data, which the
    kernel turns into a reset: the client loses the answer. The sidecar reads the rest first, so
    the 413 arrives and the next request on the same connection is answered too."""
    from raw_http import post_then_get  # tests/ is on sys.path

    with harness.serve() as (server, _):
        declared = post_then_get(server.url, "/evaluations", b"x" * (8 * 1024 * 1024), "/health")
        streamed = post_then_get(server.url, "/evaluations", [b"x" * 65536] * 128, "/health")
    assert declared == [413, 200]
    assert streamed == [413, 200]
    assert harness.backend.runs == []
