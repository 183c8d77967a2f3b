"""Access policy: fail closed, subset rules, the aggregate floor, tiers that only narrow."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vero.core.policy import AccessPolicy, Grant, narrow
from vero.errors import PolicyDenied, SpecError
from vero.spec.models import PartitionAccess

TIERS = ("none", "aggregate", "full")
RANK = {"none": 0, "aggregate": 1, "full": 2}
HIDDEN = "holdout-secret-zz9"
"""A hidden partition's name: it must never appear in a denial message."""


def access(disclosure: str, floor: int = 5) -> PartitionAccess:
    return PartitionAccess(disclosure=disclosure, min_aggregate_cases=floor, total_runs=10, total_cases=100)


@pytest.fixture
def policy() -> AccessPolicy:
    partitions = {
        "train": [f"t{i}" for i in range(8)],
        "tiny": ["x1", "x2"],
        "open": ["o1", "o2", "o3"],
        "quiet": ["q1", "q2", "q3"],
        HIDDEN: ["h1", "h2", "h3", "h4", "h5", "h6"],
    }
    return AccessPolicy(
        {"train": access("aggregate", 5), "tiny": access("aggregate", 5), "open": access("full"),
         "quiet": access("none")},
        partitions,
    )


# narrow ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("granted", "current"), list(itertools.product(TIERS, TIERS)))
def test_narrow_takes_the_narrower_tier(granted, current):
    result = narrow(granted, current)
    assert RANK[result] == min(RANK[granted], RANK[current])
    assert RANK[result] <= RANK[granted]  # never wider than what was granted
    assert narrow(current, granted) == result


def test_narrow_rejects_unknown_tiers():
    with pytest.raises(ValueError):
        narrow("everything", "full")
    with pytest.raises(ValueError):
        narrow("full", "")


@given(st.lists(st.sampled_from(TIERS), min_size=1, max_size=8))
def test_narrowing_across_restarts_never_widens(configs):
    """A tier granted once and narrowed by each later config only ever goes down."""
    tier = configs[0]
    for current in configs[1:]:
        new = narrow(tier, current)
        assert RANK[new] <= RANK[tier]
        tier = new
    assert RANK[tier] == min(RANK[c] for c in configs)


def test_disclosure_for_uses_the_current_policy(policy):
    assert policy.disclosure_for("full", "agent", "train") == "aggregate"
    assert policy.disclosure_for("none", "agent", "open") == "none"
    # A partition dropped from the policy after a restart discloses nothing.
    assert policy.current_tier("agent", "gone") == "none"
    assert policy.disclosure_for("full", "agent", "gone") == "none"
    assert policy.disclosure_for("full", "stranger", "open") == "none"


# fail closed ------------------------------------------------------------------------------------------

def test_no_policy_denies_everything():
    empty = AccessPolicy({}, {"train": ["a"]})
    with pytest.raises(PolicyDenied):
        empty.authorize("agent", "train")
    assert empty.visible("agent") == {}


@pytest.mark.parametrize("partition", [HIDDEN, "unknown-partition-q7", "", "TRAIN", "train "])
def test_unknown_or_hidden_partition_is_denied_without_echo(policy, partition):
    with pytest.raises(PolicyDenied) as info:
        policy.authorize("agent", partition)
    if partition.strip():
        assert partition.strip() not in str(info.value)
    with pytest.raises(PolicyDenied) as info:
        policy.cases("agent", partition)
    if partition.strip():
        assert partition.strip() not in str(info.value)


def test_hidden_partition_with_cases_is_denied_without_echo(policy):
    with pytest.raises(PolicyDenied) as info:
        policy.authorize("agent", HIDDEN, ["h1", "h2", "h3", "h4", "h5"])
    assert HIDDEN not in str(info.value)
    assert "h1" not in str(info.value)


@pytest.mark.parametrize("principal", ["root", "", "Agent", "admin"])
def test_unknown_principal_is_denied(policy, principal):
    with pytest.raises(PolicyDenied):
        policy.authorize(principal, "train")
    assert policy.visible(principal) == {}


def test_non_string_inputs_are_denied(policy):
    with pytest.raises(PolicyDenied):
        policy.authorize("agent", ["train"])  # type: ignore[arg-type]
    with pytest.raises(PolicyDenied):
        policy.authorize("agent", "train", "t0t1t2t3t4")  # a string is not a case list
    with pytest.raises(PolicyDenied):
        policy.authorize("agent", "open", ["o1", 3])  # type: ignore[list-item]


def test_per_principal_entries_are_independent():
    partitions = {"train": ["a", "b", "c"]}
    policy = AccessPolicy.per_principal(
        {("train", "agent"): access("aggregate", 2), ("train", "auditor"): access("full")}, partitions)
    assert policy.authorize("auditor", "train", ["a"]).disclosure == "full"
    with pytest.raises(PolicyDenied):
        policy.authorize("agent", "train", ["a"])
    with pytest.raises(PolicyDenied):
        policy.authorize("guest", "train")


def test_several_principals_share_the_access_table():
    policy = AccessPolicy({"train": access("full")}, {"train": ["a"]}, principals=("agent", "operator"))
    assert policy.authorize("operator", "train").disclosure == "full"
    assert policy.authorize("agent", "train").disclosure == "full"


def test_visible_and_cases(policy):
    visible = policy.visible("agent")
    assert list(visible) == ["open", "quiet", "tiny", "train"]
    assert HIDDEN not in visible
    assert visible["train"].min_aggregate_cases == 5
    assert policy.cases("agent", "tiny") == ("x1", "x2")


def test_configuration_errors_are_reported():
    with pytest.raises(SpecError) as info:
        AccessPolicy({"train": access("full")}, {})
    assert "agent_access.train" in str(info.value)
    with pytest.raises(SpecError):
        AccessPolicy({"train": access("full")}, {"train": ["a", "a"]})


def test_partition_without_cases_is_denied():
    policy = AccessPolicy({"empty": access("full")}, {"empty": []})
    with pytest.raises(PolicyDenied):
        policy.authorize("agent", "empty")


# case selections ------------------------------------------------------------------------------------

def test_full_partition_request(policy):
    grant = policy.authorize("agent", "train")
    assert grant == Grant(principal="agent", partition="train", disclosure="aggregate",
                          cases=tuple(f"t{i}" for i in range(8)), full_partition=True)


def test_full_request_allowed_below_the_floor(policy):
    """`tiny` has 2 cases and a floor of 5: the whole partition is still allowed."""
    grant = policy.authorize("agent", "tiny")
    assert grant.full_partition and grant.cases == ("x1", "x2")


def test_subset_listing_every_case_counts_as_full(policy):
    grant = policy.authorize("agent", "tiny", ["x2", "x1"])
    assert grant.full_partition and grant.cases == ("x1", "x2")


def test_aggregate_subset_below_floor_denied(policy):
    with pytest.raises(PolicyDenied) as info:
        policy.authorize("agent", "train", ["t0", "t1", "t2", "t3"])
    assert "at least 5" in str(info.value)
    with pytest.raises(PolicyDenied):
        policy.authorize("agent", "tiny", ["x1"])


def test_aggregate_subset_at_floor_allowed_in_partition_order(policy):
    grant = policy.authorize("agent", "train", ["t6", "t0", "t3", "t1", "t2"])
    assert grant.cases == ("t0", "t1", "t2", "t3", "t6")
    assert not grant.full_partition
    assert grant.disclosure == "aggregate"


@pytest.mark.parametrize("partition", ["open", "quiet"])
def test_full_and_none_tiers_have_no_floor(policy, partition):
    first = policy.cases("agent", partition)[0]
    grant = policy.authorize("agent", partition, [first])
    assert grant.cases == (first,) and not grant.full_partition


@pytest.mark.parametrize("cases", [[], ["t0", "t0", "t1", "t2", "t3", "t4"], ["t0", "t1", "t2", "t3", "zz"],
                                   ["t0", "t1", "t2", "t3", "x1"], ["h1", "h2", "h3", "h4", "h5"]])
def test_bad_subsets_denied(policy, cases):
    with pytest.raises(PolicyDenied) as info:
        policy.authorize("agent", "train", cases)
    for name in cases:
        assert name not in str(info.value)


def test_duplicates_cannot_pass_the_floor_by_repetition(policy):
    with pytest.raises(PolicyDenied):
        policy.authorize("agent", "train", ["t0"] * 5)
    with pytest.raises(PolicyDenied):
        policy.authorize("agent", "open", ["o1", "o1"])


@settings(max_examples=300, deadline=None)
@given(
    n_cases=st.integers(min_value=1, max_value=12),
    tier=st.sampled_from(TIERS),
    floor=st.integers(min_value=1, max_value=15),
    picks=st.lists(st.integers(min_value=0, max_value=15), max_size=16),
    whole=st.booleans(),
)
def test_authorize_matches_the_rules(n_cases, tier, floor, picks, whole):
    """Property: the decision is exactly the rule set in the module docstring."""
    names = [f"c{i:02d}" for i in range(n_cases)]
    policy = AccessPolicy({"p": access(tier, floor)}, {"p": names, "hidden": ["z"]})
    requested = None if whole else [f"c{i:02d}" for i in picks]
    if requested is None:
        expected_ok = True
    else:
        distinct = set(requested)
        expected_ok = (
            bool(requested)
            and len(distinct) == len(requested)
            and distinct <= set(names)
            and not (tier == "aggregate" and len(distinct) < floor and len(distinct) < n_cases)
        )
    if not expected_ok:
        with pytest.raises(PolicyDenied):
            policy.authorize("agent", "p", requested)
        return
    grant = policy.authorize("agent", "p", requested)
    assert grant.disclosure == tier
    assert len(set(grant.cases)) == len(grant.cases)
    assert list(grant.cases) == [n for n in names if n in set(grant.cases)]  # partition order
    assert grant.full_partition == (len(grant.cases) == n_cases)
    if requested is not None:
        assert set(grant.cases) == set(requested)
    if tier == "aggregate" and not grant.full_partition:
        assert len(grant.cases) >= floor
