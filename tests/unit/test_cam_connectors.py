"""The Ascend CAM connectors without an NPU (afd_models.connectors.cam): their kernels played by
fakes passed in, the point-to-point protocol run for real on localhost; and the kernel loaders
failing clearly, before anything is opened, where torch_npu is absent."""

from __future__ import annotations

import queue
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.distributed import TCPStore

from afd_models.connectors.base import AFDConnectionError
from afd_models.connectors.cam import (
    CAMAsyncAFDConnector,
    CAMAsyncFFNConnector,
    CAMP2PAFDConnector,
    CAMP2PFFNConnector,
    cam_async_world_rank,
    experts_per_rank,
)
from afd_models.connectors.cam_ops import (
    CamAsyncShape,
    CamOpsUnavailableError,
    DispatchReceived,
    load_cam_async_ops,
    load_cam_p2p_ops,
)
from afd_models.connectors.specs import CAMAsyncExtraConfig, CAMP2PExtraConfig
from afd_models.topology import groups

CPU = torch.device("cpu")
EXTRA = CAMP2PExtraConfig(connect_timeout_s=30, timeout_s=10)
HIDDEN = 8
LAYERS = [1, 3]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _Comm:
    def __init__(self, name: str):
        self.name = name
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeCamP2P:
    """A2E/E2A between threads: each world's rank 0 (FFN) names it in the store, rank 1 reads
    the name; tensors cross by queue. Every call is logged as (rank, op, world, rows)."""

    def __init__(self) -> None:
        self.log: list[tuple[int, str, str, int]] = []
        self._boxes: dict[tuple[str, str], queue.Queue] = {}
        self._lock = threading.Lock()

    def _box(self, comm: str, op: str) -> queue.Queue:
        with self._lock:
            return self._boxes.setdefault((comm, op), queue.Queue())

    def connect(self, store: Any, rank: int, timeout_s: float) -> _Comm:
        if rank == 0:
            store.set("name", uuid.uuid4().hex)
        return _Comm(store.get("name").decode())

    def a2e(self, x: torch.Tensor, rows: int, rank: int, comm: str) -> tuple[torch.Tensor, Any]:
        self.log.append((rank, "a2e", comm, rows))
        if rank == 1:
            self._box(comm, "a2e").put(x.clone())
            return torch.empty(1, 1, dtype=x.dtype), rows
        received = self._box(comm, "a2e").get(timeout=10)
        assert received.shape[0] == rows
        return received, rows

    def e2a(self, x: torch.Tensor, handle: Any, rows: int, rank: int, comm: str) -> torch.Tensor:
        self.log.append((rank, "e2a", comm, rows))
        assert handle == rows
        if rank == 0:
            self._box(comm, "e2a").put(x.clone())
            return torch.empty(1, 1, dtype=x.dtype)
        return self._box(comm, "e2a").get(timeout=10)

    def wait(self, timeout_s: float) -> bool:
        return True


def _serve_3a1f(
    tokens: tuple[int, ...], ops: FakeCamP2P
) -> tuple[list[torch.Tensor], list[list[torch.Tensor]], dict[int, str]]:
    """Attention ranks 0..2 send LAYERS of one step with ``tokens`` rows each to FFN rank 0,
    which computes ``2 * x + layer``. Returns the FFN inputs per layer, each peer's outputs, and
    each peer's world name."""
    (group,) = groups(len(tokens), 1, _free_port())
    results: list[list[torch.Tensor]] = [[] for _ in tokens]
    worlds: dict[int, str] = {}
    errors: list[BaseException] = []

    def attention(rank: int) -> None:
        try:
            connector = CAMP2PAFDConnector("127.0.0.1", group, rank, EXTRA, device=CPU, ops=ops)
            worlds[rank] = connector._group.plane._comms[0].name
            connector.set_layers(LAYERS)
            x = torch.full((tokens[rank], HIDDEN), float(rank + 1), dtype=torch.bfloat16)
            for layer in LAYERS:
                connector.send(layer, x, None)
                results[rank].append(connector.recv(layer, x))
            connector.close()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=attention, args=(r,)) for r in range(len(tokens))]
    for thread in threads:
        thread.start()
    ffn = CAMP2PFFNConnector("127.0.0.1", group, EXTRA, device=CPU, ops=ops)
    inputs = []
    try:
        headers = ffn.wait_step(threading.Event())
        assert [h.num_tokens for h in headers] == list(tokens)
        for layer in LAYERS:
            received = ffn.recv(layer)
            assert received.router_logits is None and received.token_ids is None
            hidden = received.hidden_states
            inputs.append(hidden)
            ffn.send(layer, hidden * 2 + layer)
    finally:
        for thread in threads:
            thread.join(30)
        ffn.close()
    assert not errors, errors
    return inputs, results, worlds


def test_camp2p_exchanges_each_peer_in_its_own_world_in_peer_order() -> None:
    """3A1F with 2, 1 and 3 tokens: the FFN worker receives (A2E) from each peer in peer order,
    then answers (E2A) each in peer order; every peer gets its own rows back."""
    ops = FakeCamP2P()
    inputs, results, worlds = _serve_3a1f((2, 1, 3), ops)
    assert len(set(worlds.values())) == 3  # one world per Attention peer
    for hidden in inputs:
        expected = torch.cat(
            [torch.full((n, HIDDEN), float(r + 1)) for r, n in enumerate((2, 1, 3))]
        )
        assert torch.equal(hidden.float(), expected)
    for rank, outputs in enumerate(results):
        for layer, output in zip(LAYERS, outputs, strict=True):
            assert output.dtype == torch.bfloat16
            assert torch.equal(
                output.float(), torch.full_like(output.float(), 2 * (rank + 1) + layer)
            )
    ffn_calls = [(op, comm, rows) for rank, op, comm, rows in ops.log if rank == 0]
    per_layer = [("a2e", worlds[r], n) for r, n in enumerate((2, 1, 3))] + [
        ("e2a", worlds[r], n) for r, n in enumerate((2, 1, 3))
    ]
    assert ffn_calls == per_layer * len(LAYERS)
    for rank, n in enumerate((2, 1, 3)):
        peer_calls = [
            (op, rows) for r, op, comm, rows in ops.log if r == 1 and comm == worlds[rank]
        ]
        assert peer_calls == [("a2e", n), ("e2a", n)] * len(LAYERS)


def test_camp2p_a_peer_without_tokens_takes_no_kernel_and_gets_empty_rows() -> None:
    """A peer whose step has no tokens: no kernel on either side of its world, no hang, an empty
    output; the others are served as usual."""
    ops = FakeCamP2P()
    inputs, results, worlds = _serve_3a1f((2, 0, 1), ops)
    assert [h.shape[0] for h in inputs] == [3, 3]
    assert all(output.shape == (0, HIDDEN) for output in results[1])
    assert not [call for call in ops.log if call[2] == worlds[1]]
    assert torch.equal(results[2][1].float(), torch.full((1, HIDDEN), 2 * 3 + 3.0))


@pytest.mark.parametrize(("a", "f"), [(3, 2), (4, 2), (5, 2)])
def test_camp2p_worlds_follow_the_project_groups(a: int, f: int) -> None:
    """A != F, divisible or not: FFN rank k forms one world per Attention rank of its group (the
    contiguous ones of topology.py), named by the peer's group rank."""
    for group in groups(a, f, 29650):
        assert list(group.attention_ranks) == [r for r in range(a) if r * f // a == group.ffn_rank]
        assert [group.group_rank_of_attention(r) for r in group.attention_ranks] == list(
            range(1, group.size)
        )


def test_camp2p_refuses_what_the_kernels_cannot_move() -> None:
    """float16 hidden states, router logits and token ids are refused by name before any kernel
    runs."""
    from afd_models.connectors.cam import CamP2PDataPlane
    from afd_models.connectors.p2p.plane import Part, Transfer, layer_tag

    ops = FakeCamP2P()
    plane = CamP2PDataPlane(CPU, 1.0, ops)
    with pytest.raises(
        AFDConnectionError,
        match=r"torch\.float16 tensor, the CAM kernels move torch\.bfloat16 only",
    ):
        plane.start(
            [Transfer(True, torch.ones(2, HIDDEN, dtype=torch.float16), 0, layer_tag(1))], "x"
        )
    for part, says in ((Part.ROUTER_LOGITS, "router logits"), (Part.TOKEN_IDS, "token ids")):
        tag = layer_tag(1, part, ubatch=1)
        with pytest.raises(AFDConnectionError, match=f"{says} \\(the CAM kernels carry hidden"):
            plane.start([Transfer(True, torch.ones(2, 4, dtype=torch.bfloat16), 0, tag)], "x")
    assert ops.log == []


@pytest.mark.parametrize(
    ("attention", "role_rank", "world_rank"),
    [(True, 0, 0), (True, 2, 2), (False, 0, 3), (False, 1, 4)],
)
def test_cam_async_world_puts_attention_first(
    attention: bool, role_rank: int, world_rank: int
) -> None:
    assert cam_async_world_rank(attention, role_rank, 3) == world_rank


def test_cam_async_experts_split_evenly() -> None:
    assert experts_per_rank(64, 4) == 16
    with pytest.raises(AFDConnectionError, match="64 routed experts evenly over num_ffn_ranks=3"):
        experts_per_rank(64, 3)


class FakeCamAsync:
    """The CAM async kernels as a log; dispatch_recv hands out the dispatches queued in it."""

    def __init__(self, dispatches: list[DispatchReceived] | None = None):
        self.log: list[tuple[Any, ...]] = []
        self.dispatches = dispatches or []

    def connect(self, store: Any, rank: int, size: int, timeout_s: float) -> _Comm:
        self.log.append(("connect", rank, size))
        return _Comm("world")

    def dispatch_send(
        self, hidden: torch.Tensor, topk_ids: torch.Tensor, layer_idx: int, comm: str
    ) -> None:
        self.log.append(("dispatch_send", layer_idx, hidden.shape[0]))

    def combine_recv(
        self, like: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, comm: str
    ) -> torch.Tensor:
        self.log.append(("combine_recv", tuple(topk_ids.shape)))
        return like * topk_weights.sum(-1, keepdim=True).to(like.dtype)

    def dispatch_recv(self, capacity: int, comm: str) -> DispatchReceived:
        self.log.append(("dispatch_recv", capacity))
        return self.dispatches.pop(0)

    def combine_send(
        self, routed: torch.Tensor, shared: torch.Tensor, handle: Any, comm: str
    ) -> None:
        self.log.append(("combine_send", tuple(routed.shape), tuple(shared.shape), handle))


ASYNC_EXTRA = CAMAsyncExtraConfig(connect_timeout_s=10)


@pytest.fixture
def world_port() -> Iterator[int]:
    """The port of a CAM async world whose store FFN rank 0 (not under test) hosts."""
    port = _free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    yield port
    del store


def _shape(rank: int) -> CamAsyncShape:
    return CamAsyncShape(HIDDEN, 2, 2, 1, 4, rank, 16, False)


def _route(
    layer: int, hidden: torch.Tensor, logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    weights, ids = logits.topk(2, dim=-1)
    return ids.to(torch.int32), weights


def test_cam_async_attention_routes_dispatches_then_combines_per_layer(world_port: int) -> None:
    """Each MoE layer: the route's top-k goes with the dispatch at send, the same top-k comes
    back to the combine at receive; a layer without router logits is refused."""
    ops = FakeCamAsync()
    connector = CAMAsyncAFDConnector(
        "127.0.0.1",
        world_port,
        _shape(0),
        CAMAsyncExtraConfig(),
        route=_route,
        device=CPU,
        ops=ops,
    )
    try:
        connector.set_layers(LAYERS)
        hidden = torch.ones(3, HIDDEN, dtype=torch.bfloat16)
        logits = torch.tensor([[0.5, 0.25, 0.0, 0.0]] * 3)
        for layer in LAYERS:
            connector.send(layer, hidden, logits)
            assert torch.equal(connector.recv(layer, hidden).float(), torch.full((3, HIDDEN), 0.75))
        assert ops.log == [
            ("connect", 0, 3),
            ("dispatch_send", 1, 3),
            ("combine_recv", (3, 2)),
            ("dispatch_send", 3, 3),
            ("combine_recv", (3, 2)),
        ]
        with pytest.raises(AFDConnectionError, match="came without router logits"):
            connector.send(LAYERS[0], hidden, None)
        # the CAM dispatch carries no token ids (the connect step refuses such a model before)
        connector.set_layers(LAYERS, token_id_layers=[LAYERS[0]])
        with pytest.raises(AFDConnectionError, match="came with token ids; the CAM dispatch"):
            connector.send(LAYERS[0], hidden, logits, token_ids=torch.arange(3))
        assert len(ops.log) == 5  # nothing dispatched
    finally:
        connector.close()


def _dispatch(layer: int, group_list: list[int], shared: int) -> DispatchReceived:
    return DispatchReceived(
        layer_idx=layer,
        hidden_states=torch.ones(16, HIDDEN, dtype=torch.bfloat16),
        group_list=torch.tensor(group_list),
        shared_hidden_states=torch.ones(16, HIDDEN, dtype=torch.bfloat16),
        shared_tokens=shared,
        scales=None,
        shared_scales=None,
        handle=f"handle-{layer}",
    )


def test_cam_async_ffn_serves_dispatches_as_they_come_even_empty_ones() -> None:
    """The FFN rank takes the layer from each dispatch, sliced to its real tokens; a rank whose
    experts got no token gets an empty work item and answers with one placeholder row."""
    ops = FakeCamAsync([_dispatch(3, [2, 1], 4), _dispatch(1, [0, 0], 2)])
    connector = CAMAsyncFFNConnector(
        "127.0.0.1", _free_port(), _shape(2), ASYNC_EXTRA, device=CPU, ops=ops
    )
    try:
        work = connector.recv_work()
        assert (
            work.layer_idx,
            work.hidden_states.shape[0],
            work.shared_hidden_states.shape[0],
        ) == (3, 3, 4)
        connector.send_work(work, work.hidden_states, work.shared_hidden_states)
        empty = connector.recv_work()
        assert (empty.layer_idx, empty.hidden_states.shape) == (1, (0, HIDDEN))
        connector.send_work(empty, empty.hidden_states, empty.shared_hidden_states)
        with pytest.raises(AFDConnectionError, match="2 routed output rows for 0 routed tokens"):
            connector.send_work(empty, torch.ones(2, HIDDEN), empty.shared_hidden_states)
    finally:
        connector.close()
    assert ops.log == [
        ("connect", 2, 3),
        ("dispatch_recv", 16),
        ("combine_send", (3, HIDDEN), (4, HIDDEN), "handle-3"),
        ("dispatch_recv", 16),
        ("combine_send", (1, HIDDEN), (2, HIDDEN), "handle-1"),
    ]


def test_cam_async_refuses_graph_capture(world_port: int) -> None:
    connector = CAMAsyncAFDConnector(
        "127.0.0.1", world_port, _shape(0), ASYNC_EXTRA, route=_route, device=CPU,
        ops=FakeCamAsync(),
    )  # fmt: skip
    try:
        connector.set_layers(LAYERS)
        with pytest.raises(AFDConnectionError, match="eager only"), connector.capturing():
            connector.send(1, torch.ones(1, HIDDEN), torch.ones(1, 4))
    finally:
        connector.close()


def test_loaders_name_every_missing_module_without_importing_any() -> None:
    """Looked up, not imported: the error names torch_npu and the op library and what installs
    them."""
    looked_up: list[str] = []

    def find_spec(name: str) -> None:
        looked_up.append(name)
        return None

    with pytest.raises(CamOpsUnavailableError) as raised:
        load_cam_p2p_ops(8, find_spec=find_spec)
    assert looked_up == ["torch_npu", "afd_plugin._C_ascend"]
    message = str(raised.value)
    assert "CAMP2PAFDConnector runs on Ascend NPUs only" in message
    assert "torch_npu (the torch_npu build matching this torch (pip install torch-npu))" in message
    assert "afd_plugin._C_ascend (the public AFD plugin's Ascend A2E/E2A extension" in message
    with pytest.raises(CamOpsUnavailableError, match="umdk_cam_op_lib \\(the CAM operator wheel"):
        load_cam_async_ops(_shape(0), CPU, find_spec=lambda name: None)


@pytest.mark.skipif("torch_npu" in sys.modules, reason="an NPU machine")
def test_off_npu_a_camp2p_connector_fails_before_it_opens_its_port() -> None:
    """Built without ops on this CPU machine, either side raises the loader's error at once: the
    FFN side never binds its group's port."""
    (group,) = groups(1, 1, _free_port())
    with pytest.raises(CamOpsUnavailableError, match="cannot import torch_npu"):
        CAMP2PFFNConnector("127.0.0.1", group, EXTRA, device=CPU)
    with pytest.raises(CamOpsUnavailableError, match="cannot import torch_npu"):
        CAMP2PAFDConnector("127.0.0.1", group, 0, EXTRA, device=CPU)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", group.port))  # still free
    assert "torch_npu" not in sys.modules
