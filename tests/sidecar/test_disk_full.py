"""Disk full, on real small file systems (tmpfs mounts): the state dir full answers 507 and
records nothing, the jobs dir full fails the job as infrastructure and refunds it; in both cases
everything recorded before stays, `/status` keeps answering, and the sidecar works on once space
is back.

Mounting needs root (CI runs as root); elsewhere the module is skipped.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from _support.cases import write_case

from vero.harbor import HarborBackend
from vero.spec.models import HarborSpec, PartitionAccess

from ._server import commit_file, make_harness, wait_for_state

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small file system (tmpfs) needs root"),
]


@contextmanager
def small_filesystem(path: Path, size_mib: int) -> Iterator[Path]:
    """`path` (created) as a tmpfs of `size_mib` MiB for the duration; unmounted lazily after."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True, timeout=30)


def fill(directory: Path) -> Path:
    """Write a file in `directory` until its file system has no space left; returns the file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1 << 9, 1):  # then whatever part of a page is left
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def budget(client, partition: str) -> dict:
    return next(p for p in client.get("/status").json()["partitions"] if p["name"] == partition)["budget"]


def test_state_dir_full_answers_507_records_nothing_and_keeps_answering(tmp_path):
    harness = make_harness(tmp_path / "h")
    with small_filesystem(harness.state_dir, 16), harness.serve() as (_, client):
        done = client.post("/evaluations", json={"partition": "train", "cases": ["t1"]}).json()
        assert wait_for_state(client, done["id"], {"complete"})["state"] == "complete"
        before = client.get("/status").json()
        runs_before = budget(client, "train")["remaining_runs"]
        exported = client.get("/admin/export", headers=harness.admin_headers()).json()
        # A new version with a blob of its own (the candidate store must write objects) and the
        # baseline (only the state database must write).
        blob = os.urandom(256 * 1024).hex()
        version = commit_file(harness.agent_repo, "data.txt", blob, "a large file")
        filler = fill(harness.state_dir)

        for request in ({"partition": "train", "version": version}, {"partition": "train", "cases": ["t2"]}):
            answer = client.post("/evaluations", json=request)
            assert answer.status_code == 507, answer.text
            assert answer.json()["code"] == "storage_full"
        answer = client.post("/submissions", json={"version": version})
        assert answer.status_code == 507, answer.text

        # Still answering, and nothing recorded before is lost or changed.
        assert client.get("/status").json() == before
        assert client.get(f"/evaluations/{done['id']}").json()["state"] == "complete"
        assert client.get("/admin/export", headers=harness.admin_headers()).json() == exported

        # Space is back: the sidecar works on, charging only what it now admits.
        filler.unlink()
        again = client.post("/evaluations", json={"partition": "train", "version": version})
        assert again.status_code == 202, again.text
        assert wait_for_state(client, again.json()["id"], {"complete"})["state"] == "complete"
        assert budget(client, "train")["remaining_runs"] == runs_before - 1


STAND_IN_HARBOR = """#!/bin/sh
# Never reached: the jobs dir is full before `harbor run` could start.
echo started > {ran}
exit 1
"""


def test_jobs_dir_full_fails_the_job_as_infrastructure_and_refunds_it(tmp_path):
    harbor = tmp_path / "harbor"
    ran = tmp_path / "stand-in-harbor.ran"
    harbor.write_text(STAND_IN_HARBOR.format(ran=ran))
    harbor.chmod(0o755)
    harness = make_harness(
        tmp_path / "h",
        backend=HarborBackend(harbor_executable=harbor),
        partitions={"train": ["c1"]},
        access={"train": PartitionAccess(disclosure="full", min_aggregate_cases=1, total_runs=3, total_cases=3)},
        # A case timeout on a case declaring none: the run writes its agent config into the jobs dir first.
        harbor=HarborSpec(environment="stand-in", infra_retries=0, evaluation_timeout_sec=120, case_timeout_sec=60),
    )
    # A valid Harbor task declaring no agent timeout: only the full jobs dir can stop the run.
    write_case(harness.cases_dir, "c1", dockerfile="FROM scratch\n", agent_timeout_sec=None)
    jobs = harness.work_dir / "jobs"
    with small_filesystem(jobs, 1), harness.serve() as (_, client):
        filler = fill(jobs)
        before = budget(client, "train")
        job = client.post("/evaluations", json={"partition": "train"}).json()
        problem = wait_for_state(client, job["id"], {"complete", "failed"})
        assert (problem["status"], problem["code"]) == (502, "infrastructure"), problem
        assert budget(client, "train") == before
        assert not ran.exists()
        export = client.get("/admin/export", headers=harness.admin_headers()).json()
        (reservation,) = export["reservations"]
        assert (reservation["state"], reservation["reason"]) == ("refunded", "infrastructure")
        filler.unlink()
