"""`benchmarks/overhead.py` as a command: its help and the refusals it makes before any run.

The benchmark itself needs Docker and minutes of nested Harbor runs and makes no assertion worth
timing in a test; these checks keep the script importable and its command line honest (a renamed
vero API breaks `--help` or the partition check here, not in an operator's shell).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "overhead.py"


def _run(*args: str, timeout_sec: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_sec, check=False
    )


@pytest.mark.timeout(60)
def test_help_lists_the_options() -> None:
    done = _run("--help", timeout_sec=50)
    assert done.returncode == 0, done.stderr
    for option in ("--task", "--partition", "--repeats", "--poll-interval-sec", "--json"):
        assert option in done.stdout


@pytest.mark.timeout(60)
def test_zero_repeats_is_a_usage_error() -> None:
    done = _run("--repeats", "0", timeout_sec=50)
    assert done.returncode == 2
    assert "--repeats must be at least 1" in done.stderr


@pytest.mark.timeout(180)
def test_a_hidden_partition_is_refused_before_any_run() -> None:
    # `hidden` is a target partition of tasks/minimal: the compiled sidecar config does not have it.
    done = _run("--task", str(ROOT / "tasks" / "minimal"), "--partition", "hidden", timeout_sec=170)
    assert done.returncode == 1
    assert "partition 'hidden' is not agent-accessible; choose one of ['holdout', 'train']" in done.stderr
    assert "warm-up" not in done.stdout
