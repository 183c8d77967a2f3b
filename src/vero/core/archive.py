"""Canonical `.tar.gz` archives: same tree in, same bytes out (docs/operating.md, "The compiled task").

Rules: entries sorted by path (directories before their contents); mtime 0, uid/gid 0, empty user
and group names; modes normalized to 0755 for directories and executable files, 0644 otherwise;
symlinks kept only when relative and resolving inside the tree, also when followed through the
tree's other symlinks (`symlink_escapes`); no absolute paths, no `..` components, no device files
or sockets; for a compiled task, a large file whose bytes an earlier entry holds is a hard link to
it (`link_duplicates`). The gzip header carries no file name and mtime 0, so the output does not depend on the
output path, the umask, file mtimes, the owner or the machine.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import zlib
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from vero.core.storage import atomic_write_bytes
from vero.errors import VeroError

__all__ = [
    "MAX_SYMLINK_HOPS",
    "ArchiveError",
    "canonical_tar_bytes",
    "digest_file_path",
    "file_digest",
    "read_digest_file",
    "safe_extract",
    "symlink_escapes",
    "write_canonical_tar",
    "write_digest_file",
]


class ArchiveError(VeroError, ValueError):
    """A tree cannot be archived canonically, or an archive is unsafe to extract.

    Also a `ValueError`, for callers that catch it as one.
    """


def file_digest(path: str | Path) -> str:
    """`sha256:<hex>` of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


MAX_SYMLINK_HOPS = 40
"""Same bound as Linux's MAXSYMLINKS: a longer chain is a loop or an attempt to exhaust the check."""


def symlink_escapes(link_path: bytes, target: bytes, links: Mapping[bytes, bytes]) -> bool:
    """Whether a symlink at `link_path` (tree-relative, `/`-separated) resolves outside the tree.

    Resolution follows the other symlinks of the same tree (`links`: path -> target) component by
    component, as the kernel would once the tree is on disk, so a chain such as `up -> ../..`
    followed by `x -> deep/up/../y` is caught although each target alone looks harmless. An empty,
    absolute or NUL-holding target, and a chain longer than `MAX_SYMLINK_HOPS` (a loop), count as
    escaping (fail closed). A dangling target inside the tree does not.
    """
    if not target or b"\0" in target or target.startswith(b"/"):
        return True
    stack = link_path.split(b"/")[:-1]
    pending = target.split(b"/")
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in (b"", b"."):
            continue
        if part == b"..":
            if not stack:
                return True
            stack.pop()
            continue
        stack.append(part)
        inner = links.get(b"/".join(stack))
        if inner is not None:
            hops += 1
            if hops > MAX_SYMLINK_HOPS or not inner or inner.startswith(b"/"):
                return True
            stack.pop()
            pending = inner.split(b"/") + pending
    return False


def canonical_tar_bytes(
    root: str | Path, prefix: str = "", *, link_duplicates: bool = False, cache_dir: Path | None = None
) -> bytes:
    """Archive the tree at `root` canonically and return the gzip bytes.

    Args:
        root: directory to archive (its contents, not the directory itself).
        prefix: optional top-level directory name inside the archive (e.g. the task name).
        link_duplicates: store a regular file of at least `LINK_DUPLICATES_FROM_BYTES` whose bytes
            and mode an earlier entry (in archive order) already holds as a hard link to that entry
            (a compiled task carries one vero wheel for three build contexts; extracting it, also
            with tarfile's `data` filter, gives the same files).
        cache_dir: where to keep the gzip bytes by the sha256 of the uncompressed archive (None: no
            cache). Compressing at level 9 is most of what archiving a compiled task costs; the same
            archive compresses to the same bytes, so a cached copy whose content has that digest is
            returned instead (`_cached_gzip`). An unwritable cache is no error.

    Raises:
        ArchiveError: the tree holds a link leaving it, an absolute link, or a special file.
    """
    root = Path(root)
    entries, links = _entries(root)
    if cache_dir is None:
        return _gzip_tar(root, entries, links, prefix, link_duplicates)
    sink = _DigestSink()
    with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        _add_entries(tar, entries, links, prefix, link_duplicates)
    key = sink.digest.hexdigest()
    cached = _cached_gzip(cache_dir, key)
    if cached is not None:
        return cached
    data = _gzip_tar(root, entries, links, prefix, link_duplicates)
    _keep_gzip(cache_dir, key, data)
    return data


def _entries(root: Path) -> tuple[list[tuple[str, Path]], dict[bytes, bytes]]:
    """The tree's entries in archive order (relative name, path) and its symlinks (name -> target).

    Raises:
        ArchiveError: a link leaves the tree.
    """
    entries: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(dirnames + filenames):
            path = base / name
            rel = path.relative_to(root).as_posix()
            entries.append((rel, path))
    entries.sort(key=lambda item: item[0].split("/"))
    links = {os.fsencode(rel): os.fsencode(os.readlink(path)) for rel, path in entries if path.is_symlink()}
    for link, target in links.items():
        if symlink_escapes(link, target, links):
            raise ArchiveError(f"link leaves the tree: {os.fsdecode(link)}")
    return entries, links


def _gzip_tar(
    root: Path, entries: list[tuple[str, Path]], links: dict[bytes, bytes], prefix: str, link_duplicates: bool
) -> bytes:
    out = io.BytesIO()
    # The tar stream goes straight into gzip (deflate output does not depend on how its input is
    # chunked), so the uncompressed archive is never held in memory.
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        _add_entries(tar, entries, links, prefix, link_duplicates)
    return out.getvalue()


def _add_entries(
    tar: tarfile.TarFile, entries: list[tuple[str, Path]], links: dict[bytes, bytes], prefix: str, link_duplicates: bool
) -> None:
    if prefix:
        tar.addfile(_info(prefix, tarfile.DIRTYPE, 0o755))
    stored: dict[tuple[str, int], str] | None = {} if link_duplicates else None
    for rel, path in entries:
        name = f"{prefix}/{rel}" if prefix else rel
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            info = _info(name, tarfile.SYMTYPE, 0o777)
            info.linkname = os.fsdecode(links[os.fsencode(rel)])
            tar.addfile(info)
        elif stat.S_ISDIR(st.st_mode):
            tar.addfile(_info(name, tarfile.DIRTYPE, 0o755))
        elif stat.S_ISREG(st.st_mode):
            _add_file(tar, name, path, st, stored)
        else:
            raise ArchiveError(f"special file cannot be archived: {rel}")


class _DigestSink:
    """A write-only file for tarfile that keeps only the sha256 of what it is given."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self._size = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self._size += len(data)
        return len(data)

    def tell(self) -> int:
        return self._size


CACHED_ARCHIVES = 16
"""How many compressed archives `canonical_tar_bytes` keeps in a cache dir (the newest)."""


def _cached_gzip(cache_dir: Path, key: str) -> bytes | None:
    """The cached gzip bytes of the archive with sha256 `key`, if their content has that digest."""
    try:
        data = (cache_dir / f"{key}.tar.gz").read_bytes()
        if hashlib.sha256(gzip.decompress(data)).hexdigest() != key:
            return None
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error):
        return None
    return data


def _keep_gzip(cache_dir: Path, key: str, data: bytes) -> None:
    """Store `data` as the archive `key`'s gzip bytes and drop all but the newest `CACHED_ARCHIVES`."""
    try:
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write_bytes(cache_dir / f"{key}.tar.gz", data, mode=0o600)
        kept = sorted(cache_dir.glob("*.tar.gz"), key=lambda path: path.stat().st_mtime_ns, reverse=True)
        for stale in kept[CACHED_ARCHIVES:]:
            stale.unlink(missing_ok=True)
    except OSError:
        return


LINK_DUPLICATES_FROM_BYTES = 64 * 1024
"""Smallest file `canonical_tar_bytes(link_duplicates=True)` stores once (smaller ones cost little)."""


def _add_file(
    tar: tarfile.TarFile, name: str, path: Path, st: os.stat_result, stored: dict[tuple[str, int], str] | None
) -> None:
    """A regular file's entry, or a hard link to the entry that holds its bytes already (`stored`:
    (sha256, mode) -> archive name; None: no links)."""
    mode = 0o755 if st.st_mode & 0o111 else 0o644
    if stored is not None and st.st_size >= LINK_DUPLICATES_FROM_BYTES:
        key = (hashlib.sha256(path.read_bytes()).hexdigest(), mode)
        if key in stored:
            info = _info(name, tarfile.LNKTYPE, mode)
            info.linkname = stored[key]
            tar.addfile(info)
            return
        stored[key] = name
    info = _info(name, tarfile.REGTYPE, mode)
    info.size = st.st_size
    with path.open("rb") as handle:
        tar.addfile(info, handle)


def _info(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_canonical_tar(
    root: str | Path,
    dest: str | Path,
    prefix: str = "",
    *,
    link_duplicates: bool = False,
    cache_dir: Path | None = None,
) -> str:
    """Write the canonical archive of `root` to `dest` atomically and return its sha256 hex digest.

    Args: as `canonical_tar_bytes`.

    Raises:
        ArchiveError: see `canonical_tar_bytes`.
        OSError: `dest` cannot be written.
    """
    data = canonical_tar_bytes(root, prefix, link_duplicates=link_duplicates, cache_dir=cache_dir)
    atomic_write_bytes(dest, data, mode=0o644)
    return hashlib.sha256(data).hexdigest()


def digest_file_path(path: str | Path) -> Path:
    """`<path>.sha256`: where the digest of the file `path` is kept."""
    return Path(f"{path}.sha256")


def write_digest_file(path: str | Path, digest: str) -> Path:
    """Write `<path>.sha256` atomically, in `sha256sum`'s format (`<hex>  <name>\\n`), and return it.

    Args:
        path: the file the digest is of (only its name is written).
        digest: its sha256 hex digest.

    Raises:
        OSError: the file cannot be written.
    """
    target = digest_file_path(path)
    atomic_write_bytes(target, f"{digest}  {Path(path).name}\n".encode(), mode=0o644)
    return target


def read_digest_file(path: str | Path) -> str:
    """The hex digest recorded in `<path>.sha256` (its first word).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is empty.
    """
    words = digest_file_path(path).read_text(encoding="utf-8").split()
    if not words:
        raise ValueError(f"{digest_file_path(path)} is empty")
    return words[0]


def safe_extract(archive: str | Path, dest: str | Path) -> None:
    """Extract a `.tar.gz` into `dest`, refusing absolute paths, `..`, links leaving `dest` and devices.

    Uses the standard library's `data` extraction filter (PEP 706) and checks names first.

    Raises:
        ArchiveError: an entry is unsafe; nothing from that entry on is written.
    """
    dest = Path(dest)
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            parts = PurePosixPath(member.name).parts
            if member.name.startswith("/") or ".." in parts:
                raise ArchiveError(f"unsafe entry in archive: {member.name!r}")
        try:
            tar.extractall(dest, filter="data")
        except tarfile.FilterError as exc:
            raise ArchiveError(f"unsafe entry in archive: {type(exc).__name__}") from None
