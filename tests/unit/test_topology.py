"""Role ranks, FFN-first groups and per-FFN token accounting over a grid of topologies (afd_models.topology)."""

from __future__ import annotations

import itertools

import pytest

from afd_models.topology import (
    TopologyError,
    check_ratio,
    expand_dp_counts,
    ffn_token_counts,
    group_of_attention,
    group_of_ffn,
    groups,
    peer_slices,
    role_rank,
)

VALID = [(a, f) for a, f in itertools.product(range(1, 9), range(1, 9)) if a >= f and a % f == 0]
INVALID = [(a, f) for a, f in itertools.product(range(0, 9), range(0, 9)) if (a, f) not in VALID]


@pytest.mark.parametrize(("a", "f"), VALID)
def test_groups_partition_attention_ranks(a: int, f: int) -> None:
    """Every Attention rank is in exactly one group; groups are FFN-first with consecutive peers and ports."""
    built = groups(a, f, 29650)
    assert [g.ffn_rank for g in built] == list(range(f))
    assert sorted(r for g in built for r in g.attention_ranks) == list(range(a))
    for g in built:
        assert g.size == 1 + a // f and g.port == 29650 + g.ffn_rank
        for rank in g.attention_ranks:
            assert group_of_attention(rank, a, f, 29650) == g
            assert g.group_rank_of_attention(rank) == 1 + g.attention_ranks.index(rank)
        assert group_of_ffn(g.ffn_rank, a, f, 29650) == g


@pytest.mark.parametrize(("a", "f"), INVALID)
def test_invalid_ratios(a: int, f: int) -> None:
    """A < F, A % F != 0 and zero counts are refused with the numbers in the message."""
    with pytest.raises(TopologyError, match=f"num_attention_ranks={a}, num_ffn_ranks={f}"):
        check_ratio(a, f)


def test_four_attention_two_ffn_token_counts() -> None:
    """4A2F with [3, 5, 7, 11]: FFN ranks compute on [8, 18]; raw counts size each peer's rows."""
    counts = [3, 5, 7, 11]
    assert ffn_token_counts(counts, 2) == [8, 18]
    second = groups(4, 2, 1000)[1]
    assert peer_slices(counts, second) == [slice(0, 7), slice(7, 18)]


@pytest.mark.parametrize(("dp", "tp"), [(1, 1), (2, 1), (1, 2), (2, 2), (3, 4)])
def test_role_rank_is_dense(dp: int, tp: int) -> None:
    """Role ranks enumerate DP x TP workers without gaps; TP ranks of one DP rank share its count."""
    ranks = [role_rank(d, t, tp) for d in range(dp) for t in range(tp)]
    assert ranks == list(range(dp * tp))
    assert expand_dp_counts([5, 9, 2][:dp], tp) == [c for c in [5, 9, 2][:dp] for _ in range(tp)]


@pytest.mark.parametrize(("dp", "tp_rank", "tp"), [(-1, 0, 1), (0, 2, 2), (0, 0, 0)])
def test_role_rank_rejects_impossible_positions(dp: int, tp_rank: int, tp: int) -> None:
    with pytest.raises(TopologyError):
        role_rank(dp, tp_rank, tp)


def test_port_range_is_checked() -> None:
    with pytest.raises(TopologyError, match="65536"):
        groups(2, 2, 65535)
