"""`AgentCase`: the case container of a `kind: agent` trial, as vero's trusted `CandidateAgent` acts on it.

Harbor's environment API moves files as root (`docker compose cp` on Docker, the SDK's root calls on
Modal), and nothing resets a case container between a candidate agent's run and the case's tests.
So, with the static case kit (`casekit/vero-kit.c`) uploaded into the case container before any
candidate code runs (`prepare`):

- **the case agent user's rights only.** `prepare` asks the kit, run as the case's agent user (the
  environment's default user in Harbor's agent phase: `[agent].user`, else the image's user), who
  that is (`vero-kit whoami`: uid, gid, groups). Every transfer then crosses a root-only staging
  dir (`STAGING_ROOT`, mode 0700) that only the trusted side writes and reads: an upload is copied
  there by the environment (as root) and then written to the candidate's path by a child of the kit
  that has become the agent user (`vero-kit put`); a download is read from the candidate's path by
  such a child and written into the staging dir by the kit as root (`vero-kit get`), then copied
  out by the environment. So an upload can create exactly what the agent user could (never a file
  in `/usr/local/bin`, `/etc` or `/root` of a case whose agent user is not root), a download gets
  only what the agent user can read (never `/etc/shadow`), only directories and regular files
  travel (links, devices and fifos are left out, as the host side's tar packing does), and no
  transfer carries more than `max_transfer_bytes` of file data. The environment never copies a
  path the candidate chose, and nothing the candidate can reach is ever followed by root;
- **a clean case before the tests** (`clean`, `vero-kit end-agent`, as root): every process of
  the agent user is killed (unless that user is root), `/logs/verifier` is emptied (whatever is
  there: links, devices, fifos, unreadable or very deep trees), `/logs/artifacts` and `/logs/agent`
  keep only directories and regular files (no links, devices, fifos, hard links to others' files,
  or entries too deep to download) made readable for Harbor's download, a `/tests` the candidate
  planted is removed, and `/logs` is root's again. What it found is returned as counts, which the
  trial records (`context.metadata["vero_case_clean"]`) and vero reports as attempt flags
  (`vero.harbor.results`).

Where the agent user is root (Harbor's default when `[agent].user` is unset and the image sets no
user), a candidate agent owns the container: nothing here can hold, and `prepare` says so
(`CaseIdentity.root`); the build warns about such cases and `vero harbor check --probe` reports
them.

Errors: `prepare` raises `CaseKitSetupError` (before any candidate code ran: infrastructure);
`clean` raises `CandidateSandboxError` (after it ran: a dead attempt); a refused transfer raises
`PermissionError`, `FileNotFoundError`, `IsADirectoryError`, `NotADirectoryError`, `ValueError`
(too large) or `OSError` back to the candidate.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from harbor.environments.base import BaseEnvironment, ExecResult

__all__ = ["KIT_PATH_IN_AGENT_CASE", "STAGING_ROOT", "AgentCase", "CaseIdentity", "clean_findings"]

KIT_PATH_IN_AGENT_CASE = PurePosixPath("/run/vero-kit/vero-kit")
"""Where the kit goes in an agent case: a dir of root's (0711) that the agent user can enter but not
change, so the binary root runs again at the end is the one uploaded (`vero-kit prepare` checks it;
`/usr/local/bin` is the agent user's in some images, e.g. for global npm installs)."""

STAGING_ROOT = PurePosixPath("/run/vero-case")
"""The root-only staging dir of transfers in the case container (`casekit/vero-kit.c`)."""

TRANSFER_TIMEOUT_SEC = 600
"""Most one kit transfer command may take in the case container (seconds)."""

CLEAN_TIMEOUT_SEC = 120
"""Most `vero-kit end-agent` may take (seconds): it waits about 20 s at most for processes to die."""

_IDENTITY = re.compile(r"^(\d+):(\d+):([\d,]*)$")

# `vero-kit put` / `get` exit codes (casekit/vero-kit.c `transfer_exit`).
_NOT_FOUND, _DENIED, _TOO_LARGE, _OS_ERROR = 2, 3, 4, 5

CLEAN_FINDINGS = (
    "agent_user_root",
    "leftover_processes_killed",
    "verifier_entries_removed",
    "log_entries_removed",
    "log_modes_fixed",
    "tests_path_removed",
    "logs_dir_protected",
)
"""What `vero-kit end-agent` reports, one count each."""


@dataclass(frozen=True)
class CaseIdentity:
    """The case agent user, as the kernel sees it when Harbor runs a command as that user.

    Attributes:
        uid: its user id.
        gid: its primary group id.
        groups: its supplementary group ids.
    """

    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    @property
    def root(self) -> bool:
        """Whether the agent user is root (then a candidate agent owns the case container)."""
        return self.uid == 0

    @property
    def argument(self) -> str:
        """`UID:GID:G1,G2,...`, the kit's `--as` argument."""
        return f"{self.uid}:{self.gid}:{','.join(str(g) for g in self.groups)}"


def _output(result: ExecResult) -> str:
    return f"{result.stdout or ''}\n{result.stderr or ''}"


def _kit_message(result: ExecResult) -> str:
    """The kit's own last message (`vero-kit: ...`), cut to 300 characters."""
    lines = [line for line in _output(result).splitlines() if line.startswith("vero-kit: ")]
    return lines[-1][len("vero-kit: ") :][-300:] if lines else f"exit {result.return_code}"


def clean_findings(stdout: str) -> dict[str, int]:
    """The counts `vero-kit end-agent` printed (`name count` lines; unknown names ignored)."""
    found: dict[str, int] = {}
    for line in stdout.splitlines():
        name, _, value = line.strip().partition(" ")
        if name in CLEAN_FINDINGS and value.isdigit():
            found[name] = int(value)
    return found


class AgentCase:
    """The case container of one `kind: agent` trial (see the module docstring).

    Args:
        environment: the trial's environment, in Harbor's agent phase (its default user is the
            case's agent user).
        kit: host path of the static case kit (`vero.harbor.casekit.kit_binary`).
        scratch: a private host dir of the trusted side (the candidate cannot reach it) for the
            host ends of transfers.
        max_transfer_bytes: most file data one transfer carries.
    """

    def __init__(self, environment: BaseEnvironment, kit: Path, scratch: Path, max_transfer_bytes: int) -> None:
        self.environment = environment
        self.kit = kit
        self.scratch = scratch
        self.max_transfer_bytes = max_transfer_bytes
        self.identity: CaseIdentity | None = None

    async def _root(self, command: str, timeout_sec: int = TRANSFER_TIMEOUT_SEC) -> ExecResult:
        return await self.environment.exec(command, user="root", timeout_sec=timeout_sec)

    @staticmethod
    def _kit(*args: str) -> str:
        return " ".join(shlex.quote(a) for a in (str(KIT_PATH_IN_AGENT_CASE), *args))

    def _staged(self, kind: str) -> str:
        return str(STAGING_ROOT / f"{kind}-{secrets.token_hex(8)}")

    def _host_path(self, name: str) -> Path:
        directory = self.scratch / secrets.token_hex(8)
        directory.mkdir(mode=0o700)
        return directory / name

    def _need_identity(self) -> CaseIdentity:
        if self.identity is None:
            raise RuntimeError("the case is not prepared")
        return self.identity

    async def prepare(self) -> CaseIdentity:
        """Upload the kit, create the staging dir and learn the agent user's ids. Before any
        candidate code runs.

        Raises:
            CaseKitSetupError: the kit cannot be uploaded or run, or the agent user's ids cannot be read.
        """
        from vero.harbor.install_agent import CaseKitSetupError

        kit = shlex.quote(str(KIT_PATH_IN_AGENT_CASE))
        try:
            folder = shlex.quote(str(KIT_PATH_IN_AGENT_CASE.parent))
            made = await self._root(f"mkdir -p {folder} && chown 0:0 {folder} && chmod 0711 {folder}", 120)
            if made.return_code != 0:
                raise CaseKitSetupError(f"cannot create {KIT_PATH_IN_AGENT_CASE.parent} in the case container")
            await self.environment.upload_file(self.kit, str(KIT_PATH_IN_AGENT_CASE))
            ready = await self._root(f"chown 0:0 {kit} && chmod 0755 {kit} && {self._kit('prepare')}", 120)
            if ready.return_code != 0:
                raise CaseKitSetupError(f"the case kit cannot prepare the case: {_kit_message(ready)}")
            # As the case's agent user: the environment's default user in Harbor's agent phase.
            who = await self.environment.exec(self._kit("whoami"), timeout_sec=120)
        except CaseKitSetupError:
            raise
        except Exception as exc:  # noqa: BLE001 - each Harbor environment raises its own types
            raise CaseKitSetupError(f"cannot set up the case kit ({type(exc).__name__})") from None
        match = next(
            (m for line in (who.stdout or "").splitlines() if (m := _IDENTITY.match(line.strip()))),
            None,
        )
        if who.return_code != 0 or match is None:
            raise CaseKitSetupError(f"cannot tell the case's agent user: {_kit_message(who)}")
        groups = tuple(int(g) for g in match.group(3).split(",") if g)
        self.identity = CaseIdentity(int(match.group(1)), int(match.group(2)), groups)
        return self.identity

    def _raise_for(self, result: ExecResult, path: str, verb: str) -> None:
        code = result.return_code
        if code == 0:
            return
        message = f"{verb} {path!r} as the case's agent user: {_kit_message(result)}"
        if code == _NOT_FOUND:
            raise FileNotFoundError(message)
        if code == _DENIED:
            raise PermissionError(message)
        if code == _TOO_LARGE:
            raise ValueError(f"{verb} {path!r}: larger than the transfer limit ({self.max_transfer_bytes} bytes)")
        raise OSError(message)

    async def _put(self, staged: str, target: str, name: str | None) -> None:
        identity = self._need_identity()
        options = ["--as", identity.argument, *(["--name", name] if name else [])]
        result = await self._root(self._kit("put", *options, staged, target))
        self._raise_for(result, target, "cannot write")

    async def _discard(self, staged: str) -> None:
        await self._root(self._kit("discard", staged), 120)

    async def upload_file(self, data: bytes, target: str, name: str) -> None:
        """Write `data` at `target` in the case (or `target/name` when it is a directory), as the agent user."""
        if len(data) > self.max_transfer_bytes:
            raise ValueError(f"file larger than the transfer limit ({self.max_transfer_bytes} bytes)")
        source = self._host_path("upload")
        await asyncio.to_thread(source.write_bytes, data)
        staged = self._staged("in")
        try:
            await self.environment.upload_file(source, staged)
        except BaseException:
            await self._discard(staged)
            raise
        await self._put(staged, target, name)

    async def upload_dir(self, tree: Path, target: str) -> None:
        """Merge the host dir `tree` (trusted, already bounded) into `target` in the case, as the agent user."""
        staged = self._staged("in")
        try:
            await self.environment.upload_dir(tree, staged)
        except BaseException:
            await self._discard(staged)
            raise
        await self._put(staged, target, None)

    async def _get(self, source: str) -> tuple[str, str]:
        identity = self._need_identity()
        staged = self._staged("out")
        result = await self._root(
            self._kit("get", "--as", identity.argument, "--max-bytes", str(self.max_transfer_bytes), source, staged)
        )
        self._raise_for(result, source, "cannot read")
        kind = "dir" if "dir" in (result.stdout or "").split() else "file"
        return staged, kind

    async def download_file(self, source: str) -> bytes:
        """The bytes of the regular file `source` in the case, as the agent user can read them."""
        staged, kind = await self._get(source)
        try:
            if kind != "file":
                raise IsADirectoryError(f"{source!r} is a directory")
            target = self._host_path("download")
            await self.environment.download_file(staged, target)
            if target.is_symlink() or not target.is_file():
                raise FileNotFoundError("the download produced no regular file")
            if target.stat().st_size > self.max_transfer_bytes:
                raise ValueError(f"file larger than the transfer limit ({self.max_transfer_bytes} bytes)")
            return await asyncio.to_thread(target.read_bytes)
        finally:
            await self._discard(staged)

    async def download_dir(self, source: str) -> Path:
        """A host copy of the directory `source` in the case, as the agent user can read it
        (directories and regular files only, at most `max_transfer_bytes` of data)."""
        staged, kind = await self._get(source)
        try:
            if kind != "dir":
                raise NotADirectoryError(f"{source!r} is not a directory")
            target = self._host_path("download")
            await self.environment.download_dir(staged, target)
            return target
        finally:
            await self._discard(staged)

    async def clean(self) -> dict[str, int]:
        """The clean case before the tests (module docstring); what was found, by `CLEAN_FINDINGS` name.

        Raises:
            CandidateSandboxError: the kit could not clean the case (e.g. a process survived
                SIGKILL, the log dirs could not be reset), or could not be run.
        """
        from vero.harbor.install_agent import CandidateSandboxError

        identity = self._need_identity()
        try:
            result = await self._root(self._kit("end-agent", "--as", identity.argument), CLEAN_TIMEOUT_SEC)
        except Exception as exc:  # noqa: BLE001 - each Harbor environment raises its own types
            raise CandidateSandboxError(f"the case could not be cleaned ({type(exc).__name__})") from None
        if result.return_code != 0:
            raise CandidateSandboxError(f"the case could not be cleaned: {_kit_message(result)}")
        return clean_findings(result.stdout or "")
