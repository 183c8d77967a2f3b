"""Reaping orphans where PID 1 does not: run a command under a small subreaper parent.

A process whose parent has exited is re-parented to the nearest *child subreaper* ancestor, or to
PID 1 (Linux `prctl(2)`, `PR_SET_CHILD_SUBREAPER`). Candidate hosts and nested runs leave such
orphans (a candidate's daemon, killed with its uid when its host ends, is one). In a container
whose PID 1 is an init (`init: true` in compose, as the compiled sidecar and the Docker verifier
have) they are reaped there. Where PID 1 is a keepalive that never waits (Harbor's Modal sandboxes
run `sleep infinity`), each would stay a zombie until the sandbox ends.

`run_reaped(main)` makes this process a subreaper, forks, runs `main` in the child and, in the
parent, only waits: for the child and for every orphan re-parented to it, forwarding the signals a
stopping container sends. The parent starts no thread and no event loop, so `wait()` can take
every child without stealing one from asyncio's child watcher (which lives in the child). The
child dies with the parent (`PR_SET_PDEATHSIG`): a killed parent leaves no command running.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

__all__ = ["FORWARDED_SIGNALS", "run_reaped"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
"""Signals the parent passes on to the command (what `docker stop`, a timeout or a user sends)."""


def _prctl(option: int, value: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(option, value, 0, 0, 0) == 0


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    code = getattr(exc, "exit_code", None)  # click's Exit (typer.Exit), raised by CLI commands
    if isinstance(code, int):
        return code
    traceback.print_exception(exc)
    return 1


def _run_child(
    main: Callable[[], int | None], parent: int, previous: dict, mask: set[int | signal.Signals]
) -> NoReturn:
    """The forked child: die with `parent`, take back the command's signal handlers and mask, run
    `main` and exit with its code (never returns)."""
    code = 1
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(128 + signal.SIGKILL)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        code = main() or 0
    except BaseException as exc:  # noqa: BLE001 - the child must end here, with a code
        code = _exit_code(exc)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_reaped(main: Callable[[], int | None]) -> int:
    """Run `main()` in a child while this process reaps everything re-parented to it.

    Returns:
        The child's exit code (`main`'s return value, a `SystemExit`'s or click `Exit`'s code, 1
        for another exception, shown with its traceback), or 128 + N when signal N ended it.
        Where subreapers are not available (not Linux), `main()` runs in this process.
    """
    if not sys.platform.startswith("linux") or not _prctl(_PR_SET_CHILD_SUBREAPER, 1):
        try:
            return main() or 0
        except BaseException as exc:  # noqa: BLE001 - turned into an exit code, as in the child
            return _exit_code(exc)
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    child = 0

    def forward(signum: int, _frame: object) -> None:
        if child:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

    # Before the fork: a signal that arrives while the child starts is forwarded, not fatal here.
    # They stay blocked across the fork: a handler run in the parent before `child` is assigned
    # (CPython runs handlers as a call returns, os.fork's too; the child may even have run and
    # said it is ready by then) would forward nothing, and one run in the child before its
    # handlers are restored would be dropped. Unblocked, each pending signal is handled once
    # `child` is known in the parent, and with the command's own handlers in the child.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED_SIGNALS}
    child = os.fork()
    if child == 0:
        _run_child(main, parent, previous, mask)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    status = None
    while status is None:
        try:
            pid, waited = os.wait()
        except ChildProcessError:
            break
        if pid == child:
            status = waited
    # Orphans already dead are reaped; any still running stay for PID 1 (the command is over).
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    if status is None:
        return 1
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code
