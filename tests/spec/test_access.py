"""Validation of `agent_access` entries (`vero.spec.blocks`, `vero.spec.models`): aggregate blocks
(declared or split by name), their floors, and the Ladder's settings; each bad declaration is
refused naming its YAML path, and `AccessPolicy` refuses the same declarations."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from vero.core.policy import AccessPolicy
from vero.errors import SpecError
from vero.spec.blocks import resolve_blocks, split_into_blocks
from vero.spec.models import LadderSpec, PartitionAccess


def access(disclosure: str, floor: int = 5, blocks=None) -> PartitionAccess:
    return PartitionAccess(
        disclosure=disclosure, min_aggregate_cases=floor, blocks=blocks, total_runs=10, total_cases=100
    )


def test_split_into_blocks_is_deterministic_balanced_and_by_name():
    names = [f"case-{i:02d}" for i in range(11)]
    blocks = split_into_blocks(names, 3)
    assert [len(b) for b in blocks] == [4, 4, 3]
    assert sorted(n for b in blocks for n in b) == sorted(names)
    for block in blocks:
        assert list(block) == [n for n in names if n in block]  # partition order inside a block
    # Membership depends on the names only, not on their order in the partition.
    shuffled = split_into_blocks(list(reversed(names)), 3)
    assert [set(b) for b in shuffled] == [set(b) for b in blocks]
    assert blocks != (tuple(names[:4]), tuple(names[4:8]), tuple(names[8:]))  # mixed, not cut by name order
    with pytest.raises(ValueError):
        split_into_blocks(names, 12)


@pytest.mark.parametrize(
    ("blocks", "floor", "where", "what"),
    [
        (3, 3, "agent_access.val.blocks", "use at most 2 block(s)"),
        ([["a", "b", "c"], ["c", "d", "e", "f", "g"]], 3, "agent_access.val.blocks[1]", "disjoint: case 'c'"),
        ([["a", "b", "c"], ["d", "e"], ["f", "g"]], 3, "agent_access.val.blocks[1]", "fewer than min_aggregate_cases"),
        ([["a", "b", "c"], ["d", "e", "f"]], 3, "agent_access.val.blocks", "case 'g' is in no block"),
        (
            [["a", "b", "c", "zz"], ["d", "e", "f", "g"]],
            3,
            "agent_access.val.blocks[0]",
            "'zz' is not in the partition",
        ),
        ([["a", "a", "b", "c"], ["d", "e", "f", "g"]], 3, "agent_access.val.blocks[0]", "also in this block"),
        (None, 8, "agent_access.val.min_aggregate_cases", "fewer than this floor of 8"),
    ],
)
def test_bad_block_declarations_are_refused_with_their_path(blocks, floor, where, what):
    names = list("abcdefg")
    with pytest.raises(SpecError) as info:
        resolve_blocks(names, access("aggregate", floor, blocks), "agent_access.val")
    assert any(issue.loc == where and what in issue.message for issue in info.value.issues), info.value.issues
    with pytest.raises(SpecError):
        AccessPolicy({"val": access("aggregate", floor, blocks)}, {"val": names})


def test_blocks_and_ladder_only_on_aggregate_partitions():
    with pytest.raises(SpecError) as info:
        resolve_blocks(["a", "b"], access("full", 1, 2), "agent_access.train")
    assert [i.loc for i in info.value.issues] == ["agent_access.train.blocks"]
    ladder = PartitionAccess(disclosure="none", ladder={"margin": 0.1}, total_runs=1, total_cases=1)
    with pytest.raises(SpecError) as info:
        resolve_blocks(["a"], ladder, "agent_access.quiet")
    assert [i.loc for i in info.value.issues] == ["agent_access.quiet.ladder"]


@pytest.mark.parametrize(
    "bad",
    [
        {"margin": 0},
        {"margin": -0.1},
        {"margin": math.inf},
        {"margin": 0.1, "precision": 0.2},
        {"margin": 0.1, "precision": 0},
        {"margin": 0.1, "extra": 1},
    ],
)
def test_bad_ladder_settings_are_refused(bad):
    with pytest.raises(ValidationError):
        LadderSpec.model_validate(bad)


def test_precision_defaults_to_the_margin():
    assert LadderSpec(margin=0.02).effective_precision == 0.02
    assert LadderSpec(margin=0.02, precision=0.005).effective_precision == 0.005
