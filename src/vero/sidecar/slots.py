"""The sidecar's evaluation slots: which are free, handed out warm first, and their warm-up.

Each slot is a persistent work tree (`SidecarPaths.slot_tree`) that `CandidateStore.update_worktree`
brings to a job's candidate, writing only the files that differ from what it held. A *cold* slot
(never written, an update cut short, or not sealed in this boot: the machine restarted since, see
`vero.core.worktree_seal`) is written whole: on a 50,000-file target that is seconds, against a
fraction of a second for a warm one. So at start (`JobRunner.warm_up`) every cold slot is brought to
the baseline in the background, one at a time, in a thread of lower CPU priority (nice 10,
inherited by its git child), and a job takes a free warm slot before a cold one.

Every slot is its own checkout from the candidate store (no file shared with another slot, such as
by hard links): a candidate that writes through its slot cannot change what another slot holds, and
the next update of its own slot restores the tree's bytes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from vero.core.offloop import finish_uncancellable

__all__ = ["WARM_UP_NICE", "SlotPool", "warm_slots"]

_logger = logging.getLogger("vero.sidecar")

WARM_UP_NICE = 10
"""Nice increment of the warm-up's thread (and its git child): admissions and jobs go first."""


class SlotPool:
    """The free evaluation slots `0 .. count - 1`; `acquire` hands out a warm one before a cold one.

    Used on one event loop. Like an `asyncio.Queue` of slots: `acquire` waits while none is free
    (waiters are woken first come first served), `release` gives one back.

    Args:
        count: number of slots (>= 1).
        is_warm: whether a slot's work tree holds an indexed tree, sealed in this boot (then an
            update writes only the files that differ: `CandidateStore.warm_tree`); asked at
            creation and on every release.
    """

    def __init__(self, count: int, is_warm: Callable[[int], bool]) -> None:
        self._is_warm = is_warm
        self._free = list(range(count))
        self._warm = {slot for slot in self._free if is_warm(slot)}
        self._waiters: deque[asyncio.Future[None]] = deque()

    def empty(self) -> bool:
        """Whether every slot is taken (an `acquire` now would wait)."""
        return not self._free

    def warm(self) -> frozenset[int]:
        """The slots known to be warm (taken ones included)."""
        return frozenset(self._warm)

    async def acquire(self) -> int:
        """A free slot, warm first, then the lowest number; waits while none is free."""
        while not self._free:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cancelled: the next waiter gets the slot instead
                raise
        slot = min(self._free, key=lambda s: (s not in self._warm, s))
        self._free.remove(slot)
        return slot

    def take_cold(self, skip: set[int]) -> int | None:
        """A free cold slot not in `skip`, taken without waiting (the warm-up's), or None."""
        cold = [slot for slot in self._free if slot not in self._warm and slot not in skip]
        if not cold:
            return None
        slot = min(cold)
        self._free.remove(slot)
        return slot

    def release(self, slot: int) -> None:
        """Give `slot` back (its warmth asked again: an update that failed leaves it cold)."""
        if self._is_warm(slot):
            self._warm.add(slot)
        else:
            self._warm.discard(slot)
        self._free.append(slot)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def _lower_priority() -> None:
    # The nice value is per thread on Linux (setpriority(2)) and a forked child inherits it.
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WARM_UP_NICE)
    except OSError:
        pass  # no such per-thread priority here: the warm-up runs at the normal one


async def warm_slots(pool: SlotPool, warm: Callable[[int], object]) -> list[int]:
    """Bring every cold free slot to the baseline with `warm(slot)`, one after another.

    Each slot is taken from `pool` while it is written and released afterwards; a slot a job has
    taken meanwhile is the job's to write. `warm` runs in a thread of lower priority; a failure
    leaves its slot cold (logged; a job writes it whole) and the warm-up goes on with the others.

    Returns:
        The slots warmed, in order.

    Raises:
        asyncio.CancelledError: cancelled; a slot being written is finished first and released
            (its thread cannot be stopped half-way, and a half-written slot stays cold anyway).
    """
    warmed: list[int] = []
    tried: set[int] = set()
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(1, thread_name_prefix="vero-slot-warm-up", initializer=_lower_priority)
    try:
        while (slot := pool.take_cold(tried)) is not None:
            tried.add(slot)
            try:
                await finish_uncancellable(loop.run_in_executor(executor, warm, slot))
                warmed.append(slot)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _logger.warning(
                    "slot %d not warmed (%s): its first job writes it whole", slot, type(exc).__name__, exc_info=exc
                )
            finally:
                pool.release(slot)
    finally:
        executor.shutdown(wait=False)  # idle by now: its one call was waited for
    return warmed
