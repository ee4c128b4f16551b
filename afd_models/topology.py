"""Which worker talks to which: role ranks, FFN-first layout, per-FFN token accounting.

Pure functions, no vLLM: every rule is unit-tested over a grid of topologies.

* A worker's **role rank** is its index among the workers of its role:
  ``(dp_rank * tp_size) + tp_rank`` (PP is not supported by AFD).
* With A Attention and F FFN workers (A >= F, A % F == 0) each FFN rank ``k`` serves the
  ``A / F`` consecutive Attention ranks ``k * A/F ... (k + 1) * A/F - 1``. Each such group is one
  connector process group, FFN first: the FFN worker is group rank 0, its Attention peers follow
  in role-rank order. Group ``k`` meets at ``port + k``.
* FFN-side token counts: an FFN rank computes on the concatenation of its peers' tokens, so the
  counts vLLM sees on the FFN side are summed per FFN rank (4A2F with [3, 5, 7, 11] -> [8, 18]),
  while the raw per-Attention counts size each transfer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class TopologyError(ValueError):
    """An impossible rank layout; the message names the numbers involved."""


def check_ratio(num_attention_ranks: int, num_ffn_ranks: int) -> int:
    """Attention ranks per FFN rank; raises unless A >= F >= 1 and A % F == 0."""
    a, f = num_attention_ranks, num_ffn_ranks
    if f < 1 or a < f or a % f:
        raise TopologyError(
            f"num_attention_ranks={a}, num_ffn_ranks={f}: need num_attention_ranks >= num_ffn_ranks >= 1 "
            "and num_attention_ranks a multiple of num_ffn_ranks"
        )
    return a // f


def role_rank(dp_rank: int, tp_rank: int, tp_size: int) -> int:
    """Index of a worker among the workers of its role."""
    if tp_size < 1 or not 0 <= tp_rank < tp_size or dp_rank < 0:
        raise TopologyError(
            f"dp_rank={dp_rank}, tp_rank={tp_rank}, tp_size={tp_size} is not a valid worker position"
        )
    return dp_rank * tp_size + tp_rank


@dataclass(frozen=True)
class Group:
    """One connector process group: an FFN rank and the Attention ranks it serves."""

    #: the FFN role rank (also the group index)
    ffn_rank: int
    #: Attention role ranks in the group, in group-rank order 1, 2, ...
    attention_ranks: tuple[int, ...]
    #: rendezvous port of this group
    port: int

    @property
    def size(self) -> int:
        return 1 + len(self.attention_ranks)

    def group_rank_of_attention(self, attention_rank: int) -> int:
        return 1 + self.attention_ranks.index(attention_rank)


def groups(num_attention_ranks: int, num_ffn_ranks: int, base_port: int) -> list[Group]:
    """Every connector group of the deployment, FFN first."""
    ratio = check_ratio(num_attention_ranks, num_ffn_ranks)
    if base_port + num_ffn_ranks - 1 > 65535:
        raise TopologyError(
            f"port={base_port} with {num_ffn_ranks} FFN ranks needs ports up to {base_port + num_ffn_ranks - 1} > 65535"
        )
    return [
        Group(k, tuple(range(k * ratio, (k + 1) * ratio)), base_port + k)
        for k in range(num_ffn_ranks)
    ]


def group_of_attention(
    attention_rank: int, num_attention_ranks: int, num_ffn_ranks: int, base_port: int
) -> Group:
    if not 0 <= attention_rank < num_attention_ranks:
        raise TopologyError(
            f"attention role rank {attention_rank} is outside 0..{num_attention_ranks - 1}"
        )
    ratio = check_ratio(num_attention_ranks, num_ffn_ranks)
    return groups(num_attention_ranks, num_ffn_ranks, base_port)[attention_rank // ratio]


def group_of_ffn(
    ffn_rank: int, num_attention_ranks: int, num_ffn_ranks: int, base_port: int
) -> Group:
    if not 0 <= ffn_rank < num_ffn_ranks:
        raise TopologyError(f"FFN role rank {ffn_rank} is outside 0..{num_ffn_ranks - 1}")
    return groups(num_attention_ranks, num_ffn_ranks, base_port)[ffn_rank]


def expand_dp_counts(counts_per_dp: Sequence[int], tp_size: int) -> list[int]:
    """Per-DP token counts -> per-Attention-worker counts (every TP rank carries its DP rank's tokens)."""
    if tp_size < 1:
        raise TopologyError(f"tp_size={tp_size} must be >= 1")
    return [count for count in counts_per_dp for _ in range(tp_size)]


def ffn_token_counts(counts_per_attention: Sequence[int], num_ffn_ranks: int) -> list[int]:
    """Tokens each FFN rank computes on: the sum over its Attention peers."""
    ratio = check_ratio(len(counts_per_attention), num_ffn_ranks)
    if any(c < 0 for c in counts_per_attention):
        raise TopologyError(f"token counts must be >= 0, got {list(counts_per_attention)}")
    return [sum(counts_per_attention[k * ratio : (k + 1) * ratio]) for k in range(num_ffn_ranks)]


def peer_slices(
    counts_per_attention: Sequence[int] | Mapping[int, int], group: Group
) -> list[slice]:
    """Rows of the FFN rank's concatenated batch that belong to each peer, in group order
    (``counts_per_attention`` is indexed by Attention rank)."""
    start = 0
    slices = []
    for rank in group.attention_ranks:
        count = counts_per_attention[rank]
        slices.append(slice(start, start + count))
        start += count
    return slices
