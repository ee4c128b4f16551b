"""DBO logic without a GPU (afd_models.dbo): which steps an engine of one DP rank splits, by
vLLM's own thresholds and rules, and the order in which the FFN side serves a split step."""

from __future__ import annotations

import ast
import copy
import inspect
import textwrap
from typing import Any

import pytest
import torch
from vllm.config import ParallelConfig

from afd_models.connectors.base import StepHeader
from afd_models.dbo import Unit, receives_before_send, split_single_rank, split_step_units


def _parallel(**settings: object) -> ParallelConfig:
    config = copy.copy(ParallelConfig())
    for key, value in {"enable_dbo": True, **settings}.items():
        setattr(config, key, value)
    return config


def _split(config: ParallelConfig, **changes: Any) -> bool:
    decide = {
        "allow_microbatching": True,
        "num_tokens": 64,
        "num_tokens_padded": 64,
        "uniform_decode": True,
        "full_graph": False,
        **changes,
    }
    return split_single_rank(config, **decide)


@pytest.mark.parametrize(
    ("tokens", "padded", "uniform", "split"),
    [
        (32, 32, True, True),  # at --dbo-decode-token-threshold (32)
        (31, 32, True, False),
        (32, 64, True, False),  # the second micro-batch would hold only padding
        (100, 100, False, False),  # prefill below --dbo-prefill-token-threshold (512)
        (512, 512, False, True),
    ],
)
def test_one_dp_rank_splits_by_vllms_thresholds(
    tokens: int, padded: int, uniform: bool, split: bool
) -> None:
    decide = {"num_tokens": tokens, "num_tokens_padded": padded, "uniform_decode": uniform}
    assert _split(_parallel(), **decide) is split
    assert not _split(_parallel(), allow_microbatching=False, **decide)
    assert not _split(_parallel(enable_dbo=False), **decide)


def test_the_thresholds_are_vllms_flags() -> None:
    low = _parallel(dbo_decode_token_threshold=2, dbo_prefill_token_threshold=4)
    assert _split(low, num_tokens=2, num_tokens_padded=2)
    assert _split(low, num_tokens=4, num_tokens_padded=4, uniform_decode=False)
    # a threshold of 0 or 1 never makes an empty micro-batch
    assert not _split(_parallel(dbo_decode_token_threshold=0), num_tokens=1, num_tokens_padded=1)


def test_a_full_graph_step_splits_only_as_a_uniform_decode_batch() -> None:
    """vLLM captures split FULL graphs of uniform decode batches only (FULL mode captures mixed
    batches whole): a mixed FULL step that split would be captured while serving."""
    config = _parallel(dbo_prefill_token_threshold=4)
    mixed = {"num_tokens": 64, "num_tokens_padded": 64, "uniform_decode": False}
    assert _split(config, **mixed) and not _split(config, full_graph=True, **mixed)
    assert _split(config, full_graph=True)  # uniform decode


def test_several_dp_ranks_leave_the_decision_to_vllm() -> None:
    assert not _split(_parallel(data_parallel_size=2))
    assert _split(_parallel())


def _header(*ubatches: int) -> StepHeader:
    first = ubatches[0] if len(ubatches) > 1 else 0
    return StepHeader(0, sum(ubatches), 8, torch.float32, ubatch_tokens=first)


def test_units_go_by_layer_then_micro_batch_with_the_peers_that_have_it() -> None:
    headers = [_header(3), _header(2, 3)]
    assert split_step_units([1, 4], headers) == [
        Unit(1, 0, (0, 1)),
        Unit(1, 1, (1,)),
        Unit(4, 0, (0, 1)),
        Unit(4, 1, (1,)),
    ]


def _attention_order(layers: list[int], micro_batches: int) -> list[tuple[str, int, int]]:
    """The transfers of one Attention worker, as vLLM's micro-batch threads take turns: each
    sends a layer, yields, then receives it; a finished thread hands over to the other."""
    programs = [
        [(op, layer, ubatch) for layer in layers for op in ("send", "yield", "recv")]
        for ubatch in range(micro_batches)
    ]
    order, turn, positions = [], 0, [0] * micro_batches
    while any(p < len(prog) for p, prog in zip(positions, programs, strict=True)):
        program = programs[turn]
        while positions[turn] < len(program):
            op, layer, ubatch = program[positions[turn]]
            positions[turn] += 1
            if op == "yield":
                break
            order.append((op, layer, ubatch))
        turn = (turn + 1) % micro_batches
    return order


@pytest.mark.parametrize("splits", [((3,), (2, 3)), ((2, 2), (4,)), ((1, 1), (2, 3)), ((3,), (4,))])
def test_the_ffn_side_posts_each_peers_transfers_in_that_peers_order(
    splits: tuple[tuple[int, ...], ...],
) -> None:
    """Walking the units as the FFN server does (receive a unit, compute, post the receives
    :func:`receives_before_send` puts before the send, send, post the rest), each peer sees its
    transfers in the order its Attention worker posts the matching ones (a send for a receive)."""
    layers = [1, 4, 6]
    headers = [_header(*split) for split in splits]
    units = split_step_units(layers, headers)
    ffn: dict[int, list[tuple[str, int, int]]] = {p: [] for p in range(len(headers))}

    def post(op: str, unit: Unit, peers: tuple[int, ...]) -> None:
        for peer in peers:
            ffn[peer].append((op, unit.layer, unit.ubatch))

    post("recv", units[0], units[0].peers)
    for index, unit in enumerate(units):
        following = units[index + 1] if index + 1 < len(units) else None
        before, after = receives_before_send(following, headers) if following else ((), ())
        if following:
            post("recv", following, before)
        post("send", unit, unit.peers)
        if following:
            post("recv", following, after)
    mirror = {"send": "recv", "recv": "send"}
    for peer, split in enumerate(splits):
        expected = [
            (mirror[op], layer, ub) for op, layer, ub in _attention_order(layers, len(split))
        ]
        assert ffn[peer] == expected


@pytest.mark.every_release
def test_micro_batches_keep_every_sm() -> None:
    """vLLM's wrapper reserves SMs for an all2all kernel (a CUDA-only context); the AFD wrapper,
    whose exchange runs no such kernel, reserves none and needs no device for it. Before vLLM
    0.30 the reservation is a static method AFD overrides; from 0.30 ``__init__`` builds it, and
    AFD's fork of ``__init__`` (which needs a CUDA stream to run) holds a null context instead."""
    from vllm import __version__
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu_ubatch_wrapper import UBatchWrapper

    from afd_models.generated_classes import generated_subclass
    from afd_models.release_order import release_key

    wrapper = generated_subclass("AFDUBatchWrapper", UBatchWrapper)
    if release_key(__version__) < release_key("0.30"):
        with wrapper._create_sm_control_context(VllmConfig()):
            pass
        with pytest.raises(AssertionError, match="SM/CU control"):
            UBatchWrapper._create_sm_control_context(VllmConfig())
        return
    from vllm.v1.worker.ubatch_utils import create_sm_control_context

    assert "_create_sm_control_context" not in vars(wrapper)
    init = ast.parse(textwrap.dedent(inspect.getsource(wrapper.__init__)))
    assignments = {
        ast.unparse(node.targets[0]): ast.unparse(node.value)
        for node in ast.walk(init)
        if isinstance(node, ast.Assign)
    }
    assert assignments["self.sm_control"] == "contextlib.nullcontext()"
    assert "create_sm_control_context" not in ast.unparse(init)
    with pytest.raises(AssertionError, match="SM/CU control"):
        create_sm_control_context(VllmConfig().parallel_config)
