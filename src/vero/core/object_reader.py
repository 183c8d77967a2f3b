"""One long-lived `git cat-file --batch-command` per repository: objects read without a process each.

An import of a new commit started ten git processes (resolve, walk, diff and measure in the agent's
repository; read, diff and measure again in the store), each a few milliseconds of CPU to start:
most of the sidecar's CPU per evaluation of a new commit (docs/benchmarks.md). An `ObjectReader`
keeps one `cat-file --batch-command` (git >= 2.36) per repository and asks it, one line per object,
what those processes printed; the difference of two trees is computed here from the tree objects
(`diff_tree_raw`), byte for byte what `git diff-tree -r -t -z --no-renames --raw` prints, so the
callers' parsers and checks stay git's. A reader given `parsed_bytes` keeps the trees and
commits it parsed by id: a new commit's root tree, read by the import's check, is not read again by
each slot moving to it. Only a repository whose every object arrived checked may have one (the
candidate store's: `index-pack --strict`): `cat-file` does not check that a loose object holds what
its id names, so in an agent's repository an id may name one content now and another later.

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

import contextlib
import re
import subprocess
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, cast

from vero.core.isolated_git import IsolatedGit, _kill_group
from vero.core.watchdog import WATCHDOG
from vero.errors import GitFailed

__all__ = [
    "MAX_DIFF_BYTES",
    "MAX_DIFF_ENTRIES",
    "MAX_TREE_BYTES",
    "PARSED_BYTES",
    "GitObject",
    "MalformedObject",
    "ObjectReader",
    "TooManyChanges",
    "commit_links",
    "diff_tree_raw",
    "first_parent_history",
    "object_sizes",
]

_TYPES = frozenset({b"blob", b"tree", b"commit", b"tag"})
_HEX = frozenset(b"0123456789abcdef")
_ZERO_OID = b"0" * 40
_CHUNK_BYTES = 32 * 1024
"""Requests written at once (bytes): half a pipe's buffer (64 KiB on Linux)."""
MAX_TREE_BYTES = 1 << 24
"""The largest tree object `diff_tree_raw` reads (bytes): 16 MiB, some 300,000 entries."""
PARSED_BYTES = 16 << 20
"""The memory a reader of the candidate store keeps parsed trees and commits in (bytes, as
`ObjectReader.remember` estimates it: a tree entry costs several times its bytes in the object)."""
_ENTRY_COST = 320
"""Bytes of memory per parsed tree entry (a dict slot, its name and id as `bytes`, a tuple, an int:
about 300 on CPython 3.12 for short names), and per parsed object besides its bytes."""
_OID = re.compile(rb"[0-9a-f]{40}")
MAX_DIFF_BYTES = 1 << 27
"""The largest tree difference `diff_tree_raw` computes (bytes): 128 MiB, some 800,000 changed
entries of 60-byte paths (a candidate has at most `CandidateLimits.max_files`, 20,000 by default)."""
MAX_DIFF_ENTRIES = 1 << 20
"""The most entries of the trees `diff_tree_raw` reads for one difference: a tree object is a few
bytes an entry, its entries here some hundreds (a million of them, in a chain of a million trees
that packs into some 30 MB, is half a GB)."""
_ZERO_MODE = b"000000"
_S_IFMT = 0o170000
_TREE_MODE = 0o040000


class MalformedObject(GitFailed):
    """An object the reader was asked to parse (a tree or a commit) is not well formed."""

    def __init__(self, message: str) -> None:
        super().__init__("cat-file", None, message)


class TooManyChanges(MalformedObject):
    """A tree difference has more entries than the caller's `max_entries` (`diff_tree_raw`)."""


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
        parsed_bytes: the memory (bytes) of parsed trees and commits kept (`recall`); 0 keeps
            none. Only for a repository whose objects all arrived checked (see the module docstring).
    """

    def __init__(self, git: IsolatedGit, parsed_bytes: int = 0) -> None:
        self._git = git
        self._lock = threading.Lock()
        self._parsed: OrderedDict[tuple[bytes, bytes], tuple[int, int, object]] = OrderedDict()
        self._parsed_size = 0
        self._parsed_limit = parsed_bytes
        self._parsed_lock = threading.Lock()
        self._slot: list[subprocess.Popen[bytes] | None] = [None]
        # A reader dropped without `close` (one a store evicted while a thread still used it, and
        # started again there) ends its process when it goes, not when the last reference to the
        # process does (the watchdog keeps one for its time limit).
        weakref.finalize(self, _end, self._slot)

    @property
    def _proc(self) -> subprocess.Popen[bytes] | None:
        return self._slot[0]

    @_proc.setter
    def _proc(self, proc: subprocess.Popen[bytes] | None) -> None:
        self._slot[0] = proc

    def info(self, name: bytes) -> GitObject | None:
        """The object `name` (an id, or any revision git resolves, e.g. `v1^{commit}`) names, or
        None if it names none (missing or ambiguous).

        Raises:
            ValueError: `name` is empty or holds a line break or NUL.
            GitFailed: the process failed, or did not answer within the time limit.
        """
        return self.info_many([name])[0]

    def info_many(self, names: Sequence[bytes]) -> list[GitObject | None]:
        """`info` of each of `names`, in order, asked together (one write per `_CHUNK_BYTES` of
        requests, not a round trip each).

        Raises:
            ValueError: as `info`.
            GitFailed: as `info`.
        """
        return self._exchange(b"info", names, None)

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
        return self.read_many([name], max_bytes)[0]

    def read_many(
        self, names: Sequence[bytes], max_bytes: int, *, deadline: float | None = None
    ) -> list[GitObject | None]:
        """`read` of each of `names`, in order, asked together as `info_many`.

        Args:
            deadline: a `time.monotonic()` by which the exchange ends (its time limit is the
                runner's or what is left until then, the shorter), for a caller whose one operation
                is many exchanges, bounded together as the one git process it replaces.

        Raises:
            ValueError, MalformedObject, GitFailed: as `read` (for the first that fails).
        """
        return self._exchange(b"contents", names, max_bytes, deadline)

    def recall(self, kind: bytes, oid: bytes, max_bytes: int) -> object | None:
        """What `remember` kept of the `kind` object `oid`, or None (not kept: read it).

        Raises:
            MalformedObject: the object is larger than `max_bytes` (as `read` raises for it).
        """
        with self._parsed_lock:
            found = self._parsed.get((kind, oid))
            if found is None:
                return None
            self._parsed.move_to_end((kind, oid))
        size, _, value = found
        if size > max_bytes:
            raise MalformedObject(f"object {oid.decode()} is {size} bytes, over {max_bytes}")
        return value

    def remember(self, kind: bytes, oid: bytes, size: int, entries: int, value: object) -> None:
        """Keep `value`, the parsed form of the `kind` object `oid` of `size` bytes and `entries`
        entries, for `recall` (the least recently recalled dropped beyond the reader's
        `parsed_bytes` of estimated memory). An id that is not 40 lowercase hex digits (a
        revision) is not kept. `value` is shared: never change it."""
        cost = size + _ENTRY_COST * (entries + 1)
        if _OID.fullmatch(oid) is None or cost > self._parsed_limit:
            return
        with self._parsed_lock:
            if (kind, oid) in self._parsed:
                return
            self._parsed[(kind, oid)] = (size, cost, value)
            self._parsed_size += cost
            while self._parsed_size > self._parsed_limit:
                _, (_, dropped, _) = self._parsed.popitem(last=False)
                self._parsed_size -= dropped

    @property
    def timeout_sec(self) -> float | None:
        """The time limit of one exchange (the runner's), seconds; None: none."""
        return self._git.timeout_sec

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

    def _exchange(
        self, command: bytes, names: Sequence[bytes], max_bytes: int | None, deadline: float | None = None
    ) -> list[GitObject | None]:
        """Ask `command <name>` for every name and read the answers (with contents when
        `max_bytes` is given), under one time limit for the whole exchange."""
        _check_names(names)
        if not names:
            return []
        limit = self._limit(deadline)
        # Waiting for another thread's exchange counts against the time limit too: requests that
        # each take nearly the limit (a name git resolves slowly, posted many times at once) would
        # otherwise queue for a limit each.
        if not self._lock.acquire(timeout=-1 if limit is None else max(limit, 0)):
            raise GitFailed("cat-file", None, f"busy for {limit:g} s")
        with _held(self._lock):
            proc = self._running()
            timeout = self._limit(deadline)
            if timeout is not None and timeout <= 0:
                raise GitFailed("cat-file", None, "out of time")
            killed = threading.Event()

            def kill() -> None:
                killed.set()
                _kill_group(proc)

            armed = WATCHDOG.arm(timeout, kill) if timeout is not None else None
            try:
                return self._answers(proc, command, names, max_bytes)
            except _CutShort as exc:
                self._stop()
                reason = f"killed after {timeout:g} s" if killed.is_set() else str(exc)
                raise GitFailed("cat-file", None, reason) from None
            except BaseException:
                self._stop()  # an answer may be unread (an object's content): the stream cannot go on
                raise
            finally:
                if armed is not None:
                    WATCHDOG.disarm(armed)
                if killed.is_set():
                    # The limit struck after the last answer was read, before it was disarmed:
                    # the answers stand, the process is gone (the next request starts another).
                    self._stop()

    def _limit(self, deadline: float | None) -> float | None:
        """The time limit of an exchange from now: the runner's, or what is left until
        `deadline`, the shorter (None: none)."""
        limit = self._git.timeout_sec
        if deadline is not None:
            left = deadline - time.monotonic()
            limit = left if limit is None else min(limit, left)
        return limit

    def _answers(
        self, proc: subprocess.Popen[bytes], command: bytes, names: Sequence[bytes], max_bytes: int | None
    ) -> list[GitObject | None]:
        # The requests of a chunk fit the pipe whole (it is empty: every earlier answer was read),
        # so writing them never waits on cat-file, which may be blocked writing its answers.
        assert proc.stdin is not None and proc.stdout is not None
        out = proc.stdout
        answers: list[GitObject | None] = []
        start = 0
        while start < len(names):
            end, size = start, 0
            while end < len(names) and (end == start or size + len(names[end]) + 16 <= _CHUNK_BYTES):
                size += len(names[end]) + 16
                end += 1
            try:
                proc.stdin.write(b"".join(command + b" " + name + b"\n" for name in names[start:end]))
                proc.stdin.flush()
            except OSError as exc:
                raise _CutShort(f"cat-file is gone: {exc}") from None
            for _ in range(start, end):
                header = _header(out.readline())
                if header is None or max_bytes is None:
                    answers.append(header)
                    continue
                if header.size > max_bytes:
                    raise MalformedObject(f"object {header.oid.decode()} is {header.size} bytes, over {max_bytes}")
                data = _read_exactly(out, header.size + 1)
                if data[-1:] != b"\n" or len(data) != header.size + 1:
                    raise _CutShort("cat-file's answer was cut short")
                answers.append(GitObject(header.oid, header.type, header.size, data[:-1]))
            start = end
        return answers

    def _running(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._stop()
            self._proc = self._git.popen(
                # A small cache of delta bases: the process lives as long as the sidecar, and its
                # objects are mostly small (commits, trees, changed files).
                ["-c", "core.deltaBaseCacheLimit=16m", "cat-file", "--batch-command"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        return self._proc

    def _stop(self) -> None:
        _end(self._slot)


def _end(slot: list[subprocess.Popen[bytes] | None]) -> None:
    """End the process in `slot` (if any): killed with its group, pipes closed, reaped."""
    proc, slot[0] = slot[0], None
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


def _check_names(names: Sequence[bytes]) -> None:
    for name in names:
        if not name or b"\n" in name or b"\0" in name or b"\r" in name:
            raise ValueError(f"object name {name!r} is empty or holds a line break")


@contextlib.contextmanager
def _held(lock: threading.Lock) -> Iterator[None]:
    """Release `lock` (acquired by the caller) on leaving."""
    try:
        yield
    finally:
        lock.release()


class _CutShort(Exception):
    """The process's answer ended early or was not one (it died, or was killed on time)."""


def _header(line: bytes) -> GitObject | None:
    """A `cat-file` answer line: the object it describes, or None (`<name> missing|ambiguous`).

    Raises:
        _CutShort: an empty, cut or unexpected line.
    """
    if not line.endswith(b"\n"):
        raise _CutShort("cat-file ended without answering")
    fields = line[:-1].split(b" ")
    if len(fields) == 2 and fields[1] in (b"missing", b"ambiguous"):
        return None
    if (
        len(fields) != 3
        or len(fields[0]) not in (40, 64)
        or not set(fields[0]) <= _HEX
        or fields[1] not in _TYPES
        or not fields[2].isdigit()
    ):
        raise _CutShort(f"unexpected answer from cat-file: {line[:200]!r}")
    return GitObject(fields[0], fields[1], int(fields[2]))


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


def _parse_tree(tree: bytes, obj: GitObject | None) -> dict[bytes, tuple[int, bytes]]:
    """A tree object's entries by git's sort key (`_keyed`): (canonical mode, id as hex).

    Raises:
        MalformedObject: `obj` is missing, not a tree or malformed.
    """
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
    return _keyed(entries)


def _load_trees(
    reader: ObjectReader, old: bytes, new: bytes, max_entries: int | None
) -> dict[bytes, dict[bytes, tuple[int, bytes]]]:
    """Every tree object `diff_tree_raw` compares, read a level at a time (one exchange per level),
    all of them within the reader's time limit and `MAX_DIFF_ENTRIES` entries (`max_entries`
    when given: the compared trees' own entries, which are at most the two trees' paths)."""
    timeout = reader.timeout_sec
    deadline = None if timeout is None else time.monotonic() + timeout
    loaded: dict[bytes, dict[bytes, tuple[int, bytes]]] = {}
    entries = 0
    level: list[tuple[bytes | None, bytes | None]] = [(old, new)]
    while level:
        wanted = list(dict.fromkeys(oid for pair in level for oid in pair if oid is not None and oid not in loaded))
        unread = []
        for oid in wanted:
            kept = reader.recall(b"tree", oid, MAX_TREE_BYTES)
            if kept is None:
                unread.append(oid)
            else:
                loaded[oid] = cast(dict[bytes, tuple[int, bytes]], kept)  # as remembered below
                entries = _counted(entries, len(loaded[oid]), (old, new), max_entries)
        read = reader.read_many(unread, MAX_TREE_BYTES, deadline=deadline) if unread else []
        for oid, obj in zip(unread, read, strict=True):
            # Counted as each is parsed: a level of many wide trees stops at the bound.
            loaded[oid] = _parse_tree(oid, obj)
            entries = _counted(entries, len(loaded[oid]), (old, new), max_entries)
            assert obj is not None  # `_parse_tree` raised otherwise
            reader.remember(b"tree", oid, obj.size, len(loaded[oid]), loaded[oid])
        # Each pair of trees once: a few tree objects can hold one subtree at millions of paths.
        below: dict[tuple[bytes | None, bytes | None], None] = {}
        for a, b in level:
            left = {} if a is None else loaded[a]
            right = {} if b is None else loaded[b]
            for key in left.keys() | right.keys():
                if key.endswith(b"/") and left.get(key) != right.get(key):
                    before, after = left.get(key), right.get(key)
                    below[(before[1] if before else None, after[1] if after else None)] = None
        level = list(below)
    return loaded


def _counted(entries: int, more: int, trees: tuple[bytes, bytes], max_entries: int | None) -> int:
    """`entries + more` entries read for the difference of the two `trees`.

    Raises:
        TooManyChanges: over `max_entries`.
        MalformedObject: over `MAX_DIFF_ENTRIES`.
    """
    entries += more
    if max_entries is not None and entries > max_entries:
        raise TooManyChanges(f"the trees of a difference hold over {max_entries} entries")
    old, new = trees
    if entries > MAX_DIFF_ENTRIES:
        raise MalformedObject(
            f"the trees of a difference of {old.decode(errors='replace')} and "
            f"{new.decode(errors='replace')} hold over {MAX_DIFF_ENTRIES} entries"
        )
    return entries


def diff_tree_raw(
    reader: ObjectReader,
    old: bytes,
    new: bytes,
    *,
    trees: bool = True,
    max_entries: int | None = None,
) -> bytes:
    """What `git diff-tree -r -t -z --no-renames --raw <old> <new>` prints, computed from the two
    trees' objects: `:<old mode> <new mode> <old id> <new id> <A|D|M|T>\\0<path>\\0` per changed
    entry, a changed, added or deleted tree's own entry before its contents, in git's tree order (a
    tree's name sorts as if it ended in `/`, so a file that became a tree is a deletion and an
    addition, as git shows it).

    Reads only the subtrees whose ids differ, a level of the tree at a time (`_load_trees`: one
    exchange with the reader per level), iteratively (a deep tree does not recurse here).

    Args:
        old, new: tree ids (40 hex, ASCII).
        trees: False leaves the trees' own entries out, as `diff-tree -r` without `-t` does.
        max_entries: the most entries (lines) of the difference; None: `MAX_DIFF_BYTES` alone
            bounds it. A few tree objects can make millions of lines (a subtree held twice per
            level): a caller that refuses past a count stops there, not at 128 MiB.

    Raises:
        MalformedObject: a tree is missing, not a tree, over `MAX_TREE_BYTES` or malformed, the trees hold over
            `MAX_DIFF_ENTRIES` entries, or the difference is over `MAX_DIFF_BYTES` (each line
            holds its full path: a chain of N nested trees, N tiny objects, makes N^2 bytes).
        TooManyChanges: the difference has over `max_entries` entries.
        GitFailed: the reader failed, or did not read the trees within its time limit (one for
            all the exchanges, as for the one `diff-tree` this replaces).
    """
    loaded = _load_trees(reader, old, new, max_entries)
    out: list[bytes] = []
    size = 0
    # Last in, first out: a line to print, or a pair of trees (either None) to compare under a
    # path prefix, whose lines replace it in place (pre-order, as git prints them).
    work: list[bytes | tuple[bytes, bytes | None, bytes | None]] = [(b"", old, new)]
    while work:
        item = work.pop()
        if isinstance(item, bytes):
            size = _appended(out, size, item, (old, new), max_entries)
            continue
        prefix, a, b = item
        left = {} if a is None else loaded[a]
        right = {} if b is None else loaded[b]
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


def _appended(out: list[bytes], size: int, line: bytes, trees: tuple[bytes, bytes], max_entries: int | None) -> int:
    """`line` appended to the difference `out` of `size` bytes of the two `trees`: its new size.

    Raises:
        MalformedObject: over `MAX_DIFF_BYTES`.
        TooManyChanges: over `max_entries` lines.
    """
    size += len(line)
    if size > MAX_DIFF_BYTES:
        old, new = trees
        raise MalformedObject(
            f"the difference of trees {old.decode(errors='replace')} and "
            f"{new.decode(errors='replace')} is over {MAX_DIFF_BYTES} bytes"
        )
    out.append(line)
    if max_entries is not None and len(out) > max_entries:
        raise TooManyChanges(f"the difference of two trees has over {max_entries} entries")
    return size


def _keyed(entries: list[tuple[bytes, int, bytes]]) -> dict[bytes, tuple[int, bytes]]:
    """Entries by git's sort key (a tree's name + `/`), so a file and a tree of one name are two."""
    keyed: dict[bytes, tuple[int, bytes]] = {}
    for name, mode, oid in entries:
        keyed[name + b"/" if mode == _TREE_MODE else name] = (mode, oid)
    return keyed


def _mode(mode: int) -> bytes:
    return _ZERO_MODE if mode == 0 else b"%06o" % mode


def first_parent_history(
    reader: ObjectReader, commit: bytes, limit: int, max_commit_bytes: int = 1 << 20
) -> list[tuple[str, str]]:
    """(commit, tree) of `commit` and its first-parent ancestors, newest first, at most `limit`, as
    `git rev-list --first-parent --max-count=<limit> --format=%T` lists them; the walk stops early
    at a parent the repository does not hold (a shallow or broken history), or one larger than
    `max_commit_bytes`.

    Raises:
        MalformedObject: `commit` is not a readable commit, or is larger than `max_commit_bytes`.
        GitFailed: the reader failed, or did not read the walk within its time limit (one for all).
    """
    timeout = reader.timeout_sec
    deadline = None if timeout is None else time.monotonic() + timeout  # one limit, as one rev-list
    history: list[tuple[str, str]] = []
    current: bytes | None = commit
    while current is not None and len(history) < limit:
        try:
            links = reader.recall(b"commit", current, max_commit_bytes)
            if links is None:
                obj = reader.read_many([current], max_commit_bytes, deadline=deadline)[0]
                if obj is None or obj.type != b"commit" or obj.data is None:
                    if not history:
                        raise MalformedObject(f"commit {current.decode(errors='replace')} cannot be read")
                    break
                links = (obj.oid, *_commit_links(obj.data))
                reader.remember(b"commit", obj.oid, obj.size, 0, links)
        except MalformedObject:
            if not history:
                raise
            break
        oid, tree, parent = cast(tuple[bytes, bytes | None, bytes | None], links)  # as remembered above
        if tree is None:
            raise MalformedObject(f"commit {current.decode(errors='replace')} names no tree")
        history.append((oid.decode(), tree.decode()))
        current = parent
    return history


_TREE_LINE = re.compile(rb"tree ([0-9a-fA-F]{40})\n")
_PARENT_LINE = re.compile(rb"parent ([0-9a-fA-F]{40})\n")


def commit_links(data: bytes) -> tuple[bytes, bytes | None] | None:
    """(tree, first parent or None) of a commit object as git reads it (`parse_commit_buffer`):
    its first line `tree <id>`, then its parents in the lines right after it (a `parent` header
    anywhere else is no parent); ids in either case, returned in lowercase as git names them.
    None when git could not read it (no tree line first, or a malformed parent line).
    """
    found = _TREE_LINE.match(data)
    if found is None:
        return None
    tree, parent, pos = found.group(1).lower(), None, found.end()
    while data.startswith(b"parent ", pos):
        line = _PARENT_LINE.match(data, pos)
        if line is None:
            return None
        parent = parent or line.group(1).lower()
        pos = line.end()
    return tree, parent


def _commit_links(data: bytes) -> tuple[bytes | None, bytes | None]:
    """(tree, first parent) from a commit object's header lines (`commit_links`; no tree if git
    could not read it)."""
    links = commit_links(data)
    return (None, None) if links is None else links


def object_sizes(reader: ObjectReader, oids: list[bytes]) -> dict[bytes, int]:
    """Object id -> size of each of `oids` the repository holds (what `cat-file --batch-check`
    printed; `vero.core.candidate_limits.measure_tree`'s `sizes`).

    Raises:
        GitFailed: the reader failed.
    """
    return {
        oid: found.size
        for oid, found in zip(oids, reader.info_many(oids), strict=True)
        if found is not None and found.oid == oid
    }
