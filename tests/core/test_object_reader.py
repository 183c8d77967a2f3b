"""The kept `cat-file --batch-command` (`vero.core.object_reader`): what it answers equals what the git
processes it replaces print, and a request that fails, hangs or is too large ends its process."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import time
import zlib
from pathlib import Path

import pytest
from _support.git import commit_files, git

from vero.core import object_reader
from vero.core.isolated_git import IsolatedGit, private_git_env
from vero.core.object_reader import MalformedObject, ObjectReader, diff_tree_raw, first_parent_history
from vero.errors import GitFailed


@pytest.fixture
def repo(tmp_path) -> Path:
    return tmp_path / "repo"


def reader_of(repo: Path, timeout_sec: float | None = 30.0, parsed_bytes: int = 0) -> tuple[ObjectReader, object]:
    context = private_git_env(safe_directories=[repo, repo / ".git"])
    env, _ = context.__enter__()
    git = IsolatedGit(repo, env=env, git_dir=repo / ".git", timeout_sec=timeout_sec)
    return ObjectReader(git, parsed_bytes=parsed_bytes), context


@pytest.fixture
def reader(repo):
    commit_files(repo, {"a.txt": "a\n"})
    reader, context = reader_of(repo)
    yield reader
    reader.close()
    context.__exit__(None, None, None)


def git_diff(repo: Path, old: str, new: str, flags: str = "-r -t") -> bytes:
    return subprocess.run(
        ["git", "-C", str(repo), "diff-tree", *flags.split(), "-z", "--no-renames", "--raw", old, new],
        check=True,
        capture_output=True,
    ).stdout


def random_edit(repo: Path, rng: random.Random) -> None:
    """Add, change, delete, chmod, turn files into directories and back, symlinks among them."""
    work = repo
    files = [p for p in work.rglob("*") if ".git" not in p.parts and (p.is_file() or p.is_symlink())]
    for _ in range(rng.randint(1, 6)):
        choice = rng.random()
        names = ["a", "a.c", "a-b", "b", "z", "x.y", "a/b", "a/c", "d/e/f", "d/e.g", "d.e", "q/r/s/t"]
        if choice < 0.35 or not files:
            rel = rng.choice(names)
            target = work / rel
            if any(parent.is_file() or parent.is_symlink() for parent in target.parents if parent != work):
                continue
            if target.is_dir() and not target.is_symlink():
                subprocess.run(["rm", "-rf", str(target)], check=True)
            elif target.is_symlink() or target.exists():
                target.unlink()
            target.parent.mkdir(parents=True, exist_ok=True)
            if rng.random() < 0.15:
                target.symlink_to(rng.choice(["a.txt", "b", "../x"]))
            else:
                target.write_text(f"{rng.random()}\n")
        elif choice < 0.55:
            victim = rng.choice(files)
            victim.unlink()
        elif choice < 0.7:
            victim = rng.choice(files)
            if not victim.is_symlink():
                victim.chmod(victim.stat().st_mode ^ 0o111)
        elif choice < 0.85:
            victim = rng.choice(files)
            victim.unlink()
            victim.mkdir()
            (victim / "inner").write_text("inner\n")
        else:
            victim = rng.choice(files)
            if not victim.is_symlink():
                victim.write_text(f"{rng.random()}\n")
        files = [p for p in work.rglob("*") if ".git" not in p.parts and (p.is_file() or p.is_symlink())]


def test_the_difference_of_two_trees_is_byte_for_byte_git_diff_tree(reader, repo):
    rng = random.Random(4711)
    trees = [git(repo, "rev-parse", "HEAD^{tree}")]
    for _ in range(40):
        random_edit(repo, rng)
        commit_files(repo, {})
        trees.append(git(repo, "rev-parse", "HEAD^{tree}"))
    compared = 0
    for _ in range(120):
        old, new = rng.choice(trees), rng.choice(trees)
        expected = git_diff(repo, old, new)
        assert diff_tree_raw(reader, old.encode(), new.encode()) == expected, (old, new)
        without_trees = git_diff(repo, old, new, "-r")
        assert diff_tree_raw(reader, old.encode(), new.encode(), trees=False) == without_trees, (old, new)
        compared += bool(expected)
    assert compared > 100  # most pairs differ: the comparison covered real changes
    empty = git(repo, "hash-object", "-t", "tree", "-w", "/dev/null")
    assert diff_tree_raw(reader, empty.encode(), trees[-1].encode()) == git_diff(repo, empty, trees[-1])


def write_object(repo: Path, kind: bytes, body: bytes) -> str:
    """Store a loose object as git would (a tree deeper than a path can be is made this way)."""
    data = b"%s %d\0%s" % (kind, len(body), body)
    oid = hashlib.sha1(data).hexdigest()
    path = repo / ".git" / "objects" / oid[:2] / oid[2:]
    path.parent.mkdir(exist_ok=True)
    if not path.exists():
        path.write_bytes(zlib.compress(data))
    return oid


def test_a_deep_tree_is_compared_without_recursion(reader, repo):
    blob = write_object(repo, b"blob", b"x\n")
    inner = write_object(repo, b"tree", b"100644 f.txt\0" + bytes.fromhex(blob))
    for _ in range(1200):
        inner = write_object(repo, b"tree", b"40000 d\0" + bytes.fromhex(inner))
    old = git(repo, "rev-parse", "HEAD^{tree}")
    assert diff_tree_raw(reader, old.encode(), inner.encode()) == git_diff(repo, old, inner)
    assert diff_tree_raw(reader, inner.encode(), old.encode()) == git_diff(repo, inner, old)


def test_history_and_names_resolve_as_rev_list_and_rev_parse(reader, repo):
    for i in range(5):
        commit_files(repo, {f"f{i}": str(i)})
    git(repo, "checkout", "-q", "-b", "side", "HEAD~2")
    commit_files(repo, {"side": "s"})
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-edit", "side")
    git(repo, "tag", "-a", "-m", "t", "v1", "HEAD~1")
    head = git(repo, "rev-parse", "HEAD")
    listed = git(repo, "rev-list", "--first-parent", "--max-count=4", "--format=%T", head).split()
    expected = [(listed[i + 1], listed[i + 2]) for i in range(0, len(listed), 3)]
    assert first_parent_history(reader, head.encode(), 4) == expected
    assert len(first_parent_history(reader, head.encode(), 64)) == 7  # to the root and no further
    for name in ("HEAD", "v1^{commit}", "main~2", head[:12], "side"):
        found = reader.info(f"{name}^{{commit}}".encode() if "^" not in name else name.encode())
        assert found is not None and found.oid.decode() == git(repo, "rev-parse", f"{name}^{{commit}}")
        assert found.type == b"commit"
    assert reader.info(b"no-such-ref") is None
    assert reader.info(b"v1^{tree}").type == b"tree"
    with pytest.raises(ValueError, match="line break"):
        reader.info(b"HEAD\ninfo HEAD")


def test_a_pack_written_after_the_process_started_is_read(reader, repo, tmp_path):
    assert reader.info(b"HEAD") is not None  # the process runs
    other = tmp_path / "other"
    new = commit_files(other, {"new.txt": "fresh\n"})
    pack = subprocess.run(
        ["git", "-C", str(other), "pack-objects", "--revs", "--stdout", "-q"],
        input=f"{new}\n".encode(),
        capture_output=True,
        check=True,
    ).stdout
    git(repo, "index-pack", "--stdin", "--strict", input=pack)
    found = reader.read(new.encode(), 1 << 20)
    assert found is not None and found.type == b"commit" and b"tree " in (found.data or b"")


def test_an_object_over_the_limit_is_not_read_and_the_next_request_is_answered(reader, repo):
    blob = git(repo, "rev-parse", "HEAD:a.txt")
    commit_files(repo, {"big.bin": "x" * 100_000})
    big = git(repo, "rev-parse", "HEAD:big.bin")
    with pytest.raises(MalformedObject) as caught:
        reader.read(big.encode(), 1000)
    assert caught.value.stderr.endswith("is 100000 bytes, over 1000")
    found = reader.read(blob.encode(), 1000)
    assert found is not None and found.data == b"a\n"


def test_a_malformed_tree_is_refused(reader, repo):
    bad = subprocess.run(
        ["git", "-C", str(repo), "hash-object", "-t", "tree", "-w", "--literally", "--stdin"],
        input=b"100644 name-without-an-id\0abc",
        capture_output=True,
        check=True,
    ).stdout.strip()
    head = git(repo, "rev-parse", "HEAD^{tree}")
    with pytest.raises(MalformedObject) as caught:
        diff_tree_raw(reader, head.encode(), bad)
    assert caught.value.stderr.endswith("is malformed")
    with pytest.raises(MalformedObject) as caught:
        diff_tree_raw(reader, head.encode(), git(repo, "rev-parse", "HEAD").encode())
    assert caught.value.stderr.endswith("cannot be read")


def test_a_request_that_hangs_is_killed_at_the_time_limit_and_the_reader_recovers(repo, tmp_path):
    commit_files(repo, {"a.txt": "a\n"})
    head = git(repo, "rev-parse", "HEAD")
    reader, context = reader_of(repo, timeout_sec=1.0)
    try:
        assert reader.info(head.encode()) is not None
        # A FIFO where git looks for a loose object: its lookup blocks opening it, as a hostile
        # repository could arrange.
        fifo = repo / ".git" / "objects" / "11" / ("1" * 38)
        fifo.parent.mkdir(exist_ok=True)
        os.mkfifo(fifo)
        start = time.monotonic()
        with pytest.raises(GitFailed) as caught:
            reader.info(b"1" * 40)
        assert caught.value.stderr == "killed after 1 s"
        assert time.monotonic() - start < 20
        fifo.unlink()
        found = reader.info(head.encode())
        assert found is not None and found.type == b"commit"
    finally:
        reader.close()
        context.__exit__(None, None, None)


def test_parsed_trees_and_commits_are_kept_by_id_within_their_size_limits(repo, monkeypatch):
    """A reader given `parsed_bytes` (the store's) asks nothing for a tree or commit read once: a
    second difference of the same trees and a second walk ask the process nothing; a kept object
    is still refused over a caller's smaller limit, revisions are not kept, and the kept memory is
    bounded. A reader without (an agent's) keeps nothing."""
    commit_files(repo, {"a.txt": "a\n"})
    commit_files(repo, {"d/e.txt": "e\n", "f.txt": "f\n"})
    commit_files(repo, {"d/e.txt": "e2\n", "g.txt": "g\n"})
    reader, context = reader_of(repo, parsed_bytes=1 << 20)
    head, before = git(repo, "rev-parse", "HEAD^{tree}"), git(repo, "rev-parse", "HEAD~1^{tree}")
    asked: list[list[bytes]] = []
    exchange = ObjectReader._exchange

    def counted(self, command, names, *args):
        asked.append(list(names))
        return exchange(self, command, names, *args)

    monkeypatch.setattr(ObjectReader, "_exchange", counted)
    first = diff_tree_raw(reader, before.encode(), head.encode())
    assert first == git_diff(repo, before, head) and asked
    asked.clear()
    assert diff_tree_raw(reader, before.encode(), head.encode()) == first and asked == [], asked
    walk = first_parent_history(reader, git(repo, "rev-parse", "HEAD").encode(), 3)
    asked.clear()
    assert first_parent_history(reader, git(repo, "rev-parse", "HEAD").encode(), 3) == walk and asked == []

    # Over a smaller limit, a kept tree is refused as a read would refuse it.
    with monkeypatch.context() as patched, pytest.raises(MalformedObject) as refused:
        patched.setattr(object_reader, "MAX_TREE_BYTES", 10)
        diff_tree_raw(reader, before.encode(), head.encode())
    assert refused.value.stderr.endswith("over 10")
    with pytest.raises(MalformedObject) as refused:
        first_parent_history(reader, git(repo, "rev-parse", "HEAD").encode(), 3, max_commit_bytes=10)
    assert refused.value.stderr.endswith("over 10")

    # A revision is asked every time (what it names may move); only ids are kept.
    asked.clear()
    diff_tree_raw(reader, b"HEAD~1^{tree}", b"HEAD^{tree}")
    diff_tree_raw(reader, b"HEAD~1^{tree}", b"HEAD^{tree}")
    assert [names for names in asked if b"HEAD^{tree}" in names] == [[b"HEAD~1^{tree}", b"HEAD^{tree}"]] * 2

    reader.close()
    context.__exit__(None, None, None)

    # The memory kept is bounded: the least recently recalled go first.
    small, context = reader_of(repo, parsed_bytes=1500)
    try:
        diff_tree_raw(small, before.encode(), head.encode())
        assert 0 < small._parsed_size <= 1500 and len(small._parsed) < 4
    finally:
        small.close()
        context.__exit__(None, None, None)
    agents, context = reader_of(repo)
    try:
        diff_tree_raw(agents, before.encode(), head.encode())
        assert agents._parsed_size == 0 and not agents._parsed
    finally:
        agents.close()
        context.__exit__(None, None, None)
