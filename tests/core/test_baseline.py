"""The deterministic baseline commit: real git, real files, hostile environments."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from vero.core.baseline import BASELINE_GIT_ENV, BASELINE_MESSAGE, commit_baseline

pytestmark = pytest.mark.timeout(60)


def _git(repo: Path, *args: str) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(repo), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run(
        ["git", "-c", f"safe.directory={repo}", "-C", str(repo), *args],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _populate(root: Path, *, umask: int = 0o022, mtime: int | None = None) -> None:
    """The same logical file set, written with a given umask and mtime."""
    old = os.umask(umask)
    try:
        root.mkdir(parents=True)
        (root / "README.md").write_text("matrix multiply\n")
        (root / "src").mkdir()
        (root / "src" / "mm.c").write_bytes(b"int main(void) {\r\n  return 0;\r\n}\r\n")  # CRLF kept
        (root / "run.sh").write_text("#!/bin/sh\necho run\n")
        (root / "run.sh").chmod((root / "run.sh").stat().st_mode | stat.S_IXUSR)
        (root / ".gitignore").write_text("*.o\nbuild/\n")
        (root / "mm.o").write_bytes(b"\x7fELF\x00ignored but tracked")
        (root / "build").mkdir()
        (root / "build" / "out.txt").write_text("ignored dir\n")
        (root / "src" / "link.c").symlink_to("mm.c")
    finally:
        os.umask(old)
    if mtime is not None:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in (*dirnames, *filenames):
                os.utime(os.path.join(dirpath, name), (mtime, mtime), follow_symlinks=False)


def _expected_commit_id(root: Path) -> str:
    """The commit id computed without git, from git's object format alone (blob, tree, commit)."""

    def obj(kind: bytes, body: bytes) -> bytes:
        return hashlib.sha1(kind + b" " + str(len(body)).encode() + b"\0" + body).digest()

    def tree(directory: Path) -> bytes:
        entries = []
        for entry in os.scandir(directory):
            if entry.name == ".git":
                continue
            if entry.is_symlink():
                entries.append((entry.name.encode(), b"120000", obj(b"blob", os.readlink(entry.path).encode())))
            elif entry.is_dir():
                entries.append((entry.name.encode() + b"/", b"40000", tree(Path(entry.path))))
            else:
                mode = b"100755" if os.stat(entry.path).st_mode & stat.S_IXUSR else b"100644"
                entries.append((entry.name.encode(), mode, obj(b"blob", Path(entry.path).read_bytes())))
        # Git sorts tree entries by name, with directories compared as if they ended in "/".
        entries.sort(key=lambda e: e[0])
        body = b"".join(mode + b" " + name.rstrip(b"/") + b"\0" + sha for name, mode, sha in entries)
        return obj(b"tree", body)

    ident = f"{BASELINE_GIT_ENV['GIT_AUTHOR_NAME']} <{BASELINE_GIT_ENV['GIT_AUTHOR_EMAIL']}> 0 +0000"
    body = (f"tree {tree(root).hex()}\nauthor {ident}\ncommitter {ident}\n\n{BASELINE_MESSAGE}\n").encode()
    return obj(b"commit", body).hex()


def test_same_files_give_same_commit_regardless_of_mtime_umask_and_owner(tmp_path):
    first, second = tmp_path / "one", tmp_path / "elsewhere" / "two"
    _populate(first, umask=0o022, mtime=1_000_000)
    _populate(second, umask=0o077, mtime=2_000_000_000)
    subprocess.run(["chown", "-R", "1001:1001", str(second)], check=True)  # the agent's uid

    id_one = commit_baseline(first)
    id_two = commit_baseline(second)

    assert id_one == id_two
    assert len(id_one) == 40 and int(id_one, 16) >= 0
    # Not just self-consistent: it is the id git's object format defines for these files, so any
    # git version (or none) gives it.
    assert id_one == _expected_commit_id(first)


def test_commit_shape_branch_and_clean_tree(tmp_path):
    root = tmp_path / "w"
    _populate(root)
    commit = commit_baseline(root)

    raw = _git(root, "cat-file", "commit", commit)
    assert "\nparent " not in raw
    assert "author vero <vero@localhost> 0 +0000\n" in raw
    assert "committer vero <vero@localhost> 0 +0000\n" in raw
    assert raw.endswith("\n\nbaseline\n")
    assert _git(root, "symbolic-ref", "HEAD").strip() == "refs/heads/main"
    assert _git(root, "rev-parse", "HEAD").strip() == commit
    assert _git(root, "status", "--porcelain", "--ignored") == ""
    assert _git(root, "for-each-ref", "--format=%(refname)").split() == ["refs/heads/main"]
    hooks = root / ".git" / "hooks"
    assert not hooks.exists() or not any(hooks.iterdir())  # no template hooks copied in


def test_ignored_files_modes_symlinks_and_crlf_are_recorded(tmp_path):
    root = tmp_path / "w"
    _populate(root)
    commit = commit_baseline(root)

    entries = {}
    for line in _git(root, "ls-tree", "-r", commit).splitlines():
        meta, path = line.split("\t")
        mode, _, oid = meta.split()
        entries[path] = (mode, oid)
    assert set(entries) == {".gitignore", "README.md", "build/out.txt", "mm.o", "run.sh", "src/link.c", "src/mm.c"}
    assert entries["run.sh"][0] == "100755"
    assert entries["README.md"][0] == "100644"
    assert entries["src/link.c"][0] == "120000"
    assert _git(root, "cat-file", "blob", entries["src/link.c"][1]) == "mm.c"
    blob = subprocess.run(
        ["git", "-C", str(root), "cat-file", "blob", entries["src/mm.c"][1]], capture_output=True, check=True
    ).stdout
    assert blob == b"int main(void) {\r\n  return 0;\r\n}\r\n"


def test_executable_bit_changes_the_commit(tmp_path):
    plain, executable = tmp_path / "plain", tmp_path / "exec"
    _populate(plain)
    _populate(executable)
    (executable / "README.md").chmod(0o755)
    assert commit_baseline(plain) != commit_baseline(executable)


def test_content_changes_the_commit(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _populate(a)
    _populate(b)
    (b / "src" / "mm.c").write_bytes(b"int main(void) { return 1; }\n")
    assert commit_baseline(a) != commit_baseline(b)


def test_caller_environment_and_user_config_do_not_leak(tmp_path, monkeypatch):
    reference, hostile = tmp_path / "ref", tmp_path / "hostile"
    _populate(reference)
    _populate(hostile)
    expected = commit_baseline(reference)

    home = tmp_path / "home"
    home.mkdir()
    marker = tmp_path / "hook-ran"
    hook_dir = tmp_path / "hooks"
    hook_dir.mkdir()
    for hook in ("pre-commit", "post-commit", "reference-transaction", "post-index-change"):
        (hook_dir / hook).write_text(f"#!/bin/sh\ntouch {marker}\n")
        (hook_dir / hook).chmod(0o755)
    (home / ".gitconfig").write_text(
        f"[core]\n\tautocrlf = true\n\thooksPath = {hook_dir}\n\tfileMode = false\n"
        "[user]\n\tname = Someone Else\n\temail = else@example.com\n[commit]\n\tgpgSign = true\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_AUTHOR_NAME", "intruder")
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2020-01-01T00:00:00+0000")
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.autocrlf'='true' 'core.hookspath'='{hook_dir}'")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere.git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "other-index"))
    monkeypatch.setenv("GIT_DEFAULT_HASH", "sha256")

    assert commit_baseline(hostile) == expected
    assert not marker.exists()
    assert not (tmp_path / "elsewhere.git").exists()


@pytest.mark.parametrize("make", ["git_dir", "reserved", "nested_git", "not_dir"])
def test_refuses_unsuitable_work_trees(tmp_path, make):
    root = tmp_path / "w"
    _populate(root)
    if make == "git_dir":
        (root / ".git").mkdir()
        match = "already has .git"
    elif make == "reserved":
        (root / ".vero").mkdir()
        (root / ".vero" / "x").write_text("x")
        match = "reserved path .vero"
    elif make == "nested_git":
        (root / "vendor" / "lib" / ".git").mkdir(parents=True)
        match = "nested Git data: vendor/lib/.git"
    else:
        root = root / "README.md"
        match = "not a directory"
    with pytest.raises(ValueError, match=match):
        commit_baseline(root)
    if make != "git_dir" and make != "not_dir":
        assert not (root / ".git").exists()
