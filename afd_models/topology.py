"""Which worker talks to which: role ranks, FFN-first groups, per-FFN token counts.

Pure functions, no vLLM: every rule is unit-tested over a grid of topologies, and the live code
calls these functions (the connect steps for groups, the FFN server for token counts).

* A worker's **role rank** is its index among the DP ranks of its role: its engine's
  ``rank_offset`` plus its DP rank (:func:`role_rank`; PP is not supported by AFD). Its TP rank is
  its **lane**: Attention rank ``a``'s TP rank ``t`` exchanges with TP rank ``t`` of the FFN rank
  serving ``a``, so both roles run the same TP size. Attention TP partners hold the same hidden
  states (vLLM all-reduces the attention output), so FFN TP partners receive identical tokens,
  each from its own lane, and their MoE layers all-reduce as in plain vLLM; every lane gets the
  reduced output back. No Attention rank's tokens are computed twice, and no role broadcasts.
* An FFN rank takes one step header from each of its peers per step, so its peers must step in
  lockstep: the DP ranks of one vLLM engine serving a MoE model do (vLLM runs a dummy batch on an
  idle DP rank while another has work), separate engines do not. So every FFN group lies within
  one Attention engine (:func:`check_attention_engine`).
* With A Attention and F FFN ranks, any A >= F >= 1 (divisible or not), Attention rank ``a`` is
  served by FFN rank ``a * F // A`` (:func:`ffn_rank_of_attention`, the public AFD plugin's rule).
  FFN rank ``k`` serves the Attention ranks ``ceil(k*A/F) ... ceil((k+1)*A/F) - 1``: contiguous,
  never empty (``A/F >= 1``, so the bounds grow by at least 1 per FFN rank) and of sizes
  ``floor(A/F)`` or ``ceil(A/F)``. 2A1F: [0, 1]; 3A2F: [0, 1], [2]; 4A2F: [0, 1], [2, 3];
  5A2F: [0, 1, 2], [3, 4].
* Each such group is one connector process group, FFN first: the FFN worker is group rank 0, its
  Attention peers follow in role-rank order. Group ``k`` of lane ``t`` meets at
  ``port + k * tp_size + t`` (:func:`group_port`): ``port + k`` without TP.
* An FFN rank computes on the concatenation of its peers' tokens, so its step's token count is
  the sum over its own peers (:func:`ffn_token_counts`: 4A2F with [3, 5, 7, 11] -> [8, 18], 3A2F
  with [3, 5, 7] -> [8, 7]), while each peer's own count sizes that peer's rows (the FFN
  connector splits its output by the peers' step headers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: the highest TCP port
MAX_PORT = 65535


class TopologyError(ValueError):
    """An impossible rank layout; the message names the numbers involved."""


def check_topology(num_attention_ranks: int, num_ffn_ranks: int) -> None:
    """Raise unless ``num_attention_ranks >= num_ffn_ranks >= 1`` (any ratio, divisible or not)."""
    a, f = num_attention_ranks, num_ffn_ranks
    if f < 1 or a < f:
        raise TopologyError(
            f"num_attention_ranks={a}, num_ffn_ranks={f}: need num_attention_ranks >= num_ffn_ranks >= 1 "
            "(every FFN rank needs at least one Attention rank)"
        )


def check_ports(base_port: int, num_ffn_ranks: int, tp_size: int = 1) -> None:
    """Raise unless the ports ``base_port ... base_port + num_ffn_ranks * tp_size - 1`` all exist."""
    last = base_port + num_ffn_ranks * tp_size - 1
    if base_port < 1 or last > MAX_PORT:
        lanes = f" x TP size {tp_size}" if tp_size > 1 else ""
        raise TopologyError(
            f"port={base_port} with {num_ffn_ranks} FFN ranks{lanes} needs ports {base_port}..{last}; "
            f"allowed: 1..{MAX_PORT}"
        )


def group_port(base_port: int, ffn_rank: int, lane: int, tp_size: int) -> int:
    """Where FFN rank ``ffn_rank``'s group of lane ``lane`` meets: an FFN engine's ports are
    consecutive."""
    if not 0 <= lane < tp_size:
        raise TopologyError(f"TP lane {lane} is outside 0..{tp_size - 1}")
    return base_port + ffn_rank * tp_size + lane


def role_rank(dp_rank: int, rank_offset: int = 0) -> int:
    """A worker's index among the DP ranks of its role: its engine's offset plus its DP rank."""
    if dp_rank < 0 or rank_offset < 0:
        raise TopologyError(
            f"dp_rank={dp_rank}, rank_offset={rank_offset} is not a valid worker position"
        )
    return rank_offset + dp_rank


def check_attention_engine(
    first_rank: int, num_ranks: int, num_attention_ranks: int, num_ffn_ranks: int
) -> None:
    """Raise unless the Attention ranks ``first_rank ... first_rank + num_ranks - 1`` of one engine
    exist and hold only whole FFN groups (an FFN rank's peers must step in lockstep)."""
    last = first_rank + num_ranks - 1
    if first_rank < 0 or num_ranks < 1 or last >= num_attention_ranks:
        raise TopologyError(
            f"an Attention engine with {num_ranks} workers from rank {first_rank} takes ranks "
            f"{first_rank}..{last}, outside 0..{num_attention_ranks - 1}"
        )
    for k, members in enumerate(_members(num_attention_ranks, num_ffn_ranks)):
        inside = [r for r in members if first_rank <= r <= last]
        if inside and len(inside) != len(members):
            raise TopologyError(
                f"FFN rank {k} of {num_attention_ranks}A{num_ffn_ranks}F serves attention ranks "
                f"{list(members)}, but the engine of ranks {first_rank}..{last} holds only {inside}: "
                "an FFN rank's peers must be DP ranks of one Attention engine, which step in "
                "lockstep (separate engines do not, and the FFN rank would wait on the idle one)"
            )


def ffn_rank_of_attention(attention_rank: int, num_attention_ranks: int, num_ffn_ranks: int) -> int:
    """The FFN rank serving ``attention_rank``: ``attention_rank * F // A``."""
    check_topology(num_attention_ranks, num_ffn_ranks)
    if not 0 <= attention_rank < num_attention_ranks:
        raise TopologyError(
            f"attention role rank {attention_rank} is outside 0..{num_attention_ranks - 1}"
        )
    return attention_rank * num_ffn_ranks // num_attention_ranks


@dataclass(frozen=True)
class Group:
    """One connector process group: an FFN rank and the Attention ranks it serves, in one TP lane."""

    #: the FFN role rank (also the group index within its lane)
    ffn_rank: int
    #: Attention role ranks in the group, in group-rank order 1, 2, ...
    attention_ranks: tuple[int, ...]
    #: rendezvous port of this group
    port: int
    #: the TP rank of every worker in the group
    lane: int = 0

    @property
    def size(self) -> int:
        return 1 + len(self.attention_ranks)

    def group_rank_of_attention(self, attention_rank: int) -> int:
        return 1 + self.attention_ranks.index(attention_rank)


def _members(num_attention_ranks: int, num_ffn_ranks: int) -> list[tuple[int, ...]]:
    """Attention ranks of each FFN rank, by :func:`ffn_rank_of_attention` (role-rank order)."""
    members: list[list[int]] = [[] for _ in range(num_ffn_ranks)]
    for rank in range(num_attention_ranks):
        members[ffn_rank_of_attention(rank, num_attention_ranks, num_ffn_ranks)].append(rank)
    return [tuple(ranks) for ranks in members]


def groups(
    num_attention_ranks: int,
    num_ffn_ranks: int,
    base_port: int,
    *,
    tp_size: int = 1,
    lane: int = 0,
) -> list[Group]:
    """The connector groups of one TP lane, FFN rank ``k``'s at :func:`group_port`."""
    check_topology(num_attention_ranks, num_ffn_ranks)
    check_ports(base_port, num_ffn_ranks, tp_size)
    return [
        Group(k, ranks, group_port(base_port, k, lane, tp_size), lane)
        for k, ranks in enumerate(_members(num_attention_ranks, num_ffn_ranks))
    ]


def group_of_attention(
    attention_rank: int,
    num_attention_ranks: int,
    num_ffn_ranks: int,
    base_port: int,
    *,
    tp_size: int = 1,
    lane: int = 0,
) -> Group:
    ffn_rank = ffn_rank_of_attention(attention_rank, num_attention_ranks, num_ffn_ranks)
    return groups(num_attention_ranks, num_ffn_ranks, base_port, tp_size=tp_size, lane=lane)[
        ffn_rank
    ]


def group_of_ffn(
    ffn_rank: int,
    num_attention_ranks: int,
    num_ffn_ranks: int,
    base_port: int,
    *,
    tp_size: int = 1,
    lane: int = 0,
) -> Group:
    if not 0 <= ffn_rank < num_ffn_ranks:
        raise TopologyError(f"FFN role rank {ffn_rank} is outside 0..{num_ffn_ranks - 1}")
    return groups(num_attention_ranks, num_ffn_ranks, base_port, tp_size=tp_size, lane=lane)[
        ffn_rank
    ]


def ffn_token_counts(
    counts: Mapping[int, int], num_attention_ranks: int, num_ffn_ranks: int
) -> dict[int, int]:
    """FFN rank -> tokens it computes on in a step: the sum of its Attention peers' counts.

    ``counts`` maps Attention role ranks to their step's token counts and must hold whole groups:
    the FFN server passes its own peers' counts and gets its own entry back; a caller holding
    every rank's count gets every FFN rank's.

    Raises:
        TopologyError: a rank outside the deployment, a negative count, or a group only partly
            present in ``counts``.
    """
    check_topology(num_attention_ranks, num_ffn_ranks)
    outside = sorted(r for r in counts if not 0 <= r < num_attention_ranks)
    if outside:
        raise TopologyError(
            f"token counts for attention role ranks {outside}, outside 0..{num_attention_ranks - 1}"
        )
    negative = {r: c for r, c in sorted(counts.items()) if c < 0}
    if negative:
        raise TopologyError(f"token counts must be >= 0, got {negative}")
    totals: dict[int, int] = {}
    for ffn_rank, members in enumerate(_members(num_attention_ranks, num_ffn_ranks)):
        present = [r for r in members if r in counts]
        if not present:
            continue
        if len(present) != len(members):
            raise TopologyError(
                f"FFN rank {ffn_rank} of {num_attention_ranks}A{num_ffn_ranks}F serves attention "
                f"ranks {list(members)}, but token counts came for {present} only"
            )
        totals[ffn_rank] = sum(counts[r] for r in members)
    return totals
