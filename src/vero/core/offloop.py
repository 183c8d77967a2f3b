"""Serialized, cancellation-proof work off the event loop (state store commits, candidate imports).

`run_to_completion` is the one wait that survives cancellation; the candidate store's imports and
`vero.core.storage`'s async writes use it directly. The state store (`vero.core.state`) runs every
transaction through `SerialCommits`: one function, run in a worker thread, that begins, changes and
commits (or rolls back). It runs to completion even when the awaiting coroutine is cancelled (the
cancellation is delivered afterwards), so no transaction is left half done. Two locks order the commits:

- a per-event-loop `asyncio.Lock` keeps at most one commit per loop queued on the default executor,
  so a burst of requests cannot occupy every worker thread;
- a `threading.Lock` taken inside the worker makes the compute-write-apply step atomic even when
  the same store is used from several event loops (tests create a new loop per `asyncio.run`).

`GroupedCommits` keeps both properties and adds group commit: what is queued while one group runs
goes to the worker as the next group, which the state store runs as one transaction (one durable
write for all of them instead of one each).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["GroupedCommits", "LoopLocalLock", "SerialCommits", "finish_uncancellable", "run_to_completion"]


class LoopLocalLock:
    """An `asyncio.Lock` per running event loop, created lazily.

    An `asyncio.Lock` binds to the loop that first waits on it and then fails on any other loop;
    keeping one per loop (weakly keyed, so closed loops are dropped) lets one store object live
    across several `asyncio.run` calls.
    """

    def __init__(self) -> None:
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
        self._guard = threading.Lock()

    def get(self) -> asyncio.Lock:
        """The lock of the running loop. Raises RuntimeError outside a running loop."""
        loop = asyncio.get_running_loop()
        with self._guard:
            lock = self._locks.get(loop)
            if lock is None:
                lock = self._locks[loop] = asyncio.Lock()
            return lock


async def finish_uncancellable[T](awaitable: Awaitable[T], on_cancel: Callable[[], None] | None = None) -> T:
    """Await `awaitable` to completion even if the caller is cancelled meanwhile, any number of times.

    Cleanup and commits that must happen (killing a process group, removing containers, a state
    transaction) go through here, so a cancellation cannot cut them short (docs/trust-model.md
    "cleanup survives cancellation").

    Args:
        awaitable: the work; it runs to completion whatever happens to the caller.
        on_cancel: called once, on the loop, when the caller is first cancelled (e.g. to ask the
            work to stop early at its next step); the wait goes on afterwards.

    Returns:
        What `awaitable` returned.

    Raises:
        asyncio.CancelledError: the caller was cancelled; the work has finished by then (its own
            result or exception is discarded, so the work must leave consistent state).
        Exception: whatever the work raised, when the caller was not cancelled.
    """
    task = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if on_cancel is not None and not task.done():
            on_cancel()
        # Repeated cancellations must not cut the wait short: leaving early would, e.g., release
        # the caller's asyncio lock while a commit is still running.
        while not task.done():
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError:
                continue
        if not task.cancelled():
            task.exception()  # mark retrieved; the caller's cancellation wins
        raise


async def run_to_completion[T](func: Callable[[], T], on_cancel: Callable[[], None] | None = None) -> T:
    """Run `func` in a worker thread and wait for it even if the caller is cancelled
    (`finish_uncancellable` of `asyncio.to_thread(func)`; same arguments and errors)."""
    return await finish_uncancellable(asyncio.to_thread(func), on_cancel)


class SerialCommits:
    """The two locks of the module docstring around `run_to_completion`: one commit at a time.

    A store creates one and runs every mutation through `run`; the function it passes does the
    compute-write-apply step and is never interrupted half-way.
    """

    def __init__(self) -> None:
        self._loop_lock = LoopLocalLock()
        self._thread_lock = threading.Lock()

    async def run[T](self, func: Callable[[], T]) -> T:
        """Run `func` in a worker thread after every earlier commit, to completion.

        Returns and raises as `run_to_completion`.
        """

        def locked() -> T:
            with self._thread_lock:
                return func()

        async with self._loop_lock.get():
            return await run_to_completion(locked)

    def run_sync[T](self, func: Callable[[], T]) -> T:
        """Run `func` in the calling thread after every earlier commit (startup, tools, tests).

        Never call it from a running event loop's thread while that loop has a commit in flight.
        """
        with self._thread_lock:
            return func()


Outcome = tuple[bool, Any]
"""(True, what an item returned) or (False, the exception it raised)."""


class _LoopGroups:
    """One event loop's queue of `GroupedCommits` items and the task that runs them."""

    def __init__(self) -> None:
        self.pending: list[tuple[Any, asyncio.Future[Any]]] = []
        self.runner: asyncio.Task[None] | None = None


class GroupedCommits[C]:
    """Group commit: items queued while a group runs form the next group, run in one call.

    `run_group(items)` runs in a worker thread (holding the thread lock) and returns one `Outcome`
    per item, in order. Each awaiting caller gets its item's result or exception once the whole
    group is done; a caller cancelled meanwhile still has its item run (the cancellation is
    raised afterwards), as with `SerialCommits`. At most one group per event loop is on the default
    executor at a time.
    """

    def __init__(self, run_group: Callable[[list[C]], list[Outcome]]) -> None:
        self._run_group = run_group
        self._thread_lock = threading.Lock()
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopGroups] = weakref.WeakKeyDictionary()
        self._guard = threading.Lock()

    async def run(self, item: C) -> Any:
        """Queue `item` and wait for its outcome (its return value, or its exception raised)."""
        loop = asyncio.get_running_loop()
        with self._guard:
            groups = self._loops.get(loop)
            if groups is None:
                groups = self._loops[loop] = _LoopGroups()
        future: asyncio.Future[Any] = loop.create_future()
        groups.pending.append((item, future))
        if groups.runner is None or groups.runner.done():
            groups.runner = loop.create_task(self._run_groups(groups))
        return await finish_uncancellable(future)

    def run_sync[T](self, func: Callable[[], T]) -> T:
        """Run `func` in the calling thread between groups (startup, tools, tests)."""
        with self._thread_lock:
            return func()

    def _locked(self, items: list[C]) -> list[Outcome]:
        with self._thread_lock:
            return self._run_group(items)

    async def _run_groups(self, groups: _LoopGroups) -> None:
        # Not cut short by a cancellation (the loop shutting down): every queued item is run and
        # every waiter answered first, then the cancellation is raised.
        cancelled = False
        while groups.pending:
            batch, groups.pending = groups.pending, []
            work = asyncio.get_running_loop().run_in_executor(None, self._locked, [item for item, _ in batch])
            while not work.done():
                try:
                    await asyncio.wait([work])
                except asyncio.CancelledError:
                    cancelled = True
            error = work.exception() if not work.cancelled() else asyncio.CancelledError()
            outcomes: list[Outcome] = [(False, error)] * len(batch) if error is not None else work.result()
            for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                if not future.done():
                    future.set_result(value) if ok else future.set_exception(value)
        if cancelled:
            raise asyncio.CancelledError
