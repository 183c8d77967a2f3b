"""The sealed session archive: idempotent writes, verified reads, tampering refused."""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import subprocess
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import pytest
from _support.git import commit_file  # tests/ is on sys.path: the tests' one set of git helpers

from vero.core.archive import canonical_tar_bytes, file_digest
from vero.core.candidates import CandidateStore
from vero.core.jobs import EvaluationJob, JobStore
from vero.core.ledger import BudgetLedger, BudgetTotals, Cost
from vero.core.session import SealHeader, Submission, read_session, write_session_archive
from vero.core.state import StateStore
from vero.core.submission import record_submission
from vero.errors import SessionInvalid

SPEC_DIGEST = "sha256:" + "1" * 64
SEALED_AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture
def state(tmp_path: Path) -> tuple[Path, str, str]:
    """A sidecar-like state dir: two candidates, a ledger with one settled run, a job, a submission."""
    agent = tmp_path / "agent"
    agent.mkdir()
    first = commit_file(agent, "a.txt", "one")
    second = commit_file(agent, "b.txt", "two")
    state_dir = tmp_path / "state"
    state_store = StateStore.open(state_dir / "state.db")
    store = CandidateStore.open(state_dir, state_store)

    async def fill() -> None:
        await store.import_version(agent, first)
        await store.import_version(agent, second)
        ledger = BudgetLedger.open(state_store, {("train", "agent"): BudgetTotals(runs=5, cases=20)})
        job_id = JobStore.new_id()
        jobs = JobStore(ledger)
        await jobs.admit(
            EvaluationJob(
                id=job_id,
                principal="agent",
                partition="train",
                cases=["c1", "c2"],
                full_partition=True,
                version="HEAD",
                candidate=second,
                disclosure="full",
                reservation_id=job_id,
                created_at=SEALED_AT,
            ),
            Cost.of_evaluation(2),
        )
        await jobs.finish(job_id, "complete", finished_at=SEALED_AT)
        await record_submission(state_store, Submission(candidate=second, version="HEAD", submitted_at=SEALED_AT))

    asyncio.run(fill())
    state_store.close()
    (state_dir / "admin-token").write_text("never-packed")
    return state_dir, first, second


def _write(state_dir: Path, dest: Path) -> str:
    return write_session_archive(
        state_dir,
        dest,
        SealHeader(name="demo", spec_digest=SPEC_DIGEST, baseline_commit="f" * 40, sealed_at=SEALED_AT),
    )


def test_sealing_twice_gives_identical_bytes(state, tmp_path: Path) -> None:
    state_dir, _, _ = state
    first = _write(state_dir, tmp_path / "out1" / "session.tar.gz")
    second = _write(state_dir, tmp_path / "out2" / "session.tar.gz")
    assert first == second
    assert (tmp_path / "out1" / "session.tar.gz").read_bytes() == (tmp_path / "out2" / "session.tar.gz").read_bytes()
    assert (tmp_path / "out1" / "session.tar.gz.sha256").read_text() == f"{first}  session.tar.gz\n"


def test_read_session_round_trips_records_and_commits(state, tmp_path: Path) -> None:
    state_dir, first, second = state
    archive = tmp_path / "out" / "session.tar.gz"
    _write(state_dir, archive)
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert "admin-token" not in names and "manifest.json" in names
    session = read_session(archive, tmp_path / "x", spec_digest=SPEC_DIGEST, baseline_commit="f" * 40)
    assert [c.id for c in session.candidates] == [first, second]
    assert session.submission is not None and session.submission.candidate == second
    assert [j.candidate for j in session.jobs] == [second]
    (balance,) = session.balances
    assert (balance.settled_runs, balance.settled_cases) == (1, 2)
    refs = subprocess.run(
        ["git", "--git-dir", str(session.git_dir), "for-each-ref", "--format=%(objectname)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert sorted(refs) == sorted([first, second])


def _rewrite(archive: Path, edit) -> None:
    """Re-pack the archive with `edit(stage_dir)` applied, and fix the outer sha256 (not the manifest)."""
    stage = archive.parent / "stage"
    with tarfile.open(archive) as tar:
        tar.extractall(stage, filter="data")
    edit(stage)
    data = canonical_tar_bytes(stage)
    archive.write_bytes(data)
    import hashlib

    Path(f"{archive}.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {archive.name}\n")


def _edit_state(edit):
    """An `_rewrite` edit of state.json that also fixes the manifest's digest of it (a forger with
    the archive in hand), so only the state's own checks can refuse it."""

    def apply(stage: Path) -> None:
        path = stage / "state.json"
        state = json.loads(path.read_text())
        edit(state)
        path.write_text(json.dumps(state))
        manifest = json.loads((stage / "manifest.json").read_text())
        manifest["files"]["state.json"] = file_digest(path)
        (stage / "manifest.json").write_text(json.dumps(manifest))

    return apply


def _settle_nothing(state: dict) -> None:
    for budget in state["budgets"]:
        budget["settled"] = 0


def _reopen_reservation(state: dict) -> None:
    state["reservations"][0].update(state="reserved", closed_at=None, reason=None)
    for budget in state["budgets"]:
        budget["reserved"], budget["settled"] = budget["settled"], 0


@pytest.mark.parametrize("edit", [_settle_nothing, _reopen_reservation], ids=["budget", "job-reservation"])
def test_an_inconsistent_state_is_refused_even_with_matching_digests(state, tmp_path: Path, edit) -> None:
    state_dir, _, _ = state
    archive = tmp_path / "out" / "session.tar.gz"
    _write(state_dir, archive)
    _rewrite(archive, _edit_state(edit))
    with pytest.raises(SessionInvalid, match=r"state\.json is invalid"):
        read_session(archive, tmp_path / "x", spec_digest=SPEC_DIGEST, baseline_commit="f" * 40)


def test_the_archive_carries_the_state_export_byte_for_byte(state, tmp_path: Path) -> None:
    state_dir, _, _ = state
    archive = tmp_path / "out" / "session.tar.gz"
    _write(state_dir, archive)
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["candidates.bundle", "manifest.json", "state.json"]
        packed = tar.extractfile("state.json").read()
    with StateStore.open(state_dir / "state.db") as store:
        assert packed == store.export_bytes()


def test_the_state_export_depends_on_the_content_not_the_file(state, tmp_path: Path) -> None:
    """A copy of the database rebuilt page by page (`VACUUM INTO`: another file, other bytes) exports
    the same bytes."""
    state_dir, _, _ = state
    copy = tmp_path / "copy" / "state.db"
    copy.parent.mkdir()
    conn = sqlite3.connect(state_dir / "state.db")
    try:
        conn.execute("VACUUM INTO ?", (str(copy),))
    finally:
        conn.close()
    assert copy.read_bytes() != (state_dir / "state.db").read_bytes()
    with StateStore.open(state_dir / "state.db") as original, StateStore.open(copy) as rebuilt:
        assert rebuilt.export_bytes() == original.export_bytes()


@pytest.mark.parametrize("case", ["flip-byte", "edit-record", "extra-file", "no-sha256"])
def test_tampered_archives_are_refused(state, tmp_path: Path, case: str) -> None:
    state_dir, _, _ = state
    archive = tmp_path / "out" / "session.tar.gz"
    _write(state_dir, archive)
    if case == "flip-byte":
        data = bytearray(archive.read_bytes())
        data[len(data) // 2] ^= 0xFF
        archive.write_bytes(bytes(data))
    elif case == "edit-record":

        def edit(stage: Path) -> None:
            path = stage / "state.json"
            record = json.loads(path.read_text())
            record["submission"]["version"] = "evil"
            path.write_text(json.dumps(record))

        _rewrite(archive, edit)
    elif case == "extra-file":
        _rewrite(archive, lambda stage: (stage / "planted.json").write_text("{}"))
    else:
        Path(f"{archive}.sha256").unlink()
    with pytest.raises(SessionInvalid):
        read_session(archive, tmp_path / "x", spec_digest=SPEC_DIGEST, baseline_commit="f" * 40)


@pytest.mark.parametrize("field", ["spec_digest", "baseline_commit"])
def test_archive_for_another_spec_or_baseline_is_refused(state, tmp_path: Path, field: str) -> None:
    state_dir, _, _ = state
    archive = tmp_path / "out" / "session.tar.gz"
    _write(state_dir, archive)
    expected = {"spec_digest": SPEC_DIGEST, "baseline_commit": "f" * 40}
    expected[field] = "sha256:" + "2" * 64 if field == "spec_digest" else "e" * 40
    with pytest.raises(SessionInvalid) as info:
        read_session(archive, tmp_path / "x", **expected)
    assert field.split("_")[0] in str(info.value)


@pytest.mark.parametrize("version", [1, 3, "2", None])
def test_a_manifest_of_another_schema_version_is_refused(state, tmp_path: Path, version) -> None:
    state_dir, _, _ = state
    archive = tmp_path / "out" / "session.tar.gz"
    _write(state_dir, archive)

    def edit(stage: Path) -> None:
        manifest = json.loads((stage / "manifest.json").read_text())
        manifest["schema_version"] = version
        (stage / "manifest.json").write_text(json.dumps(manifest))

    _rewrite(archive, edit)
    with pytest.raises(SessionInvalid) as info:
        read_session(archive, tmp_path / "x", spec_digest=SPEC_DIGEST, baseline_commit="f" * 40)
    expected = "manifest is missing or malformed" if version is None else f"schema version {version!r};"
    assert expected in str(info.value)


def test_unsafe_entries_are_refused(tmp_path: Path) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    archive = tmp_path / "session.tar.gz"
    archive.write_bytes(raw.getvalue())
    import hashlib

    Path(f"{archive}.sha256").write_text(hashlib.sha256(raw.getvalue()).hexdigest() + "  session.tar.gz\n")
    with pytest.raises(SessionInvalid):
        read_session(archive, tmp_path / "x", spec_digest=SPEC_DIGEST, baseline_commit="f" * 40)
    assert not (tmp_path / "escape.txt").exists()
