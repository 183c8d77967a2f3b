"""`PartitionGate`: evaluations of different partitions never run at the same time.

For `kind: agent` targets every evaluation's candidate hosts run in the sidecar's own container
(`vero.harbor.boundary`), as throw-away uids that share its loopback network, its `/proc` and its
world-writable dirs while they live. Two hosts alive at once could talk (a socket, a file, a
process title), so a candidate evaluated on a `none` or `aggregate` partition could hand what it
saw of its cases to one evaluated on a `full` partition, whose artifacts the agent reads. What a
host leaves behind is swept when it ends (`vero.harbor.boundary.sweep`); this gate keeps hosts of
different partitions from ever being alive together. Evaluations of one partition share a tier
and a case set, so they may run together.

First come, first served: a job waits for the gate when another partition holds it or when a job
admitted earlier is already waiting, so a stream of one partition's jobs cannot starve another's.
Waiting never charges anything; the seal's drain and cancellation work as for a queued job.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

__all__ = ["PartitionGate"]


class PartitionGate:
    """Admits jobs of one partition at a time (any number of them), in arrival order."""

    def __init__(self) -> None:
        self._partition: str | None = None
        self._inside = 0
        self._waiting: collections.deque[tuple[str, asyncio.Future[None]]] = collections.deque()

    @property
    def partition(self) -> str | None:
        """The partition whose jobs hold the gate, None when it is free."""
        return self._partition

    def would_wait(self, partition: str) -> bool:
        """Whether `enter(partition)` would wait now."""
        return bool(self._waiting) or (self._inside > 0 and self._partition != partition)

    @contextlib.asynccontextmanager
    async def enter(self, partition: str) -> AsyncIterator[None]:
        """Hold the gate for `partition` for the duration of the block (waiting for it first)."""
        if not self.would_wait(partition):
            self._admit(partition)
        else:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append((partition, future))
            try:
                await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    self._leave()  # admitted just as it was cancelled: give the place back
                else:
                    with contextlib.suppress(ValueError):
                        self._waiting.remove((partition, future))
                    self._wake()
                raise
        try:
            yield
        finally:
            self._leave()

    def _admit(self, partition: str) -> None:
        self._partition = partition
        self._inside += 1

    def _leave(self) -> None:
        self._inside -= 1
        if self._inside == 0:
            self._partition = None
        self._wake()

    def _wake(self) -> None:
        # The head of the queue goes in when the gate is free or its partition holds it, and with
        # it every job of that partition queued right behind it.
        while self._waiting:
            partition, future = self._waiting[0]
            if future.done():
                self._waiting.popleft()
                continue
            if self._inside and self._partition != partition:
                return
            self._waiting.popleft()
            self._admit(partition)
            future.set_result(None)
