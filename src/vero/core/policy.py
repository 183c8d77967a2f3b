"""Split-visibility policy: who may evaluate which partition, and what they learn (DESIGN §2, §6).

INTERFACE SKELETON — signatures and docstrings are the contract; bodies are to be implemented.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from vero.errors import PolicyDenied
from vero.spec.models import Disclosure, PartitionAccess

__all__ = ["AccessPolicy", "Grant", "narrow"]

_ORDER: dict[str, int] = {"none": 0, "aggregate": 1, "full": 2}


def narrow(granted: Disclosure, current: Disclosure) -> Disclosure:
    """The narrower of two tiers (`none` < `aggregate` < `full`): a tier once granted never widens."""
    raise NotImplementedError


class Grant(BaseModel):
    """A positive policy decision for one evaluation request."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    principal: str
    partition: str
    disclosure: Disclosure
    cases: tuple[str, ...]
    """The selected cases, in partition order, without duplicates."""
    full_partition: bool
    """True when `cases` is the whole partition."""


class AccessPolicy:
    """Fail-closed policy over (partition, principal).

    Args:
        access: partition -> `PartitionAccess` for the agent-accessible partitions.
        partitions: partition -> case names (at least every partition in `access`).
        principals: principals the policy knows (default: only `agent`).
    """

    def __init__(self, access: Mapping[str, PartitionAccess], partitions: Mapping[str, Sequence[str]],
                 principals: Sequence[str] = ("agent",)) -> None:
        raise NotImplementedError

    def authorize(self, principal: str, partition: str, cases: Sequence[str] | None = None) -> Grant:
        """Decide an evaluation request before anything else happens (no budget, no import).

        Args:
            principal: who asks.
            partition: partition name as requested.
            cases: a case subset, or None for the whole partition.

        Returns:
            The grant with the tier and the normalized case list.

        Raises:
            PolicyDenied: unknown principal, unknown or non-accessible partition (the message does not
                echo the name), an empty subset, a case not in the partition, or an `aggregate` subset
                smaller than `min_aggregate_cases` (a full-partition request is always allowed).
        """
        raise NotImplementedError

    def visible(self, principal: str) -> dict[str, PartitionAccess]:
        """Partitions `principal` may evaluate, with their access settings (empty for unknown principals)."""
        raise NotImplementedError

    def cases(self, principal: str, partition: str) -> tuple[str, ...]:
        """Case names of an accessible partition. Raises PolicyDenied otherwise."""
        raise NotImplementedError
