"""DBO (dual batch overlap) with the AFD exchange: which steps split, and the order of transfers.

**Attention.** With ``additional_config.afd.dbo`` the Attention worker switches vLLM's DBO on in
its own config (:func:`afd_models.worker_config.with_dbo`), so vLLM wraps the model in its micro-batch
wrapper: a split step runs as two threads, one per micro-batch, taking turns. vLLM decides to
split only across DP ranks; an AFD Attention engine of one DP rank decides alone, by vLLM's own
thresholds (:func:`split_single_rank`). Inside the exchange op a micro-batch sends its layer, then
yields (vLLM's ``dbo_yield``), so the other computes its attention while the FFN role computes
this one's layer; then it receives. A split step's transfers on one Attention worker therefore
go out as::

    send(u0, L0)  send(u1, L0)  recv(u0, L0)  send(u0, L1)  recv(u1, L0)  send(u1, L1) ...

**FFN.** The header of a split step names its micro-batches; the FFN side serves *units* (a
layer of one micro-batch, with every peer that has that micro-batch) in layer order, micro-batch
order within a layer (:func:`split_step_units`). Device transfers on one stream run in the order
they are posted, and NCCL pairs them by order, so the FFN side posts each peer's transfers in the
order that peer posts the matching ones: after computing a unit it posts the receive of a split
peer's next unit *before* sending the results (that peer sent it before waiting for them), and of
an unsplit peer's next layer *after* (it sends that layer only once it has its result, and it
must not hold up the others' results) (:func:`receives_before_send`). A split peer's order is
required: anything else deadlocks on a transport that pairs a send with its receive. Split steps
run eagerly on the FFN role; its graphs serve unsplit steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from afd_models.connectors.base import StepHeader, peers_with


def split_single_rank(
    parallel_config: Any,
    *,
    allow_microbatching: bool,
    num_tokens: int,
    num_tokens_padded: int,
    uniform_decode: bool,
    full_graph: bool,
) -> bool:
    """Whether an engine of one DP rank splits a step of ``num_tokens`` tokens (padded to
    ``num_tokens_padded``; ``full_graph``: it runs as a FULL CUDA graph) into micro-batches:
    vLLM's rule across DP ranks, for one rank.

    vLLM's thresholds decide (``--dbo-decode-token-threshold`` for uniform decode batches,
    ``--dbo-prefill-token-threshold`` for others), and a split whose last micro-batch would hold
    only padding is dropped, as vLLM drops it. A FULL-graph step splits only as a uniform decode
    batch: vLLM captures split graphs of those alone, so another would be captured while
    serving. Each micro-batch holds at least one token.
    """
    from vllm.v1.worker.ubatch_utils import check_ubatch_thresholds, is_last_ubatch_empty

    num_ubatches = parallel_config.num_ubatches
    return (
        allow_microbatching
        and parallel_config.data_parallel_size == 1
        and num_tokens_padded >= num_ubatches
        and (uniform_decode or not full_graph)
        and check_ubatch_thresholds(parallel_config, num_tokens, uniform_decode)
        and not is_last_ubatch_empty(num_tokens, num_tokens_padded, num_ubatches)
    )


@dataclass(frozen=True)
class Unit:
    """One layer of one micro-batch on the FFN side."""

    layer: int
    ubatch: int
    #: positions (in the group's peer order) of the peers whose step has this micro-batch
    peers: tuple[int, ...]


def split_step_units(layers: Sequence[int], headers: Sequence[StepHeader]) -> list[Unit]:
    """The units of a step, in the order the FFN side computes them."""
    most = max(len(h.ubatches) for h in headers)
    return [
        Unit(layer, ubatch, peers_with(headers, ubatch))
        for layer in layers
        for ubatch in range(most)
    ]


def receives_before_send(
    following: Unit, headers: Sequence[StepHeader]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The peers of ``following`` whose receive the FFN side posts before sending the results of
    the unit it just computed, and those it posts after.

    Before: a split peer (it sent ``following`` before waiting for those results). After: an
    unsplit peer, which sends its next layer only once it has this one's result (and whose next
    layer must not hold up the results of the others).
    """
    before = tuple(p for p in following.peers if len(headers[p].ubatches) > 1)
    return before, tuple(p for p in following.peers if p not in before)
