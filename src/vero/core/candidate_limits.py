"""Candidate size limits: how many files a commit's tree holds, their total size and the largest one.

The sidecar measures a candidate twice (`vero.core.candidates`, admission steps 3 and 6):

1. in the agent's repository, before anything is fetched: a tree over a limit is refused
   (`CandidateTooLarge`, HTTP 413) and the candidate store is left exactly as it was;
2. in the store, on the fetched objects, before the candidate is published: the authoritative
   figure (the agent's repository may hold objects whose headers lie; a lie either fails the fetch,
   which checks every object it receives, or is caught here).

A measurement is incremental when an already measured tree lies on the commit's first-parent line:
the figures of that tree plus what `git diff-tree` says changed, with one `cat-file --batch-check`
for the changed blobs' sizes. Otherwise `git ls-tree -r -l` of the whole tree. Unchanged files
are not compared to `max_file_bytes` again: a measured tree's files all passed it (the compiler
refuses a baseline over the limits, `vero.compiler.build`).

Sizes are Git's object sizes (bytes): a symlink counts as one file of its target's length; a
submodule entry (mode 160000) counts as nothing, since no content of it is stored or checked out.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from vero.core.isolated_git import IsolatedGit, private_git_env
from vero.errors import CandidateRejected, CandidateTooLarge
from vero.spec.models import CandidateLimits

__all__ = ["TreeSize", "check_limits", "measure_commit", "measure_difference", "measure_tree"]

_FILE_MODES = frozenset({b"100644", b"100755", b"120000"})


class _Git(Protocol):
    def ls_tree(self, *args: str, **kwargs: object) -> bytes: ...
    def diff_tree(self, *args: str, **kwargs: object) -> bytes: ...
    def cat_file(self, *args: str, **kwargs: object) -> bytes: ...


@dataclass(frozen=True)
class TreeSize:
    """Figures of one tree (what `checked_trees` records with it)."""

    files: int
    """Files (blobs, symlinks included; submodule entries excluded)."""
    bytes: int
    """Sum of the files' sizes, bytes."""


def measure_tree(
    git: _Git,
    tree: str,
    limits: CandidateLimits,
    base: tuple[str, TreeSize] | None = None,
) -> TreeSize:
    """Measure `tree` and check it against `limits`, with git processes (`ls-tree`, or `diff-tree`
    and `cat-file --batch-check` from `base`).

    Args:
        git: a `git.Git` (or `vero.core.isolated_git.IsolatedGit`) bound to the repository holding `tree`
            (and `base`'s tree).
        tree: the tree's object id (40 hex).
        limits: the limits to enforce.
        base: an already measured tree and its figures; the measurement then reads only the
            entries that differ from it.

    Returns:
        The tree's figures.

    Raises:
        CandidateTooLarge: a limit is exceeded (the error names the limit, the figure and the
            path of an oversized file).
        CandidateRejected: an object of the difference cannot be read.
        GitFailed: git could not read the objects.
    """
    if base is None:
        files, total, grown = _whole(git, tree)
        return _checked(files, total, grown, limits)
    diff = git.diff_tree("-r", "-z", "--no-renames", "--raw", "--end-of-options", base[0], tree, stdout_as_string=False)
    return measure_difference(diff, base[1], limits, lambda oids: _blob_sizes(git, oids))


def measure_difference(
    diff: bytes, base: TreeSize, limits: CandidateLimits, sizes: Callable[[list[bytes]], dict[bytes, int]]
) -> TreeSize:
    """Measure a tree from an already measured tree's figures and their difference, and check it
    against `limits` (`measure_tree`'s second case, for a caller that read the difference itself:
    the candidate store, through its kept `cat-file`, `vero.core.object_reader`).

    Args:
        diff: `git diff-tree -r [-t] -z --no-renames --raw <base tree> <tree>` output (or the same
            bytes from `vero.core.object_reader.diff_tree_raw`); tree entries in it are ignored.
        base: the base tree's figures.
        limits: the limits to enforce.
        sizes: reads the sizes of objects by id, returning those it finds.

    Raises:
        CandidateTooLarge: as `measure_tree`.
        CandidateRejected: an object of the difference cannot be read.
        GitFailed: `sizes` failed.
    """
    files, total, grown = _delta(sizes, diff, base, limits)
    return _checked(files, total, grown, limits)


def _checked(files: int, total: int, grown: list[tuple[bytes, int]], limits: CandidateLimits) -> TreeSize:
    for path, file_bytes in grown:
        if file_bytes > limits.max_file_bytes:
            shown = path.decode("utf-8", errors="replace")
            raise CandidateTooLarge("max_file_bytes", limits.max_file_bytes, file_bytes, path=shown)
    size = TreeSize(files=files, bytes=total)
    check_limits(size, limits)
    return size


def measure_commit(work_tree: Path, limits: CandidateLimits, rev: str = "HEAD") -> TreeSize:
    """Measure `rev`'s tree in a trusted repository (the compiler's baseline commit).

    Raises:
        CandidateTooLarge: over a limit.
        GitFailed: `rev` cannot be read.
    """
    with private_git_env(safe_directories=[work_tree, work_tree / ".git"]) as (env, _template):
        repo = IsolatedGit(work_tree, env=env)
        return measure_tree(repo, repo.rev_parse("--verify", f"{rev}^{{tree}}").strip(), limits)


def check_limits(size: TreeSize, limits: CandidateLimits) -> None:
    """Refuse a tree whose file count or total size is over `limits`.

    Raises:
        CandidateTooLarge: naming the first limit exceeded.
    """
    if size.files > limits.max_files:
        raise CandidateTooLarge("max_files", limits.max_files, size.files)
    if size.bytes > limits.max_total_bytes:
        raise CandidateTooLarge("max_total_bytes", limits.max_total_bytes, size.bytes)


def _whole(git: _Git, tree: str) -> tuple[int, int, list[tuple[bytes, int]]]:
    """(files, bytes, every (path, size)) from `ls-tree -r -l` of the whole tree."""
    listing = git.ls_tree("-r", "-l", "-z", "--full-tree", "--end-of-options", tree, stdout_as_string=False)
    files = total = 0
    sizes: list[tuple[bytes, int]] = []
    for entry in listing.split(b"\0"):
        if not entry:
            continue
        meta, _, path = entry.partition(b"\t")
        mode, _kind, _oid, size = meta.split()
        if mode not in _FILE_MODES:
            continue
        files += 1
        total += int(size)
        sizes.append((path, int(size)))
    return files, total, sizes


def _delta(
    read_sizes: Callable[[list[bytes]], dict[bytes, int]], raw: bytes, base: TreeSize, limits: CandidateLimits
) -> tuple[int, int, list[tuple[bytes, int]]]:
    """(files, bytes, (path, size) of every added or changed file) of a tree, from its base tree's
    figures and their difference `raw` (`diff-tree --raw -z`). The file count is checked before any
    size is read, so a tree with far too many files costs one `diff-tree`."""
    fields = raw.split(b"\0")
    removed: list[bytes] = []
    added: list[tuple[bytes, bytes]] = []
    i = 0
    while i < len(fields):
        meta = fields[i]
        if not meta:
            i += 1
            continue
        old_mode, new_mode, old_oid, new_oid, _status = meta[1:].split(b" ")
        path = fields[i + 1]
        if old_mode in _FILE_MODES:
            removed.append(old_oid)
        if new_mode in _FILE_MODES:
            added.append((path, new_oid))
        i += 2
    files = base.files + len(added) - len(removed)
    check_limits(TreeSize(files=files, bytes=0), limits)
    wanted = sorted(set(removed + [oid for _, oid in added]))
    sizes = read_sizes(wanted) if wanted else {}
    missing = [oid for oid in wanted if oid not in sizes]
    if missing:
        raise CandidateRejected(f"object {missing[0].decode(errors='replace')} of the commit's tree cannot be read")
    grown = [(path, sizes[oid]) for path, oid in added]
    total = base.bytes + sum(size for _, size in grown) - sum(sizes[oid] for oid in removed)
    return files, total, grown


def _blob_sizes(git: _Git, oids: list[bytes]) -> dict[bytes, int]:
    """Object id -> size of those `oids` git finds, with one `cat-file --batch-check` process."""
    unique = sorted(set(oids))
    if not unique:
        return {}
    with tempfile.TemporaryFile() as requests:
        requests.write(b"".join(oid + b"\n" for oid in unique))
        requests.seek(0)
        out = git.cat_file("--batch-check=%(objectname) %(objectsize)", istream=requests, stdout_as_string=False)
    sizes: dict[bytes, int] = {}
    for line in out.splitlines():
        oid, _, size = line.partition(b" ")
        if size.isdigit():
            sizes[oid] = int(size)
    return sizes
