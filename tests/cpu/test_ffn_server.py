"""The FFN server loop (afd_models.ffn_server.FFNServer) over a scripted connector: per-step token
counts from its own peers' headers, the rows its layers really computed, the step record operators
and the e2e tests read, a failure kept instead of a silent thread death, and the device and stream
its thread computes on (a fake accelerator module stands in for ``torch.cuda``)."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from vllm.config import VllmConfig

from afd_models.config import parse_afd_config
from afd_models.connectors.base import AFDConnectionError, LayerInput, StepHeader, peers_with
from afd_models.ffn_server import FFNServer
from afd_models.graphs import FFNGraphKey, FFNGraphs
from afd_models.topology import group_of_ffn

HIDDEN = 8
LAYERS = [1, 2]
CPU = torch.device("cpu")


class ScriptedConnector:
    """FFN rank 0 of 3A2F (peers: Attention ranks 0 and 1) receiving scripted steps; ``graphs``
    says, per step, which peers announce a graph replay (none when not given)."""

    def __init__(
        self,
        steps: list[tuple[int, ...]],
        rows_sent: list[int] | None = None,
        graphs: list[tuple[bool, ...]] | None = None,
    ):
        self.group = group_of_ffn(0, 3, 2, 29650)
        self.steps = list(steps)
        self.graphs = list(graphs) if graphs is not None else None
        self.rows_sent = rows_sent  # rows actually delivered per step, when not the announced sum
        self.current = 0
        self.outputs: list[tuple[int, torch.Tensor]] = []
        self.done = threading.Event()

    def wait_step(self, stop: threading.Event) -> list[StepHeader] | None:
        if not self.steps:
            self.done.set()
            stop.wait(30)
            return None
        counts = self.steps.pop(0)
        self.current = sum(counts) if self.rows_sent is None else self.rows_sent.pop(0)
        flags = self.graphs.pop(0) if self.graphs is not None else (False,) * len(counts)
        return [
            StepHeader(0, n, HIDDEN, torch.float32, graph=flag)
            for n, flag in zip(counts, flags, strict=True)
        ]

    def recv(self, layer_idx: int) -> LayerInput:
        return LayerInput(torch.full((self.current, HIDDEN), float(layer_idx)))

    def send(self, layer_idx: int, output: torch.Tensor) -> None:
        self.outputs.append((layer_idx, output))

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeAccelerator:
    """What the FFN server calls of ``torch.cuda``, recording which thread selected which device
    and which stream each layer computed on."""

    def __init__(self) -> None:
        self.selected: list[tuple[str, torch.device]] = []
        self.streams: list[tuple[str, torch.device]] = []
        self.current: tuple[str, torch.device] | None = None

    def set_device(self, device: torch.device) -> None:
        self.selected.append((threading.current_thread().name, device))

    def Stream(self, device: torch.device) -> tuple[str, torch.device]:
        stream = (f"stream {len(self.streams)}", device)
        self.streams.append(stream)
        return stream

    @contextlib.contextmanager
    def stream(self, stream: tuple[str, torch.device]) -> Iterator[None]:
        self.current = stream
        try:
            yield
        finally:
            self.current = None


class DoublingModel:
    def __init__(self, accelerator: FakeAccelerator | None = None) -> None:
        self.accelerator = accelerator
        #: the stream current at each compute, when an accelerator is faked
        self.computed_on: list[object] = []

    def ffn_layer_indices(self) -> list[int]:
        return LAYERS

    def compute_ffn_output(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.accelerator is not None:
            self.computed_on.append(self.accelerator.current)
        return hidden_states * 2


def _serve(
    connector: ScriptedConnector,
    failures: list[BaseException],
    model: DoublingModel | None = None,
    device: torch.device = CPU,
    accelerator: Any = None,
    graphs: FFNGraphs | None = None,
    **options: Any,
) -> FFNServer:
    section = {"role": "ffn", "num_attention_ranks": 3, "num_ffn_ranks": 2}
    server = FFNServer(
        model or DoublingModel(),
        VllmConfig(additional_config={"afd": section}),
        connector,
        afd=parse_afd_config(section),
        hidden_size=HIDDEN,
        dtype=torch.float32,
        device=device,
        graphs=graphs,
        on_failure=failures.append,
        accelerator=accelerator,
        **options,
    )
    server.start()
    deadline = time.monotonic() + 60
    while not (connector.done.is_set() or failures):
        assert time.monotonic() < deadline, "the scripted steps were not served within 60 s"
        time.sleep(0.01)
    server.stop()
    return server


def _record(step: int, peers: dict[int, int], tokens: int, rows: list[int]) -> dict[str, Any]:
    """The step record of an eager, unsplit step."""
    return {
        "step": step,
        "peers": peers,
        "tokens": tokens,
        "rows": rows,
        "graph": False,
        "split": False,
    }


def _untimed(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step records without their per-layer timings, which are checked here: a receive, a
    compute and a send time for each remote layer of an eager, unsplit step, none otherwise."""
    records = []
    for step in steps:
        record = dict(step)
        seconds = record.pop("layer_seconds")
        eager = not record["graph"] and not record["split"]
        assert len(seconds) == (len(record["rows"]) if eager else 0), step
        assert all(len(s) == 3 and min(s) >= 0 for s in seconds), step
        records.append(record)
    return records


def test_steps_are_computed_on_the_sum_of_the_peers_tokens_and_recorded() -> None:
    failures: list[BaseException] = []
    connector = ScriptedConnector([(3, 5), (1, 1), (0, 2)])
    server = _serve(connector, failures)
    assert not failures
    assert _untimed(server.recent_steps()) == [
        _record(0, {0: 3, 1: 5}, 8, [8, 8]),
        _record(1, {0: 1, 1: 1}, 2, [2, 2]),
        _record(2, {0: 0, 1: 2}, 2, [2, 2]),
    ]
    assert [(layer, out.shape[0]) for layer, out in connector.outputs] == [
        (1, 8),
        (2, 8),
        (1, 2),
        (2, 2),
        (1, 2),
        (2, 2),
    ]
    assert all(
        torch.equal(out, torch.full_like(out, 2.0 * layer)) for layer, out in connector.outputs
    )


def test_rows_record_what_arrived_not_what_was_announced() -> None:
    """The step record reads the tensors' rows, so a connector delivering other rows than its
    headers announced shows in it (the e2e tests compare the two)."""
    failures: list[BaseException] = []
    server = _serve(ScriptedConnector([(3, 5)], rows_sent=[7]), failures)
    assert _untimed(server.recent_steps()) == [_record(0, {0: 3, 1: 5}, 8, [7, 7])]


def test_headers_of_another_shape_end_the_loop_with_the_error_kept() -> None:
    failures: list[BaseException] = []

    class WrongWidth(ScriptedConnector):
        def wait_step(self, stop: threading.Event) -> list[StepHeader] | None:
            headers = super().wait_step(stop)
            return None if headers is None else [StepHeader(0, 1, HIDDEN + 1, torch.float32)] * 2

    server = _serve(WrongWidth([(1, 1)]), failures)
    assert len(failures) == 1 and isinstance(failures[0], AFDConnectionError)
    assert "hidden size 9" in str(failures[0]) and server.steps == 0
    with pytest.raises(RuntimeError, match="the AFD FFN server failed"):
        server.raise_if_failed()


def test_the_server_thread_selects_the_workers_device_and_computes_on_its_own_stream() -> None:
    """On an accelerator the server thread selects its worker's device (not device 0, where a new
    thread starts) before anything runs, and every layer computes on one stream of its own."""
    failures: list[BaseException] = []
    accelerator = FakeAccelerator()
    model = DoublingModel(accelerator)
    device = torch.device("cuda", 1)
    _serve(ScriptedConnector([(1, 2), (2, 2)]), failures, model, device, accelerator)
    assert not failures
    assert accelerator.selected == [("AFD-FFN-server", device)]
    assert accelerator.streams == [("stream 0", device)]
    assert model.computed_on == [("stream 0", device)] * 4
    assert accelerator.current is None  # left when the loop ended


class ContextModel(DoublingModel):
    """Records the forward context each layer computes in (the platform's, given to the server)."""

    def __init__(self) -> None:
        super().__init__()
        self.current: int | None = None
        self.contexts: list[int | None] = []

    @contextlib.contextmanager
    def context(self, vllm_config: VllmConfig, num_tokens: int) -> Iterator[None]:
        self.current = num_tokens
        try:
            yield
        finally:
            self.current = None

    def compute_ffn_output(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: torch.Tensor | None = None
    ) -> torch.Tensor:
        self.contexts.append(self.current)
        return super().compute_ffn_output(layer_idx, hidden_states, router_logits)


def test_layers_compute_in_the_forward_context_the_server_is_given() -> None:
    """The platform's forward context (vLLM-Ascend's on an NPU) is entered with the step's token
    count, and every layer computes inside it."""
    failures: list[BaseException] = []
    model = ContextModel()
    _serve(ScriptedConnector([(1, 2), (0, 4)]), failures, model, forward_context=model.context)
    assert not failures
    assert model.contexts == [3, 3, 4, 4]


def test_on_the_cpu_no_device_is_selected() -> None:
    failures: list[BaseException] = []
    accelerator = FakeAccelerator()
    model = DoublingModel(accelerator)
    _serve(ScriptedConnector([(1, 2)]), failures, model, CPU, accelerator)
    assert not failures
    assert accelerator.selected == [] and model.computed_on == [None, None]


class FakeGraphs:
    """A graph backend that records captures and replays; a replay runs what was captured, so a
    replayed step still answers (and a replay of the wrong graph answers the wrong layer)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []

    def capture(self, run: Any) -> Any:
        self.log.append(("capture", len(self.log)))
        return run

    def replay(self, graph: Any) -> None:
        self.log.append(("replay", len(self.log)))
        graph()


def test_ffn_graphs_follow_the_peers_replays_keyed_by_each_peers_tokens() -> None:
    """Only steps every peer replays run from FFN graphs; a key is (layer, per-peer tokens,
    logit width), so the same total split differently between the peers is another graph; the
    first step of a key runs eagerly, the second captures and replays, the third replays."""
    failures: list[BaseException] = []
    graphs = FFNGraphs(FakeGraphs())
    steps = [(1, 3), (1, 3), (2, 2), (1, 3), (1, 3), (1, 3)]
    flags = [(True, True), (True, True), (True, True), (True, False), (False, False), (True, True)]
    connector = ScriptedConnector(steps, graphs=flags)
    server = _serve(connector, failures, graphs=graphs)
    assert not failures
    assert [step["graph"] for step in server.recent_steps()] == [
        True,
        True,
        True,
        False,
        False,
        True,
    ]
    key = FFNGraphKey(1, (1, 3), 0)
    assert set(graphs._graphs) == {key, FFNGraphKey(2, (1, 3), 0)}  # (2, 2) is only warm
    assert graphs._warm == {
        key,
        FFNGraphKey(2, (1, 3), 0),
        FFNGraphKey(1, (2, 2), 0),
        FFNGraphKey(2, (2, 2), 0),
    }
    # step 1 captures both layers, step 6 replays them: 2 captures, 4 replays
    assert server.counters() == {"graph_captures": 2, "graph_replays": 4, "ubatch_splits": 0}
    # every layer of every step still answered with its own layer's output
    assert [layer for layer, _ in connector.outputs] == [1, 2] * len(steps)
    assert all(
        torch.equal(out, torch.full_like(out, 2.0 * layer)) for layer, out in connector.outputs
    )


def test_without_graphs_a_replaying_peer_is_served_eagerly() -> None:
    failures: list[BaseException] = []
    server = _serve(ScriptedConnector([(1, 3)], graphs=[(True, True)]), failures)
    assert not failures and server.recent_steps()[0]["graph"] is False
    assert server.counters() == {"graph_captures": 0, "graph_replays": 0, "ubatch_splits": 0}


class SplitScripted(ScriptedConnector):
    """A scripted connector whose steps' peer 1 splits into micro-batches of 1 and 2 tokens
    (``ubatch_tokens`` 1) while peer 0 sends its 3 whole; receives give each unit's rows."""

    def wait_step(self, stop: threading.Event) -> list[StepHeader] | None:
        headers = super().wait_step(stop)
        if headers is not None:
            headers = [headers[0], dataclasses.replace(headers[1], ubatch_tokens=1)]
            self.headers = headers
        return headers

    def start_recv(self, layer_idx: int, ubatch: int, peers: tuple[int, ...]) -> Any:
        return lambda: None

    def received(self, layer_idx: int, ubatch: int) -> LayerInput:
        rows = sum(self.headers[p].ubatches[ubatch] for p in peers_with(self.headers, ubatch))
        return LayerInput(torch.full((rows, HIDDEN), float(layer_idx)))

    def send(self, layer_idx: int, output: torch.Tensor, ubatch: int = 0) -> None:
        self.outputs.append((layer_idx, output))


def test_split_steps_are_counted_and_recorded() -> None:
    """A step a peer split runs unit by unit (both micro-batches' rows per layer), counts in
    ``ubatch_splits`` and is marked ``split``; an unsplit one is not."""
    failures: list[BaseException] = []
    server = _serve(SplitScripted([(3, 3), (3, 3)]), failures)
    assert not failures
    assert [(step["rows"], step["split"]) for step in server.recent_steps()] == [
        ([6, 6], True),
        ([6, 6], True),
    ]
    assert server.counters() == {"graph_captures": 0, "graph_replays": 0, "ubatch_splits": 2}
