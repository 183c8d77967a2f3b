"""Split-visibility policy: who may evaluate which partition, and what they learn (docs/agent-api.md).

The policy is a table (partition, principal) -> `PartitionAccess` (disclosure tier, floor, blocks,
Ladder mode). It fails closed: a principal or partition that is not in the table is denied, and so
is every malformed case selection. Denial messages are generic and never repeat the requested
partition or case names, since a guessed name may be that of a hidden partition or case
(docs/agent-api.md: "error bodies are generic: no hidden names").

Case selections (`cases`, or `blocks` by position):

- `None` asks for the whole partition and is always allowed.
- A subset must be non-empty, name only cases of the partition and name each case once. Duplicates
  are *denied*, not normalized: a client that sends duplicates has a bug worth reporting.
- A subset that lists every case of the partition is treated as a full-partition request.
- On an `aggregate` partition the selection must be a union of whole *blocks*
  (`vero.spec.blocks`): disjoint case sets of at least `min_aggregate_cases` each, covering the
  partition (by default one block, the whole partition). A size floor alone is not enough: any two
  admitted subsets that differ in one case give that case's result by differencing. Over unions of
  blocks, every combination of answers is a combination of block scores, so no set of answers
  isolates one case (unless the floor is 1). `blocks` selects blocks by their position in
  `blocks()` and is valid on `aggregate` partitions only.
- `full` and `none` partitions accept any subset (the first discloses per-case results anyway, the
  second discloses nothing).

Every check runs before anything is charged or imported: the sidecar calls `authorize` first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from vero.errors import PolicyDenied, SpecError
from vero.spec.blocks import Blocks, resolve_blocks
from vero.spec.models import Disclosure, LadderSpec, PartitionAccess

__all__ = ["AccessPolicy", "DisclosureRule", "Grant", "narrow"]

_ORDER: dict[str, int] = {"none": 0, "aggregate": 1, "full": 2}

_DENIED_PRINCIPAL = "this principal may not evaluate anything"
_DENIED_PARTITION = "the requested partition is not available for evaluation"
_DENIED_BLOCKS = (
    "this partition discloses aggregates over fixed blocks only: select the whole partition or "
    "whole blocks (see the partition's blocks in the status)"
)


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


class DisclosureRule(BaseModel):
    """What the answers about one job may show (`AccessPolicy.rule_for`; the views that apply it:
    `vero.sidecar.disclosure`).

    Attributes:
        tier: the narrower of the job's granted tier and the pair's current one.
        ladder: on `aggregate`, the Ladder rule in force (its score is then shown only as the
            Ladder's answer); None otherwise.
        money_step_micro_usd: on `aggregate`, the step the money shown is rounded to (micro US
            dollars, `money_step_micro_usd`); 1 (exact) otherwise.
    """

    model_config = ConfigDict(frozen=True)
    tier: Disclosure
    ladder: LadderSpec | None = None
    money_step_micro_usd: int = Field(default=1, ge=1)


AGGREGATE_MONEY_STEPS = 100
"""How many steps an `aggregate` partition's inference money is shown in: a candidate chooses what
it spends, so a figure exact to the micro-dollar could carry some 15 bits of a hidden case per
evaluation; in steps of a hundredth of the partition's `total_inference_usd` it carries at most
log2(steps in one evaluation's reservation + 1), under 7 bits (issue 23's attack A12)."""


def money_step_micro_usd(access: PartitionAccess) -> int:
    """The step (micro US dollars, at least 1) in which an `aggregate` partition shows inference
    money: a hundredth of its `total_inference_usd` (`AGGREGATE_MONEY_STEPS`), rounded up."""
    total = round(access.total_inference_usd * 1_000_000)
    return max(1, -(-total // AGGREGATE_MONEY_STEPS))


class AccessPolicy:
    """Fail-closed policy over (partition, principal).

    Every principal in `principals` gets the same `access` table; `AccessPolicy.per_principal`
    builds a policy whose entries differ per principal.

    Args:
        access: partition -> `PartitionAccess` for the agent-accessible partitions.
        partitions: partition -> case names (at least every partition in `access`).
        principals: principals the policy knows (default: only `agent`).

    Raises:
        SpecError: a partition in `access` has no case list, a case list names a case twice, or
            an entry's blocks or Ladder mode are invalid (`vero.spec.blocks.resolve_blocks`):
            configuration errors the compiler's validation prevents.
    """

    def __init__(
        self,
        access: Mapping[str, PartitionAccess],
        partitions: Mapping[str, Sequence[str]],
        principals: Sequence[str] = ("agent",),
    ) -> None:
        entries = {(partition, principal): rule for partition, rule in access.items() for principal in principals}
        self._setup(entries, partitions)

    @classmethod
    def per_principal(
        cls, entries: Mapping[tuple[str, str], PartitionAccess], partitions: Mapping[str, Sequence[str]]
    ) -> AccessPolicy:
        """A policy from explicit (partition, principal) -> `PartitionAccess` entries.

        Raises:
            SpecError: as for the constructor.
        """
        policy = cls.__new__(cls)
        policy._setup(entries, partitions)
        return policy

    def _setup(
        self, entries: Mapping[tuple[str, str], PartitionAccess], partitions: Mapping[str, Sequence[str]]
    ) -> None:
        cases: dict[str, tuple[str, ...]] = {}
        blocks: dict[tuple[str, str], Blocks] = {}
        for (partition, principal), rule in entries.items():
            if partition not in cases:
                if partition not in partitions:
                    # Names in `access` are agent-accessible partitions, so naming one here leaks nothing.
                    raise SpecError.at(f"agent_access.{partition}", "no case list for this partition")
                names = tuple(partitions[partition])
                if len(set(names)) != len(names):
                    raise SpecError.at(f"partitions.{partition}", "a case is listed twice")
                cases[partition] = names
            # An empty partition is denied at request time; it has no blocks to resolve.
            blocks[(partition, principal)] = (
                resolve_blocks(cases[partition], rule, f"agent_access.{partition}") if cases[partition] else ()
            )
        self._entries: dict[tuple[str, str], PartitionAccess] = dict(entries)
        self._cases = cases
        self._blocks = blocks
        self._principals = frozenset(principal for _, principal in entries)

    def _entry(self, principal: str, partition: str) -> PartitionAccess:
        if not isinstance(principal, str) or principal not in self._principals:
            raise PolicyDenied(_DENIED_PRINCIPAL)
        entry = self._entries.get((partition, principal)) if isinstance(partition, str) else None
        if entry is None:
            raise PolicyDenied(_DENIED_PARTITION)
        return entry

    def authorize(
        self, principal: str, partition: str, cases: Sequence[str] | None = None, blocks: Sequence[int] | None = None
    ) -> Grant:
        """Decide an evaluation request before anything else happens (no budget, no import).

        Args:
            principal: who asks.
            partition: partition name as requested.
            cases: a case subset, or None for the whole partition.
            blocks: positions in `blocks(principal, partition)` (an `aggregate` partition's blocks),
                instead of `cases`.

        Returns:
            The grant with the tier and the normalized case list (partition order). A subset that
            lists every case of the partition is granted as a full-partition request.

        Raises:
            PolicyDenied: unknown principal, unknown or non-accessible partition (the message does not
                echo the name), a partition without cases, both `cases` and `blocks`, an empty
                selection, a selection given as a plain string, a duplicate case or block, a case
                not in the partition, a block position out of range or on a partition without
                blocks, or an `aggregate` selection that is not a union of whole blocks.
        """
        entry = self._entry(principal, partition)
        partition_cases = self._cases[partition]
        if not partition_cases:
            raise PolicyDenied("the requested partition has no cases to evaluate")
        partition_blocks = self._blocks[(partition, principal)]
        if blocks is not None:
            if cases is not None:
                raise PolicyDenied("select cases or blocks, not both")
            requested = self._block_cases(partition_blocks, blocks)
        elif cases is None:
            requested = list(partition_cases)
        else:
            if isinstance(cases, (str, bytes)):
                raise PolicyDenied("cases must be a list of case names")
            requested = list(cases)
            if not all(isinstance(name, str) for name in requested):
                raise PolicyDenied("cases must be a list of case names")
        if not requested:
            raise PolicyDenied("an empty case selection is not allowed")
        if len(set(requested)) != len(requested):
            raise PolicyDenied("a case is selected more than once")
        wanted = set(requested)
        if not wanted <= set(partition_cases):
            raise PolicyDenied("a selected case is not in the partition")
        if entry.disclosure == "aggregate" and any(
            not wanted.isdisjoint(block) and not wanted.issuperset(block) for block in partition_blocks
        ):
            raise PolicyDenied(_DENIED_BLOCKS)
        selected = tuple(name for name in partition_cases if name in wanted)
        return Grant(
            principal=principal,
            partition=partition,
            disclosure=entry.disclosure,
            cases=selected,
            full_partition=len(selected) == len(partition_cases),
        )

    @staticmethod
    def _block_cases(partition_blocks: Blocks, positions: Sequence[int]) -> list[str]:
        if isinstance(positions, (str, bytes)) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in positions
        ):
            raise PolicyDenied("blocks must be a list of block positions")
        if not partition_blocks:
            raise PolicyDenied("this partition has no blocks: select cases")
        if len(set(positions)) != len(positions):
            raise PolicyDenied("a block is selected more than once")
        if not all(0 <= p < len(partition_blocks) for p in positions):
            raise PolicyDenied("a selected block does not exist")
        return [name for p in positions for name in partition_blocks[p]]

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

    def blocks(self, principal: str, partition: str) -> Blocks:
        """The blocks of an accessible partition: for `aggregate`, disjoint case tuples covering the
        partition (at least one); for `full` and `none`, `()` (any subset may be selected).

        Raises:
            PolicyDenied: unknown principal, or a partition `principal` may not evaluate.
        """
        self._entry(principal, partition)
        return self._blocks[(partition, principal)]

    def ladder(self, principal: str, partition: str) -> LadderSpec | None:
        """The Ladder rule in force for the pair now; None when there is none or the pair is no longer
        in the policy."""
        try:
            entry = self._entry(principal, partition)
        except PolicyDenied:
            return None
        return entry.ladder if entry.disclosure == "aggregate" else None

    def current_tier(self, principal: str, partition: str) -> Disclosure:
        """The tier in force now; `none` when the pair is no longer in the policy (fail closed)."""
        try:
            return self._entry(principal, partition).disclosure
        except PolicyDenied:
            return "none"

    def disclosure_for(self, granted: Disclosure, principal: str, partition: str) -> Disclosure:
        """What may be disclosed for a job admitted with `granted`: `narrow(granted, current_tier(...))`."""
        return narrow(granted, self.current_tier(principal, partition))

    def rule_for(self, granted: Disclosure, principal: str, partition: str) -> DisclosureRule:
        """The rule of a job admitted with `granted`, in one call: its tier (`disclosure_for`) and,
        on `aggregate`, the Ladder in force (`ladder`)."""
        tier = self.disclosure_for(granted, principal, partition)
        if tier != "aggregate":
            return DisclosureRule(tier=tier)
        step = money_step_micro_usd(self._entry(principal, partition))
        return DisclosureRule(tier=tier, ladder=self.ladder(principal, partition), money_step_micro_usd=step)
