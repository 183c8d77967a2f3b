"""Caps on the connections candidates hold open to the gateway, checked when each is accepted.

Every open connection costs the trusted process (sidecar or verifier) a file descriptor, idle or
not, and its descriptors are shared with its API, its Harbor runs and the caller check: candidate
hosts that each held ~10k connections through their relays took all 20000, and `/health`, a valid
token's caller check and the evaluation's own run failed. So each listener of a gateway admits a
connection only while its caller, its evaluation and all candidates together stay under their caps
(`ConnectionCaps`); a connection past a cap is closed at once (its descriptor freed before it sends
anything), counted `too_many_connections` on the evaluation it belongs to and logged. Its caller
sees a reset connection: a failure of its own making, charged like any other (never refunded).

The caller is the uid that owns the connection's other end in this network namespace
(`vero.inference.callers.peer_of`, a netlink lookup that needs no descriptor), or, on a case
route's listener, the calling container's address; its evaluation is the one whose host runs as
that uid (`InferenceGateway.bind_host`) or whose case route the listener serves.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

__all__ = ["ConnectionCaps", "ConnectionGate", "gated_protocol"]

logger = logging.getLogger(__name__)

PER_CALLER = 256
"""Connections one candidate host (a uid, or a case container's address) may hold at once: far
more than an SDK's pool (httpx keeps at most 100)."""

PER_EVALUATION = 512
"""Connections all of one evaluation's hosts may hold at once."""

_SHARE_OF_LIMIT = 4
"""All candidates together hold at most this fraction of the process's descriptor limit, so the
API, the runs and the caller check keep the rest."""


@dataclass(frozen=True)
class ConnectionCaps:
    """How many gateway connections may be open at once: per caller, per evaluation, in all."""

    per_caller: int = PER_CALLER
    per_evaluation: int = PER_EVALUATION
    total: int = 0
    """0: a quarter of the process's soft descriptor limit (`RLIMIT_NOFILE`), at least 64."""

    def total_cap(self) -> int:
        if self.total > 0:
            return self.total
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return max(64, soft // _SHARE_OF_LIMIT) if soft != resource.RLIM_INFINITY else 16384


class ConnectionGate:
    """Counts the gateway's open connections per caller and per evaluation (all its listeners).

    Args:
        caps: the caps.
        refused: called with the evaluation id (or None) of each connection refused.
    """

    def __init__(self, caps: ConnectionCaps, refused: Callable[[str | None], None]) -> None:
        self.caps = caps
        self._total_cap = caps.total_cap()
        self._refused = refused
        self._callers: Counter[Hashable] = Counter()
        self._evaluations: Counter[str] = Counter()
        self.open = 0
        self.refusals = 0

    def admit(self, caller: Hashable, evaluation: str | None) -> bool:
        """Count a new connection of `caller` (of `evaluation`, if known); False (nothing counted,
        the refusal reported) when a cap would be passed."""
        over = (
            self.open >= self._total_cap
            or self._callers[caller] >= self.caps.per_caller
            or (evaluation is not None and self._evaluations[evaluation] >= self.caps.per_evaluation)
        )
        if over:
            self.refusals += 1
            if self.refusals == 1 or self.refusals % 1000 == 0:
                logger.warning(
                    "gateway connection of %s (evaluation %s) refused: too many open (%d refused so far)",
                    caller,
                    evaluation,
                    self.refusals,
                )
            self._refused(evaluation)
            return False
        self.open += 1
        self._callers[caller] += 1
        if evaluation is not None:
            self._evaluations[evaluation] += 1
        return True

    def release(self, caller: Hashable, evaluation: str | None) -> None:
        """An admitted connection has closed."""
        self.open -= 1
        self._callers[caller] -= 1
        if self._callers[caller] <= 0:
            del self._callers[caller]
        if evaluation is not None:
            self._evaluations[evaluation] -= 1
            if self._evaluations[evaluation] <= 0:
                del self._evaluations[evaluation]


Classify = Callable[[tuple[str, int] | None, tuple[str, int] | None], tuple[Hashable, str | None]]
"""(client address, server address) -> (caller, its evaluation or None)."""


def gated_protocol(base: type[asyncio.Protocol], gate: ConnectionGate, classify: Classify) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class `base`, admitting each connection through `gate` first: one
    past a cap is aborted before uvicorn sees it (`Config(http=...)` takes the class)."""

    class GatedProtocol(base):  # type: ignore[valid-type, misc]
        _vero_admitted: tuple[Hashable, str | None] | None = None

        def connection_made(self, transport: Any) -> None:
            caller, evaluation = classify(transport.get_extra_info("peername"), transport.get_extra_info("sockname"))
            if not gate.admit(caller, evaluation):
                transport.abort()
                return
            self._vero_admitted = (caller, evaluation)
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            admitted, self._vero_admitted = self._vero_admitted, None
            if admitted is None:
                return  # refused: uvicorn never saw it
            gate.release(*admitted)
            super().connection_lost(exc)

    return GatedProtocol
