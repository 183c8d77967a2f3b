"""One long-lived `git cat-file --batch-command` per repository: objects read without a process each.

An import of a new commit started ten git processes (resolve, walk, diff and measure in the agent's
repository; read, diff and measure again in the store), each a few milliseconds of CPU to start:
most of the sidecar's CPU per evaluation of a new commit (docs/benchmarks.md). An `ObjectReader`
keeps one `cat-file --batch-command` (git >= 2.36) per repository and asks it, one line per object,
what those processes printed; the difference of two trees is computed here from the tree objects
(`diff_tree_raw`), byte for byte what `git diff-tree -r -t -z --no-renames --raw` prints, so the
callers' parsers and checks stay git's.

The process starts with exactly its runner's environment and `-c` options (`IsolatedGit`, which also
passes `--no-replace-objects`), so a hostile repository reaches it only through its objects and
config as it reached the processes it replaces. Every request is bounded: a request that does not
answer within the runner's `timeout_sec` has its process group killed (`vero.core.watchdog`) and
raises `GitFailed`; an object larger than the caller's `max_bytes` is not read (the process is
ended, its unread output with it); the next request starts a fresh process. A pack added by
another process (`index-pack` into the store) is seen by the running process: git rescans the pack
directory when an object is not found in the packs it knows.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from vero.core.isolated_git import IsolatedGit, _kill_group
from vero.core.watchdog import WATCHDOG
from vero.errors import GitFailed

__all__ = [
    "GitObject",
    "MalformedObject",
    "ObjectReader",
    "diff_tree_raw",
    "first_parent_history",
    "object_sizes",
]

_TYPES = frozenset({b"blob", b"tree", b"commit", b"tag"})
_HEX = frozenset(b"0123456789abcdef")
_ZERO_OID = b"0" * 40
_ZERO_MODE = b"000000"
_S_IFMT = 0o170000
_TREE_MODE = 0o040000


class MalformedObject(GitFailed):
    """An object the reader was asked to parse (a tree or a commit) is not well formed."""

    def __init__(self, message: str) -> None:
        super().__init__("cat-file", None, message)


@dataclass(frozen=True)
class GitObject:
    """One object as `cat-file` describes it."""

    oid: bytes
    """Its id, 40 lowercase hex digits (ASCII)."""
    type: bytes
    """`blob`, `tree`, `commit` or `tag`."""
    size: int
    """Its size, bytes."""
    data: bytes | None = None
    """Its content (`ObjectReader.read`), None from `ObjectReader.info`."""


class ObjectReader:
    """A repository's objects by name through one kept `git cat-file --batch-command`.

    Thread-safe: requests are answered one at a time (each takes microseconds; a tree difference
    is many requests, each holding the process alone). `close` ends the process; a reader may be
    used again after it (a fresh process starts).

    Args:
        git: the runner whose repository, environment and time limit (`timeout_sec`, per request)
            the process gets.
    """

    def __init__(self, git: IsolatedGit) -> None:
        self._git = git
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def info(self, name: bytes) -> GitObject | None:
        """The object `name` (an id, or any revision git resolves, e.g. `v1^{commit}`) names, or
        None if it names none (missing or ambiguous).

        Raises:
            ValueError: `name` is empty or holds a line break or NUL.
            GitFailed: the process failed, or did not answer within the time limit.
        """
        with self._lock:
            return self._ask(b"info", name)

    def read(self, name: bytes, max_bytes: int) -> GitObject | None:
        """The object `name` names with its content, or None if it names none.

        Args:
            max_bytes: the largest content read; a larger object raises `MalformedObject`
                (nothing of it is read: the process ends and the next request starts another).

        Raises:
            ValueError: as `info`.
            MalformedObject: the object is larger than `max_bytes`.
            GitFailed: as `info`.
        """
        with self._lock:
            header = self._ask(b"contents", name)
            if header is None:
                return None
            if header.size > max_bytes:
                self._stop()
                raise MalformedObject(f"object {header.oid.decode()} is {header.size} bytes, over {max_bytes}")
            data = self._timed(lambda out: _read_exactly(out, header.size + 1))
            if data[-1:] != b"\n":
                self._stop()
                raise GitFailed("cat-file", None, "cat-file's answer was cut short")
            return GitObject(header.oid, header.type, header.size, data[:-1])

    @property
    def pid(self) -> int | None:
        """The running process's id, or None (not started, or ended)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def close(self) -> None:
        """End the process (if any); idempotent."""
        with self._lock:
            self._stop()

    # -- the process -------------------------------------------------------------------------

    def _ask(self, command: bytes, name: bytes) -> GitObject | None:
        if not name or any(c in name for c in (b"\n", b"\0", b"\r")):
            raise ValueError(f"object name {name!r} is empty or holds a line break")
        proc = self._running()
        assert proc.stdin is not None
        try:
            proc.stdin.write(command + b" " + name + b"\n")
            proc.stdin.flush()
        except OSError as exc:
            self._stop()
            raise GitFailed("cat-file", None, f"cat-file is gone: {exc}") from None
        line = self._timed(lambda out: out.readline())
        if not line.endswith(b"\n"):
            self._stop()
            raise GitFailed("cat-file", None, "cat-file ended without answering")
        fields = line[:-1].split(b" ")
        if fields[-1] in (b"missing", b"ambiguous") and len(fields) == 2:
            return None
        if (
            len(fields) != 3
            or len(fields[0]) not in (40, 64)
            or not set(fields[0]) <= _HEX
            or fields[1] not in _TYPES
            or not fields[2].isdigit()
        ):
            self._stop()
            raise GitFailed("cat-file", None, f"unexpected answer from cat-file: {line[:200]!r}")
        return GitObject(fields[0], fields[1], int(fields[2]))

    def _running(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._stop()
            self._proc = self._git.popen(
                ["cat-file", "--batch-command"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        return self._proc

    def _timed(self, read: Callable[[IO[bytes]], bytes]) -> bytes:
        """`read(stdout)` with the runner's time limit: past it the process group is killed, so the
        read returns what came before (cut short, which the callers refuse)."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        timeout = self._git.timeout_sec
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            _kill_group(proc)

        armed = WATCHDOG.arm(timeout, kill) if timeout is not None else None
        try:
            result = read(proc.stdout)
        finally:
            if armed is not None:
                WATCHDOG.disarm(armed)
        if killed.is_set():
            self._stop()
            raise GitFailed("cat-file", None, f"killed after {timeout:g} s")
        return result

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        _kill_group(proc)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        proc.wait()


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    chunks = []
    left = size
    while left > 0:
        chunk = stream.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# -- trees and commits ---------------------------------------------------------------------------


def _canon_mode(mode: int) -> int:
    """Git's `canon_mode` (git `cache.h`): what `ls-tree` and `diff-tree` print for a stored mode."""
    kind = mode & _S_IFMT
    if kind == 0o100000:
        return 0o100755 if mode & 0o100 else 0o100644
    if kind in (0o120000, _TREE_MODE):
        return kind
    return 0o160000


def _tree_entries(reader: ObjectReader, tree: bytes, max_bytes: int) -> list[tuple[bytes, int, bytes]]:
    """(name, canonical mode, id as hex) of each entry of the tree object `tree`, in stored order.

    Raises:
        MalformedObject: `tree` is missing, not a tree, larger than `max_bytes` or malformed.
    """
    obj = reader.read(tree, max_bytes)
    if obj is None or obj.type != b"tree" or obj.data is None:
        raise MalformedObject(f"tree {tree.decode(errors='replace')} cannot be read")
    data = obj.data
    entries = []
    pos = 0
    try:
        while pos < len(data):
            space = data.index(b" ", pos)
            nul = data.index(b"\0", space)
            if nul + 21 > len(data):
                raise ValueError
            mode = int(data[pos:space], 8)
            entries.append((data[space + 1 : nul], _canon_mode(mode), data[nul + 1 : nul + 21].hex().encode()))
            pos = nul + 21
    except ValueError:
        raise MalformedObject(f"tree {tree.decode(errors='replace')} is malformed") from None
    return entries


def diff_tree_raw(
    reader: ObjectReader, old: bytes, new: bytes, *, trees: bool = True, max_tree_bytes: int = 1 << 24
) -> bytes:
    """What `git diff-tree -r -t -z --no-renames --raw <old> <new>` prints, computed from the two
    trees' objects: `:<old mode> <new mode> <old id> <new id> <A|D|M|T>\\0<path>\\0` per changed
    entry, a changed, added or deleted tree's own entry before its contents, in git's tree order (a
    tree's name sorts as if it ended in `/`, so a file that became a tree is a deletion and an
    addition, as git shows it).

    Reads only the subtrees whose ids differ, iteratively (a deep tree does not recurse here).

    Args:
        old, new: tree ids (40 hex, ASCII).
        trees: False leaves the trees' own entries out, as `diff-tree -r` without `-t` does.
        max_tree_bytes: the largest tree object read.

    Raises:
        MalformedObject: a tree is missing, not a tree, too large or malformed.
        GitFailed: the reader failed.
    """
    out: list[bytes] = []
    # Last in, first out: a line to print, or a pair of trees (either None) to compare under a
    # path prefix, whose lines replace it in place (pre-order, as git prints them).
    work: list[bytes | tuple[bytes, bytes | None, bytes | None]] = [(b"", old, new)]
    while work:
        item = work.pop()
        if isinstance(item, bytes):
            out.append(item)
            continue
        prefix, a, b = item
        left = {} if a is None else _keyed(_tree_entries(reader, a, max_tree_bytes))
        right = {} if b is None else _keyed(_tree_entries(reader, b, max_tree_bytes))
        expanded: list[bytes | tuple[bytes, bytes | None, bytes | None]] = []
        for key in sorted(left.keys() | right.keys()):
            before, after = left.get(key), right.get(key)
            if before == after:
                continue
            path = prefix + (key[:-1] if key.endswith(b"/") else key)
            old_mode, old_oid = before if before is not None else (0, _ZERO_OID)
            new_mode, new_oid = after if after is not None else (0, _ZERO_OID)
            if before is None:
                status = b"A"
            elif after is None:
                status = b"D"
            elif (old_mode & _S_IFMT) != (new_mode & _S_IFMT):
                status = b"T"
            else:
                status = b"M"
            if trees or not key.endswith(b"/"):
                line = b":%s %s %s %s %s\0%s\0" % (_mode(old_mode), _mode(new_mode), old_oid, new_oid, status, path)
                expanded.append(line)
            if key.endswith(b"/"):
                expanded.append((path + b"/", old_oid if before else None, new_oid if after else None))
        work.extend(reversed(expanded))
    return b"".join(out)


def _keyed(entries: list[tuple[bytes, int, bytes]]) -> dict[bytes, tuple[int, bytes]]:
    """Entries by git's sort key (a tree's name + `/`), so a file and a tree of one name are two."""
    keyed: dict[bytes, tuple[int, bytes]] = {}
    for name, mode, oid in entries:
        keyed[name + b"/" if mode == _TREE_MODE else name] = (mode, oid)
    return keyed


def _mode(mode: int) -> bytes:
    return _ZERO_MODE if mode == 0 else b"%06o" % mode


def first_parent_history(reader: ObjectReader, commit: bytes, limit: int) -> list[tuple[str, str]]:
    """(commit, tree) of `commit` and its first-parent ancestors, newest first, at most `limit`, as
    `git rev-list --first-parent --max-count=<limit> --format=%T` lists them; the walk stops early
    at a parent the repository does not hold (a shallow or broken history).

    Raises:
        MalformedObject: `commit` is not a readable commit.
        GitFailed: the reader failed.
    """
    history: list[tuple[str, str]] = []
    current: bytes | None = commit
    while current is not None and len(history) < limit:
        obj = reader.read(current, 1 << 20)
        if obj is None or obj.type != b"commit" or obj.data is None:
            if not history:
                raise MalformedObject(f"commit {current.decode(errors='replace')} cannot be read")
            break
        tree, parent = _commit_links(obj.data)
        if tree is None:
            raise MalformedObject(f"commit {current.decode(errors='replace')} names no tree")
        history.append((obj.oid.decode(), tree.decode()))
        current = parent
    return history


def _commit_links(data: bytes) -> tuple[bytes | None, bytes | None]:
    """(tree, first parent) from a commit object's header lines."""
    tree = parent = None
    for line in data.split(b"\n"):
        if not line:
            break
        key, _, value = line.partition(b" ")
        if key == b"tree" and tree is None and len(value) == 40 and set(value) <= _HEX:
            tree = value
        elif key == b"parent" and parent is None and len(value) == 40 and set(value) <= _HEX:
            parent = value
    return tree, parent


def object_sizes(reader: ObjectReader, oids: list[bytes]) -> dict[bytes, int]:
    """Object id -> size of each of `oids` the repository holds (what `cat-file --batch-check`
    printed; `vero.core.candidate_limits.measure_tree`'s `sizes`).

    Raises:
        GitFailed: the reader failed.
    """
    sizes: dict[bytes, int] = {}
    for oid in oids:
        found = reader.info(oid)
        if found is not None and found.oid == oid:
            sizes[oid] = found.size
    return sizes
