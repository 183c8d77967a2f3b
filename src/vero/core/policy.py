"""Split-visibility policy: who may evaluate which partition, and what they learn (DESIGN §2, §6).

The policy is a table (partition, principal) -> `PartitionAccess` (disclosure tier and
`min_aggregate_cases`). It fails closed: a principal or partition that is not in the table is
denied, and so is every malformed case selection. Denial messages are generic and never repeat the
requested partition or case names, since a guessed name may be that of a hidden partition or case
(DESIGN §6: "error bodies are generic: no hidden names").

Case selections:

- `None` asks for the whole partition and is always allowed, even when the partition has fewer
  cases than `min_aggregate_cases`.
- A subset must be non-empty, name only cases of the partition and name each case once. Duplicates
  are *denied*, not normalized: `[a, a, a, a, a]` must never pass a floor of 5 by repetition, and a
  client that sends duplicates has a bug worth reporting.
- A subset that lists every case of the partition is treated as a full-partition request.
- On an `aggregate` partition a proper subset smaller than `min_aggregate_cases` is denied, because
  aggregates over a few cases would reveal per-case results. `full` and `none` partitions have no
  floor (the first discloses per-case results anyway, the second discloses nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from vero.errors import PolicyDenied, SpecError
from vero.spec.models import Disclosure, PartitionAccess

__all__ = ["AccessPolicy", "Grant", "narrow"]

_ORDER: dict[str, int] = {"none": 0, "aggregate": 1, "full": 2}

_DENIED_PRINCIPAL = "this principal may not evaluate anything"
_DENIED_PARTITION = "the requested partition is not available for evaluation"


def narrow(granted: Disclosure, current: Disclosure) -> Disclosure:
    """The narrower of two tiers (`none` < `aggregate` < `full`): a tier once granted never widens.

    Use it when a result is disclosed: `granted` is the tier recorded with the job at admission,
    `current` the tier of the policy in force now (possibly after a restart with a changed config).

    Raises:
        ValueError: either argument is not a disclosure tier.
    """
    for tier in (granted, current):
        if tier not in _ORDER:
            raise ValueError("unknown disclosure tier")
    return granted if _ORDER[granted] <= _ORDER[current] else current


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

    Every principal in `principals` gets the same `access` table; `AccessPolicy.per_principal`
    builds a policy whose entries differ per principal.

    Args:
        access: partition -> `PartitionAccess` for the agent-accessible partitions.
        partitions: partition -> case names (at least every partition in `access`).
        principals: principals the policy knows (default: only `agent`).

    Raises:
        SpecError: a partition in `access` has no case list, or a case list names a case twice
            (a configuration error; the compiler's validation prevents both).
    """

    def __init__(self, access: Mapping[str, PartitionAccess], partitions: Mapping[str, Sequence[str]],
                 principals: Sequence[str] = ("agent",)) -> None:
        entries = {(partition, principal): rule for partition, rule in access.items() for principal in principals}
        self._setup(entries, partitions)

    @classmethod
    def per_principal(cls, entries: Mapping[tuple[str, str], PartitionAccess],
                      partitions: Mapping[str, Sequence[str]]) -> AccessPolicy:
        """A policy from explicit (partition, principal) -> `PartitionAccess` entries.

        Raises:
            SpecError: as for the constructor.
        """
        policy = cls.__new__(cls)
        policy._setup(entries, partitions)
        return policy

    def _setup(self, entries: Mapping[tuple[str, str], PartitionAccess],
               partitions: Mapping[str, Sequence[str]]) -> None:
        cases: dict[str, tuple[str, ...]] = {}
        for partition, _principal in entries:
            if partition in cases:
                continue
            if partition not in partitions:
                # Names in `access` are agent-accessible partitions, so naming one here leaks nothing.
                raise SpecError.at(f"agent_access.{partition}", "no case list for this partition")
            names = tuple(partitions[partition])
            if len(set(names)) != len(names):
                raise SpecError.at(f"partitions.{partition}", "a case is listed twice")
            cases[partition] = names
        self._entries: dict[tuple[str, str], PartitionAccess] = dict(entries)
        self._cases = cases
        self._principals = frozenset(principal for _, principal in entries)

    def _entry(self, principal: str, partition: str) -> PartitionAccess:
        if not isinstance(principal, str) or principal not in self._principals:
            raise PolicyDenied(_DENIED_PRINCIPAL)
        entry = self._entries.get((partition, principal)) if isinstance(partition, str) else None
        if entry is None:
            raise PolicyDenied(_DENIED_PARTITION)
        return entry

    def authorize(self, principal: str, partition: str, cases: Sequence[str] | None = None) -> Grant:
        """Decide an evaluation request before anything else happens (no budget, no import).

        Args:
            principal: who asks.
            partition: partition name as requested.
            cases: a case subset, or None for the whole partition.

        Returns:
            The grant with the tier and the normalized case list (partition order). A subset that
            lists every case of the partition is granted as a full-partition request.

        Raises:
            PolicyDenied: unknown principal, unknown or non-accessible partition (the message does not
                echo the name), a partition without cases, an empty subset, a subset given as a plain
                string, a duplicate case, a case not in the partition, or an `aggregate` subset
                smaller than `min_aggregate_cases` (a full-partition request is always allowed).
        """
        entry = self._entry(principal, partition)
        partition_cases = self._cases[partition]
        if not partition_cases:
            raise PolicyDenied("the requested partition has no cases to evaluate")
        if cases is None:
            selected = partition_cases
        else:
            if isinstance(cases, (str, bytes)):
                raise PolicyDenied("cases must be a list of case names")
            requested = list(cases)
            if not requested:
                raise PolicyDenied("an empty case selection is not allowed")
            if not all(isinstance(name, str) for name in requested):
                raise PolicyDenied("cases must be a list of case names")
            if len(set(requested)) != len(requested):
                raise PolicyDenied("a case is selected more than once")
            wanted = set(requested)
            if not wanted <= set(partition_cases):
                raise PolicyDenied("a selected case is not in the partition")
            selected = tuple(name for name in partition_cases if name in wanted)
        full_partition = len(selected) == len(partition_cases)
        if entry.disclosure == "aggregate" and not full_partition and len(selected) < entry.min_aggregate_cases:
            raise PolicyDenied(
                f"this partition discloses aggregates only: select at least {entry.min_aggregate_cases} "
                f"cases or the whole partition"
            )
        return Grant(principal=principal, partition=partition, disclosure=entry.disclosure,
                     cases=selected, full_partition=full_partition)

    def visible(self, principal: str) -> dict[str, PartitionAccess]:
        """Partitions `principal` may evaluate, with their access settings (empty for unknown principals).

        Returns:
            partition name -> `PartitionAccess`, sorted by partition name.
        """
        return {partition: entry for (partition, who), entry in sorted(self._entries.items()) if who == principal}

    def cases(self, principal: str, partition: str) -> tuple[str, ...]:
        """Case names of an accessible partition, in partition order.

        Raises:
            PolicyDenied: unknown principal, or a partition `principal` may not evaluate.
        """
        self._entry(principal, partition)
        return self._cases[partition]

    def current_tier(self, principal: str, partition: str) -> Disclosure:
        """The tier in force now; `none` when the pair is no longer in the policy (fail closed)."""
        try:
            return self._entry(principal, partition).disclosure
        except PolicyDenied:
            return "none"

    def disclosure_for(self, granted: Disclosure, principal: str, partition: str) -> Disclosure:
        """What may be disclosed for a job admitted with `granted`: `narrow(granted, current_tier(...))`."""
        return narrow(granted, self.current_tier(principal, partition))
