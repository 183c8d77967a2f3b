"""Fixtures of the compiler tests: the standard spec tree (`_support.specs`) under `tmp_path`."""

from __future__ import annotations

from pathlib import Path

import pytest
from _support.specs import SpecTree, make_spec_tree


@pytest.fixture
def spec_tree(tmp_path: Path) -> SpecTree:
    return make_spec_tree(tmp_path / "spec")
