"""Role ranks, FFN-first groups and per-FFN token counts over a grid of topologies (afd_models.topology)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re

import pytest

from afd_models.topology import (
    MAX_PORT,
    TopologyError,
    check_attention_engine,
    check_ports,
    check_topology,
    ffn_rank_of_attention,
    ffn_token_counts,
    group_of_attention,
    group_of_ffn,
    groups,
    role_rank,
)

BASE_PORT = 29650
GRID = [(a, f) for a in range(1, 13) for f in range(1, a + 1)]
INVALID = [(a, f) for a, f in itertools.product(range(0, 9), range(0, 9)) if not a >= f >= 1]


@pytest.mark.parametrize(("a", "f"), GRID)
def test_groups_partition_attention_ranks(a: int, f: int) -> None:
    """Every Attention rank is in exactly one group; groups are non-empty, contiguous, in rank
    order, of sizes differing by at most 1, and FFN rank k meets at port + k."""
    built = groups(a, f, BASE_PORT)
    assert [g.ffn_rank for g in built] == list(range(f))
    assert [g.port for g in built] == [BASE_PORT + k for k in range(f)]
    # concatenated in FFN-rank order, the groups are exactly 0..a-1: each rank once, contiguous
    assert [r for g in built for r in g.attention_ranks] == list(range(a))
    sizes = [len(g.attention_ranks) for g in built]
    assert min(sizes) >= 1
    assert max(sizes) - min(sizes) <= 1
    assert set(sizes) <= {a // f, math.ceil(a / f)}


@pytest.mark.parametrize(("a", "f"), GRID)
def test_the_mapping_rule_matches_group_membership(a: int, f: int) -> None:
    """Attention rank r is in group r * F // A (the public plugin's rule), and the lookups agree."""
    built = groups(a, f, BASE_PORT)
    for rank in range(a):
        k = ffn_rank_of_attention(rank, a, f)
        assert k == rank * f // a
        assert rank in built[k].attention_ranks
        assert group_of_attention(rank, a, f, BASE_PORT) == built[k]
        assert built[k].group_rank_of_attention(rank) == 1 + built[k].attention_ranks.index(rank)
    for g in built:
        assert g.size == 1 + len(g.attention_ranks)
        assert group_of_ffn(g.ffn_rank, a, f, BASE_PORT) == g


@pytest.mark.parametrize(
    ("a", "f", "expected"),
    [
        (1, 1, [(0,)]),
        (2, 1, [(0, 1)]),
        (2, 2, [(0,), (1,)]),
        (3, 2, [(0, 1), (2,)]),
        (4, 2, [(0, 1), (2, 3)]),
        (5, 2, [(0, 1, 2), (3, 4)]),
        (7, 3, [(0, 1, 2), (3, 4), (5, 6)]),
    ],
)
def test_documented_examples(a: int, f: int, expected: list[tuple[int, ...]]) -> None:
    """The groups the docs list."""
    assert [g.attention_ranks for g in groups(a, f, BASE_PORT)] == expected


@pytest.mark.parametrize(("a", "f"), INVALID)
def test_impossible_rank_counts_are_refused(a: int, f: int) -> None:
    """A < F and zero counts are refused with the numbers in the message."""
    with pytest.raises(TopologyError, match=f"num_attention_ranks={a}, num_ffn_ranks={f}"):
        check_topology(a, f)
    with pytest.raises(TopologyError):
        groups(a, f, BASE_PORT)


@pytest.mark.parametrize(("rank", "a", "f"), [(-1, 2, 1), (2, 2, 1), (3, 3, 2)])
def test_attention_ranks_outside_the_deployment_are_refused(rank: int, a: int, f: int) -> None:
    with pytest.raises(TopologyError, match=f"attention role rank {rank} is outside 0..{a - 1}"):
        ffn_rank_of_attention(rank, a, f)
    with pytest.raises(TopologyError):
        group_of_attention(rank, a, f, BASE_PORT)


@pytest.mark.parametrize("rank", [-1, 2])
def test_ffn_ranks_outside_the_deployment_are_refused(rank: int) -> None:
    with pytest.raises(TopologyError, match=f"FFN role rank {rank} is outside 0..1"):
        group_of_ffn(rank, 3, 2, BASE_PORT)


def _uneven_counts(a: int) -> dict[int, int]:
    """Distinct, uneven token counts per Attention rank (a step where peers carry different counts)."""
    return {rank: 3 + 2 * rank + rank * rank % 5 for rank in range(a)}


@pytest.mark.parametrize(("a", "f"), GRID)
def test_ffn_token_counts_sum_each_ffn_ranks_own_peers(a: int, f: int) -> None:
    """With every rank's count, each FFN rank gets the sum over its group; with only one group's
    counts (what an FFN rank holds), exactly that FFN rank's sum."""
    counts = _uneven_counts(a)
    built = groups(a, f, BASE_PORT)
    expected = {g.ffn_rank: sum(counts[r] for r in g.attention_ranks) for g in built}
    assert ffn_token_counts(counts, a, f) == expected
    assert sum(expected.values()) == sum(counts.values())
    for g in built:
        own = {r: counts[r] for r in g.attention_ranks}
        assert ffn_token_counts(own, a, f) == {g.ffn_rank: expected[g.ffn_rank]}


@pytest.mark.parametrize(
    ("counts", "f", "expected"),
    [
        ([3, 5, 7, 11], 2, {0: 8, 1: 18}),
        ([3, 5, 7], 2, {0: 8, 1: 7}),
        ([3, 5, 7, 11, 13], 2, {0: 15, 1: 24}),
        ([4, 0], 1, {0: 4}),
    ],
)
def test_ffn_token_counts_examples(counts: list[int], f: int, expected: dict[int, int]) -> None:
    """4A2F [3, 5, 7, 11] -> [8, 18]; 3A2F [3, 5, 7] -> [8, 7]; 5A2F; an idle peer counts 0."""
    assert ffn_token_counts(dict(enumerate(counts)), len(counts), f) == expected


@pytest.mark.parametrize(
    ("counts", "a", "f", "fragment"),
    [
        (
            {0: 3},
            3,
            2,
            "FFN rank 0 of 3A2F serves attention ranks [0, 1], but token counts came for [0] only",
        ),
        ({1: 5, 2: 7}, 3, 2, "serves attention ranks [0, 1], but token counts came for [1] only"),
        ({0: 3, 4: 1}, 4, 2, "attention role ranks [4], outside 0..3"),
        ({-1: 3}, 4, 2, "attention role ranks [-1], outside 0..3"),
        ({0: 3, 1: -2}, 2, 1, "token counts must be >= 0, got {1: -2}"),
        ({0: 3}, 1, 2, "num_attention_ranks=1, num_ffn_ranks=2"),
    ],
)
def test_ffn_token_counts_refuse_partial_groups_and_bad_counts(
    counts: dict[int, int], a: int, f: int, fragment: str
) -> None:
    with pytest.raises(TopologyError) as raised:
        ffn_token_counts(counts, a, f)
    assert fragment in str(raised.value)


def test_role_rank_is_the_engines_offset_plus_its_dp_rank() -> None:
    assert [role_rank(d) for d in range(3)] == [0, 1, 2]
    assert [role_rank(d, rank_offset=2) for d in range(2)] == [2, 3]


@pytest.mark.parametrize(("dp", "offset"), [(-1, 0), (0, -1)])
def test_role_rank_rejects_impossible_positions(dp: int, offset: int) -> None:
    with pytest.raises(TopologyError, match=f"dp_rank={dp}, rank_offset={offset}"):
        role_rank(dp, offset)


@pytest.mark.parametrize("sizes", [(2, 1), (1, 1, 1), (3,), (1, 2)])
def test_engines_with_offsets_number_the_role_without_gaps_or_overlaps(
    sizes: tuple[int, ...],
) -> None:
    """Engines of DP sizes ``sizes`` started with rank_offset = the DP ranks before them."""
    ranks = []
    offset = 0
    for dp in sizes:
        ranks += [role_rank(d, rank_offset=offset) for d in range(dp)]
        offset += dp
    assert ranks == list(range(offset))


@pytest.mark.parametrize(("a", "f"), [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3)])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tp_lanes_pair_equal_tp_ranks_on_distinct_ports(a: int, f: int, tp: int) -> None:
    """TP rank t of Attention rank r meets TP rank t of FFN rank r*F//A, with the same peers as
    without TP; every (FFN rank, lane) has its own port, an FFN engine's ports consecutive."""
    ports = {}
    for lane in range(tp):
        lane_groups = groups(a, f, BASE_PORT, tp_size=tp, lane=lane)
        assert [g.attention_ranks for g in lane_groups] == [
            g.attention_ranks for g in groups(a, f, BASE_PORT)
        ]
        for g in lane_groups:
            assert g.lane == lane
            assert group_of_ffn(g.ffn_rank, a, f, BASE_PORT, tp_size=tp, lane=lane) == g
            for r in g.attention_ranks:
                assert group_of_attention(r, a, f, BASE_PORT, tp_size=tp, lane=lane) == g
            ports[(g.ffn_rank, lane)] = g.port
    assert sorted(ports.values()) == list(range(BASE_PORT, BASE_PORT + f * tp))
    for k in range(f):
        assert [ports[(k, t)] for t in range(tp)] == list(
            range(BASE_PORT + k * tp, BASE_PORT + (k + 1) * tp)
        )
    with pytest.raises(TopologyError, match=f"TP lane {tp} is outside 0..{tp - 1}"):
        groups(a, f, BASE_PORT, tp_size=tp, lane=tp)


def _engine_splits(a: int) -> list[list[tuple[int, int]]]:
    """Every way to cut Attention ranks 0..a-1 into consecutive engines: (first rank, size) each."""
    splits = []
    for cuts in itertools.product([False, True], repeat=a - 1):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [a]
        splits.append([(lo, hi - lo) for lo, hi in itertools.pairwise(bounds)])
    return splits


@pytest.mark.parametrize(("a", "f"), [(a, f) for a, f in GRID if a <= 7])
def test_an_attention_engine_must_hold_whole_ffn_groups(a: int, f: int) -> None:
    """Over every split of the Attention ranks into engines: the split is accepted exactly when
    no FFN rank's peers span two engines (they would not step in lockstep)."""
    for split in _engine_splits(a):
        engine_of = {
            r: i for i, (first, size) in enumerate(split) for r in range(first, first + size)
        }
        whole = all(
            len({engine_of[r] for r in group.attention_ranks}) == 1
            for group in groups(a, f, BASE_PORT)
        )
        refused = []
        for first, size in split:
            try:
                check_attention_engine(first, size, a, f)
            except TopologyError:
                refused.append((first, size))
        assert (not refused) == whole, (split, refused)


def test_a_group_split_over_engines_is_named() -> None:
    """2A1F from two separate engines: the FFN rank would wait on whichever engine is idle."""
    with pytest.raises(TopologyError) as raised:
        check_attention_engine(1, 1, 2, 1)
    assert str(raised.value).startswith(
        "FFN rank 0 of 2A1F serves attention ranks [0, 1], but the engine of ranks 1..1 holds only [1]"
    )
    check_attention_engine(0, 2, 2, 1)  # one DP engine: accepted
    check_attention_engine(2, 1, 3, 2)  # 3A2F: DP 2 engine for FFN 0, one engine for FFN 1
    check_attention_engine(0, 2, 3, 2)


@pytest.mark.parametrize(("first", "size", "a"), [(2, 2, 3), (-1, 1, 2), (0, 0, 2)])
def test_an_attention_engine_outside_the_deployment_is_refused(
    first: int, size: int, a: int
) -> None:
    with pytest.raises(TopologyError, match=f"outside 0..{a - 1}"):
        check_attention_engine(first, size, a, 1)


@pytest.mark.parametrize(("port", "f"), [(65535, 1), (65534, 2), (1, 4096)])
def test_ports_up_to_the_last_one_are_accepted(port: int, f: int) -> None:
    check_ports(port, f)
    assert groups(f, f, port)[-1].port == port + f - 1 <= MAX_PORT


@pytest.mark.parametrize(("port", "f", "last"), [(65535, 2, 65536), (65000, 600, 65599), (0, 1, 0)])
def test_ports_past_the_range_are_refused(port: int, f: int, last: int) -> None:
    with pytest.raises(
        TopologyError, match=f"port={port} with {f} FFN ranks needs ports {port}..{last}"
    ):
        groups(f, f, port)


def test_tp_lanes_need_a_port_each() -> None:
    check_ports(65532, 2, 2)
    with pytest.raises(
        TopologyError,
        match=re.escape("port=65533 with 2 FFN ranks x TP size 2 needs ports 65533..65536"),
    ):
        groups(2, 2, 65533, tp_size=2)


def test_the_ffn_server_counts_a_step_with_ffn_token_counts() -> None:
    """The live FFN loop's step token count is its own peers' sum (3A2F, uneven counts), and
    headers that do not match its peers are refused."""
    pytest.importorskip("vllm", reason="afd_models.ffn_server imports vLLM")
    import torch

    from afd_models.connectors.base import AFDConnectionError, StepHeader
    from afd_models.ffn_server import check_headers

    def header(tokens: int) -> StepHeader:
        return StepHeader(0, tokens, 8, torch.float32)

    first, second = groups(3, 2, BASE_PORT)
    shape = {"num_attention_ranks": 3, "num_ffn_ranks": 2, "hidden_size": 8, "dtype": torch.float32}
    assert check_headers([header(3), header(5)], first, **shape) == 8
    assert check_headers([header(7)], second, **shape) == 7
    with pytest.raises(
        AFDConnectionError, match=r"got 1 step headers for its 2 attention peers \[0, 1\]"
    ):
        check_headers([header(3)], first, **shape)
    with pytest.raises(AFDConnectionError, match=r"hidden size 8 torch\.float32"):
        check_headers([header(3), header(5)], first, **{**shape, "hidden_size": 16})
    with pytest.raises(TopologyError, match=r"came for \[2\] only"):
        check_headers([header(7)], second, **{**shape, "num_attention_ranks": 4})
    with pytest.raises(TopologyError, match=r"are not the peers of FFN rank 0 in 2A2F"):
        check_headers([header(3), header(5)], first, **{**shape, "num_attention_ranks": 2})
    # the sends' parts pair only if both sides agree whether token ids come
    with_ids = dataclasses.replace(header(7), token_ids=True)
    assert check_headers([with_ids], second, **shape, token_ids=True) == 7
    with pytest.raises(AFDConnectionError, match="says token ids come, but this FFN model has no"):
        check_headers([with_ids], second, **shape)
    with pytest.raises(AFDConnectionError, match="do not come, but this FFN model has token-id"):
        check_headers([header(7)], second, **shape, token_ids=True)
