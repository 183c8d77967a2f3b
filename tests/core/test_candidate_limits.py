"""Candidate size limits: refused before the fetch, measured incrementally, exact after any edits."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import git as gitpython
import pytest
from _support.git import commit_files, git  # tests/ is on sys.path: the tests' one set of git helpers

from vero.core.candidate_limits import TreeSize, measure_tree
from vero.core.candidates import CandidateStore
from vero.core.state import StateStore
from vero.errors import CandidateRejected, CandidateTooLarge
from vero.spec.models import CandidateLimits

from .test_candidates import chown_agent, snapshot

pytestmark = pytest.mark.timeout(300)

LIMITS = CandidateLimits(max_files=20, max_total_bytes=10_000, max_file_bytes=4_000)


def open_store(root: Path, limits: CandidateLimits = LIMITS) -> CandidateStore:
    return CandidateStore.open(root, StateStore.open(root / "state.db"), limits=limits)


def objects_in(git_dir: Path) -> set[str]:
    out = git(git_dir, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)")
    return set(out.split())


def recorded_size(store: CandidateStore, tree: str) -> TreeSize:
    ((files, size),) = store.state.rows("SELECT files, bytes FROM checked_trees WHERE tree = ?", (tree,))
    return TreeSize(files=files, bytes=size)


def whole_size(repo: Path, rev: str) -> TreeSize:
    """The figures of a tree by plain `git ls-tree -r -l` (files and symlinks; no submodules)."""
    files = total = 0
    for line in git(repo, "ls-tree", "-r", "-l", rev).splitlines():
        mode, _kind, _oid, size = line.split("\t")[0].split()
        if mode in ("100644", "100755", "120000"):
            files, total = files + 1, total + int(size)
    return TreeSize(files=files, bytes=total)


@pytest.fixture
def repo(tmp_path) -> Path:
    repo = tmp_path / "workspace"
    commit_files(repo, {"README.md": "baseline\n", "src/main.py": "print('hi')\n"}, message="baseline")
    return repo


@pytest.fixture
def store(tmp_path, repo) -> CandidateStore:
    store = open_store(tmp_path / "state")
    store.import_version_sync(repo, "HEAD")
    return store


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({f"many/{i}.txt": "x" for i in range(25)}, "max_files"),
        ({"big.bin": "y" * 5_000}, "max_file_bytes"),
        ({f"part{i}.bin": "z" * 3_000 for i in range(4)}, "max_total_bytes"),
    ],
)
def test_a_tree_over_a_limit_is_refused_before_anything_reaches_the_store(store, repo, files, limit):
    before_objects, before_state = objects_in(store.git_dir), snapshot(store)
    head = commit_files(repo, files, message="too large")
    chown_agent(repo)

    with pytest.raises(CandidateTooLarge) as caught:
        store.import_version_sync(repo, head)

    assert caught.value.limit == limit
    assert caught.value.allowed == getattr(LIMITS, limit) < caught.value.actual
    assert f"target.limits.{limit}" in str(caught.value)
    assert isinstance(caught.value, CandidateRejected)
    # Refused in the agent's repository: no object, ref or record of it in the store.
    assert objects_in(store.git_dir) == before_objects
    assert snapshot(store) == before_state
    assert store.temporary_refs() == []


def test_the_oversized_file_is_named_and_the_error_text_gives_the_figures(store, repo):
    head = commit_files(repo, {"data/huge.bin": "q" * 4_001})
    with pytest.raises(CandidateTooLarge) as caught:
        store.import_version_sync(repo, head)
    assert caught.value.path == "data/huge.bin"
    assert "4,001 bytes ('data/huge.bin'), the limit is 4,000" in str(caught.value)


def test_a_large_sparse_file_is_refused_by_its_size_not_its_disk_use(store, repo):
    sparse = repo / "sparse.bin"
    with open(sparse, "wb") as f:
        f.truncate(256 << 20)  # 256 MiB of holes: cheap on disk, 256 MiB for git
    git(repo, "add", "sparse.bin")
    git(repo, "commit", "-q", "-m", "sparse")
    before = objects_in(store.git_dir)
    with pytest.raises(CandidateTooLarge) as caught:
        store.import_version_sync(repo, "HEAD")
    assert (caught.value.limit, caught.value.actual) == ("max_file_bytes", 256 << 20)
    assert objects_in(store.git_dir) == before


def test_a_tree_at_the_limits_is_accepted_and_its_figures_recorded(store, repo):
    existing = whole_size(repo, "HEAD")
    room = LIMITS.max_files - existing.files
    files = {f"f/{i}.txt": "a" * 100 for i in range(room)}
    head = commit_files(repo, files)
    record = store.import_version_sync(repo, head)
    assert recorded_size(store, record.tree) == whole_size(repo, head)
    assert whole_size(repo, head).files == LIMITS.max_files


def test_incremental_figures_equal_a_whole_measurement_after_random_edits(tmp_path, repo):
    """Each commit is measured from its checked parent; the recorded figures must equal git's own
    whole-tree listing after additions, changes, deletions, symlinks, mode and type changes."""
    store = open_store(tmp_path / "state", CandidateLimits())
    rng = random.Random(20261130)
    store.import_version_sync(repo, "HEAD")
    for step in range(25):
        tracked = git(repo, "ls-files").split()
        action = rng.choice(["add", "change", "delete", "link", "exec", "dir-to-file"])
        if action == "delete" and len(tracked) > 2:
            victim = rng.choice(tracked)
            git(repo, "rm", "-q", "-r", "--", victim)
        elif action == "link":
            name = f"links/l{step}"
            (repo / "links").mkdir(exist_ok=True)
            os.symlink("../README.md", repo / name)
        elif action == "exec" and tracked:
            target = repo / rng.choice(tracked)
            if target.is_file() and not target.is_symlink():
                target.chmod(0o755)
                target.write_text("#!/bin/sh\n" + "e" * rng.randint(0, 50))
        elif action == "dir-to-file" and (repo / "d").is_dir():
            subprocess.run(["rm", "-rf", str(repo / "d")], check=True)
            (repo / "d").write_text("now a file\n")
        else:
            for _ in range(rng.randint(1, 4)):
                name = rng.choice([f"d/{rng.randint(0, 9)}.txt", f"s{rng.randint(0, 5)}.txt", "README.md"])
                if (repo / name).parent.is_file():
                    continue
                (repo / name).parent.mkdir(parents=True, exist_ok=True)
                (repo / name).write_text("w" * rng.randint(0, 300))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--allow-empty", "-m", f"step {step}")
        record = store.import_version_sync(repo, "HEAD")
        assert recorded_size(store, record.tree) == whole_size(repo, "HEAD"), f"step {step} ({action})"


def test_a_child_over_the_limit_of_an_accepted_parent_is_refused_from_the_difference(store, repo):
    head = commit_files(repo, {f"n/{i}.txt": "n" for i in range(10)})
    store.import_version_sync(repo, head)
    calls: list[tuple[str, ...]] = []

    class CountingGit:
        """Plain git on the repository, counting whole-tree listings."""

        def __init__(self) -> None:
            self.git = gitpython.Git(repo)

        def ls_tree(self, *args, **kwargs):
            calls.append(args)
            return self.git.ls_tree(*args, **kwargs)

        def diff_tree(self, *args, **kwargs):
            return self.git.diff_tree(*args, **kwargs)

        def cat_file(self, *args, **kwargs):
            return self.git.cat_file(*args, **kwargs)

    agent = CountingGit()
    parent_tree = git(repo, "rev-parse", "HEAD^{tree}")
    commit_files(repo, {f"m/{i}.txt": "m" for i in range(10)})
    with pytest.raises(CandidateTooLarge) as caught:
        measure_tree(agent, git(repo, "rev-parse", "HEAD^{tree}"), LIMITS, (parent_tree, whole_size(repo, "HEAD~1")))
    assert caught.value.limit == "max_files" and caught.value.actual == whole_size(repo, "HEAD").files
    assert calls == []  # only the difference was read
    with pytest.raises(CandidateTooLarge):
        store.import_version_sync(repo, "HEAD")
