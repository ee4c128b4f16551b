"""CUDA-graph logic of both roles without a GPU (afd_models.graphs): what a call of vLLM's graph
wrapper is about to do, read from a real forward context; the Attention side announcing replays
and never captures; FFN graph keys (the per-peer split, not the total)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.forward_context import BatchDescriptor, set_forward_context

from afd_models.connectors.base import StepHeader
from afd_models.graphs import (
    AttentionGraphSteps,
    DeviceGraphs,
    FFNGraphKey,
    full_graph_call,
    replays_graphs,
)
from afd_models.wiring.loopback import LoopbackConnector

FOUR = BatchDescriptor(num_tokens=4)


class Announcing(LoopbackConnector):
    """A loopback connector keeping the step headers it announces."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.announced: list[StepHeader] = []

    def _send_header(self, header: StepHeader) -> None:
        self.announced.append(header)
        super()._send_header(header)


def _call_in(mode: CUDAGraphMode, entries: dict, wrapper_mode: CUDAGraphMode = CUDAGraphMode.FULL):
    with set_forward_context(
        None, VllmConfig(), cudagraph_runtime_mode=mode, batch_descriptor=FOUR
    ):
        return full_graph_call(wrapper_mode, entries)


def test_a_full_call_without_a_graph_captures_and_with_one_replays() -> None:
    assert _call_in(CUDAGraphMode.FULL, {}) == (False, 4)
    assert _call_in(CUDAGraphMode.FULL, {FOUR: SimpleNamespace(cudagraph=None)}) == (False, 4)
    assert _call_in(CUDAGraphMode.FULL, {FOUR: SimpleNamespace(cudagraph=object())}) == (True, 4)


def test_an_acl_graph_entry_holds_its_graph_under_its_own_name() -> None:
    """vLLM-Ascend's ACL-graph entries keep the graph in ``aclgraph``; the same rule reads it."""
    with set_forward_context(
        None, VllmConfig(), cudagraph_runtime_mode=CUDAGraphMode.FULL, batch_descriptor=FOUR
    ):
        captured = {FOUR: SimpleNamespace(aclgraph=object())}
        assert full_graph_call(CUDAGraphMode.FULL, captured, graph_attribute="aclgraph") == (
            True,
            4,
        )
        empty = {FOUR: SimpleNamespace(aclgraph=None)}
        assert full_graph_call(CUDAGraphMode.FULL, empty, graph_attribute="aclgraph") == (False, 4)


def test_calls_vllm_neither_captures_nor_replays_are_left_alone() -> None:
    graph = {FOUR: SimpleNamespace(cudagraph=object())}
    assert _call_in(CUDAGraphMode.NONE, graph) is None  # eager step, warm-up, profile run
    assert _call_in(CUDAGraphMode.PIECEWISE, graph) is None  # another wrapper's mode
    assert full_graph_call(CUDAGraphMode.FULL, graph) is None  # no forward context


def test_attention_announces_replays_of_what_it_captured() -> None:
    """A capture runs the exchange (the loopback FFN half in its own forward context) without
    announcing a step; each replay announces the captured step with ``graph`` set."""
    connector = Announcing(lambda layer, received: received.hidden_states * layer)
    announced = connector.announced
    connector.set_layers([1, 2])
    steps = AttentionGraphSteps(connector)
    x = torch.ones(4, 8)

    def forward() -> list[torch.Tensor]:
        outputs = []
        for layer in (1, 2):
            connector.send(layer, x, None)
            outputs.append(connector.recv(layer, x))
        return outputs

    captured = steps.run(False, 4, forward)
    assert [out[0, 0].item() for out in captured] == [1.0, 2.0] and announced == []
    steps.run(True, 4, lambda: None)  # a replay runs no Python of the model
    steps.run(True, 4, lambda: None)
    assert [(h.step, h.num_tokens, h.graph) for h in announced] == [(0, 4, True), (1, 4, True)]
    assert steps.counters.as_dict() == {"graph_captures": 1, "graph_replays": 2, "ubatch_splits": 0}


def test_ffn_graph_keys_hold_each_peers_tokens() -> None:
    first = [StepHeader(0, 1, 8, torch.float32, 4), StepHeader(0, 3, 8, torch.float32, 4)]
    second = [StepHeader(0, 3, 8, torch.float32, 4), StepHeader(0, 1, 8, torch.float32, 4)]
    assert FFNGraphKey.of(2, first) == FFNGraphKey(2, (1, 3), 4)
    assert FFNGraphKey.of(2, first) != FFNGraphKey.of(2, second)  # same total, other split
    with pytest.raises(ValueError, match=r"different router-logit widths \[0, 4\]"):
        FFNGraphKey.of(2, [first[0], StepHeader(0, 3, 8, torch.float32, 0)])


def test_the_ffn_replays_only_when_every_peer_does() -> None:
    replaying = StepHeader(0, 1, 8, torch.float32, graph=True)
    eager = StepHeader(0, 1, 8, torch.float32)
    assert replays_graphs([replaying, replaying])
    assert not replays_graphs([replaying, eager]) and not replays_graphs([])


def test_split_steps_are_told_to_the_connector_captured_and_replayed() -> None:
    """vLLM's micro-batch wrapper hands each split step to the graph steps (split_step, read from
    the wrapper's own state): an eager split step and a captured one tell the connector the
    split first (its header carries it), a replay announces the header kept at capture; eager
    runs and replays count as splits, a capture as a capture."""
    from afd_models.graphs import split_step

    connector = Announcing(lambda layer, received: received.hidden_states * layer)
    announced = connector.announced
    connector.set_layers([1])
    steps = AttentionGraphSteps(connector)
    slices = [SimpleNamespace(num_tokens=3), SimpleNamespace(num_tokens=5)]

    def forward() -> None:  # the two micro-batches, as vLLM's threads take turns
        for ubatch, rows in enumerate((3, 5)):
            connector.send(1, torch.ones(rows, 8), None, ubatch=ubatch)
        for ubatch, rows in enumerate((3, 5)):
            assert connector.recv(1, torch.ones(rows, 8), ubatch=ubatch).shape == (rows, 8)

    with split_step(steps, slices, CUDAGraphMode.NONE, {}):
        forward()
    with split_step(steps, slices, CUDAGraphMode.FULL, {}):
        forward()  # a capture: nothing announced
    with split_step(steps, slices, CUDAGraphMode.FULL, {8: object()}):
        pass  # a replay runs no Python of the model
    assert [(h.step, h.ubatches, h.graph) for h in announced] == [
        (0, (3, 5), False),
        (1, (3, 5), True),
    ]
    assert steps.counters.as_dict() == {"graph_captures": 1, "graph_replays": 1, "ubatch_splits": 2}
    with split_step(None, slices, CUDAGraphMode.NONE, {}):
        pass  # before the runner binds its steps: vLLM's own behaviour


class FakeDevice:
    """A torch device module (``torch.cuda``, ``torch.npu``) recording graph captures."""

    def __init__(self) -> None:
        self.log: list[tuple[str, object]] = []

    class NPUGraph:
        def __init__(self) -> None:
            self.replays = 0

        def replay(self) -> None:
            self.replays += 1

    def graph_pool_handle(self) -> str:
        return "pool"

    def current_stream(self) -> str:
        return "stream"

    @contextlib.contextmanager
    def graph(self, graph: object, pool: object, stream: object) -> Iterator[None]:
        self.log.append(("capture", (type(graph).__name__, pool, stream)))
        yield
        self.log.append(("captured", None))


def test_npu_graphs_capture_on_the_current_stream_from_one_pool_and_replay() -> None:
    device = FakeDevice()
    graphs = DeviceGraphs("npu", device)
    ran: list[str] = []
    graph = graphs.capture(lambda: ran.append("layer"))
    assert device.log == [("capture", ("NPUGraph", "pool", "stream")), ("captured", None)]
    assert ran == ["layer"]  # captured while it ran
    graphs.replay(graph)
    assert graph.replays == 1


def test_device_graphs_of_another_device_type_are_refused() -> None:
    with pytest.raises(ValueError, match="no device graphs on 'cpu'; allowed: cuda, npu"):
        DeviceGraphs("cpu", FakeDevice())
