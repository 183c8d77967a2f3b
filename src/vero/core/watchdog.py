"""One thread for the time limits of every child process vero waits on synchronously.

`threading.Timer` per command started a thread per git process: under a burst of admissions (64
imports of 10 processes each, 6 at a time) starting those threads was a tenth of the sidecar's GIL
time (py-spy), and `Popen.communicate(timeout=)` waits by polling with sleeps instead. A
`Watchdog` keeps the deadlines in a heap and one daemon thread sleeps until the nearest; arming
and disarming take a lock and push or mark one entry.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable

__all__ = ["WATCHDOG", "Watchdog"]


class Watchdog:
    """Run an action at a deadline unless disarmed first.

    Actions run on the watchdog's thread while it holds its lock, one at a time, so they must be
    short (sending a signal): once `disarm` returns, the entry's action has either run or never
    will.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._deadlines: list[tuple[float, int, Callable[[], None]]] = []
        self._armed: set[int] = set()
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, timeout_sec: float, action: Callable[[], None]) -> int:
        """Run `action` `timeout_sec` seconds from now (monotonic clock); returns the key to disarm it."""
        deadline = time.monotonic() + timeout_sec
        with self._condition:
            key = next(self._keys)
            heapq.heappush(self._deadlines, (deadline, key, action))
            self._armed.add(key)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="vero-watchdog", daemon=True)
                self._thread.start()
            elif self._deadlines[0][1] == key:
                self._condition.notify()  # the thread sleeps until a later deadline
        return key

    def disarm(self, key: int) -> None:
        """Cancel the entry `key` (nothing if its action ran already)."""
        with self._condition:
            self._armed.discard(key)  # its heap entry is dropped when it comes to the top

    def _run(self) -> None:
        with self._condition:
            while True:
                while self._deadlines and self._deadlines[0][1] not in self._armed:
                    heapq.heappop(self._deadlines)
                if not self._deadlines:
                    self._condition.wait()
                    continue
                deadline, key, action = self._deadlines[0]
                delay = deadline - time.monotonic()
                if delay > 0:
                    self._condition.wait(delay)
                    continue
                heapq.heappop(self._deadlines)
                self._armed.discard(key)
                try:
                    action()
                except Exception:  # noqa: BLE001 - one action's failure must not stop the others' limits
                    pass


WATCHDOG = Watchdog()
"""The process's watchdog (its thread starts with the first deadline)."""
