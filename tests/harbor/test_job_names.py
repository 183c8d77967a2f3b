"""Job names of an evaluation's rounds: built and found by one module (`vero.harbor.job_names`)."""

from __future__ import annotations

from pathlib import Path

from vero.harbor.job_names import job_dirs_of, round_job_name


def test_rounds_are_named_and_found_in_round_order(tmp_path: Path) -> None:
    names = [round_job_name("ev-1", n) for n in range(12)]
    assert names[:3] == ["ev-1", "ev-1.retry-1", "ev-1.retry-2"]
    for name in [*names, "ev-1.retry-x", "ev-1.retry-01", "ev-10.retry-1"]:
        (tmp_path / name).mkdir()
    (tmp_path / "ev-1.retry-12").symlink_to(tmp_path / "ev-10.retry-1")  # never a job dir
    # Numeric order (retry-10 after retry-2), nothing of another evaluation, no link.
    assert [p.name for p in job_dirs_of(tmp_path / "ev-1")] == names
    assert job_dirs_of(tmp_path / "missing" / "ev-1") == [tmp_path / "missing" / "ev-1"]
