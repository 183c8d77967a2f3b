"""Fetching a registry case's pinned git repository (`vero.compiler.cases.CaseStore`), over a
real git transport (`file://`, which takes the same path through git's transport code as https)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vero.compiler.cases import CaseStore
from vero.errors import SpecError
from vero.spec.cases import CaseSource

pytestmark = pytest.mark.timeout(120)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def task_repo(tmp_path) -> tuple[Path, str]:
    repo = tmp_path / "upstream"
    task = repo / "tasks" / "hello"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text('version = "1.0"\n')
    (task / "instruction.md").write_text("Say hello.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    _git(tmp_path, "init", "-q", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "task")
    return repo, _git(repo, "rev-parse", "HEAD").strip()


def test_a_pinned_commit_is_fetched_without_its_git_dir(tmp_path, task_repo, monkeypatch):
    repo, commit = task_repo
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-q", "--allow-empty", "-m", "later")
    # An inherited GIT_DIR would point git at another repository; the hardened runner drops it.
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    store = CaseStore(tmp_path / "staging", "cases.dataset")
    (tmp_path / "staging").mkdir()
    dest = store.fetch(CaseSource("hello", Path("tasks/hello"), f"file://{repo}", commit))
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == [
        "instruction.md",
        "task.toml",
        "tests",
        "tests/test.sh",
    ]
    assert store.path("hello") == dest


@pytest.mark.parametrize("url", ["ext::sh -c touch% {marker}", "fd::7"])
def test_transports_that_run_commands_are_refused(tmp_path, task_repo, url):
    _, commit = task_repo
    marker = tmp_path / "pwned"
    (tmp_path / "staging").mkdir()
    store = CaseStore(tmp_path / "staging", "cases.dataset")
    with pytest.raises(SpecError, match="cannot fetch its git repository") as raised:
        store.fetch(CaseSource("hello", Path("tasks/hello"), url.format(marker=marker), commit))
    assert raised.value.issues[0].loc == "cases.dataset"
    assert not marker.exists()


def test_an_unknown_commit_or_a_missing_task_names_the_case(tmp_path, task_repo):
    repo, commit = task_repo
    (tmp_path / "staging").mkdir()
    store = CaseStore(tmp_path / "staging", "cases.dataset")
    with pytest.raises(SpecError, match="'hello': cannot fetch"):
        store.fetch(CaseSource("hello", Path("tasks/hello"), f"file://{repo}", "0" * 40))
    with pytest.raises(SpecError, match="'other': no Harbor task at tasks/other"):
        store.fetch(CaseSource("other", Path("tasks/other"), f"file://{repo}", commit))
