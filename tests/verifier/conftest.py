"""The `bench` fixture of the verifier tests (helpers: `verifier_bench.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from verifier_bench import Workbench


@pytest.fixture
def bench(tmp_path: Path) -> Workbench:
    """A fresh `Workbench` (baseline, agent repo, sidecar state, cases) under `tmp_path`."""
    return Workbench(tmp_path)
