"""Running a nested `harbor` process: own process group, optional unprivileged user, group kill.
What a killed run leaves in Docker or Modal is `vero.harbor.leftovers`' to remove.

- `runner_identity` resolves the unprivileged user nested runs take when the caller is root
  (the sidecar's and the verifier's `vero-runner`, with the Docker socket's group).
- The child starts a new session (`start_new_session=True`), so it and everything it spawns
  (`docker compose`, candidate subprocesses) share one process group that can be signalled at once.
- When the caller is root and a `RunAs` is given, the child runs with that uid, gid and
  supplementary groups (e.g. the Docker socket's group) via `asyncio.create_subprocess_exec`'s
  `user=`/`group=`/`extra_groups=`; when the caller is not root it cannot switch and runs as itself.
- On timeout or cancellation the group gets SIGTERM (Harbor turns it into `KeyboardInterrupt` and
  starts tearing its trials down, `cli/jobs.py` `_handle_sigterm`), then SIGKILL after a grace
  period (at once when the caller is stopping: `hurry`), and SIGKILL again once the leader is gone
  so no straggler survives.
- Only the last `tail_bytes` of the merged stdout/stderr are kept, with secret values scrubbed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vero.core.offloop import finish_uncancellable
from vero.core.run import RunAs
from vero.errors import InfrastructureFailure
from vero.harbor.command import scrub

__all__ = [
    "DOCKER_SOCKET",
    "RUNNER_USER",
    "ProcessOutcome",
    "finish_uncancellable",
    "run_process_group",
    "runner_identity",
]

logger = logging.getLogger(__name__)

_READ_CHUNK_BYTES = 65536

RUNNER_USER = "vero-runner"
"""The unprivileged user the sidecar and verifier images create for nested runs."""

DOCKER_SOCKET = Path("/var/run/docker.sock")
"""Where the compiled task's compose files mount the engine's socket (`/run/docker.sock:/var/run/docker.sock:ro`)."""


def runner_identity(user: str = RUNNER_USER, docker_socket: Path = DOCKER_SOCKET) -> RunAs | None:
    """The identity nested runs take: None unless this process is root.

    Args:
        user: the unprivileged account (`vero-runner` in the sidecar and verifier images).
        docker_socket: its group (if the socket exists) becomes an extra group, so the run reaches
            the engine without root.

    Raises:
        InfrastructureFailure: running as root but `user` does not exist (candidate code must never
            run as root; each caller decides whether that refuses a start or only a measurement).
    """
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise InfrastructureFailure(
            f"this process runs as root but the unprivileged user {user!r} does not exist"
        ) from None
    extra: tuple[int, ...] = ()
    try:
        gid = os.stat(docker_socket).st_gid
        if gid != entry.pw_gid:
            extra = (gid,)
    except OSError:
        pass
    return RunAs(uid=entry.pw_uid, gid=entry.pw_gid, extra_groups=extra, home=Path(entry.pw_dir))


@dataclass(frozen=True)
class ProcessOutcome:
    """How a nested process ended.

    Attributes:
        returncode: the exit status (negative: killed by that signal); None if it never exited.
        timed_out: the wall-clock limit passed and the group was killed.
        output_tail: the last bytes of merged stdout/stderr, decoded, secrets scrubbed.
        duration_sec: wall-clock seconds from start to exit.
    """

    returncode: int | None
    timed_out: bool
    output_tail: str
    duration_sec: float


def _signal_group(pgid: int, signum: int) -> bool:
    try:
        os.killpg(pgid, signum)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        logger.warning("not permitted to signal process group %d", pgid)
        return False


_HURRY_POLL_SEC = 0.1


async def _kill_group(
    process: asyncio.subprocess.Process, pgid: int, grace_sec: float, hurry: Callable[[], bool] | None = None
) -> None:
    if process.returncode is None:
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_sec
        while process.returncode is None and not (hurry is not None and hurry()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(process.wait(), timeout=min(remaining, _HURRY_POLL_SEC))
            except TimeoutError:
                pass
    # Whatever of the group is still alive (the leader or children it left) goes now.
    _signal_group(pgid, signal.SIGKILL)
    if process.returncode is None:
        await process.wait()


class _Tail:
    def __init__(self, limit_bytes: int, secrets: Sequence[str]):
        self.limit_bytes = limit_bytes
        # Keep a margin so a secret cut by the window edge is still whole when scrubbed.
        self.keep_bytes = limit_bytes + max((len(s.encode()) for s in secrets), default=0) + 16
        self.secrets = secrets
        self.buffer = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        if len(self.buffer) > self.keep_bytes:
            del self.buffer[: len(self.buffer) - self.keep_bytes]

    def text(self) -> str:
        text = scrub(self.buffer.decode(errors="replace"), self.secrets)
        encoded = text.encode()
        if len(encoded) > self.limit_bytes:
            text = encoded[-self.limit_bytes :].decode(errors="replace")
        return text


async def _drain(stream: asyncio.StreamReader, tail: _Tail) -> None:
    while chunk := await stream.read(_READ_CHUNK_BYTES):
        tail.feed(chunk)


async def _start(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    identity: tuple[int | None, int | None, list[int] | None],
) -> tuple[asyncio.subprocess.Process, asyncio.ReadTransport, asyncio.StreamReader]:
    """Start the process in a session of its own, its merged output on a pipe read by the loop.

    `identity`: (user, group, extra groups) to switch to, each None to keep the caller's."""
    user, group, extra_groups = identity
    # Our own pipe, not `stdout=PIPE`: on Python 3.12 `Process.wait()` returns only once every
    # transport pipe is closed, so a grandchild holding stdout would hide the leader's exit.
    read_fd, write_fd = os.pipe()
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            env=dict(env),
            cwd=str(cwd),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=write_fd,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            user=user,
            group=group,
            extra_groups=extra_groups,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), os.fdopen(read_fd, "rb", 0)
        )
    except BaseException:
        _signal_group(process.pid, signal.SIGKILL)
        raise
    return process, transport, reader


async def _abandon(start: asyncio.Future, grace_sec: float, hurry: Callable[[], bool] | None) -> None:
    """The caller was cancelled while `start` ran: once it has, kill the group it started."""
    try:
        process, transport, _ = await start
    except Exception:  # noqa: BLE001 - nothing started (the caller's cancellation is what is raised)
        return
    try:
        await _kill_group(process, process.pid, grace_sec, hurry)
    finally:
        transport.close()


async def run_process_group(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    run_as: RunAs | None = None,
    timeout_sec: float | None = None,
    kill_grace_sec: float = 15.0,
    tail_bytes: int = 4096,
    secrets: Sequence[str] = (),
    hurry: Callable[[], bool] | None = None,
) -> ProcessOutcome:
    """Run `argv` in its own process group and wait for it, at most `timeout_sec` seconds.

    Args:
        argv: executable and arguments.
        env: the complete environment (never logged).
        cwd: working directory.
        run_as: identity to switch to when the caller is root; ignored otherwise.
        timeout_sec: wall-clock limit; past it the group is killed and `timed_out` is True.
        kill_grace_sec: seconds between SIGTERM and SIGKILL.
        tail_bytes: how much of the merged output to keep.
        secrets: values scrubbed from the kept output.
        hurry: once it returns True (the caller's process is stopping), a kill waits no longer for
            the grace: SIGKILL follows SIGTERM at once (checked every 0.1 s).

    Returns:
        How the process ended.

    Raises:
        OSError: the executable could not be started (missing, not executable for `run_as`).
        asyncio.CancelledError: the caller was cancelled; the group was killed first.
    """
    user: int | None = None
    group: int | None = None
    extra_groups: list[int] | None = None
    if run_as is not None and os.geteuid() == 0:
        user, group, extra_groups = run_as.uid, run_as.gid, list(run_as.extra_groups)
    elif run_as is not None:
        logger.debug("not root: the nested run keeps the caller's identity")
    started = time.monotonic()
    # The start runs to its end even when the caller is cancelled meanwhile: cancelled halfway (in
    # `create_subprocess_exec`, which then kills the leader only, or before the try below), it left
    # the group running with no one to kill it.
    start = asyncio.ensure_future(_start(argv, env, cwd, (user, group, extra_groups)))
    try:
        process, transport, reader = await asyncio.shield(start)
    except asyncio.CancelledError:
        await finish_uncancellable(_abandon(start, kill_grace_sec, hurry))
        raise
    pgid = process.pid  # the session leader's pid is its group id
    tail = _Tail(tail_bytes, secrets)
    drain = asyncio.ensure_future(_drain(reader, tail))
    timed_out = False
    try:
        try:
            await asyncio.wait_for(process.wait(), timeout=timeout_sec)
        except TimeoutError:
            timed_out = True
            await finish_uncancellable(_kill_group(process, pgid, kill_grace_sec, hurry))
        else:
            # The leader exited; children it left in the group must not outlive the run.
            _signal_group(pgid, signal.SIGKILL)
    except asyncio.CancelledError:
        await finish_uncancellable(_kill_group(process, pgid, kill_grace_sec, hurry))
        drain.cancel()
        transport.close()
        raise
    try:
        await asyncio.wait_for(drain, timeout=5)
    except TimeoutError:
        # A grandchild that escaped the group may still hold the pipe; the tail is good enough.
        drain.cancel()
    finally:
        transport.close()
    return ProcessOutcome(
        returncode=process.returncode,
        timed_out=timed_out,
        output_tail=tail.text(),
        duration_sec=time.monotonic() - started,
    )
