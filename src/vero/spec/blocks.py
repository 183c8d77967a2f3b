"""Fixed blocks of an `aggregate` partition: the only case sets one aggregate answer may cover.

A floor on the size of one answer does not bound what several answers reveal together: with a
floor of 3 on cases `a b c d`, the answers for `a b c d`, `a b c` and `d b c` give `d` (and then
every case) by differencing. So an `aggregate` request must select a *union of whole blocks*, where
the blocks are disjoint, cover the partition and hold at least `min_aggregate_cases` cases each.
Every admitted answer is then a linear combination of block sums: the most any set of answers
reveals is the score of each block, never one case's (unless the operator sets a floor of 1).

Blocks come from `PartitionAccess.blocks`:

- unset: one block, the whole partition;
- a number `n`: `split_into_blocks` (deterministic, by case name);
- explicit case lists: used as declared, and checked here (disjoint, covering, at least the floor).

The whole partition is itself a union of blocks, so it is always a valid request; the partition
must therefore hold at least `min_aggregate_cases` cases too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from vero.errors import SpecError, SpecIssue
from vero.spec.models import PartitionAccess

__all__ = ["Blocks", "resolve_blocks", "split_into_blocks"]

Blocks = tuple[tuple[str, ...], ...]
"""Disjoint case-name tuples covering a partition; each lists its cases in partition order."""


def split_into_blocks(cases: Sequence[str], n_blocks: int) -> Blocks:
    """Split `cases` into `n_blocks` blocks, deterministically by case name.

    The cases are ordered by the SHA-256 of their UTF-8 name (so blocks mix cases whatever their
    naming scheme, yet depend on nothing but the names), then cut into `n_blocks` contiguous runs
    whose sizes differ by at most one, larger runs first. Each block lists its cases in `cases`
    order. Adding or renaming a case may move others between blocks.

    Args:
        cases: the partition's case names (distinct).
        n_blocks: how many blocks, 1 <= n_blocks <= len(cases).

    Returns:
        `n_blocks` non-empty blocks.

    Raises:
        ValueError: `n_blocks` is out of range.
    """
    if not 1 <= n_blocks <= len(cases):
        raise ValueError("n_blocks must be between 1 and the number of cases")
    hashed = sorted(cases, key=lambda name: hashlib.sha256(name.encode()).hexdigest())
    size, extra = divmod(len(hashed), n_blocks)
    position = {name: index for index, name in enumerate(cases)}
    blocks: list[tuple[str, ...]] = []
    start = 0
    for index in range(n_blocks):
        end = start + size + (1 if index < extra else 0)
        blocks.append(tuple(sorted(hashed[start:end], key=position.__getitem__)))
        start = end
    return tuple(blocks)


def resolve_blocks(cases: Sequence[str], access: PartitionAccess, loc: str) -> Blocks:
    """The blocks of one agent-accessible partition, after checking its declaration.

    Args:
        cases: the partition's case names, in partition order (distinct, non-empty).
        access: its `agent_access` entry.
        loc: YAML path of that entry (e.g. `agent_access.val`), for error locations.

    Returns:
        For an `aggregate` partition its blocks (see the module docstring); for `full` and `none`
        partitions `()` (any subset may be requested there).

    Raises:
        SpecError: every problem, each at its YAML path: `blocks` or `ladder` on a partition that
            is not `aggregate`; an `aggregate` partition smaller than `min_aggregate_cases`; a
            number of blocks that leaves a block below the floor; declared blocks that name a case
            outside the partition, overlap, leave a case out, or hold fewer cases than the floor.
    """
    issues: list[SpecIssue] = []
    if access.disclosure != "aggregate":
        for field in ("blocks", "ladder"):
            if getattr(access, field) is not None:
                issues.append(SpecIssue(f"{loc}.{field}", "only valid when disclosure is aggregate"))
        if issues:
            raise SpecError(issues)
        return ()
    floor = access.min_aggregate_cases
    if len(cases) < floor:
        raise SpecError.at(
            f"{loc}.min_aggregate_cases",
            f"the partition has {len(cases)} case(s), fewer than this floor of {floor}: every "
            f"aggregate answer covers at least the floor (lower it to at most {len(cases)} to "
            f"accept answers over the whole partition)",
        )
    declared = access.blocks
    if declared is None:
        return (tuple(cases),)
    if isinstance(declared, int):
        smallest = len(cases) // declared
        if smallest < floor:
            raise SpecError.at(
                f"{loc}.blocks",
                f"{declared} blocks of a {len(cases)}-case partition leave blocks of {smallest} "
                f"case(s), fewer than min_aggregate_cases ({floor}); use at most "
                f"{len(cases) // floor} block(s)",
            )
        return split_into_blocks(cases, declared)
    members = set(cases)
    owner: dict[str, int] = {}
    for index, block in enumerate(declared):
        where = f"{loc}.blocks[{index}]"
        if len(block) < floor:
            issues.append(
                SpecIssue(where, f"a block holds {len(block)} case(s), fewer than min_aggregate_cases ({floor})")
            )
        for name in block:
            if name not in members:
                issues.append(SpecIssue(where, f"case {name!r} is not in the partition"))
            elif name in owner:
                other = owner[name]
                issues.append(
                    SpecIssue(
                        where,
                        f"blocks must be disjoint: case {name!r} is also in "
                        + ("this block" if other == index else f"blocks[{other}]"),
                    )
                )
            else:
                owner[name] = index
    left_out = [name for name in cases if name not in owner]
    if left_out:
        issues.append(
            SpecIssue(
                f"{loc}.blocks",
                f"blocks must cover the partition: case {left_out[0]!r}"
                + (f" and {len(left_out) - 1} more are" if len(left_out) > 1 else " is")
                + " in no block",
            )
        )
    if issues:
        raise SpecError(issues)
    position = {name: index for index, name in enumerate(cases)}
    return tuple(tuple(sorted(block, key=position.__getitem__)) for block in declared)
