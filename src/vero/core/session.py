"""The sealed session archive: what the sidecar hands to the verifier (docs/architecture.md).

Layout of `session.tar.gz` (a canonical archive, `vero.core.archive`):

```
manifest.json          SealManifest: name, spec_digest, baseline_commit, sealed_at, files
candidates.bundle      git bundle of every refs/vero/candidates/* ref of the candidate store
candidates/<id>.json   CandidateRecord
ledger.json            the budget ledger as persisted
jobs/index.json        job ids in creation order
jobs/<id>.json         EvaluationJob (with the trusted full result)
submission.json        Submission (absent when the agent never submitted)
```

Trust: the archive travels from the sidecar to the verifier through Harbor's artifact copy. The
verifier checks three things before using it: the outer `session.tar.gz.sha256`, every file's
digest in the manifest (and that no unlisted file is present), and that `spec_digest` and
`baseline_commit` equal its own compiled config. Same state and `sealed_at` give the same bytes, so
sealing twice is idempotent.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

import git
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vero.core._git import IsolatedGit, private_git_env
from vero.core.archive import ArchiveError, file_digest, safe_extract, write_canonical_tar
from vero.core.candidates import CANDIDATE_REF_PREFIX, CandidateRecord
from vero.core.jobs import EvaluationJob, JobStore
from vero.core.ledger import BudgetBalance, read_ledger_file
from vero.core.storage import atomic_write_bytes
from vero.errors import LedgerCorrupt, SessionInvalid

__all__ = [
    "SealManifest",
    "Session",
    "Submission",
    "read_session",
    "read_submission",
    "write_session_archive",
]

_BUNDLE = "candidates.bundle"
_MANIFEST = "manifest.json"


class Submission(BaseModel):
    """The version the agent asked to be scored (`POST /submissions`); the last one wins."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    candidate: str = Field(pattern=r"^[0-9a-f]{40}$")
    version: str
    submitted_at: datetime


class SealManifest(BaseModel):
    """`manifest.json` of a sealed session."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    schema_version: int = 1
    name: str
    spec_digest: str
    baseline_commit: str
    sealed_at: datetime
    files: dict[str, str]
    """Relative path -> `sha256:<hex>` for every other file in the archive."""


class Session(BaseModel):
    """A verified, extracted session."""

    root: Path
    """Extraction directory (holds `candidates.git`, a bare repo with the bundle's refs)."""
    manifest: SealManifest
    candidates: list[CandidateRecord]
    jobs: list[EvaluationJob]
    balances: list[BudgetBalance]
    submission: Submission | None

    @property
    def git_dir(self) -> Path:
        return self.root / "candidates.git"


def _session_git(cwd: Path, git_dir: Path, env: dict[str, str]) -> IsolatedGit:
    """Hardened git on a bare repository (`vero.core._git`); one delta-search thread, so the same
    refs always give the same bundle bytes."""
    return IsolatedGit(cwd, env=env, git_dir=git_dir,
                       config=[("pack.threads", "1"), ("safe.directory", str(git_dir))])


def read_submission(state_dir: str | Path) -> Submission | None:
    """The submission recorded under `state_dir`, or None.

    Raises:
        LedgerCorrupt: `submission.json` exists but is not a valid `Submission`.
    """
    path = Path(state_dir) / "submission.json"
    try:
        return Submission.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError):
        raise LedgerCorrupt(f"submission record {path} is unreadable") from None


def write_session_archive(state_dir: str | Path, dest: str | Path, *, name: str, spec_digest: str,
                          baseline_commit: str, sealed_at: datetime) -> str:
    """Pack the sidecar state under `state_dir` into the canonical archive `dest`; write `dest.sha256`.

    Args:
        state_dir: the sidecar's state dir (`ledger.json`, `jobs/`, `candidates.git`, `candidates/`,
            optionally `submission.json`). The admin token and anything else there is not packed.
        dest: archive path; its directory is created if missing.
        name, spec_digest, baseline_commit: copied into the manifest from the served config.
        sealed_at: the seal time (persisted by the caller so a second seal gives the same bytes).

    Returns:
        The archive's sha256 hex digest.

    Raises:
        OSError: a state file cannot be read or the archive cannot be written.
        git.GitCommandError: git could not bundle the candidate store.
    """
    state = Path(state_dir)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vero-seal-") as tmp:
        stage = Path(tmp) / "session"
        stage.mkdir()
        if (state / "ledger.json").is_file():
            shutil.copyfile(state / "ledger.json", stage / "ledger.json")
        if (state / "submission.json").is_file():
            shutil.copyfile(state / "submission.json", stage / "submission.json")
        for sub in ("jobs", "candidates"):
            if (state / sub).is_dir():
                (stage / sub).mkdir()
                for record in sorted((state / sub).glob("*.json")):
                    if not record.name.startswith("."):
                        shutil.copyfile(record, stage / sub / record.name)
        git_dir = state / "candidates.git"
        if git_dir.is_dir():
            with private_git_env(safe_directories=[git_dir]) as (env, _):
                store = _session_git(stage, git_dir, env)
                refs = store.for_each_ref("--format=%(refname)", CANDIDATE_REF_PREFIX).split()
                if refs:
                    store.bundle("create", "-q", str(stage / _BUNDLE), *sorted(refs))
        files = {
            path.relative_to(stage).as_posix(): file_digest(path)
            for path in sorted(stage.rglob("*")) if path.is_file()
        }
        manifest = SealManifest(name=name, spec_digest=spec_digest, baseline_commit=baseline_commit,
                                sealed_at=sealed_at, files=files)
        (stage / _MANIFEST).write_text(
            json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        digest = write_canonical_tar(stage, dest)
    atomic_write_bytes(Path(f"{dest}.sha256"), f"{digest}  {dest.name}\n".encode(), mode=0o644)
    return digest


def read_session(archive: str | Path, dest: str | Path, *, spec_digest: str,
                 baseline_commit: str) -> Session:
    """Check and extract a sealed archive into `dest` (created; must be empty or absent).

    Raises:
        SessionInvalid: missing or mismatching `.sha256`, a file digest mismatch or an unlisted
            file, a different `spec_digest` or `baseline_commit`, unsafe entries, an invalid bundle,
            or unreadable records.
    """
    archive = Path(archive)
    dest = Path(dest)
    try:
        recorded = Path(f"{archive}.sha256").read_text(encoding="utf-8").split()[0]
    except (OSError, IndexError):
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
        manifest = SealManifest.model_validate_json((dest / _MANIFEST).read_bytes())
    except (OSError, ValidationError):
        raise SessionInvalid("the session manifest is missing or malformed") from None
    if manifest.spec_digest != spec_digest:
        raise SessionInvalid("the session was sealed for a different spec (spec digest mismatch)")
    if manifest.baseline_commit != baseline_commit:
        raise SessionInvalid("the session was sealed for a different baseline commit")
    present = {
        path.relative_to(dest).as_posix()
        for path in dest.rglob("*") if path.is_file() or path.is_symlink()
    } - {_MANIFEST}
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
                session_git.fetch("-q", "--no-tags", "--end-of-options", str(bundle),
                                  f"{CANDIDATE_REF_PREFIX}*:{CANDIDATE_REF_PREFIX}*")
            known = set(session_git.for_each_ref("--format=%(objectname)", CANDIDATE_REF_PREFIX).split())
        except git.GitCommandError:
            raise SessionInvalid("the session's candidate bundle is invalid") from None

    try:
        candidates = sorted(
            (CandidateRecord.model_validate_json(p.read_bytes()) for p in (dest / "candidates").glob("*.json")),
            key=lambda record: (record.imported_at, record.id),
        ) if (dest / "candidates").is_dir() else []
        jobs = JobStore.open(dest).list() if (dest / "jobs").is_dir() else []
        # Read, not `BudgetLedger.open`: that is the owner's API (it tidies temp files, may write).
        balances = read_ledger_file(dest / "ledger.json").entries if (dest / "ledger.json").is_file() else []
        submission = read_submission(dest)
    except (OSError, ValidationError, LedgerCorrupt) as exc:
        raise SessionInvalid(f"a session record is unreadable ({type(exc).__name__})") from None
    for record in candidates:
        if record.id not in known:
            raise SessionInvalid("a candidate record has no commit in the session's bundle")
    if submission is not None and submission.candidate not in known:
        raise SessionInvalid("the submission names a candidate missing from the session")
    return Session(root=dest, manifest=manifest, candidates=candidates, jobs=jobs, balances=balances,
                   submission=submission)
