"""Work that concurrent callers ask for at once, done once for all of them (a leader per batch).

64 evaluations of 64 new commits posted at once made 64 imports, each copying its commit with its
own `pack-objects | index-pack` pair (a fork and exec each, most of an import's CPU once the rest
is read by the kept `cat-file`, `vero.core.object_reader`). `Batches` lets the imports that ask
while a copy runs share the next one: the first caller of a key leads, runs the work for every
request queued under that key, and hands the lead to the first request that arrived meanwhile.
No caller waits for more than the batch its request is in (a leader never serves later arrivals),
and a batch that fails is redone by each of its callers alone, so one bad request (a hostile
commit the store refuses) fails only itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

_logger = logging.getLogger(__name__)

__all__ = ["Batches"]


@dataclass
class _Request[T]:
    item: T
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False
    ok: bool = False


@dataclass
class _Queue[T]:
    pending: list[_Request[T]] = field(default_factory=list)


class Batches[T]:
    """Batches of items by key, each run by one caller for every item queued under its key.

    Thread-safe; `run` is called with no lock held, at most once at a time per key.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[Hashable, _Queue[T]] = {}

    def run(self, key: Hashable, item: T, work: Callable[[Sequence[T]], None]) -> bool:
        """Have `item` done with whatever else is asked under `key` at the same time.

        Args:
            key: what items may share a batch (e.g. the repository they come from).
            item: this caller's part.
            work: does a batch (every item at once); raises if it could not.

        Returns:
            True once a batch holding `item` was done; False when a batch of several items failed
            (the caller then does its item alone, and learns its own error).

        Raises:
            Exception: what `work` raised for a batch of `item` alone.
        """
        request: _Request[T] = _Request(item)
        with self._lock:
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = _Queue()
                request.lead = True
            queue.pending.append(request)
        if not request.lead:
            request.done.wait()
            if not request.lead:
                return request.ok
        with self._lock:
            batch, queue.pending = queue.pending, []
        ok = False
        try:
            work([each.item for each in batch])
            ok = True
        except Exception as exc:
            if len(batch) == 1:
                raise
            _logger.info("a batch of %d failed (%s); each is done alone", len(batch), type(exc).__name__)
        finally:
            # Whatever happened (even an exception that is not an `Exception`), every caller of the
            # batch is released, and the next batch gets a leader.
            for each in batch:
                each.ok = ok
                if each is not request:
                    each.done.set()
            self._hand_over(key, queue)
        return ok

    def _hand_over(self, key: Hashable, queue: _Queue[T]) -> None:
        """The lead to the first request queued during the batch, or the key's queue closed."""
        with self._lock:
            if queue.pending:
                successor = queue.pending[0]
                successor.lead = True
                successor.done.set()
            else:
                del self._queues[key]
