"""Starting candidate host processes as their own throw-away user, and ending them with all they spawned.

The launcher lives in the trusted process that starts a nested run (the sidecar or the verifier,
root in their images). Per nested round it listens on a Unix socket in a private directory that only
the nested `harbor` process's user can enter; the trusted `CandidateAgent` inside Harbor connects,
asks for a candidate host, and receives one end of a socket pair (`SCM_RIGHTS`) whose other end is
the host's pipe. The host runs `python -I -m vero.harbor.boundary.host` with:

- a **fresh uid and gid** (`CANDIDATE_UID_RANGE`, no passwd entry, no supplementary groups) when
  the launcher is root: it can read only what is world-readable (the interpreter, the candidate
  checkout) and write only its own scratch dir. It cannot read the cases, the job dir, the runner's
  home, the trusted state, the Docker socket, or any other process's environment
  (`/proc/<pid>/environ` needs the same uid);
- a **minimal environment**: `PATH`, `HOME`/`TMPDIR` in its scratch dir, locale, and the variables
  the caller passes (the inference gateway's URLs and this evaluation's token); nothing of the
  runner's or the trusted process's environment;
- its own session, a per-process **scratch dir** (`0700`, owned by that uid) and stderr captured
  by the launcher (root-owned file outside the scratch dir; its tail is handed back on `finish`).

Ending a host kills its process group and then every process of its uid (`kill(-1)` run as that
uid, Linux kill(2)), so daemons it detached die too, and empties the uid's keyrings; then whatever
the uid left where any user can write (`/tmp`, `/var/tmp`, `/dev/shm`, `/run/lock`, `/dev/mqueue`,
any world-writable dir of the image) and its SysV IPC objects are removed
(`vero.harbor.boundary.sweep`), and so is the scratch dir. Nothing a host leaves survives it, so
a later host (of another evaluation, partition or tier, or one given the same uid) finds nothing
of it; this holds in the sidecar and in the verifier alike. A host ends
when the agent says `finish`, when the agent's connection drops (Harbor cancelled or crashed), or
when the launcher closes at the end of the round.

A host's network is the trusted process's unless that process fences the uids
(`vero.harbor.boundary.fence`, which `vero.harbor.runner.HarborBackend` sets up around the launcher
in the sidecar and the verifier): then it reaches its evaluation's gateway listeners only. There the
launcher is also `confine`d: each host starts in a pid, ipc, mount, uts and network namespace of its
own with no capability (`vero.harbor.boundary.namespaces`), its gateway reached through a relay
whose outer end runs as its uid here, so nothing of one host reaches another through the kernel.

Without root the launcher cannot switch users: hosts run as the caller, the pipe and environment
boundaries still hold but files do not (`isolated` is False, and a warning is logged). The compiled
sidecar and verifier always run as root.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import pwd
import secrets
import shutil
import signal
import socket
import struct
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from vero.core.storage import remove_tree
from vero.harbor.boundary.sweep import (
    KILL_AND_CLEAR_AS_UID,
    WritableRoots,
    process_writable_roots,
    sweep_uid,
)

if TYPE_CHECKING:
    from vero.harbor.boundary.namespaces import HostNamespaces

__all__ = [
    "CANDIDATE_UID_RANGE",
    "CandidateHostProcess",
    "CandidateLauncher",
    "HostBinding",
    "request_candidate_host",
    "uid_in_use",
]

logger = logging.getLogger("vero.harbor.boundary")

CANDIDATE_UID_RANGE = range(52000, 60000)
"""uids (and equal gids) handed to candidate hosts: below 65536 so that user-namespaced engines
accept them, above the usual system and login users; a uid with a passwd entry or a running
process is skipped."""

_STDERR_TAIL_BYTES = 8192
_SPAWN_REQUEST = b'{"op":"spawn"}\n'
_FINISH_REQUEST = b'{"op":"finish"}\n'
_BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "HARBOR_TELEMETRY": "0",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "NO_COLOR": "1",
    "USER": "vero-candidate",
    "LOGNAME": "vero-candidate",
}


class HostBinding(Protocol):
    """Who may use an evaluation's gateway token: `vero.inference.gateway.InferenceGateway`."""

    def bind_host(self, token: str, uid: int) -> None: ...

    def release_host(self, token: str, uid: int) -> None: ...


def uid_in_use(uid: int) -> bool:
    """Whether `uid` has a passwd entry or owns a running process."""
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        pass
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry.path).st_uid == uid:
                return True
        except OSError:
            continue
    return False


def _live_processes_of(uid: int) -> int:
    """Processes of `uid` that are not zombies (a zombie can do nothing more)."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry.path).st_uid != uid:
                continue
            with open(os.path.join(entry.path, "stat"), "rb") as stat_file:
                state = stat_file.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            count += 1
    return count


async def _until_gone(uid: int, timeout_sec: float = 5.0) -> None:
    """Wait until SIGKILLed processes of `uid` are gone (delivery is asynchronous: a process in a
    system call may still finish it), so that nothing is created after the sweep."""
    deadline = asyncio.get_running_loop().time() + timeout_sec
    while await asyncio.to_thread(_live_processes_of, uid):
        if asyncio.get_running_loop().time() > deadline:
            logger.warning("candidate host uid %d: processes still alive after the kill", uid)
            return
        await asyncio.sleep(0.05)


def _tail_of(path: Path) -> str:
    """The last `_STDERR_TAIL_BYTES` of a host's stderr file, decoded ("" if it is unreadable)."""
    try:
        with open(path, "rb") as stream:
            stream.seek(0, os.SEEK_END)
            stream.seek(max(0, stream.tell() - _STDERR_TAIL_BYTES))
            return stream.read().decode(errors="replace")
    except OSError:
        return ""


@functools.cache
def _setpriv() -> str | None:
    """util-linux's `setpriv` (in every compiled image: the hosts' namespaces need it), or None."""
    return shutil.which("setpriv")


async def kill_uid(python: Path, uid: int) -> None:
    """Kill every process of `uid` and clear its keyrings, from a child that has become the uid
    (`KILL_AND_CLEAR_AS_UID`); returns once that child has exited."""
    kill = [str(python), "-I", "-S", "-c", KILL_AND_CLEAR_AS_UID]
    setpriv = _setpriv()
    identity: dict[str, Any] = {}
    if setpriv is not None:
        # The child drops to the uid itself: CPython changes a child's uid only after a full fork of
        # this process (no vfork), about 10 ms of the event loop's time per kill, two kills per host.
        argv = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *kill]
    else:
        argv, identity = kill, {"user": uid, "group": uid, "extra_groups": []}
    killer = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL, cwd="/", **identity,
    )  # fmt: skip
    await killer.wait()


@dataclass(eq=False)
class CandidateHostProcess:
    """One running candidate host, as the launcher sees it.

    Attributes:
        uid: its uid and gid (the caller's own when not isolated).
        scratch_dir: its private writable dir (`HOME`, `TMPDIR`, the candidate's logs).
        process: the host process (leader of its own session).
        pipe: the launcher's end of the host's socket pair until it is handed to the agent.
    """

    uid: int
    scratch_dir: Path
    process: asyncio.subprocess.Process
    pipe: socket.socket | None
    stderr_path: Path
    isolated: bool
    python: Path
    """The hosts' interpreter: runnable by the host's uid, so it also runs the uid-wide kill."""
    sweep_roots: WritableRoots | None = None
    """Where the uid may have left files (isolated hosts only; swept at `finish`)."""
    relay: asyncio.subprocess.Process | None = None
    """The outer end of its gateway relay (confined hosts: `vero.harbor.boundary.relay`)."""
    on_finish: Callable[[], None] | None = None
    """Called once when the host is gone (the launcher frees its uid and slot)."""
    _finished: asyncio.Event = field(default_factory=asyncio.Event)
    _tail: str = ""

    async def finish(self, grace_sec: float = 0.0) -> str:
        """End the host and everything it started, remove what its uid left and its scratch dir. Idempotent.

        Returns:
            The last bytes of its stderr (decoded; candidate output, not trusted).
        """
        if self._finished.is_set():
            return self._tail
        self._finished.set()
        try:
            if self.pipe is not None:
                self.pipe.close()
                self.pipe = None
            if grace_sec > 0 and self.process.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.process.wait(), timeout=grace_sec)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            if self.isolated:
                # Whatever left the session (setsid, double fork) still has the uid; so does the
                # outer end of a confined host's relay.
                for _ in range(2):
                    await kill_uid(self.python, self.uid)
            for process in (self.process, self.relay):
                if process is not None and process.returncode is None:
                    await process.wait()
            self._tail = _tail_of(self.stderr_path)
            await asyncio.to_thread(remove_tree, self.scratch_dir)  # any depth the candidate made
            if self.isolated and self.sweep_roots is not None:
                await _until_gone(self.uid)
                swept = await asyncio.to_thread(sweep_uid, self.uid, self.sweep_roots, self.python)
                if swept.entries or swept.ipc_objects:
                    logger.info(
                        "candidate host uid %d left %d file(s) and %d SysV IPC object(s) outside its "
                        "scratch dir: removed",
                        self.uid,
                        swept.entries,
                        swept.ipc_objects,
                    )
            with contextlib.suppress(OSError):
                self.stderr_path.unlink()
        finally:
            if self.on_finish is not None:
                self.on_finish()
        return self._tail


class CandidateLauncher:
    """Starts candidate hosts for one nested round (see the module docstring).

    Use as `async with CandidateLauncher(...) as launcher:`; pass `launcher.socket_path` to the
    nested run's `CandidateAgent` and call `spawn()` directly for the pre-flight.

    Args:
        python: the interpreter of the hosts (must be executable by any uid and see Harbor and vero).
        agent_uid: the uid allowed to connect (the nested `harbor` process's); root may always.
        env: extra variables of every host (gateway URLs and token); never the caller's environment.
        isolate: switch to a fresh uid per host; default: when this process is root (without root and
            without being asked not to, a warning says the file boundary does not hold).
        max_hosts: hosts alive at once (further requests wait), bounding what a round can start.
        on_host: called with `(uid, True)` when a host starts and `(uid, False)` once it has ended
            and its uid's leftovers are gone (the inference gateway binds the evaluation's token
            to the uids of its hosts: `InferenceGateway.bind_host`).

    `confine(namespaces)` before opening starts each host in namespaces of its own.
    """

    def __init__(
        self,
        python: Path,
        *,
        agent_uid: int | None = None,
        env: Mapping[str, str] | None = None,
        isolate: bool | None = None,
        max_hosts: int = 32,
        on_host: Callable[[int, bool], None] | None = None,
    ) -> None:
        self.python = Path(python)
        self.agent_uid = os.geteuid() if agent_uid is None else agent_uid
        self.env = dict(env or {})
        self.isolated = os.geteuid() == 0 if isolate is None else isolate
        self._asked_not_to_isolate = isolate is False
        if self.isolated and os.geteuid() != 0:
            raise PermissionError("isolating candidate hosts needs root")
        self._slots = asyncio.Semaphore(max_hosts)
        self._on_host = on_host
        self._hosts: set[CandidateHostProcess] = set()
        self._uids: set[int] = set()
        self._root: Path | None = None
        self._server_task: asyncio.Task[None] | None = None
        self._listener: socket.socket | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.site_dir: Path | None = None
        """The candidate's installed dependencies (`vero.harbor.boundary.dependencies`), given to
        hosts started from now on as `VERO_CANDIDATE_SITE` (the host adds it after Harbor)."""
        self.namespaces: HostNamespaces | None = None

    def confine(self, namespaces: HostNamespaces) -> CandidateLauncher:
        """Start each host in namespaces of its own (`vero.harbor.boundary.namespaces`); call before
        opening, which then tries them once and raises `NamespacesUnavailable` when they cannot be
        made here.

        Raises:
            PermissionError: the hosts are not isolated (namespaces are made by root, per uid).
        """
        if not self.isolated:
            raise PermissionError("confining candidate hosts needs isolated hosts (root)")
        self.namespaces = namespaces
        return self

    @property
    def socket_path(self) -> Path:
        assert self._root is not None, "the launcher is not open"
        return self._root / "sock" / "launcher"

    async def __aenter__(self) -> CandidateLauncher:
        if not self.isolated and not self._asked_not_to_isolate:
            logger.warning(
                "candidate hosts run as this process's user (not root): the file boundary "
                "between a candidate agent and the harness does not hold"
            )
        self._root = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="vero-cand-"))
        os.chmod(self._root, 0o711)  # hosts traverse to their own scratch dir, never list
        sock_dir = self._root / "sock"
        sock_dir.mkdir(mode=0o700)
        if os.geteuid() == 0 and self.agent_uid != 0:
            os.chown(sock_dir, self.agent_uid, -1)
        (self._root / "stderr").mkdir(mode=0o700)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        if os.geteuid() == 0 and self.agent_uid != 0:
            os.chown(self.socket_path, self.agent_uid, -1)
        os.chmod(self.socket_path, 0o600)
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        if self.namespaces is not None:
            try:
                await self._try_namespaces(self.namespaces)
            except BaseException:
                await self.close()
                raise
        self._server_task = asyncio.create_task(self._serve(), name="vero-candidate-launcher")
        return self

    async def _try_namespaces(self, namespaces: HostNamespaces) -> None:
        """`HostNamespaces.check` as a free uid, before any host is asked for.

        Raises:
            NamespacesUnavailable: the namespaces cannot be made here, with the cause.
        """
        assert self._root is not None
        uid = await asyncio.to_thread(self._allocate_uid)
        probe = self._root / f"probe-{uid}"
        try:
            probe.mkdir(mode=0o700)
            os.chown(probe, uid, uid)
            await namespaces.check(self.python, uid, probe)
        finally:
            remove_tree(probe)
            self._uids.discard(uid)

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop accepting, end every host (and all they started), remove the launcher's dirs."""
        if self._server_task is not None:
            self._server_task.cancel()
            await asyncio.gather(self._server_task, return_exceptions=True)
            self._server_task = None
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await asyncio.gather(*(host.finish() for host in list(self._hosts)), return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._root is not None:
            await asyncio.to_thread(remove_tree, self._root)
            self._root = None

    def _allocate_uid(self) -> int:
        if not self.isolated:
            return os.geteuid()
        for _ in range(64):
            uid = CANDIDATE_UID_RANGE.start + secrets.randbelow(len(CANDIDATE_UID_RANGE))
            if uid not in self._uids and not uid_in_use(uid):
                self._uids.add(uid)
                return uid
        raise RuntimeError("no free uid for a candidate host")

    async def spawn(self) -> CandidateHostProcess:
        """Start one candidate host; the caller must `finish()` it (the launcher does at close).

        Raises:
            OSError: the interpreter cannot be started as the host's uid.
            RuntimeError: the launcher is not open, or no free uid was found.
        """
        if self._root is None:
            raise RuntimeError("the launcher is not open")
        await self._slots.acquire()
        try:
            sweep_roots = await asyncio.to_thread(process_writable_roots) if self.isolated else None
            uid = await asyncio.to_thread(self._allocate_uid)
            scratch = self._root / f"host-{uid}-{secrets.token_hex(4)}"
            scratch.mkdir(mode=0o700)
            (scratch / "tmp").mkdir(mode=0o700)
            if self.isolated:
                for path in (scratch, scratch / "tmp"):
                    os.chown(path, uid, uid)
            stderr_path = self._root / "stderr" / f"{scratch.name}.log"
            parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            argv, env, identity = self._host_command(uid, scratch, child_end.fileno())
            relay = None
            try:
                relay = await self._start_relay(uid, scratch)
                with open(stderr_path, "wb") as stderr:
                    process = await asyncio.create_subprocess_exec(
                        *argv,
                        stdin=asyncio.subprocess.DEVNULL,
                        stdout=stderr,
                        stderr=stderr,
                        pass_fds=(child_end.fileno(),),
                        cwd=str(scratch),
                        env=env,
                        start_new_session=True,
                        **identity,
                    )
            except BaseException:
                parent_end.close()
                if self.isolated:
                    await kill_uid(self.python, uid)  # a relay started before the host
                remove_tree(scratch)
                self._uids.discard(uid)
                raise
            finally:
                child_end.close()
        except BaseException:
            self._slots.release()
            raise
        host = CandidateHostProcess(
            uid=uid,
            scratch_dir=scratch,
            process=process,
            pipe=parent_end,
            stderr_path=stderr_path,
            isolated=self.isolated,
            python=self.python,
            sweep_roots=sweep_roots,
            relay=relay,
        )

        def release() -> None:
            self._hosts.discard(host)
            self._uids.discard(uid)
            self._slots.release()
            if self._on_host is not None:
                self._on_host(uid, False)

        host.on_finish = release
        self._hosts.add(host)
        if self._on_host is not None:
            self._on_host(uid, True)
        return host

    def _host_command(self, uid: int, scratch: Path, pipe_fd: int) -> tuple[list[str], dict[str, str], dict[str, Any]]:
        """A host's argv, environment and the identity to start it with (`spawn`)."""
        env = {
            **_BASE_ENV,
            "HOME": str(scratch),
            "TMPDIR": str(scratch / "tmp"),
            "VERO_CANDIDATE_SCRATCH": str(scratch),
            **self.env,
            **({"VERO_CANDIDATE_SITE": str(self.site_dir)} if self.site_dir is not None else {}),
        }
        argv = [str(self.python), "-I", "-m", "vero.harbor.boundary.host", str(pipe_fd)]
        if self.namespaces is not None:
            # Root starts the namespaces; the trusted step inside drops to the uid (setpriv).
            site = () if self.site_dir is None else (self.site_dir,)
            command = self.namespaces.command(self.python, uid, scratch, argv, site)
            return command, self.namespaces.host_env(env), {}
        identity: dict[str, Any] = {"user": uid, "group": uid, "extra_groups": []} if self.isolated else {}
        return argv, env, identity

    async def _start_relay(self, uid: int, scratch: Path) -> asyncio.subprocess.Process | None:
        """The outer end of a confined host's gateway relay, as its uid, in this network namespace."""
        argv = None if self.namespaces is None else self.namespaces.relay_command(self.python, scratch)
        if argv is None:
            return None
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            cwd="/",
            env={"PATH": _BASE_ENV["PATH"], "LANG": "C.UTF-8"},
            start_new_session=True,
            user=uid,
            group=uid,
            extra_groups=[],
        )  # ended with the uid (`CandidateHostProcess.finish`)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            connection, _ = await loop.sock_accept(self._listener)
            task = asyncio.create_task(self._handle(connection))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _handle(self, connection: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        host: CandidateHostProcess | None = None
        try:
            _pid, uid, _gid = struct.unpack(
                "3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            )
            if uid not in (0, self.agent_uid, os.geteuid()):
                logger.warning("candidate launcher: refused a connection from uid %d", uid)
                return
            request = await _read_line(loop, connection)
            if request != _SPAWN_REQUEST:
                return
            try:
                host = await self.spawn()
            except (OSError, RuntimeError) as exc:
                logger.warning("candidate launcher: cannot start a candidate host (%s)", type(exc).__name__)
                await loop.sock_sendall(connection, b'{"op":"unavailable"}\n')
                return
            assert host.pipe is not None
            reply = (
                json.dumps(
                    {"op": "spawned", "scratch": str(host.scratch_dir), "uid": host.uid, "isolated": host.isolated}
                ).encode()
                + b"\n"
            )
            # The pipe travels with the reply (SCM_RIGHTS); it is a few bytes, sent at once.
            socket.send_fds(connection, [reply], [host.pipe.fileno()])
            host.pipe.close()
            host.pipe = None
            request = await _read_line(loop, connection)
            tail = await host.finish(grace_sec=2.0 if request == _FINISH_REQUEST else 0.0)
            if request == _FINISH_REQUEST:
                with contextlib.suppress(OSError):
                    await loop.sock_sendall(
                        connection, json.dumps({"op": "finished", "stderr_tail": tail}).encode() + b"\n"
                    )
        except OSError:
            pass
        finally:
            if host is not None:
                await host.finish()
            connection.close()


async def _read_line(loop: asyncio.AbstractEventLoop, connection: socket.socket, limit: int = 4096) -> bytes:
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = await loop.sock_recv(connection, limit - len(data))
        if not chunk:
            break
        data += chunk
    return data


def request_candidate_host(socket_path: Path) -> tuple[socket.socket, socket.socket, dict]:
    """Ask the launcher at `socket_path` for a candidate host (blocking; run it in a thread).

    Returns:
        `(launcher connection, host pipe, reply)`: keep the connection open while the host is in
        use; send `finish` (or close it) to end the host.

    Raises:
        OSError: the launcher is unreachable or has no host to give.
    """
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.settimeout(60)
        connection.connect(str(socket_path))
        connection.sendall(_SPAWN_REQUEST)
        message, fds, _, _ = socket.recv_fds(connection, 4096, 1)
        reply = json.loads(message.decode() or "{}")
        if reply.get("op") != "spawned" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise ConnectionError("the candidate launcher has no host to give")
        connection.settimeout(None)
        return connection, socket.socket(fileno=fds[0]), reply
    except BaseException:
        connection.close()
        raise


def finish_candidate_host(connection: socket.socket, timeout_sec: float = 30.0) -> str:
    """Tell the launcher the host is done and wait until it is gone (blocking).

    Returns:
        The tail of the host's stderr (untrusted text), or "" if the launcher did not answer.
    """
    try:
        connection.settimeout(timeout_sec)
        connection.sendall(_FINISH_REQUEST)
        data = b""
        while not data.endswith(b"\n") and len(data) < 65536:
            chunk = connection.recv(65536)
            if not chunk:
                break
            data += chunk
        return str(json.loads(data.decode() or "{}").get("stderr_tail", ""))
    except (OSError, ValueError):
        return ""
    finally:
        connection.close()
