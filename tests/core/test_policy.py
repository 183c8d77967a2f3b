"""Access policy: fail closed, subset rules, aggregate blocks that cannot be differenced, tiers that only narrow."""

from __future__ import annotations

import itertools
from fractions import Fraction

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


def access(disclosure: str, floor: int = 5, blocks=None) -> PartitionAccess:
    return PartitionAccess(
        disclosure=disclosure, min_aggregate_cases=floor, blocks=blocks, total_runs=10, total_cases=100
    )


@pytest.fixture
def policy() -> AccessPolicy:
    partitions = {
        "train": [f"t{i}" for i in range(8)],
        "tiny": ["x1", "x2"],
        "blocked": ["b1", "b2", "b3", "b4", "b5", "b6", "b7"],
        "open": ["o1", "o2", "o3"],
        "quiet": ["q1", "q2", "q3"],
        HIDDEN: ["h1", "h2", "h3", "h4", "h5", "h6"],
    }
    return AccessPolicy(
        {
            "train": access("aggregate", 5),
            "tiny": access("aggregate", 2),
            "open": access("full"),
            "quiet": access("none"),
            "blocked": access("aggregate", 2, [["b1", "b4"], ["b2", "b3", "b6"], ["b5", "b7"]]),
        },
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
        {("train", "agent"): access("aggregate", 2), ("train", "auditor"): access("full")}, partitions
    )
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
    assert list(visible) == ["blocked", "open", "quiet", "tiny", "train"]
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
    assert grant == Grant(
        principal="agent",
        partition="train",
        disclosure="aggregate",
        cases=tuple(f"t{i}" for i in range(8)),
        full_partition=True,
    )


def test_subset_listing_every_case_counts_as_full(policy):
    grant = policy.authorize("agent", "tiny", ["x2", "x1"])
    assert grant.full_partition and grant.cases == ("x1", "x2")


def test_aggregate_subsets_that_are_not_unions_of_blocks_are_denied(policy):
    """`train` declares no blocks: its one block is the whole partition, so no proper subset
    passes, however large; `tiny` likewise."""
    for subset in (["t0", "t1", "t2", "t3", "t4"], [f"t{i}" for i in range(7)]):
        with pytest.raises(PolicyDenied) as info:
            policy.authorize("agent", "train", subset)
        assert "fixed blocks" in str(info.value)
        assert not any(name in str(info.value) for name in subset)
    with pytest.raises(PolicyDenied):
        policy.authorize("agent", "tiny", ["x1"])


def test_declared_blocks_admit_their_unions_only(policy):
    grant = policy.authorize("agent", "blocked", ["b6", "b3", "b2"])
    assert grant.cases == ("b2", "b3", "b6") and not grant.full_partition
    grant = policy.authorize("agent", "blocked", ["b7", "b1", "b5", "b4"])
    assert grant.cases == ("b1", "b4", "b5", "b7")
    for partial in (["b1"], ["b1", "b4", "b5"], ["b2", "b3"], ["b1", "b2", "b3", "b4", "b6", "b7"]):
        with pytest.raises(PolicyDenied):
            policy.authorize("agent", "blocked", partial)


def test_blocks_are_selected_by_position(policy):
    assert policy.blocks("agent", "blocked") == (("b1", "b4"), ("b2", "b3", "b6"), ("b5", "b7"))
    assert policy.authorize("agent", "blocked", blocks=[2, 0]).cases == ("b1", "b4", "b5", "b7")
    assert policy.authorize("agent", "blocked", blocks=[0, 1, 2]).full_partition
    assert policy.authorize("agent", "train", blocks=[0]).full_partition
    for bad in ([], [3], [-1], [0, 0], [True], ["0"], "0"):
        with pytest.raises(PolicyDenied):
            policy.authorize("agent", "blocked", blocks=bad)
    with pytest.raises(PolicyDenied):
        policy.authorize("agent", "blocked", ["b1", "b4"], blocks=[0])
    for partition in ("open", "quiet"):  # any subset there; blocks mean nothing
        assert policy.blocks("agent", partition) == ()
        with pytest.raises(PolicyDenied):
            policy.authorize("agent", partition, blocks=[0])


def test_the_differencing_sequence_is_refused_at_its_second_request():
    """Issue 10's attack: whole (0.25), [a, b, c] (0.333), [d, b, c] (0.0) gave every case's result."""
    policy = AccessPolicy({"p": access("aggregate", 3)}, {"p": ["a", "b", "c", "d"]})
    assert policy.authorize("agent", "p").full_partition
    with pytest.raises(PolicyDenied):
        policy.authorize("agent", "p", ["a", "b", "c"])
    with pytest.raises(PolicyDenied):
        policy.authorize("agent", "p", ["d", "b", "c"])


def test_six_cases_with_a_floor_of_three_admit_whole_blocks_only():
    """Before fixed blocks, 42 of these 63 requests were admitted and all six cases could be derived."""
    names = [f"c{i}" for i in range(6)]
    subsets = [list(c) for k in range(1, 7) for c in itertools.combinations(names, k)]

    def admitted(policy: AccessPolicy) -> list[tuple[str, ...]]:
        out = []
        for subset in subsets:
            try:
                out.append(policy.authorize("agent", "p", subset).cases)
            except PolicyDenied:
                pass
        return out

    assert admitted(AccessPolicy({"p": access("aggregate", 3)}, {"p": names})) == [tuple(names)]
    two = AccessPolicy({"p": access("aggregate", 3, 2)}, {"p": names})
    first, second = two.blocks("agent", "p")
    assert sorted(admitted(two)) == sorted([first, second, tuple(names)])
    assert not isolated_cases(admitted(two), names)


@pytest.mark.parametrize("partition", ["open", "quiet"])
def test_full_and_none_tiers_accept_any_subset(policy, partition):
    first = policy.cases("agent", partition)[0]
    grant = policy.authorize("agent", partition, [first])
    assert grant.cases == (first,) and not grant.full_partition


@pytest.mark.parametrize(
    "cases",
    [
        [],
        ["t0", "t0", "t1", "t2", "t3", "t4"],
        ["t0", "t1", "t2", "t3", "zz"],
        ["t0", "t1", "t2", "t3", "x1"],
        ["h1", "h2", "h3", "h4", "h5"],
    ],
)
def test_bad_subsets_denied(policy, cases):
    with pytest.raises(PolicyDenied) as info:
        policy.authorize("agent", "train", cases)
    for name in cases:
        assert name not in str(info.value)


def test_duplicates_are_denied(policy):
    with pytest.raises(PolicyDenied):
        policy.authorize("agent", "train", ["t0"] * 8)
    with pytest.raises(PolicyDenied):
        policy.authorize("agent", "open", ["o1", "o1"])


# nothing admitted isolates a case ---------------------------------------------------------------------


def _rank(rows: list[list[Fraction]]) -> int:
    """Rank over the rationals by exact Gaussian elimination."""
    matrix = [list(row) for row in rows]
    rank = 0
    n_cols = len(matrix[0]) if matrix else 0
    for col in range(n_cols):
        pivot = next((r for r in range(rank, len(matrix)) if matrix[r][col] != 0), None)
        if pivot is None:
            continue
        matrix[rank], matrix[pivot] = matrix[pivot], matrix[rank]
        for r in range(len(matrix)):
            if r != rank and matrix[r][col] != 0:
                factor = matrix[r][col] / matrix[rank][col]
                matrix[r] = [a - factor * b for a, b in zip(matrix[r], matrix[rank], strict=True)]
        rank += 1
    return rank


def isolated_cases(selections: list[tuple[str, ...]], names: list[str]) -> list[str]:
    """Cases whose unit vector is in the span of the selections' indicator vectors: exactly the cases
    some combination of the answers (sums = mean x size) determines on its own."""
    rows = [[Fraction(int(name in selection)) for name in names] for selection in selections]
    if not rows:
        return []
    base = _rank(rows)
    return [
        name
        for i, name in enumerate(names)
        if _rank([*rows, [Fraction(int(j == i)) for j in range(len(names))]]) == base
    ]


def test_the_rank_test_finds_the_old_attack():
    """The checker itself: the three answers of issue 10 isolate every case."""
    names = ["a", "b", "c", "d"]
    assert isolated_cases([("a", "b", "c", "d"), ("a", "b", "c"), ("b", "c", "d")], names) == ["a", "d"]
    assert isolated_cases([("a", "b", "c", "d"), ("a", "b", "c"), ("b", "c", "d"), ("a", "c", "d")], names) == names
    assert isolated_cases([("a", "b", "c", "d"), ("a", "b")], names) == []


@st.composite
def declarations(draw):
    """A partition, a floor and a block declaration, valid or not."""
    n_cases = draw(st.integers(min_value=1, max_value=8))
    names = [f"c{i}" for i in range(n_cases)]
    floor = draw(st.integers(min_value=1, max_value=6))
    kind = draw(st.sampled_from(["none", "count", "lists", "valid lists"]))
    if kind == "none":
        blocks = None
    elif kind == "count":
        blocks = draw(st.integers(min_value=1, max_value=n_cases))
    elif kind == "valid lists" and n_cases >= floor:
        # k blocks of at least `floor` shuffled cases each, the rest spread at random.
        order = draw(st.permutations(names))
        k = draw(st.integers(min_value=1, max_value=n_cases // floor))
        sizes = [floor] * k
        for extra in draw(st.lists(st.integers(0, k - 1), min_size=n_cases - k * floor, max_size=n_cases - k * floor)):
            sizes[extra] += 1
        cuts = list(itertools.accumulate(sizes, initial=0))
        blocks = [list(order[a:b]) for a, b in itertools.pairwise(cuts)]
    else:
        # Each case goes to one of k blocks or to none (-1); a few cases may go to two (overlap).
        k = draw(st.integers(min_value=1, max_value=n_cases))
        owner = draw(st.lists(st.integers(min_value=-1, max_value=k - 1), min_size=n_cases, max_size=n_cases))
        extra = draw(st.lists(st.tuples(st.integers(0, n_cases - 1), st.integers(0, k - 1)), max_size=2))
        lists = [[name for name, o in zip(names, owner, strict=True) if o == b] for b in range(k)]
        for case, b in extra:
            lists[b].append(names[case])
        blocks = [block for block in lists if block] or [[names[0]]]
    return names, floor, blocks


def _valid(names: list[str], floor: int, blocks) -> bool:
    if len(names) < floor:
        return False
    if blocks is None:
        return True
    if isinstance(blocks, int):
        return len(names) // blocks >= floor
    flat = [n for b in blocks for n in b]
    return all(len(b) >= floor for b in blocks) and len(flat) == len(set(flat)) and set(flat) == set(names)


@settings(max_examples=400, deadline=None)
@given(declarations())
def test_no_combination_of_admitted_requests_isolates_a_case(declaration):
    """Property: for any valid declaration, the admitted requests' indicator vectors never span a
    single case's unit vector (unless the floor is 1, where a one-case block is declared on purpose),
    while every block is itself admitted; invalid declarations are refused."""
    names, floor, blocks = declaration
    rule = access("aggregate", floor, blocks)
    if not _valid(names, floor, blocks):
        with pytest.raises(SpecError):
            AccessPolicy({"p": rule}, {"p": names})
        return
    policy = AccessPolicy({"p": rule}, {"p": names})
    declared = policy.blocks("agent", "p")
    admitted: list[tuple[str, ...]] = [policy.authorize("agent", "p").cases]
    for k in range(1, len(names) + 1):
        for subset in itertools.combinations(names, k):
            try:
                admitted.append(policy.authorize("agent", "p", list(subset)).cases)
            except PolicyDenied:
                continue
    for k in range(1, len(declared) + 1):
        for positions in itertools.combinations(range(len(declared)), k):
            admitted.append(policy.authorize("agent", "p", blocks=list(positions)).cases)
    assert all(len(selection) >= floor for selection in admitted)
    assert all(block in admitted for block in declared)  # each block is an answer: what is learnable
    assert _rank([[Fraction(int(n in s)) for n in names] for s in admitted]) == len(declared)
    if floor >= 2:
        assert isolated_cases(admitted, names) == []


@settings(max_examples=300, deadline=None)
@given(
    n_cases=st.integers(min_value=1, max_value=12),
    tier=st.sampled_from(TIERS),
    floor=st.integers(min_value=1, max_value=12),
    picks=st.lists(st.integers(min_value=0, max_value=15), max_size=16),
    whole=st.booleans(),
)
def test_authorize_matches_the_rules(n_cases, tier, floor, picks, whole):
    """Property: the decision is exactly the rule set in the module docstring (no blocks declared)."""
    names = [f"c{i:02d}" for i in range(n_cases)]
    if tier == "aggregate" and n_cases < floor:
        with pytest.raises(SpecError):
            AccessPolicy({"p": access(tier, floor)}, {"p": names, "hidden": ["z"]})
        return
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
            and not (tier == "aggregate" and len(distinct) < n_cases)
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
    if tier == "aggregate":
        assert grant.full_partition
