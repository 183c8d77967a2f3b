"""The standard spec tree of the tests: a complete optimization spec (a program target, five tiny
Harbor cases, a reference overlay) whose hidden partition and cases carry unusual names (`zq-...`),
so a test can grep every compiled byte for them. Tests change the spec through `edit`, a function
of the YAML document (a plain dict), before it is written.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from _support.cases import write_case

__all__ = ["BASE_SPEC", "HIDDEN_CASES", "HIDDEN_MARKER", "HIDDEN_PARTITION", "SpecTree", "make_spec_tree"]

HIDDEN_PARTITION = "zq-hidden-part"
HIDDEN_CASES = ("zq-hidden-case-4", "zq-hidden-case-5")
HIDDEN_MARKER = "ZQ-HIDDEN-CONTENT-7b1e"
"""Written into every hidden case's files: no compiled byte outside `tests/` may contain it."""

BASE_SPEC: dict[str, Any] = {
    "schema_version": 1,
    "name": "demo",
    "description": "Make `prog.py` print the right answer.",
    "target": {"kind": "program", "path": "target", "install_path": "/opt/candidate", "reference": "reference"},
    "cases": {
        "path": "cases",
        "partitions": {
            "train": ["case-1", "case-2"],
            "holdout": ["case-3"],
            HIDDEN_PARTITION: list(HIDDEN_CASES),
        },
    },
    "agent_access": {
        "train": {"disclosure": "full", "total_runs": 3, "total_cases": 6},
        "holdout": {"disclosure": "aggregate", "min_aggregate_cases": 1, "total_runs": 1, "total_cases": 1},
    },
    "selection": {"mode": "submit", "partition": "train"},
    "targets": {HIDDEN_PARTITION: {}},
    "harbor": {"requirement": "harbor==0.26.0", "environment": "docker", "drain_timeout_sec": 60},
}


@dataclass
class SpecTree:
    """A spec directory: `build.yaml`, `target/`, `cases/`, `reference/`.

    Attributes:
        root: the directory holding `build.yaml`.
        document: the YAML document as written (after `edit`).
    """

    root: Path
    document: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.root / "build.yaml"

    def write(self, edit: Callable[[dict[str, Any]], Any] | None = None) -> Path:
        document = copy.deepcopy(BASE_SPEC)
        if edit is not None:
            edit(document)
        self.document = document
        self.path.write_text(yaml.safe_dump(document, sort_keys=False))
        return self.path


def make_spec_tree(root: Path, edit: Callable[[dict[str, Any]], Any] | None = None) -> SpecTree:
    """Create the standard spec tree under `root` and write its `build.yaml`."""
    root.mkdir(parents=True, exist_ok=True)
    target = root / "target"
    target.mkdir()
    (target / "prog.py").write_text('print("wrong")\n')
    (target / "run.sh").write_text("#!/bin/sh\npython3 prog.py\n")
    (target / "run.sh").chmod(0o755)
    (target / "lib").mkdir()
    (target / "lib" / "util.py").write_text("VALUE = 1\n")
    (target / "util-link.py").symlink_to("lib/util.py")
    reference = root / "reference"
    reference.mkdir()
    (reference / "prog.py").write_text('print("right")\n')
    cases = root / "cases"
    for name in ("case-1", "case-2", "case-3"):
        _standard_case(cases, name)
    for name in HIDDEN_CASES:
        _standard_case(cases, name, marker=HIDDEN_MARKER)
    tree = SpecTree(root)
    tree.write(edit)
    return tree


def _standard_case(cases: Path, name: str, marker: str = "") -> Path:
    """A case of the standard tree: reward 1, `marker` in its instruction and its test."""
    return write_case(
        cases,
        name,
        test_sh=f"#!/bin/bash\n# {marker}\nmkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt\n",
        instruction=f"Case {name}. {marker}\n",
        dockerfile="FROM python:3.13-slim\nWORKDIR /opt/candidate\n",
        agent_timeout_sec=60.0,
        verifier_timeout_sec=60.0,
        build_timeout_sec=None,
    )
