"""What a candidate host's uid leaves behind: found and removed when the host ends.

A candidate host runs as a throw-away uid with its own gid and no supplementary groups
(`vero.harbor.boundary.launcher`), so the only places it can create anything outside its scratch
dir are directories writable by *other* users (`/tmp`, `/var/tmp`, `/dev/shm`, `/run/lock`,
`/dev/mqueue`, any `o+w` dir of the image) and the kernel's SysV IPC namespace. Whatever it created
there is owned by its uid (it cannot chown), and it can create nothing below a dir it cannot
enter. So, after every process of the uid is dead:

1. `writable_roots` (once per process): every directory an arbitrary uid can reach (each ancestor
   `o+x`) and write (`o+w`), on a file system mounted read-write; `/proc` and `/sys` are left out
   (nothing there outlives a process) and so are read-only mounts without a read-write mount below;
2. `sweep_uid`: in each root, every entry owned by the uid is removed (a directory with everything
   below it, never following a link); a directory of another owner that is `o+w` is searched the
   same way (another host may have made one and handed it over), iteratively, so no depth a
   candidate chose can stop the sweep;
3. every SysV shared memory segment, semaphore set and message queue whose owner or creator is the
   uid (`/proc/sysvipc/*`) is removed (`IPC_RMID`) by a child that has become the uid: root in a
   container without CAP_SYS_ADMIN (Docker's default) may not remove another uid's objects.

POSIX shared memory and message queues are files in `/dev/shm` and `/dev/mqueue` (covered by 1-2).
The uid's kernel keyrings (persistent per user namespace since Linux 5.3) are cleared by the kill
that runs as the uid (`KILL_AND_CLEAR_AS_UID`); Docker's default seccomp profile refuses `keyctl`
in containers anyway. What is not swept: the contents of a world-writable *file* (a candidate can
write into it but does not own it; `writable_roots` reports such files so the launcher can warn)
and anything outside the container's own file systems and IPC namespace.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from vero.core.storage import remove_tree

__all__ = [
    "KILL_AND_CLEAR_AS_UID",
    "SweepResult",
    "WritableRoots",
    "process_writable_roots",
    "sweep_uid",
    "writable_roots",
]

logger = logging.getLogger("vero.harbor.boundary")

_PSEUDO_ROOTS = ("/proc", "/sys")
_IPC_SWEEP_TIMEOUT_SEC = 30

REMOVE_IPC_AS_UID = """\
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
me = os.getuid()
removed = failed = 0
for kind in ("shm", "sem", "msg"):
    try:
        with open("/proc/sysvipc/" + kind) as table:
            lines = table.read().splitlines()
    except OSError:
        continue
    if not lines:
        continue
    header = lines[0].split()
    owner, creator = header.index("uid"), header.index("cuid")
    for line in lines[1:]:
        fields = line.split()
        if len(fields) <= max(owner, creator) or me not in (int(fields[owner]), int(fields[creator])):
            continue
        ipc_id = int(fields[1])
        if kind == "shm":
            result = libc.shmctl(ipc_id, 0, None)
        elif kind == "sem":
            result = libc.semctl(ipc_id, 0, 0)
        else:
            result = libc.msgctl(ipc_id, 0, None)
        if result == 0:
            removed += 1
        else:
            failed += 1
print(removed, failed)
"""
"""Run as the host's uid (`python -I -c`) once none of its processes is left: removes (IPC_RMID, 0)
every SysV shared memory segment, semaphore set and message queue whose owner or creator is the uid,
and prints how many it removed and how many it could not."""

KILL_AND_CLEAR_AS_UID = """\
import os
try:
    os.kill(-1, 9)  # SIGKILL (9 on every Linux architecture)
except ProcessLookupError:
    pass
# KEYCTL_CLEAR (7) of the user (-4) and user-session (-5) keyrings: they outlive the uid's processes.
# The kernel lists every uid that owns a key in /proc/key-users ("<uid>: ..."); none listed, none to clear.
try:
    with open("/proc/key-users") as key_users:
        holds_keys = any(line.split(":", 1)[0].strip() == str(os.getuid()) for line in key_users)
except OSError:
    holds_keys = True
number = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
if holds_keys and number is not None:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    for keyring in (-4, -5):
        libc.syscall(number, 7, keyring)
"""
"""Run as the host's uid (`python -I -S -c`): kills every process of the uid but itself (kill(2) with
pid -1) and empties the uid's keyrings (keyctl(2); refused under Docker's seccomp, harmlessly) when
the kernel lists a key of the uid. It runs twice per host end, so it imports no more than it needs
and no site-packages (`-S`): per run about 45 ms of CPU with `signal` and `ctypes` imported, 21 ms
with `os` alone (measured in the sidecar image; `signal` pulls in `enum`, `platform` cost 5 ms more
before that; `os.uname().machine` is what `platform.machine()` returns)."""


@dataclass(frozen=True)
class WritableRoots:
    """Where any uid can create files (see the module docstring).

    Attributes:
        dirs: reachable, writable directories on read-write mounts.
        files: reachable regular files any uid can write (their contents are not swept).
    """

    dirs: tuple[Path, ...]
    files: tuple[Path, ...]


@dataclass(frozen=True)
class SweepResult:
    """What `sweep_uid` removed: file system entries (a directory counts once) and IPC objects."""

    entries: int
    ipc_objects: int


def _mounts(mountinfo: Path) -> tuple[set[str], set[str]]:
    """(read-only mount points, read-write mount points) from `/proc/self/mountinfo`."""
    read_only: set[str] = set()
    read_write: set[str] = set()
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return read_only, read_write
    for line in lines:
        fields = line.split()
        if len(fields) < 6:
            continue
        point = fields[4].replace("\\040", " ")
        options = fields[5].split(",")
        (read_only if "ro" in options else read_write).add(point)
    return read_only, read_write


def _pruned_mounts(read_only: set[str], read_write: set[str]) -> set[str]:
    """Read-only mount points with no read-write mount below them: nothing there is writable."""

    def below(child: str, parent: str) -> bool:
        return parent == "/" or child.startswith(parent.rstrip("/") + "/")

    return {point for point in read_only if not any(below(rw, point) and rw != point for rw in read_write)}


def writable_roots(top: Path = Path("/"), mountinfo: Path = Path("/proc/self/mountinfo")) -> WritableRoots:
    """Every directory (and regular file) under `top` that any uid can reach and write.

    Walks the tree once (no links followed), pruning directories other users cannot enter, `/proc`,
    `/sys` and read-only mounts without a read-write mount below them. Unreadable directories are
    skipped (the caller is root in the images, so there are none).
    """
    read_only, read_write = _mounts(mountinfo)
    pruned = _pruned_mounts(read_only, read_write) | set(_PSEUDO_ROOTS)
    points = sorted(read_only | read_write, key=len, reverse=True)

    def on_read_only_mount(path: str) -> bool:
        for point in points:  # the deepest mount point holding `path` decides
            if path == point or path.startswith(point.rstrip("/") + "/"):
                return point in read_only
        return False

    dirs: list[Path] = []
    files: list[Path] = []
    stack = [str(top)]
    while stack:
        path = stack.pop()
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    mode = info.st_mode
                    if stat.S_ISDIR(mode):
                        if entry.path in pruned or not mode & stat.S_IXOTH:
                            continue
                        if mode & stat.S_IWOTH and not on_read_only_mount(entry.path):
                            dirs.append(Path(entry.path))
                        stack.append(entry.path)
                    elif stat.S_ISREG(mode) and mode & stat.S_IWOTH and not on_read_only_mount(entry.path):
                        files.append(Path(entry.path))
        except OSError:
            continue
    top_info = os.stat(top, follow_symlinks=False)
    if top_info.st_mode & stat.S_IWOTH:
        dirs.insert(0, top)
    return WritableRoots(dirs=tuple(dirs), files=tuple(files))


_WALK_LOCK = threading.Lock()


def process_writable_roots() -> WritableRoots:
    """`writable_roots()` of this process's file systems, walked once per process (they are the
    container's: what the image and its mounts made writable does not change while it runs).
    World-writable regular files are logged once: a candidate can leave data in them. Thread-safe:
    hosts started together (each asks from a worker thread) wait for one walk (about 0.3 s of CPU
    in the sidecar image) instead of each walking the whole tree."""
    with _WALK_LOCK:
        return _walked_roots()


@functools.cache
def _walked_roots() -> WritableRoots:
    roots = writable_roots()
    if roots.files:
        logger.warning(
            "%d world-writable file(s) (e.g. %s): a candidate host can leave data in them for later ones",
            len(roots.files),
            roots.files[0],
        )
    return roots


def _remove_entry(path: str, is_dir: bool) -> bool:
    if is_dir:
        return remove_tree(Path(path))
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _sweep_files(uid: int, roots: tuple[Path, ...]) -> int:
    removed = 0
    seen: set[tuple[int, int]] = set()
    stack = [str(root) for root in roots]
    while stack:
        path = stack.pop()
        try:
            info = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) in seen or not stat.S_ISDIR(info.st_mode):
            continue
        seen.add((info.st_dev, info.st_ino))
        try:
            with os.scandir(path) as scan:
                entries = list(scan)
        except OSError:
            continue
        for entry in entries:
            try:
                entry_info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            is_dir = stat.S_ISDIR(entry_info.st_mode)
            if entry_info.st_uid == uid:
                if _remove_entry(entry.path, is_dir):
                    removed += 1
                else:
                    logger.warning("candidate host uid %d: %s could not be removed", uid, entry.path)
            elif is_dir and entry_info.st_mode & stat.S_IWOTH and entry_info.st_mode & stat.S_IXOTH:
                stack.append(entry.path)
    return removed


def _holds_ipc_objects(uid: int) -> bool:
    """Whether `/proc/sysvipc/{shm,sem,msg}` (world-readable) list an object whose owner or creator is
    `uid`, read the way `REMOVE_IPC_AS_UID` reads them; True when a table cannot be read or parsed,
    so that the child decides."""
    for kind in ("shm", "sem", "msg"):
        try:
            lines = Path("/proc/sysvipc", kind).read_text().splitlines()
        except FileNotFoundError:
            continue  # no SysV IPC in this kernel: nothing to remove, as the child would find
        except OSError:
            return True
        if not lines:
            continue
        header = lines[0].split()
        try:
            owner, creator = header.index("uid"), header.index("cuid")
            for line in lines[1:]:
                fields = line.split()
                if len(fields) > max(owner, creator) and uid in (int(fields[owner]), int(fields[creator])):
                    return True
        except ValueError:
            return True
    return False


def _sweep_ipc(uid: int, python: Path) -> int:
    """Remove the uid's SysV IPC objects from a child that has become the uid.

    `IPC_RMID` needs the object's owner or creator, or CAP_SYS_ADMIN (shmctl(2), semctl(2),
    msgctl(2)); Docker's default capabilities leave root in the sidecar without it, so root cannot
    remove them there. The creator's uid stays on an object whatever owner it was given (IPC_SET), so
    the uid itself can always remove what it made. The child (an interpreter start, about 20 ms of
    CPU) runs only when the tables list an object of the uid: no process of the uid is left
    (`sweep_uid`'s precondition), so none can appear after the tables were read."""
    if not _holds_ipc_objects(uid):
        return 0
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", REMOVE_IPC_AS_UID],
            user=uid,
            group=uid,
            extra_groups=[],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            cwd="/",
            timeout=_IPC_SWEEP_TIMEOUT_SEC,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as error:
        logger.warning("candidate host uid %d: SysV IPC sweep did not run: %s", uid, error)
        return 0
    try:
        removed, failed = (int(field) for field in done.stdout.split())
    except ValueError:
        logger.warning("candidate host uid %d: SysV IPC sweep failed (exit %s)", uid, done.returncode)
        return 0
    if failed:
        logger.warning("candidate host uid %d: %d SysV IPC object(s) could not be removed", uid, failed)
    return removed


def sweep_uid(uid: int, roots: WritableRoots, python: Path = Path(sys.executable)) -> SweepResult:
    """Remove everything `uid` owns in `roots.dirs` and its SysV IPC objects (see the module docstring).

    `python` is an interpreter the uid may run (the hosts' own): the IPC objects are removed by a
    child of it that has become the uid.

    Call only when no process of `uid` is left (it could otherwise create more), and never for a
    uid that trusted processes share. Errors are logged, never raised.

    Returns:
        How many file system entries and IPC objects were removed.
    """
    entries = _sweep_files(uid, roots.dirs)
    ipc = _sweep_ipc(uid, python)
    return SweepResult(entries=entries, ipc_objects=ipc)
