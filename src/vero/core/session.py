"""The sealed session archive: what the sidecar hands to the verifier (docs/architecture.md).

Layout of `session.tar.gz` (a canonical archive, `vero.core.archive`):

```
manifest.json          SealManifest (schema 2): name, spec_digest, baseline_commit, sealed_at, files,
                       and when intake closed and why (absent in archives sealed before it was recorded)
candidates.bundle      git bundle of every refs/vero/candidates/* ref of the candidate store
state.json             the state store's canonical export (`vero.core.state.StateStore.export`):
                       budgets, reservations, jobs (with trusted full results), candidates, submission
```

Trust: the archive travels from the sidecar to the verifier through Harbor's artifact copy. The
verifier checks three things before using it: the outer `session.tar.gz.sha256`, every file's
digest in the manifest (and that no unlisted file is present), and that `spec_digest` and
`baseline_commit` equal its own compiled config. Then `state.json` must parse and satisfy the
ledger's invariants and the job/reservation agreement (`SessionState`). Same state and `sealed_at`
give the same bytes, so sealing twice is idempotent: `state.json` depends only on the state's
content, the bundle on the candidate store as it is on disk (see `_session_git`).
"""

from __future__ import annotations

import json
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Final, Literal, Self

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from vero.core.archive import (
    ArchiveError,
    file_digest,
    read_digest_file,
    safe_extract,
    write_canonical_tar,
    write_digest_file,
)
from vero.core.candidates import CANDIDATE_REF_PREFIX, CandidateRecord
from vero.core.isolated_git import IsolatedGit, private_git_env
from vero.core.jobs import TERMINAL_STATES, EvaluationJob
from vero.core.ledger import BudgetBalance, BudgetFigures, Reservation, balances_of, check_ledger_invariants
from vero.core.state import STATE_FILE, StateStore, canonical_json
from vero.core.submission import Submission
from vero.errors import GitFailed, SessionInvalid

__all__ = [
    "SESSION_SCHEMA_VERSION",
    "SealHeader",
    "SealManifest",
    "Session",
    "SessionState",
    "Submission",
    "read_session",
    "write_session_archive",
]

SESSION_SCHEMA_VERSION: Final = 2
"""`manifest.json`'s schema: 2 carries `state.json` (1 carried per-record JSON files)."""

_BUNDLE = "candidates.bundle"
_MANIFEST = "manifest.json"
_STATE = "state.json"


class SessionState(BaseModel):
    """`state.json`: the state store's canonical export, validated as a whole.

    Validation enforces, besides the field types, the ledger's invariants
    (`vero.core.ledger.check_ledger_invariants`), one reservation per job, and that a job is
    terminal exactly when its reservation is closed (complete exactly when settled).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    schema_version: Literal[3]
    """The state store's `SCHEMA_VERSION` (`vero.core.state`)."""
    budgets: list[BudgetFigures]
    reservations: list[Reservation]
    jobs: list[EvaluationJob]
    candidates: list[CandidateRecord]
    submission: Submission | None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        check_ledger_invariants(self.budgets, self.reservations)
        reservations = {r.id: r for r in self.reservations}
        owned: set[str] = set()
        for job in self.jobs:
            reservation = reservations.get(job.reservation_id)
            if reservation is None or job.reservation_id in owned:
                raise ValueError("a job has no reservation of its own")
            owned.add(job.reservation_id)
            if (job.state in TERMINAL_STATES) != (reservation.state != "reserved") or (job.state == "complete") != (
                reservation.state == "settled"
            ):
                raise ValueError("a job's state disagrees with its reservation's")
        if len({c.id for c in self.candidates}) != len(self.candidates):
            raise ValueError("a candidate is recorded twice")
        return self


class SealHeader(BaseModel):
    """What a seal records about the session besides its files: the served config's identity and
    the seal's and intake's times (`SealManifest` without `files` and `schema_version`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    name: str
    spec_digest: str
    baseline_commit: str
    sealed_at: datetime
    """The seal time (persisted by the caller, so a second seal gives the same bytes)."""
    intake_closed_at: datetime | None = None
    """When the sidecar stopped taking evaluations and submissions (`vero.sidecar.intake`); every job
    and the submission predate it. None: sealed by a vero that did not record it."""
    intake_closed_by: Literal["agent_ended", "sealed"] | None = None
    """`agent_ended`: `main`'s collect hook said the agent phase was over; `sealed`: the hook never
    came and the seal closed intake."""


class SealManifest(SealHeader):
    """`manifest.json` of a sealed session."""

    schema_version: Literal[2] = SESSION_SCHEMA_VERSION
    files: dict[str, str]
    """Relative path -> `sha256:<hex>` for every other file in the archive."""


class Session(BaseModel):
    """A verified, extracted session."""

    root: Path
    """Extraction directory (holds `candidates.git`, a bare repo with the bundle's refs)."""
    manifest: SealManifest
    state: SessionState
    candidates: list[CandidateRecord]
    jobs: list[EvaluationJob]
    balances: list[BudgetBalance]
    """Runs and cases per (partition, principal), from `state.budgets`."""
    submission: Submission | None

    @property
    def git_dir(self) -> Path:
        return self.root / "candidates.git"


def _session_git(cwd: Path, git_dir: Path, env: dict[str, str]) -> IsolatedGit:
    """Hardened git on a bare repository (`vero.core.isolated_git`); one delta-search thread, so the same
    store gives the same bundle bytes. (pack-objects reuses the store's deltas: the same commits in
    another pack layout, e.g. repacked at another moment, may bundle to other bytes.)"""
    return IsolatedGit(cwd, env=env, git_dir=git_dir, config=[("pack.threads", "1"), ("safe.directory", str(git_dir))])


def write_session_archive(
    state_dir: str | Path,
    dest: str | Path,
    header: SealHeader,
    *,
    state: StateStore | None = None,
) -> str:
    """Pack the sidecar state under `state_dir` into the canonical archive `dest`; write `dest.sha256`.

    Args:
        state_dir: the sidecar's state dir (`state.db`, `candidates.git`). The admin token and
            anything else there is not packed.
        dest: archive path; its directory is created if missing.
        header: copied into the manifest (the served config's name, spec digest and baseline, the
            seal's and intake's times).
        state: the open state store (the sidecar's); None opens `state_dir/state.db`.

    Returns:
        The archive's sha256 hex digest.

    Raises:
        LedgerCorrupt: the database is refused by the full check (`StateStore.verify`), or at open
            (`state` None); nothing is written.
        OSError: a state file cannot be read or the archive cannot be written.
        GitFailed: git could not bundle the candidate store.
    """
    state_path = Path(state_dir)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    owned = state is None
    store = StateStore.open(state_path / STATE_FILE) if state is None else state
    try:
        # The full check (`StateStore.verify`): the open-time one reads only the newest rows, so an
        # older row edited by hand is found here, before any of it is sealed.
        store.verify()
        exported = store.export_bytes()
    finally:
        if owned:
            store.close()
    with tempfile.TemporaryDirectory(prefix="vero-seal-") as tmp:
        stage = Path(tmp) / "session"
        stage.mkdir()
        (stage / _STATE).write_bytes(exported)
        git_dir = state_path / "candidates.git"
        if git_dir.is_dir():
            with private_git_env(safe_directories=[git_dir]) as (env, _):
                store_git = _session_git(stage, git_dir, env)
                refs = store_git.for_each_ref("--format=%(refname)", CANDIDATE_REF_PREFIX).split()
                if refs:
                    store_git.bundle("create", "-q", str(stage / _BUNDLE), *sorted(refs))
        files = {
            path.relative_to(stage).as_posix(): file_digest(path) for path in sorted(stage.rglob("*")) if path.is_file()
        }
        manifest = SealManifest(**dict(header), files=files)
        # Unset fields are left out, so a session without an intake record seals to the bytes it
        # always did.
        (stage / _MANIFEST).write_bytes(canonical_json(manifest.model_dump(mode="json", exclude_none=True)))
        digest = write_canonical_tar(stage, dest)
    write_digest_file(dest, digest)
    return digest


def _schema_version_of(raw: bytes) -> object:
    """The `schema_version` a manifest declares, whatever else it holds (None if it declares none)."""
    try:
        document = json.loads(raw)
    except ValueError:
        return None
    return document.get("schema_version") if isinstance(document, dict) else None


def read_session(archive: str | Path, dest: str | Path, *, spec_digest: str, baseline_commit: str) -> Session:
    """Check and extract a sealed archive into `dest` (created; must be empty or absent).

    Raises:
        SessionInvalid: missing or mismatching `.sha256`, a file digest mismatch or an unlisted
            file, a different `spec_digest` or `baseline_commit`, unsafe entries, an invalid bundle,
            or unreadable records.
    """
    archive = Path(archive)
    dest = Path(dest)
    try:
        recorded = read_digest_file(archive)
    except (OSError, ValueError):
        raise SessionInvalid("the session archive has no readable .sha256 beside it") from None
    try:
        actual = file_digest(archive).removeprefix("sha256:")
    except OSError:
        raise SessionInvalid("the session archive cannot be read") from None
    if recorded != actual:
        raise SessionInvalid("the session archive does not match its sha256")
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise SessionInvalid(f"extraction directory {dest} is not empty")
    try:
        safe_extract(archive, dest)
    except (ArchiveError, OSError, EOFError) as exc:
        raise SessionInvalid(f"the session archive cannot be extracted safely ({type(exc).__name__})") from None
    try:
        raw_manifest = (dest / _MANIFEST).read_bytes()
        manifest = SealManifest.model_validate_json(raw_manifest)
    except OSError:
        raise SessionInvalid("the session manifest is missing or malformed") from None
    except ValidationError:
        version = _schema_version_of(raw_manifest)
        if version is not None and version != SESSION_SCHEMA_VERSION:
            raise SessionInvalid(
                f"the session has schema version {version!r}; this verifier reads "
                f"{SESSION_SCHEMA_VERSION} (seal and verify with the same vero)"
            ) from None
        raise SessionInvalid("the session manifest is missing or malformed") from None
    if manifest.spec_digest != spec_digest:
        raise SessionInvalid("the session was sealed for a different spec (spec digest mismatch)")
    if manifest.baseline_commit != baseline_commit:
        raise SessionInvalid("the session was sealed for a different baseline commit")
    present = {path.relative_to(dest).as_posix() for path in dest.rglob("*") if path.is_file() or path.is_symlink()} - {
        _MANIFEST
    }
    if present != set(manifest.files):
        raise SessionInvalid("the session archive's files do not match its manifest")
    for rel, digest in manifest.files.items():
        if (dest / rel).is_symlink() or file_digest(dest / rel) != digest:
            raise SessionInvalid(f"session file {rel} does not match its manifest digest")

    git_dir = dest / "candidates.git"
    bundle = dest / _BUNDLE
    with private_git_env(safe_directories=[git_dir]) as (env, template):
        try:
            IsolatedGit(dest, env=env).init("-q", "--bare", f"--template={template}", str(git_dir))
            session_git = _session_git(dest, git_dir, env)
            if bundle.is_file():
                # `transfer.fsckObjects` (hardening config) checks every object the fetch brings in.
                session_git.bundle("verify", "-q", str(bundle))
                session_git.fetch(
                    "-q",
                    "--no-tags",
                    "--end-of-options",
                    str(bundle),
                    f"{CANDIDATE_REF_PREFIX}*:{CANDIDATE_REF_PREFIX}*",
                )
            known = set(session_git.for_each_ref("--format=%(objectname)", CANDIDATE_REF_PREFIX).split())
        except GitFailed:
            raise SessionInvalid("the session's candidate bundle is invalid") from None

    try:
        state = SessionState.model_validate_json((dest / _STATE).read_bytes())
    except OSError:
        raise SessionInvalid("the session has no readable state.json") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "<root>"
        raise SessionInvalid(f"the session's state.json is invalid at {where}: {first['msg']}") from None
    candidates, jobs, submission = state.candidates, state.jobs, state.submission
    for record in candidates:
        if record.id not in known:
            raise SessionInvalid("a candidate record has no commit in the session's bundle")
    if submission is not None and submission.candidate not in known:
        raise SessionInvalid("the submission names a candidate missing from the session")
    return Session(
        root=dest,
        manifest=manifest,
        state=state,
        candidates=candidates,
        jobs=jobs,
        balances=balances_of(state.budgets),
        submission=submission,
    )
