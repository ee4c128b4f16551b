"""The connector interface without a network: step headers, fingerprints and their comparison,
layer order, stats (afd_models.connectors.base)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from afd_models.connectors.base import (
    DTYPES,
    AFDConnectionError,
    AFDConnector,
    AFDPeerGoneError,
    Fingerprint,
    StepHeader,
    compare_fingerprints,
)
from tests.logs import AFDLines

ENGINE = Fingerprint(
    role_rank=1,
    num_attention_ranks=4,
    num_ffn_ranks=2,
    tensor_parallel_size=1,
    compute_gate_on_attention=False,
    layers=(0, 1, 2, 3, 5),
    hidden_size=2048,
    dtype="bfloat16",
    model="AFDDeepseekV2ForCausalLM config-sha256:0123456789abcdef",
    version="0.1.0",
    connector="GlooAFDConnector",
    token_id_layers=(0, 1),
)


class Recording(AFDConnector):
    """A connector whose FFN side doubles the activations, recording what crossed."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, object]] = []
        #: the token ids each layer's send carried, by layer
        self.token_ids: dict[int, torch.Tensor | None] = {}
        self._out: dict[tuple[int, int], torch.Tensor] = {}

    def _send_header(self, header: StepHeader) -> None:
        self.sent.append(("header", header))

    def _send_layer(
        self,
        layer_idx: int,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor | None,
        ubatch: int,
        token_ids: torch.Tensor | None,
    ) -> None:
        self.token_ids[layer_idx] = token_ids
        what = (layer_idx, router_logits is not None)
        self.sent.append(("layer", what if not ubatch else (*what, ubatch)))
        self._out[(ubatch, layer_idx)] = hidden_states * 2

    def _recv_layer(self, layer_idx: int, like: torch.Tensor, ubatch: int) -> torch.Tensor:
        return self._out.pop((ubatch, layer_idx))


@pytest.mark.parametrize("dtype", DTYPES)
def test_header_round_trip(dtype: torch.dtype) -> None:
    """A header survives encode/decode for every wire dtype."""
    header = StepHeader(7, 33, 256, dtype, 64, torch.float32)
    assert StepHeader.decode(header.encode()) == header


@pytest.mark.parametrize("graph", [False, True])
def test_header_carries_the_graph_flag(graph: bool) -> None:
    header = StepHeader(1, 4, 16, torch.float16, graph=graph)
    assert StepHeader.decode(header.encode()).graph is graph


def test_header_carries_the_split() -> None:
    """A split step's header names its first micro-batch; both come back as ``ubatches``."""
    header = StepHeader(1, 10, 16, torch.float16, ubatch_tokens=4)
    assert StepHeader.decode(header.encode()) == header
    assert header.ubatches == (4, 6)
    assert StepHeader(1, 10, 16, torch.float16).ubatches == (10,)


@pytest.mark.parametrize("token_ids", [False, True])
def test_header_carries_whether_token_ids_come(token_ids: bool) -> None:
    header = StepHeader(1, 4, 16, torch.float16, token_ids=token_ids)
    assert StepHeader.decode(header.encode()) == header


@pytest.mark.parametrize(
    ("position", "value"), [(0, 9), (4, 9), (7, 9), (8, 10), (8, -1), (9, 2), (9, -1)]
)
def test_malformed_header_is_refused(position: int, value: int) -> None:
    """A wrong magic, dtype code, graph flag, micro-batch split (a first micro-batch of all
    the step's tokens or fewer than none) or token-id flag is refused."""
    values = list(StepHeader.WIRE.unpack(StepHeader(0, 10, 8, torch.float32).encode()))
    values[position] = value
    with pytest.raises(AFDConnectionError, match="malformed step header"):
        StepHeader.decode(StepHeader.WIRE.pack(*values))


def test_token_ids_go_with_the_token_id_layers_only() -> None:
    """A model whose layer 2 routes by token id: its step headers say token ids come, layer 2
    sends them (as int32), layer 1 sends none; leaving them out of layer 2, giving them to layer
    1, or giving a count other than the layer's tokens is an error before anything is sent."""
    connector = Recording()
    connector.set_layers([1, 2], token_id_layers=[2])
    hidden, ids = torch.ones(3, 8), torch.tensor([5, 7, 9])
    connector.send(1, hidden, None)
    connector.recv(1, hidden)
    connector.send(2, hidden, None, token_ids=ids)
    connector.recv(2, hidden)
    assert connector.sent[0] == ("header", StepHeader(0, 3, 8, torch.float32, token_ids=True))
    sent_ids = connector.token_ids[2]
    assert connector.token_ids[1] is None and sent_ids is not None
    assert sent_ids.dtype == torch.int32 and sent_ids.tolist() == [5, 7, 9]
    before = list(connector.sent)
    with pytest.raises(AFDConnectionError, match="layer 1 was sent token ids, but only layers"):
        connector.send(1, hidden, None, token_ids=ids)
    connector.send(1, hidden, None)
    connector.recv(1, hidden)
    with pytest.raises(AFDConnectionError, match="layer 2 routes by token id, but was sent"):
        connector.send(2, hidden, None)
    with pytest.raises(AFDConnectionError, match=r"token ids of shape \(2,\) for 3 tokens"):
        connector.send(2, hidden, None, token_ids=ids[:2])
    assert connector.sent == [
        *before,
        ("header", StepHeader(1, 3, 8, torch.float32, token_ids=True)),
        ("layer", (1, False)),
    ]


def test_a_send_refused_for_its_token_ids_keeps_the_planned_split() -> None:
    """The token-id checks come before the step opens: a refused first send leaves the split
    announced for the step, which the corrected send then opens."""
    connector = Recording()
    connector.set_layers([1], token_id_layers=[1])
    connector.split_next_step([1, 2])
    first = torch.ones(1, 8)
    with pytest.raises(AFDConnectionError, match="routes by token id, but was sent without"):
        connector.send(1, first, None)
    connector.send(1, first, None, token_ids=torch.tensor([3]))
    assert connector.sent[0] == (
        "header",
        StepHeader(0, 3, 8, torch.float32, ubatch_tokens=1, token_ids=True),
    )


def test_a_model_without_token_id_layers_says_so_in_its_headers() -> None:
    connector = Recording()
    connector.set_layers([1, 2])
    connector.send(1, torch.ones(2, 8), None)
    assert connector.sent[0] == ("header", StepHeader(0, 2, 8, torch.float32))
    with pytest.raises(ValueError, match=r"token-id layers \[3\] are not remote layers \[1, 2\]"):
        connector.set_layers([1, 2], token_id_layers=[3])


def test_a_split_step_opens_once_with_its_split() -> None:
    """With a split announced, micro-batch 0's first layer opens the step (one header for both,
    with the split), the micro-batches send their layers interleaved, each in order, and the
    next step is whole again."""
    connector = Recording()
    connector.set_layers([1, 2])
    first, second = torch.ones(3, 8), torch.full((5, 8), 2.0)
    connector.split_next_step([3, 5])
    for layer in (1, 2):
        connector.send(layer, first, None, ubatch=0)
        connector.send(layer, second, None, ubatch=1)
        assert torch.equal(connector.recv(layer, first, ubatch=0), first * 2)
        assert torch.equal(connector.recv(layer, second, ubatch=1), second * 2)
    assert connector.sent == [
        ("header", StepHeader(0, 8, 8, torch.float32, ubatch_tokens=3)),
        ("layer", (1, False)),
        ("layer", (1, False, 1)),
        ("layer", (2, False)),
        ("layer", (2, False, 1)),
    ]
    assert connector.stats.as_dict()["exchanges"] == 4
    connector.send(1, second, None)
    assert connector.sent[-2] == ("header", StepHeader(1, 5, 8, torch.float32))
    with pytest.raises(AFDConnectionError, match="micro-batch 1, but the step in progress has 1"):
        connector.send(1, second, None, ubatch=1)


def test_a_micro_batch_of_another_size_than_announced_is_an_error() -> None:
    connector = Recording()
    connector.set_layers([1])
    connector.split_next_step([3, 5])
    connector.send(1, torch.ones(3, 8), None, ubatch=0)
    with pytest.raises(
        AFDConnectionError, match="micro-batch 1 has 4 tokens, but its step announced 5"
    ):
        connector.send(1, torch.ones(4, 8), None, ubatch=1)
    with pytest.raises(ValueError, match="two micro-batches of at least one token"):
        connector.split_next_step([8])


def test_a_captured_split_step_replays_with_its_split() -> None:
    """A split step captured into a graph keeps its header (split included) by its total and
    its split; an unsplit graph of the same total (vLLM's V2 graph manager captures both) keeps
    its own, so neither replay announces the other's header."""
    connector = Recording()
    connector.set_layers([1])
    connector.split_next_step([2, 2])
    with connector.capturing():
        for ubatch in (0, 1):
            connector.send(1, torch.ones(2, 8), None, ubatch=ubatch)
            connector.recv(1, torch.ones(2, 8), ubatch=ubatch)
    with pytest.raises(
        AFDConnectionError, match=r"replay of 4 tokens, .* graphs for 4 tokens split"
    ):
        connector.announce_graph_step(4)
    with connector.capturing():
        connector.send(1, torch.ones(4, 8), None)
        connector.recv(1, torch.ones(4, 8))
    connector.announce_graph_step(4, split=True)
    assert connector.sent[-1] == (
        "header",
        StepHeader(0, 4, 8, torch.float32, graph=True, ubatch_tokens=2),
    )
    connector.announce_graph_step(4)
    assert connector.sent[-1] == ("header", StepHeader(1, 4, 8, torch.float32, graph=True))


def test_first_remote_layer_opens_a_step() -> None:
    """The first remote layer of a forward sends a header with the step's shape; later ones do not."""
    connector = Recording()
    connector.set_layers([1, 2])
    x = torch.ones(5, 8, dtype=torch.bfloat16)
    logits = torch.zeros(5, 4, dtype=torch.float32)
    for _ in range(2):
        for layer in (1, 2):
            connector.send(layer, x, logits if layer == 2 else None)
            assert torch.equal(connector.recv(layer, x), x * 2)
    headers = [item for kind, item in connector.sent if kind == "header"]
    assert [h.step for h in headers] == [0, 1]  # type: ignore[union-attr]
    assert headers[0] == StepHeader(0, 5, 8, torch.bfloat16, 0, torch.float32)
    assert connector.stats.as_dict()["exchanges"] == 4


def test_a_captured_step_is_announced_at_each_replay_not_at_capture() -> None:
    """While a graph captures, the exchange runs (into the graph) but no step is announced and
    no round trip counted; each replay announces the captured step's header with ``graph`` set,
    numbered with the eager steps; a replay of a size never captured is an error."""
    connector = Recording()
    connector.set_layers([1, 2])
    x = torch.ones(4, 8, dtype=torch.bfloat16)
    with connector.capturing():
        assert connector.is_capturing
        for layer in (1, 2):
            connector.send(layer, x, None)
            connector.recv(layer, x)
    assert not connector.is_capturing
    assert [kind for kind, _ in connector.sent] == ["layer", "layer"]
    assert connector.stats.as_dict()["steps"] == 0 and connector.stats.as_dict()["exchanges"] == 0
    connector.announce_graph_step(4)
    for layer in (1, 2):  # an eager step after the replay
        connector.send(layer, x, None)
        connector.recv(layer, x)
    headers = [item for kind, item in connector.sent if kind == "header"]
    assert headers == [
        StepHeader(0, 4, 8, torch.bfloat16, graph=True),
        StepHeader(1, 4, 8, torch.bfloat16, graph=False),
    ]
    with pytest.raises(AFDConnectionError, match=r"replay of 8 tokens, .* graphs for 4 tokens$"):
        connector.announce_graph_step(8)


def test_out_of_order_layer_is_an_error() -> None:
    """Sending layers out of forward order fails loudly instead of mixing layers."""
    connector = Recording()
    connector.set_layers([1, 2, 3])
    x = torch.ones(2, 4)
    connector.send(1, x, None)
    with pytest.raises(
        AFDConnectionError,
        match="layer 3 of micro-batch 0 sent out of order; the FFN side expects layer 2",
    ):
        connector.send(3, x, None)
    with pytest.raises(AFDConnectionError, match="layer 2 of micro-batch 0 has 3 tokens"):
        connector.send(2, torch.ones(3, 4), None)


def test_unbound_connector_refuses() -> None:
    with pytest.raises(AFDConnectionError, match="set_layers"):
        Recording().send(0, torch.ones(1, 1), None)
    with pytest.raises(ValueError, match="no remote layers"):
        Recording().set_layers([])


def test_fingerprint_round_trip() -> None:
    """A fingerprint survives encode/decode, its bytes start with their length, and a bare one too."""
    data = ENGINE.encode()
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    assert Fingerprint.decode(data) == ENGINE
    assert Fingerprint.decode(Fingerprint.bare(3).encode()) == Fingerprint.bare(3)


def _framed(values: object) -> bytes:
    payload = json.dumps(values).encode()
    return len(payload).to_bytes(4, "big") + payload


def _fields(**changes: object) -> dict[str, object]:
    values = json.loads(ENGINE.encode()[4:])
    values.update(changes)
    return values


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\0\0", "2 bytes, shorter than its length prefix"),
        (ENGINE.encode()[:-1], "carries"),
        (b"\xff\xff\xff\xff", "announces 4294967295 bytes, more than the 1048576 allowed"),
        (b"\0\0\0\3abc", "not JSON"),
        (_framed([1, 2]), "format None, expected 'afd-fingerprint/5'"),
        (
            _framed(_fields(format="afd-fingerprint/1", version="0.3.0")),
            "format 'afd-fingerprint/1', expected 'afd-fingerprint/5'; it says it runs vllm-afd-overlay 0.3.0",
        ),
        (_framed({k: v for k, v in _fields().items() if k != "dtype"}), "fields ["),
        (_framed(_fields(extra=1)), "'extra'"),
        (_framed(_fields(hidden_size=True)), "hidden_size=True is not an integer"),
        (_framed(_fields(layers=[0, "1"])), "layers=[0, '1'] is not a list of integers"),
        (
            _framed(_fields(token_id_layers=1)),
            "token_id_layers=1 is not a list of integers",
        ),
        (
            _framed(_fields(compute_gate_on_attention=1)),
            "compute_gate_on_attention=1 is not true or false",
        ),
        (_framed(_fields(model=None)), "model=None is not a string"),
    ],
    ids=[
        "short",
        "truncated",
        "too-long",
        "not-json",
        "not-an-object",
        "other-format",
        "missing-field",
        "extra-field",
        "bool-for-int",
        "layer-not-int",
        "token-id-layers-not-a-list",
        "int-for-bool",
        "null-model",
    ],
)
def test_malformed_fingerprint_says_what_is_wrong(data: bytes, says: str) -> None:
    with pytest.raises(AFDConnectionError, match="received a malformed fingerprint") as failure:
        Fingerprint.decode(data)
    assert says in str(failure.value)
    assert "same vllm-afd-overlay version" in str(failure.value)


def test_fingerprints_differing_in_role_rank_only_match() -> None:
    assert compare_fingerprints(ENGINE, dataclasses.replace(ENGINE, role_rank=0)) == []
    assert compare_fingerprints(Fingerprint.bare(2), Fingerprint.bare(0)) == []


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (
            {"num_attention_ranks": 3},
            "num_attention_ranks: attention rank 1 has 4, the FFN rank 0 has 3",
        ),
        ({"num_ffn_ranks": 1}, "num_ffn_ranks: attention rank 1 has 2, the FFN rank 0 has 1"),
        (
            {"compute_gate_on_attention": True},
            "compute_gate_on_attention: attention rank 1 has false, the FFN rank 0 has true",
        ),
        ({"layers": (0, 2, 4)}, "layers: attention rank 1 has [0-3,5], the FFN rank 0 has [0,2,4]"),
        ({"layers": ()}, "layers: attention rank 1 has [0-3,5], the FFN rank 0 has []"),
        ({"hidden_size": 1024}, "hidden_size: attention rank 1 has 2048, the FFN rank 0 has 1024"),
        ({"dtype": "float16"}, "dtype: attention rank 1 has bfloat16, the FFN rank 0 has float16"),
        (
            {"model": "AFDDeepseekV2ForCausalLM config-sha256:fedcba9876543210"},
            "model: attention rank 1 has AFDDeepseekV2ForCausalLM config-sha256:0123456789abcdef, "
            "the FFN rank 0 has AFDDeepseekV2ForCausalLM config-sha256:fedcba9876543210",
        ),
        ({"version": "0.2.0"}, "version: attention rank 1 has 0.1.0, the FFN rank 0 has 0.2.0"),
        ({"version": ""}, "version: attention rank 1 has 0.1.0, the FFN rank 0 has (none)"),
        (
            {"token_id_layers": ()},
            "token_id_layers: attention rank 1 has [0-1], the FFN rank 0 has []",
        ),
    ],
)
def test_each_differing_field_is_named_with_both_values(
    change: dict[str, object], line: str
) -> None:
    """Every compared field, alone, yields exactly one line naming it and both values."""
    ffn = dataclasses.replace(ENGINE, role_rank=0, **change)
    assert compare_fingerprints(ENGINE, ffn) == [line]


def test_every_differing_field_is_listed_in_field_order() -> None:
    ffn = dataclasses.replace(ENGINE, role_rank=0, dtype="float32", num_ffn_ranks=4)
    assert compare_fingerprints(ENGINE, ffn) == [
        "num_ffn_ranks: attention rank 1 has 2, the FFN rank 0 has 4",
        "dtype: attention rank 1 has bfloat16, the FFN rank 0 has float32",
    ]
    assert compare_fingerprints(ENGINE, Fingerprint.bare(0))[0] == (
        "num_attention_ranks: attention rank 1 has 4, the FFN rank 0 has 0"
    )
    # a bare fingerprint differs from an engine's in every compared field but the gate placement
    assert [line.split(":")[0] for line in compare_fingerprints(ENGINE, Fingerprint.bare(0))] == [
        "num_attention_ranks",
        "num_ffn_ranks",
        "tensor_parallel_size",
        "layers",
        "hidden_size",
        "dtype",
        "model",
        "version",
        "connector",
        "token_id_layers",
    ]


def test_every_transfer_of_a_step_has_a_tag_of_its_own() -> None:
    """gloo pairs transfers by tag: each layer, micro-batch and part gets its own, and the tag
    tells which part it carries."""
    from afd_models.connectors.p2p.plane import Part, layer_tag, tag_part

    tags = {
        (layer, ubatch, part): layer_tag(layer, part, ubatch)
        for layer in range(64)
        for ubatch in (0, 1)
        for part in Part
    }
    assert len(set(tags.values())) == len(tags)
    assert all(tag_part(tag) is part for (_, _, part), tag in tags.items())


class LosingPeer(Recording):
    """A connector whose FFN peer goes away at the receive of layer ``gone_at``."""

    def __init__(self, gone_at: int) -> None:
        super().__init__()
        self.gone_at = gone_at

    def _recv_layer(self, layer_idx: int, like: torch.Tensor, ubatch: int) -> torch.Tensor:
        if layer_idx == self.gone_at:
            raise AFDPeerGoneError(f"the peer closed the connection at layer {layer_idx}")
        return super()._recv_layer(layer_idx, like, ubatch)


def _forward(connector: AFDConnector, hidden: torch.Tensor) -> list[torch.Tensor]:
    outputs = []
    for layer in connector.layers:
        connector.send(layer, hidden, None)
        outputs.append(connector.recv(layer, hidden))
    return outputs


def test_a_held_forward_runs_to_its_end_on_zeros_after_its_peer_went_away() -> None:
    """Holding, a lost exchange gives zeros, and so does every later one of the forward without
    touching the wire, and lost_step says what was lost; not holding, the loss raises; the next
    held forward starts with no loss and opens its step as usual."""
    hidden = torch.ones(2, 4)
    connector = LosingPeer(gone_at=1)
    connector.set_layers([0, 1, 3])
    with pytest.raises(AFDPeerGoneError, match="at layer 1"):
        _forward(connector, hidden)

    connector = LosingPeer(gone_at=1)
    connector.set_layers([0, 1, 3])
    with connector.holding_lost_steps():
        outputs = _forward(connector, hidden)
    assert [o.tolist() for o in outputs] == [
        (hidden * 2).tolist(),
        [[0.0] * 4] * 2,
        [[0.0] * 4] * 2,
    ]
    assert connector.lost_step == "the peer closed the connection at layer 1"
    # the header and layers 0 and 1 went out; layer 3's send was skipped
    assert [kind for kind, _ in connector.sent] == ["header", "layer", "layer"]
    connector.gone_at = -1  # a restarted peer
    with connector.holding_lost_steps():
        outputs = _forward(connector, hidden)
    assert connector.lost_step is None
    assert all(torch.equal(o, hidden * 2) for o in outputs)
    assert [kind for kind, _ in connector.sent[3:]] == ["header", "layer", "layer", "layer"]


def test_a_held_ffn_step_computes_every_peers_rows_when_one_went_away() -> None:
    """The FFN side of an Attention engine that died while its first layer crossed: the read from
    the first peer's step channel ends early, and the step, held (TP partners' collectives must
    pair), still receives both peers' rows, zeros included, as its partner lanes do."""
    import socket
    from types import SimpleNamespace

    from afd_models.connectors.p2p.ffn import P2PFFNConnector
    from afd_models.connectors.p2p.wire import byte_view

    gone, live = socket.socketpair(), socket.socketpair()
    gone[1].close()  # the first peer's process ended before its layer
    sent = torch.arange(3 * 4, dtype=torch.float32).reshape(3, 4)
    live[1].sendall(byte_view(sent))
    # the connector's state after wait_step, without a group of processes
    ffn = P2PFFNConnector.__new__(P2PFFNConnector)
    ffn.peers, ffn.holds_lost_steps, ffn.lost_step = [1, 2], True, None
    ffn.headers = [StepHeader(0, 2, 4, torch.float32), StepHeader(0, 3, 4, torch.float32)]
    ffn._channels, ffn._on_channel, ffn._incoming = [gone[0], live[0]], {0, 1}, {}
    ffn.fingerprint = Fingerprint.bare(0)
    ffn._group = SimpleNamespace(plane=SimpleNamespace(device=torch.device("cpu")))
    ffn._connector = "AFD gloo connector"
    ffn.metrics = [SimpleNamespace(received=lambda nbytes: None)] * 2
    ffn.start_recv(0, 0, [0, 1])()
    assert ffn.lost_step is not None and "layer 0 from rank 1" in ffn.lost_step
    received = ffn.received(0, 0).hidden_states
    assert tuple(received.shape) == (5, 4) and not received.any()
    for pair in (gone, live):
        pair[0].close()
    live[1].close()


def test_an_idle_ranks_dummy_step_given_up_on_is_logged_and_other_errors_go_up() -> None:
    """An idle DP rank's dummy step has no request to fail: a step given up on is logged and its
    worker serves on; any other error still stops the engine."""
    from afd_models.connectors.base import AFDPeerLostError
    from afd_models.runner_roles import dummy_step_across_restarts

    def lost() -> None:
        raise AFDPeerLostError("no FFN engine came back")

    with AFDLines() as lines:
        dummy_step_across_restarts(lost)
    assert lines == [
        "AFD Attention: an idle DP rank's dummy step was given up on: no FFN engine came back"
    ]

    def broken() -> None:
        raise RuntimeError("not a lost step")

    with pytest.raises(RuntimeError, match="not a lost step"):
        dummy_step_across_restarts(broken)
