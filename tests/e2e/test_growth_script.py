"""`benchmarks/growth.py --smoke`: the benchmark runs end to end on a small scale.

No figure is asserted (docs/benchmarks.md records them from a full run); this keeps the script working
when the APIs it drives change (a refactor of `SidecarService` once broke it unnoticed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_the_smoke_run_reports_every_section(tmp_path: Path) -> None:
    out = tmp_path / "growth.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "growth.py"), "--smoke", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert [row["n"] for row in figures["growth"]] == [1, 10]
    assert all(row["evaluations"] >= row["n"] and row["status_bytes"] > 0 for row in figures["growth"])
    assert figures["big_target"]["slot_checkout_ms"] > 0 and figures["start_with_jobs"]["jobs"] == 500
    cli = figures["cli"]
    assert all(cli[f"{name}_cpu_ms"] > 0 for name in ("python_pass", "status", "typer_help"))
    assert "agent CLI in main" in done.stdout
