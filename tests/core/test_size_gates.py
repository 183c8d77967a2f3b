"""Size gates: ruff's complexity, argument and statement rules (C901, PLR0913, PLR0915) with ceilings
that only go down.

The limits are ruff's own settings (`[tool.ruff.lint.mccabe]`, `[tool.ruff.lint.pylint]` in
`pyproject.toml`). A function of `src/vero` over a limit must be listed in `size_ceilings.toml` with
the value it may not exceed; a new function over a limit, or a listed one that grew, fails here. So
does a ceiling above what its function now measures (or one whose function is gone): lower it
(or remove it) in the same change, so that every ceiling stays where the code is.

What keeps a ceiling from going up, or a new function from being listed to let it pass: the file's
Git history. Every committed version of `size_ceilings.toml`, and the working tree's, may only drop
entries and lower values relative to the version before it (`test_ceilings_only_ever_go_down`); raising
one means rewriting main's history, which landing by fast-forward refuses.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CEILINGS = Path(__file__).with_name("size_ceilings.toml")
RULES = ("C901", "PLR0913", "PLR0915")
_VALUE = re.compile(r"\((\d+) > \d+\)")


def _function_at(tree: ast.Module, row: int) -> str:
    """The qualified name (`Class.method`) of the function whose `def` is on line `row`."""

    def visit(nodes: list[ast.stmt], prefix: str) -> str | None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{node.name}"
                if not isinstance(node, ast.ClassDef) and node.lineno == row:
                    return name
                found = visit(node.body, f"{name}.")
                if found is not None:
                    return found
        return None

    found = visit(tree.body, "")
    assert found is not None, f"no function defined on line {row}"
    return found


def measured(findings: list[dict]) -> dict[str, dict[str, int]]:
    """rule -> `path::function` -> the value ruff measured, from ruff's JSON findings."""
    trees: dict[str, ast.Module] = {}
    values: dict[str, dict[str, int]] = {rule: {} for rule in RULES}
    for finding in findings:
        path = Path(finding["filename"])
        rel = path.relative_to(ROOT / "src").as_posix()
        if rel not in trees:
            trees[rel] = ast.parse(path.read_text(encoding="utf-8"))
        match = _VALUE.search(finding["message"])
        assert match is not None, finding["message"]
        values[finding["code"]][f"{rel}::{_function_at(trees[rel], finding['location']['row'])}"] = int(match[1])
    return values


def judge(values: dict[str, dict[str, int]], ceilings: dict[str, dict[str, int]]) -> list[str]:
    """What breaks the gates: a value over its ceiling or with none, a ceiling above its value or
    with no function over the limit."""
    found = []
    for rule in RULES:
        have, allowed = values.get(rule, {}), ceilings.get(rule, {})
        for name, value in sorted(have.items()):
            if name not in allowed:
                found.append(f"{rule} {name}: {value} is over ruff's limit (split it along its steps)")
            elif value > allowed[name]:
                found.append(f"{rule} {name}: {value} is over its ceiling {allowed[name]}")
        for name, ceiling in sorted(allowed.items()):
            if name not in have:
                found.append(f"{rule} {name}: within ruff's limit now: remove its ceiling ({ceiling})")
            elif have[name] < ceiling:
                found.append(f"{rule} {name}: lower its ceiling from {ceiling} to {have[name]}")
    return found


def test_the_gates_judge_growth_new_offenders_and_stale_ceilings():
    ceilings = {"C901": {"a.py::f": 12, "a.py::g": 15, "a.py::gone": 11}}
    values = {"C901": {"a.py::f": 13, "a.py::g": 14, "a.py::new": 11}}
    assert judge(values, ceilings) == [
        "C901 a.py::f: 13 is over its ceiling 12",
        "C901 a.py::new: 11 is over ruff's limit (split it along its steps)",
        "C901 a.py::g: lower its ceiling from 15 to 14",
        "C901 a.py::gone: within ruff's limit now: remove its ceiling (11)",
    ]
    assert judge(values, {"C901": dict(values["C901"])}) == []


@pytest.mark.timeout(120)
def test_no_function_of_src_grows_past_its_ceiling():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", ",".join(RULES), "--output-format", "json", "src"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]
    values = measured(json.loads(done.stdout))
    assert judge(values, tomllib.loads(CEILINGS.read_text(encoding="utf-8"))) == []


def rises(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> list[str]:
    """What `after` raises or adds relative to `before` (ceilings by rule and function)."""
    found = []
    for rule in RULES:
        old = before.get(rule, {})
        for name, ceiling in sorted(after.get(rule, {}).items()):
            if name not in old:
                found.append(f"{rule} {name}: added with {ceiling}")
            elif ceiling > old[name]:
                found.append(f"{rule} {name}: raised from {old[name]} to {ceiling}")
    return found


def test_rises_finds_a_raised_and_an_added_ceiling():
    before = {"C901": {"a.py::f": 12, "a.py::g": 15}}
    assert rises(before, {"C901": {"a.py::f": 11}}) == []
    assert rises(before, {"C901": {"a.py::f": 13, "a.py::g": 15, "a.py::h": 11}}) == [
        "C901 a.py::f: raised from 12 to 13",
        "C901 a.py::h: added with 11",
    ]


@pytest.mark.timeout(120)
def test_ceilings_only_ever_go_down():
    rel = CEILINGS.relative_to(ROOT).as_posix()
    log = subprocess.run(["git", "log", "--format=%H", "--", rel], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if log.returncode != 0:
        pytest.skip(f"no Git history here ({log.stderr.strip()[:200]})")
    versions = []
    for commit in reversed(log.stdout.split()):
        shown = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        if shown.returncode == 0:
            versions.append((commit[:12], tomllib.loads(shown.stdout)))
    versions.append(("the working tree", tomllib.loads(CEILINGS.read_text(encoding="utf-8"))))
    found = [
        f"{label}: {rise}"
        for (_, before), (label, after) in itertools.pairwise(versions)
        for rise in rises(before, after)
    ]
    assert found == []
