"""Candidate store: agent commits imported into a trusted bare Git repository (DESIGN §6).

The agent controls its repository completely (objects, refs, `.git/config`, hooks, alternates,
replace refs), so the store treats it as hostile input. An import is:

1. validate the version string before git sees it (`_check_version`);
2. resolve it in the agent's repository to a commit id: `rev-parse --verify --end-of-options
   <version>^{commit}` with an explicit `--git-dir` (no discovery), an isolated environment and
   `-c` options that override the repository's own config (`vero.core._git`);
3. fetch exactly that object id into the store under a unique temporary ref `refs/vero/tmp/<uuid>`
   (`git fetch --no-tags --no-write-fetch-head --no-recurse-submodules`); a local fetch runs
   `upload-pack`/`pack-objects` and the store indexes its own copy of every object, so nothing is
   borrowed from the agent's alternates, and `transfer.fsckObjects` checks what arrives;
4. verify in the store that the temporary ref holds that id and that it is a commit;
5. inspect its tree (`ls-tree -r -t -z`): no reserved top-level path (`RESERVED_PATHS`), no path
   component `.`/`..`/`.git`, only git's regular modes, and no symlink whose target leaves the tree
   (absolute, or `..` escaping, following symlinks inside the tree as the kernel would);
6. publish: `refs/vero/candidates/<id>` and the record `root/candidates/<id>.json`
   (`vero.core.storage`, atomic);
7. always delete the temporary ref (also on rejection, error or cancellation).

No `git` process of the store runs a hook or fsmonitor of any repository, reads the system or user
config, or talks to anything but a local path. No branch or tag is ever created in the store.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import threading
import unicodedata
import uuid
from datetime import UTC, datetime
from pathlib import Path

import git
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vero.core._git import IsolatedGit, minimal_env, write_global_config
from vero.core._offloop import run_to_completion
from vero.core.archive import symlink_escapes
from vero.core.storage import atomic_write_model
from vero.errors import CandidateRejected, LedgerCorrupt

__all__ = ["CandidateRecord", "CandidateStore", "MAX_VERSION_CHARS", "RESERVED_PATHS"]

RESERVED_PATHS: tuple[str, ...] = (".vero",)
"""Top-level paths a candidate tree may not track."""

MAX_VERSION_CHARS = 256
"""Longest version string accepted (characters)."""

CANDIDATE_REF_PREFIX = "refs/vero/candidates/"
TEMPORARY_REF_PREFIX = "refs/vero/tmp/"

_OID = re.compile(r"^[0-9a-f]{40}$")
_SUBJECT_CHARS = 200
# Git's regular tree entry modes: file, executable, symlink, directory, gitlink (submodule).
_ALLOWED_MODES = {b"100644", b"100755", b"120000", b"040000", b"160000"}
_SYMLINK_MODE = b"120000"
_MAX_SYMLINK_TARGET_BYTES = 4096


class CandidateRecord(BaseModel):
    """Durable description of an imported candidate (`root/candidates/<id>.json`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str = Field(pattern=r"^[0-9a-f]{40}$")
    """Commit object id."""
    parent: str | None
    """First parent's commit id (`None` for a root commit)."""
    tree: str
    """Tree object id of the commit."""
    subject: str
    """First line of the commit message (truncated to 200 characters, control characters removed)."""
    imported_at: datetime
    """When the candidate was first imported (aware UTC)."""


class _Aborted(Exception):
    """The awaiting task was cancelled; the worker stops before publishing (internal)."""


def _check_version(version: object) -> str:
    """Refuse version strings that could be read as options, several arguments or garbage.

    Raises:
        CandidateRejected: the version is not a string, is empty, longer than `MAX_VERSION_CHARS`,
            contains control characters (NUL, newline, ...) or whitespace, or starts with `-`.
    """
    if not isinstance(version, str):
        raise CandidateRejected("version must be a string")
    if not version:
        raise CandidateRejected("version is empty")
    if len(version) > MAX_VERSION_CHARS:
        raise CandidateRejected(f"version is longer than {MAX_VERSION_CHARS} characters")
    for ch in version:
        if unicodedata.category(ch).startswith("C"):
            raise CandidateRejected("version contains control or non-printable characters")
        if ch.isspace():
            raise CandidateRejected("version contains whitespace")
    if version.startswith("-"):
        raise CandidateRejected("version may not start with '-'")
    return version


def _source_git_dir(source: str | Path) -> tuple[Path, list[Path]]:
    """Locate the Git directory of a source repository without asking git to discover it.

    Returns:
        The git dir and the paths to list as `safe.directory` (work tree and git dir).

    Raises:
        CandidateRejected: no `.git` directory (a `.git` file or symlink, which could send git to
            any repository on the trusted side, is refused) and the path is not a bare repository;
            or the git dir has a `commondir` file (same reason).
    """
    root = Path(os.path.abspath(source))
    dot_git = root / ".git"
    if os.path.lexists(dot_git):
        if dot_git.is_symlink() or not dot_git.is_dir():
            raise CandidateRejected("the source repository's .git must be a plain directory")
        git_dir, safe = dot_git, [root, dot_git]
    elif (root / "HEAD").is_file() and (root / "objects").is_dir() and (root / "refs").is_dir():
        git_dir, safe = root, [root]
    else:
        raise CandidateRejected("the source repository has no Git directory")
    # `commondir` (linked work trees) would make git read refs and objects of another repository.
    if os.path.lexists(git_dir / "commondir"):
        raise CandidateRejected("the source repository's Git directory may not be a linked work tree")
    return git_dir, safe


def _parse_commit(oid: str, raw: bytes) -> CandidateRecord:
    header, _, message = raw.partition(b"\n\n")
    tree: str | None = None
    parent: str | None = None
    for line in header.split(b"\n"):
        if line.startswith(b"tree ") and tree is None:
            tree = line[5:].decode("ascii")
        elif line.startswith(b"parent ") and parent is None:
            parent = line[7:].decode("ascii")
    if tree is None:
        raise CandidateRejected("the commit has no tree")
    first_line = message.split(b"\n", 1)[0].decode("utf-8", errors="replace")
    # Agent-written text ends up in terminals and reports: no escape sequences or other controls.
    first_line = "".join(ch for ch in first_line if unicodedata.category(ch) != "Cc").strip()
    return CandidateRecord(id=oid, parent=parent, tree=tree, subject=first_line[:_SUBJECT_CHARS],
                           imported_at=datetime.now(UTC))


class CandidateStore:
    """A bare repository at `root/candidates.git` plus records at `root/candidates/`.

    Candidates live under `refs/vero/candidates/<id>`; no branch or tag is ever created.
    `root/.git-env/` holds the store's private git `HOME` (empty) and global config files.

    Attributes:
        root: the store's directory (the sidecar's state dir, `/var/lib/vero`).
        git_dir: the bare repository.
        git_timeout_sec: a git command that runs longer is killed and the import rejected.
    """

    root: Path
    git_dir: Path

    def __init__(self, root: Path, *, git_timeout_sec: float = 600.0) -> None:
        self.root = root
        self.git_dir = root / "candidates.git"
        self.records_dir = root / "candidates"
        self.git_timeout_sec = git_timeout_sec
        self._env_dir = root / ".git-env"
        self._home = self._env_dir / "home"
        self._template = self._env_dir / "template"
        self._publish_lock = threading.Lock()
        self._config_lock = threading.Lock()
        self._configs: set[Path] = set()

    @classmethod
    def open(cls, root: str | Path, *, git_timeout_sec: float = 600.0) -> "CandidateStore":
        """Open or create the store under `root`.

        Args:
            root: directory of the store (created with mode 0700 if missing).
            git_timeout_sec: time limit of each git command, seconds.

        Raises:
            OSError: `root` cannot be created or written.
            git.GitCommandError: the bare repository cannot be initialized.
        """
        root = Path(os.path.abspath(root))
        store = cls(root, git_timeout_sec=git_timeout_sec)
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        store.records_dir.mkdir(mode=0o700, exist_ok=True)
        for private in (store._env_dir, store._home, store._template):
            private.mkdir(mode=0o700, exist_ok=True)
        if not (store.git_dir / "HEAD").is_file():
            store._git(store.root).init("-q", "--bare", f"--template={store._template}",
                                        "--object-format=sha1", str(store.git_dir))
        return store

    # -- git plumbing -------------------------------------------------------------------------

    def _global_config(self, safe_directories: list[Path]) -> Path:
        """The private `GIT_CONFIG_GLOBAL` file trusting exactly `safe_directories` (written once)."""
        key = hashlib.sha256("\0".join(map(str, safe_directories)).encode()).hexdigest()[:16]
        path = self._env_dir / f"global-{key}.gitconfig"
        with self._config_lock:
            if path not in self._configs:
                write_global_config(path, safe_directories=safe_directories)
                self._configs.add(path)
        return path

    def _git(self, cwd: Path, *, git_dir: Path | None = None,
             safe_directories: list[Path] | None = None) -> IsolatedGit:
        safe = [self.git_dir, *(safe_directories or [])]
        env = minimal_env(self._home, self._global_config(safe))
        return IsolatedGit(cwd, env=env, config=[("safe.directory", str(p)) for p in safe],
                           git_dir=git_dir, timeout_sec=self.git_timeout_sec)

    def _store_git(self, safe_directories: list[Path] | None = None) -> IsolatedGit:
        return self._git(self._home, git_dir=self.git_dir, safe_directories=safe_directories)

    def _candidate_ref_exists(self, store: IsolatedGit, oid: str) -> bool:
        status, _, _ = store.show_ref("--verify", "--quiet", CANDIDATE_REF_PREFIX + oid,
                                      with_extended_output=True, with_exceptions=False)
        return status == 0

    def temporary_refs(self) -> list[str]:
        """Names of every `refs/vero/tmp/*` ref (empty unless an import is running or crashed)."""
        out = self._store_git().for_each_ref("--format=%(refname)", TEMPORARY_REF_PREFIX)
        return out.split()

    def remove_stale_temporary_refs(self) -> int:
        """Delete leftover `refs/vero/tmp/*` refs (after a crash); call only when no import runs.

        Returns:
            How many refs were deleted.
        """
        refs = self.temporary_refs()
        store = self._store_git()
        for ref in refs:
            store.update_ref("-d", ref)
        return len(refs)

    # -- import ---------------------------------------------------------------------------------

    async def import_version(self, source_repo: str | Path, version: str) -> CandidateRecord:
        """Import `version` (a commit-ish) from the agent's repository; idempotent.

        Off the event loop; the temporary ref is removed even when the caller is cancelled.
        On cancellation the worker thread stops at its next step (a running git command finishes
        first, bounded by `git_timeout_sec`), skips publishing if it has not started, deletes its
        temporary ref, and only then is `asyncio.CancelledError` raised to the caller.

        Raises:
            CandidateRejected: malformed version (empty, leading `-`, control characters or
                whitespace, too long), a source without a plain Git directory, unknown object, not a
                commit, fetched id mismatch, a tree with a reserved or unsafe path or an unsupported
                mode, or a symlink pointing outside the tree. No ref or record is added (objects
                already fetched stay in the store, unreferenced).
        """
        abort = threading.Event()
        return await run_to_completion(lambda: self._import_version(source_repo, version, abort),
                                       on_cancel=abort.set)

    def import_version_sync(self, source_repo: str | Path, version: str) -> CandidateRecord:
        """Blocking form of `import_version` (for threads and tools).

        Raises:
            CandidateRejected: as `import_version`.
        """
        return self._import_version(source_repo, version, None)

    def _import_version(self, source_repo: str | Path, version: str,
                        abort: threading.Event | None) -> CandidateRecord:
        version = _check_version(version)
        source_git_dir, safe = _source_git_dir(source_repo)
        agent = self._git(self._home, git_dir=source_git_dir, safe_directories=safe)
        try:
            oid = agent.rev_parse("--verify", "--quiet", "--end-of-options", f"{version}^{{commit}}")
        except git.GitCommandError:
            raise CandidateRejected(f"version {version!r} does not name a commit in the repository") from None
        oid = oid.strip()
        if not _OID.fullmatch(oid):
            raise CandidateRejected("the repository does not use SHA-1 object ids")
        return self._import_oid(source_git_dir, safe, oid, abort)

    def import_commit_from_store(self, other_git_dir: str | Path, commit: str) -> CandidateRecord:
        """Import a commit from another trusted repository (e.g. the baseline repo); same checks.

        Args:
            other_git_dir: a Git directory, or a work tree with a `.git` directory.
            commit: full 40-hex commit id.

        Raises:
            CandidateRejected: `commit` is not a full commit id, or as `import_version`.
        """
        if not isinstance(commit, str) or not _OID.fullmatch(commit):
            raise CandidateRejected("commit must be a full 40-character lowercase hex object id")
        source_git_dir, safe = _source_git_dir(other_git_dir)
        return self._import_oid(source_git_dir, safe, commit, None)

    def _import_oid(self, source_git_dir: Path, safe: list[Path], oid: str,
                    abort: threading.Event | None) -> CandidateRecord:
        store = self._store_git(safe)
        existing = self._existing(store, oid)
        if existing is not None:
            return existing
        temporary = f"{TEMPORARY_REF_PREFIX}{uuid.uuid4().hex}"
        try:
            if abort is not None and abort.is_set():
                raise _Aborted
            try:
                store.fetch("--no-tags", "--no-write-fetch-head", "--no-recurse-submodules", "--quiet",
                            "--end-of-options", str(source_git_dir), f"{oid}:{temporary}")
            except git.GitCommandError:
                raise CandidateRejected(
                    f"commit {oid} could not be fetched (unknown, incomplete or malformed objects)"
                ) from None
            self._verify_fetched(store, temporary, oid)
            raw = store.cat_file("commit", oid, stdout_as_string=False)
            record = _parse_commit(oid, raw)
            self._inspect_tree(store, record.tree)
            if abort is not None and abort.is_set():
                raise _Aborted
            return self._publish(store, record)
        finally:
            self._delete_ref(store, temporary)

    def _existing(self, store: IsolatedGit, oid: str) -> CandidateRecord | None:
        if not self._candidate_ref_exists(store, oid):
            return None
        try:
            return self.get(oid)
        except KeyError:
            return None  # ref without record (crash between the two writes): import again

    def _verify_fetched(self, store: IsolatedGit, temporary: str, oid: str) -> None:
        try:
            fetched = store.rev_parse("--verify", "--quiet", "--end-of-options", temporary).strip()
            kind = store.cat_file("-t", oid).strip()
        except git.GitCommandError:
            raise CandidateRejected(f"commit {oid} is missing from the store after fetching") from None
        if fetched != oid:
            raise CandidateRejected(f"fetched object id does not match the requested commit {oid}")
        if kind != "commit":
            raise CandidateRejected(f"object {oid} is a {kind}, not a commit")

    def _inspect_tree(self, store: IsolatedGit, tree: str) -> None:
        """Reject a tree with reserved paths, unsafe names, odd modes or escaping symlinks.

        Raises:
            CandidateRejected: names the offending path (paths come from the agent's own tree).
        """
        listing = store.ls_tree("-r", "-t", "-z", "--full-tree", "--end-of-options", tree,
                                stdout_as_string=False)
        reserved = {name.encode().lower() for name in RESERVED_PATHS}
        symlinks: dict[bytes, bytes] = {}
        for entry in listing.split(b"\0"):
            if not entry:
                continue
            meta, _, path = entry.partition(b"\t")
            mode, _, rest = meta.partition(b" ")
            _kind, _, blob = rest.partition(b" ")
            shown = path.decode("utf-8", errors="replace")
            parts = path.split(b"/")
            if parts[0].lower() in reserved:
                raise CandidateRejected(f"the commit tracks the reserved path {shown!r}")
            if any(part in (b"", b".", b"..") or part.lower() == b".git" for part in parts):
                raise CandidateRejected(f"the commit's tree contains the unsafe path {shown!r}")
            if mode not in _ALLOWED_MODES:
                raise CandidateRejected(f"the commit's tree has unsupported mode {mode.decode(errors='replace')} "
                                        f"at {shown!r}")
            if mode == _SYMLINK_MODE:
                symlinks[path] = blob
        if not symlinks:
            return
        targets = self._read_blobs(store, list(symlinks.values()))
        links = {path: targets[blob] for path, blob in symlinks.items()}
        for path, target in sorted(links.items()):
            if len(target) > _MAX_SYMLINK_TARGET_BYTES or symlink_escapes(path, target, links):
                raise CandidateRejected(
                    f"symlink {path.decode('utf-8', errors='replace')!r} points outside the tree"
                )

    def _read_blobs(self, store: IsolatedGit, oids: list[bytes]) -> dict[bytes, bytes]:
        """Contents of blobs by id, with one `cat-file --batch` process."""
        unique = sorted(set(oids))
        with tempfile.TemporaryFile() as requests:
            requests.write(b"".join(oid + b"\n" for oid in unique))
            requests.seek(0)
            out = store.cat_file("--batch", istream=requests, stdout_as_string=False,
                                 strip_newline_in_stdout=False)
        contents: dict[bytes, bytes] = {}
        pos = 0
        for oid in unique:
            end = out.index(b"\n", pos)
            header = out[pos:end].split(b" ")
            if len(header) != 3 or header[0] != oid or header[1] != b"blob":
                raise CandidateRejected("a symlink of the commit's tree is not a readable blob")
            size = int(header[2])
            contents[oid] = out[end + 1:end + 1 + size]
            pos = end + 1 + size + 1
        return contents

    def _publish(self, store: IsolatedGit, record: CandidateRecord) -> CandidateRecord:
        # One publisher at a time: two concurrent imports of one commit keep the first record.
        with self._publish_lock:
            existing = self._existing(store, record.id)
            if existing is not None:
                return existing
            store.update_ref("-m", "vero: import candidate", CANDIDATE_REF_PREFIX + record.id, record.id)
            atomic_write_model(self.records_dir / f"{record.id}.json", record)
            return record

    def _delete_ref(self, store: IsolatedGit, ref: str) -> None:
        # `update-ref -d` of an absent ref succeeds; a failure here must not hide the real error.
        try:
            store.update_ref("-d", ref)
        except git.GitCommandError:
            pass

    # -- reading --------------------------------------------------------------------------------

    def get(self, candidate_id: str) -> CandidateRecord:
        """The record of an imported candidate.

        Raises:
            KeyError: unknown id (or not a 40-hex id).
            LedgerCorrupt: the record exists but cannot be read or validated.
        """
        if not isinstance(candidate_id, str) or not _OID.fullmatch(candidate_id):
            raise KeyError(candidate_id)
        path = self.records_dir / f"{candidate_id}.json"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise KeyError(candidate_id) from None
        try:
            return CandidateRecord.model_validate_json(data)
        except ValidationError:
            raise LedgerCorrupt(f"candidate record {path} is unreadable") from None

    def list(self) -> list[CandidateRecord]:
        """All records, by `imported_at` (then id).

        Raises:
            LedgerCorrupt: a record cannot be read or validated.
        """
        records = [self.get(path.stem) for path in self.records_dir.glob("*.json")
                   if not path.name.startswith(".") and _OID.fullmatch(path.stem)]
        return sorted(records, key=lambda record: (record.imported_at, record.id))

    def checkout(self, candidate_id: str, dest: str | Path) -> Path:
        """Materialize a candidate into a fresh directory `dest` (must not exist) as a detached work tree.

        The result has its own `.git` and does not depend on the agent's repository or the store.

        Raises:
            KeyError: unknown id.
            FileExistsError: `dest` exists.
            git.GitCommandError: git failed (then `dest` is removed).
        """
        record = self.get(candidate_id)
        dest = Path(os.path.abspath(dest))
        store = self._store_git()
        if not self._candidate_ref_exists(store, record.id):
            raise KeyError(candidate_id)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.mkdir()  # FileExistsError if present
        try:
            # `dest` is created here by this process, so git's ownership check needs no exception.
            work = self._git(dest)
            work.init("-q", f"--template={self._template}", "--object-format=sha1", str(dest))
            # A local fetch copies the objects (no alternates): the checkout outlives the store.
            work.fetch("--no-tags", "--no-write-fetch-head", "--no-recurse-submodules", "--quiet",
                       "--end-of-options", str(self.git_dir), CANDIDATE_REF_PREFIX + record.id)
            work.checkout("-q", "--detach", record.id)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        return dest
