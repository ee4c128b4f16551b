"""The real point-to-point connectors between processes: a step with two Attention peers, an
interruptible idle wait on the FFN side and a vanished peer surfacing at once, over the gloo data
plane and over the NCCL data plane (its NCCL calls played by gloo, as NCCL cannot run here); and
the connect-time handshake (mismatched engines, duplicate ranks) failing both sides within
seconds with nothing left open, and malformed peers dropped while the real one gets in."""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import multiprocessing
import os
import socket
import threading
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from afd_models.cli.serve import free_port
from afd_models.config import AFDConfig, parse_afd_config
from afd_models.connectors.base import AFDConnectionError, Fingerprint
from afd_models.connectors.specs import GlooExtraConfig
from afd_models.topology import Group, groups
from tests import probes
from tests.logs import AFDLines
from tests.probes import port_is_free

EXTRA = GlooExtraConfig(connect_timeout_s=60, timeout_s=30)
LAYERS = [0, 2]
#: a refused handshake must end well within both timeouts of EXTRA
FAST_S = 10.0
#: tokens per step sent by Attention ranks 0 and 1 (different, so the FFN side must split right)
TOKENS = (3, 5)
STEPS = 2


def _step_input(rank: int, step: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * rank + 10 * step + layer)
    hidden = torch.randn(TOKENS[rank], 16, generator=generator).to(torch.bfloat16)
    logits = torch.randn(TOKENS[rank], 4, generator=generator)
    return hidden, logits


def _expected(hidden: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
    """What the fake FFN computes: depends on both tensors, so a mixed-up logit row shows."""
    return hidden if logits is None else hidden + logits.sum(-1, keepdim=True).to(hidden.dtype)


def _fingerprint(
    rank: int, num_attention_ranks: int = 2, num_ffn_ranks: int = 1, **changes: object
) -> Fingerprint:
    """The fingerprint of a worker of the test deployment (2A1F unless said), with ``changes``."""
    engine = Fingerprint(
        role_rank=rank,
        num_attention_ranks=num_attention_ranks,
        num_ffn_ranks=num_ffn_ranks,
        tensor_parallel_size=1,
        compute_gate_on_attention=False,
        layers=tuple(LAYERS),
        hidden_size=16,
        dtype="bfloat16",
        model="AFDDeepseekV2ForCausalLM config-sha256:0123456789abcdef",
        version="0.1.0",
        connector="GlooAFDConnector",
    )
    return dataclasses.replace(engine, **changes)


def _open_fds() -> set[tuple[int, str]]:
    """This process's open file descriptors and what they point at (``socket:[...]``, ...)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            found.add((int(name), os.readlink(f"/proc/self/fd/{name}")))
        except FileNotFoundError:  # the directory listing's own descriptor, closed meanwhile
            pass
    return found


def _left_open(before: set[tuple[int, str]], settle_s: float = 5.0) -> set[tuple[int, str]]:
    """The descriptors open now and not in ``before``, once those that are closing have closed:
    the FFN side's threads (an opening, a store server) close their connection on their own, some
    time after the other end closed it. Anything still open after ``settle_s`` is left open."""
    deadline = time.monotonic() + settle_s
    while (left := _open_fds() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _fds_before() -> set[tuple[int, str]]:
    """:func:`_open_fds` before a connector is made, so that only what it leaves open differs
    after."""
    return _open_fds()


class GlooPlaysNccl:
    """The calls the NCCL data plane makes of vLLM's NCCL communicator, played by gloo on CPU
    tensors: transfers queue between ``group_start`` and ``group_end``, which posts them all with
    one tag (so gloo pairs them by order per peer, as NCCL does) and waits for them."""

    def __init__(self, group: Any, device: torch.device):
        from torch.distributed import PrefixStore
        from vllm.distributed.utils import init_gloo_process_group

        assert device == torch.device("cpu")
        self.pg = init_gloo_process_group(
            PrefixStore("stand-in", group.store),
            group.rank,
            group.world_size,
            timedelta(seconds=30),
        )
        self.queued: list[tuple[bool, torch.Tensor, int]] | None = None
        #: groups run, and what crossed: (send?, peer, rows) per transfer
        self.groups = 0
        self.transfers: list[tuple[bool, int, int]] = []

    def group_start(self) -> None:
        assert self.queued is None, "NCCL groups do not nest here"
        self.queued = []

    def send(self, tensor: torch.Tensor, dst: int, stream: object = None) -> None:
        assert self.queued is not None, "a send outside an NCCL group"
        self.queued.append((True, tensor, dst))

    def recv(self, tensor: torch.Tensor, src: int, stream: object = None) -> None:
        assert self.queued is not None, "a receive outside an NCCL group"
        self.queued.append((False, tensor, src))

    def group_end(self) -> None:
        queued, self.queued = self.queued or [], None
        works = [
            (self.pg.send if send else self.pg.recv)([tensor.view(torch.uint8)], peer, 0)
            for send, tensor, peer in queued
        ]
        for work in works:
            work.wait(timedelta(seconds=30))
        self.groups += 1
        self.transfers += [(send, peer, tensor.shape[0]) for send, tensor, peer in queued]

    def destroy(self) -> None:
        self.pg.abort()


#: the data planes every connector test here runs over: the gloo connector's two (shared memory
#: between peers on one host, and gloo as across hosts) and NCCL's
PLANES = ("shm", "gloo", "nccl")
#: what each plane's connectors say they use
IN_USE = {
    "shm": "shared memory (every peer on this host)",
    "gloo": "gloo over TCP (shared_memory is false on the FFN worker)",
    "nccl": "nccl",
}


def _extra(plane: str) -> GlooExtraConfig:
    """The test deployment's settings for ``plane`` (the gloo plane: shared memory off)."""
    return dataclasses.replace(EXTRA, shared_memory=plane != "gloo")


def _attention_connector(
    plane: str, rank: int, port: int, made: list[Any], **changes: object
) -> Any:
    group, fingerprint = groups(2, 1, port)[0], _fingerprint(rank, **changes)
    if plane != "nccl":
        from afd_models.connectors.gloo import GlooAttentionConnector

        return GlooAttentionConnector("127.0.0.1", group, rank, _extra(plane), fingerprint)
    from afd_models.connectors.nccl import NcclAttentionConnector

    return NcclAttentionConnector(
        "127.0.0.1",
        group,
        rank,
        EXTRA,
        fingerprint,
        device=torch.device("cpu"),
        make_communicator=lambda *args: made.append(GlooPlaysNccl(*args)) or made[-1],
    )


def _ffn_connector(plane: str, port: int, made: list[Any], **changes: object) -> Any:
    group, fingerprint = groups(2, 1, port)[0], _fingerprint(0, **changes)
    if plane != "nccl":
        from afd_models.connectors.gloo import GlooFFNConnector

        return GlooFFNConnector("127.0.0.1", group, _extra(plane), fingerprint)
    from afd_models.connectors.nccl import NcclFFNConnector

    return NcclFFNConnector(
        "127.0.0.1",
        group,
        EXTRA,
        fingerprint,
        device=torch.device("cpu"),
        make_communicator=lambda *args: made.append(GlooPlaysNccl(*args)) or made[-1],
    )


def _attention_peer(
    plane: str,
    rank: int,
    port: int,
    results: multiprocessing.Queue,
    release: multiprocessing.Event,
) -> None:
    made: list[GlooPlaysNccl] = []
    connector = _attention_connector(plane, rank, port, made)
    connector.set_layers(LAYERS)
    exact = True
    for step in range(STEPS):
        for layer in LAYERS:
            hidden, logits = _step_input(rank, step, layer)
            with_logits = logits if step == 0 else None  # step 0: gate on Attention
            connector.send(layer, hidden, with_logits)
            exact &= torch.equal(connector.recv(layer, hidden), _expected(hidden, with_logits))
    transfers = made[0].transfers if made else None
    labels = ("attention", rank, "ffn0")
    series = {
        "steps": _sample("afd_steps_total", *labels),
        "tokens": _sample("afd_tokens_total", *labels),
        "connected": _sample("afd_peer_connected", *labels),
        "sent": _sample("afd_bytes_total", *labels, direction="sent"),
        "received": _sample("afd_bytes_total", *labels, direction="received"),
        "exchanges": [
            _sample("afd_exchange_seconds_count", *labels, layer=str(layer)) for layer in LAYERS
        ],
        # the round trips split into the wait for the answer and this side's own code
        "waited": 0 < connector.stats.waited_s < connector.stats.total_s,
    }
    results.put((rank, exact, connector.stats.steps, transfers, series))
    release.wait(60)
    connector.close()


def _sample(name: str, role: str, rank: int, peer: str, **labels: str) -> float:
    """A series' value in this process's Prometheus registry, TP lane 0 (0 when never written)."""
    from prometheus_client import REGISTRY

    value = REGISTRY.get_sample_value(
        name, {"role": role, "rank": str(rank), "lane": "0", "peer": peer, **labels}
    )
    return 0.0 if value is None else value


@pytest.fixture(params=PLANES)
def pair(request: pytest.FixtureRequest) -> Any:
    """(plane, FFN connector, Attention peer processes, their results, release event, the FFN
    side's NCCL stand-ins)."""
    plane = request.param
    ffn, peers, results, release, made = _start_pair(plane, _attention_peer)
    yield plane, ffn, peers, results, release, made
    _stop_pair(ffn, peers, release)


def _start_pair(
    plane: str, peer: Any, **changes: object
) -> tuple[Any, list[Any], Any, Any, list[GlooPlaysNccl]]:
    """Attention ranks 0 and 1 running ``peer`` in processes of their own, and the FFN connector
    here, its fingerprint with ``changes``: (FFN connector, peer processes, their results,
    release event, the FFN side's NCCL stand-ins)."""
    context = multiprocessing.get_context("spawn")
    results, release, port = context.Queue(), context.Event(), free_port()
    peers = [
        context.Process(target=peer, args=(plane, rank, port, results, release)) for rank in (0, 1)
    ]
    for process in peers:
        process.start()
    made: list[GlooPlaysNccl] = []
    return _ffn_connector(plane, port, made, **changes), peers, results, release, made


def _stop_pair(ffn: Any, peers: list[Any], release: Any) -> None:
    release.set()
    for peer in peers:
        peer.join(30)
        if peer.is_alive():
            peer.kill()
    ffn.close()


def _ffn_series() -> list[dict[str, float]]:
    """This process's FFN-side series of rank 0 for Attention peers 0 and 1."""
    return [
        {
            "steps": _sample("afd_steps_total", "ffn", 0, f"attention{rank}"),
            "tokens": _sample("afd_tokens_total", "ffn", 0, f"attention{rank}"),
            "connected": _sample("afd_peer_connected", "ffn", 0, f"attention{rank}"),
            "received": _sample(
                "afd_bytes_total", "ffn", 0, f"attention{rank}", direction="received"
            ),
            "sent": _sample("afd_bytes_total", "ffn", 0, f"attention{rank}", direction="sent"),
        }
        for rank in (0, 1)
    ]


def test_step_interruptible_idle_and_vanished_peer(pair) -> None:
    plane, ffn, peers, results, release, made = pair
    assert ffn.data_plane == IN_USE[plane]
    # the counters of this process add up over the tests run in it: count from here
    before = _ffn_series()
    for step in range(STEPS):
        headers = ffn.wait_step(threading.Event())
        assert [(h.step, h.num_tokens, h.dtype) for h in headers] == [
            (step, n, torch.bfloat16) for n in TOKENS
        ]
        for layer in LAYERS:
            received = ffn.recv(layer)
            hidden, logits = received.hidden_states, received.router_logits
            assert hidden.shape == (sum(TOKENS), 16)
            assert (logits is None) == (step == 1)
            assert received.token_ids is None  # no layer of this model routes by token id
            ffn.send(layer, _expected(hidden, logits))
    ffn_series = [
        {key: value - earlier[key] if key != "connected" else value for key, value in now.items()}
        for now, earlier in zip(_ffn_series(), before, strict=True)
    ]
    outcomes = sorted((results.get(timeout=60) for _ in peers), key=lambda outcome: outcome[0])
    assert [outcome[:3] for outcome in outcomes] == [(0, True, STEPS), (1, True, STEPS)]
    # each side's Prometheus series (afd_models.metrics) counted every step, token, exchange and
    # byte of its connection: the peers' in their own processes, the FFN side's in this one
    for rank, *_, series in outcomes:
        logits = TOKENS[rank] * 4 * 4  # float32 router logits, sent on step 0
        assert series == {
            "steps": STEPS,
            "tokens": STEPS * TOKENS[rank],
            "connected": 1,
            "sent": STEPS * len(LAYERS) * TOKENS[rank] * 16 * 2 + len(LAYERS) * logits,
            "received": STEPS * len(LAYERS) * TOKENS[rank] * 16 * 2,  # bfloat16 outputs
            "exchanges": [STEPS] * len(LAYERS),
            "waited": True,
        }, rank
        assert ffn_series[rank] == {
            "steps": STEPS,
            "tokens": STEPS * TOKENS[rank],
            "connected": 1,
            "received": STEPS * len(LAYERS) * TOKENS[rank] * 16 * 2 + len(LAYERS) * logits,
            "sent": STEPS * len(LAYERS) * TOKENS[rank] * 16 * 2,
        }, rank
    if plane == "nccl":
        # every layer crossed the data plane, the first included (NCCL tensors never ride the
        # CPU step channel): per step and layer, each peer one group of its hidden states, its
        # logits on step 0, and the receive of its rows; the FFN side one group of receives
        # from both peers and one of sends
        for rank, _, _, transfers, _ in outcomes:
            expected = []
            for step in range(STEPS):
                for _ in LAYERS:
                    expected.append((False, 0, TOKENS[rank]))
                    expected += [(True, 0, TOKENS[rank])] * (2 if step == 0 else 1)
            assert transfers == expected
        (communicator,) = made
        assert communicator.groups == 2 * STEPS * len(LAYERS)
    else:
        assert not made and all(outcome[3] is None for outcome in outcomes)

    # idle: a stop from another thread ends the wait at once
    stop, outcome = threading.Event(), {}
    waiter = threading.Thread(target=lambda: outcome.update(headers=ffn.wait_step(stop)))
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive()  # really waiting
    stopped = time.monotonic()
    stop.set()
    ffn.interrupt()
    waiter.join(5)
    assert not waiter.is_alive() and outcome == {"headers": None}
    assert time.monotonic() - stopped < 2

    # the Attention peers leave: the FFN side says so instead of waiting out its idle timeout
    release.set()
    started = time.monotonic()
    with pytest.raises(AFDConnectionError, match="step header from rank 1 failed: the peer closed"):
        ffn.wait_step(threading.Event())
    assert time.monotonic() - started < EXTRA.timeout_s
    # closing marks both peers disconnected (the fixture closes it again: closing is idempotent)
    ffn.close()
    assert [series["connected"] for series in _ffn_series()] == [0, 0]


def _token_ids(rank: int, step: int) -> torch.Tensor:
    return torch.arange(TOKENS[rank], dtype=torch.int64) * 7 + 100 * rank + step


def _with_token_ids(hidden: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """What the fake FFN computes on a token-id layer: each row shifted by its token's id."""
    return hidden + token_ids.unsqueeze(-1).to(hidden.dtype)


def _token_id_peer(
    plane: str,
    rank: int,
    port: int,
    results: multiprocessing.Queue,
    release: multiprocessing.Event,
    *,
    token_layer: int,
    with_logits: bool,
) -> None:
    """An Attention peer of a model whose layer ``token_layer`` routes by token id, sending
    router logits too if ``with_logits``."""
    made: list[GlooPlaysNccl] = []
    connector = _attention_connector(plane, rank, port, made, token_id_layers=(token_layer,))
    try:  # token-id layers other than those presented at connect time are refused
        connector.set_layers(LAYERS, [])
        refused = "accepted"
    except ValueError as exc:
        refused = str(exc)
    connector.set_layers(LAYERS, [token_layer])
    exact = True
    for step in range(STEPS):
        ids = _token_ids(rank, step)
        for layer in LAYERS:
            hidden, logits = _step_input(rank, step, layer)
            logits = logits if with_logits else None
            needs_ids = layer == token_layer
            connector.send(layer, hidden, logits, token_ids=ids if needs_ids else None)
            expected = _expected(hidden, logits)
            expected = _with_token_ids(expected, ids) if needs_ids else expected
            exact &= torch.equal(connector.recv(layer, hidden), expected)
    results.put((rank, exact, made[0].transfers if made else None, refused))
    release.wait(60)
    connector.close()


@pytest.mark.parametrize(
    ("token_layer", "with_logits"),
    # the first layer (on gloo: with the header over the step channel) with router logits, as
    # DeepSeek-V4's first MoE layers route by token id; a later one without
    [(LAYERS[0], True), (LAYERS[-1], False)],
    ids=["first-layer-with-logits", "later-layer"],
)
@pytest.mark.parametrize("plane", PLANES)
def test_token_ids_cross_only_for_the_layers_that_route_by_them(
    plane: str, token_layer: int, with_logits: bool
) -> None:
    """A model one of whose two remote layers routes by token id (DeepSeek-V4's hash layers):
    every step header says token ids come, that layer's sends carry each peer's ids (int32,
    after the router logits, concatenated in peer order on the FFN side), the other layer's carry
    none, and the outputs computed from them reach each peer's rows. A peer binding other
    token-id layers than it presented is refused."""
    peer = functools.partial(_token_id_peer, token_layer=token_layer, with_logits=with_logits)
    ffn, peers, results, release, _ = _start_pair(plane, peer, token_id_layers=(token_layer,))
    try:
        for step in range(STEPS):
            headers = ffn.wait_step(threading.Event())
            assert [h.token_ids for h in headers] == [True, True]
            for layer in LAYERS:
                received = ffn.recv(layer)
                assert (received.router_logits is not None) == with_logits
                output = _expected(received.hidden_states, received.router_logits)
                if layer != token_layer:
                    assert received.token_ids is None
                    ffn.send(layer, output)
                    continue
                ids = torch.cat([_token_ids(rank, step) for rank in (0, 1)])
                assert received.token_ids is not None
                assert received.token_ids.dtype == torch.int32
                assert torch.equal(received.token_ids, ids.to(torch.int32))
                ffn.send(layer, _with_token_ids(output, received.token_ids))
        outcomes = sorted((results.get(timeout=60) for _ in peers), key=lambda o: o[0])
        assert [outcome[:2] for outcome in outcomes] == [(0, True), (1, True)]
        for *_, refused in outcomes:
            assert refused == (
                f"token-id layers [], but this connector presented [{token_layer}] at connect time"
            )
        if plane == "nccl":
            # per step and layer: the receive, the hidden states, the logits if sent, and on the
            # token-id layer the ids (NCCL never uses the step channel, the first layer included)
            for rank, _, transfers, _ in outcomes:
                per_step = []
                for layer in LAYERS:
                    parts = 1 + with_logits + (layer == token_layer)
                    per_step += [(False, 0, TOKENS[rank])] + [(True, 0, TOKENS[rank])] * parts
                assert transfers == per_step * STEPS, rank
    finally:
        _stop_pair(ffn, peers, release)


def _quick_progress(connector: type) -> type:
    """``connector`` reporting its waits every 0.5 s instead of every PROGRESS_EVERY_S."""
    return type(connector.__name__, (connector,), {"progress_every_s": 0.5})


def test_attention_without_ffn_fails_clearly() -> None:
    """No FFN worker: the Attention side says, while it waits, whom it waits for and for how long;
    then where it looked, and it leaves nothing open."""
    from afd_models.connectors.gloo import GlooAttentionConnector

    port = free_port()
    fds = _fds_before()
    started = time.monotonic()
    with (
        AFDLines() as lines,
        pytest.raises(
            AFDConnectionError, match=f"no connector group at 127.0.0.1:{port} within 2 s"
        ),
    ):
        _quick_progress(GlooAttentionConnector)(
            "127.0.0.1", groups(1, 1, port)[0], 0, GlooExtraConfig(connect_timeout_s=2)
        )
    assert time.monotonic() - started < 10
    assert _open_fds() - fds == set()
    waiting = [line for line in lines if "still waiting for FFN rank 0 to host group 0" in line]
    assert len(waiting) >= 2, lines
    assert waiting[0].endswith("of 2 s; last try: [Errno 111] Connection refused"), waiting[0]
    assert f"at 127.0.0.1:{port} (it does once its model is loaded)" in waiting[0]


def test_ffn_names_the_attention_ranks_it_still_waits_for() -> None:
    """2A1F with only Attention rank 0 started: while connecting, the FFN side names rank 1 as
    missing and rank 0 as admitted, and rank 0 says it waits for rank 1; at the connect timeout
    the FFN side fails naming rank 1, and rank 0 learns why."""
    from afd_models.connectors.gloo import GlooAttentionConnector, GlooFFNConnector

    group = groups(2, 1, free_port())[0]
    extra = GlooExtraConfig(connect_timeout_s=3, timeout_s=30)
    # rank 0 starts first: with the same budget it could time out before the FFN side's answer
    # reaches it (a slow machine did); a longer one makes the FFN side's the deadline that ends it
    patient = GlooExtraConfig(connect_timeout_s=30, timeout_s=30)
    outcome: list[BaseException] = []

    def attention() -> None:
        try:
            GlooAttentionConnector("127.0.0.1", group, 0, patient, _fingerprint(0))
        except AFDConnectionError as exc:
            outcome.append(exc)

    peer = threading.Thread(target=attention)
    with AFDLines() as lines:
        peer.start()
        with pytest.raises(
            AFDConnectionError,
            match=r"attention ranks \[1\] did not open their step channel within 3 s",
        ):
            _quick_progress(GlooFFNConnector)("127.0.0.1", group, extra, _fingerprint(0))
        peer.join(FAST_S)
    assert not peer.is_alive() and len(outcome) == 1, outcome
    assert "gave up before the group formed" in str(outcome[0]), outcome[0]
    assert any("still waiting for attention ranks [1] (admitted: [0])" in line for line in lines), (
        lines
    )
    assert any("waiting for the group's other attention ranks [1]" in line for line in lines)


def _connecting_peer(
    rank: int,
    group: Group,
    fingerprint: Fingerprint,
    ready: multiprocessing.Event,
    results: multiprocessing.Queue,
) -> None:
    """An Attention worker that connects and reports: its rank, the outcome (``connected`` or the
    error), how long the constructor took, and the descriptors it left open (counted while the
    error and the frames its traceback holds are alive: only an explicit close counts)."""
    from afd_models.connectors.gloo import GlooAttentionConnector

    fds = _fds_before()
    ready.set()
    started = time.monotonic()
    error: AFDConnectionError | None = None
    try:
        connector = GlooAttentionConnector("127.0.0.1", group, rank, EXTRA, fingerprint)
    except AFDConnectionError as exc:
        error = exc
    else:
        connector.close()
    elapsed = time.monotonic() - started
    outcome = "connected" if error is None else str(error)
    results.put((rank, outcome, elapsed, sorted(_open_fds() - fds)))


def _start_peers(
    peers: list[tuple[int, Group, Fingerprint]],
) -> tuple[list[multiprocessing.Process], multiprocessing.Queue]:
    """Start one connecting peer per entry; return once every one is about to connect."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes, events = [], []
    for rank, group, fingerprint in peers:
        ready = context.Event()
        process = context.Process(  # a daemon: a failed test does not leave it behind
            target=_connecting_peer, args=(rank, group, fingerprint, ready, results), daemon=True
        )
        process.start()
        processes.append(process)
        events.append(ready)
    for ready in events:
        assert ready.wait(120), "a peer process did not start"
    return processes, results


def _ffn_refuses(group: Group, fingerprint: Fingerprint) -> tuple[str, float]:
    """Construct the FFN side, which must fail; its error and how long it took. It must leave
    no descriptor open and its rendezvous port free."""
    from afd_models.connectors.gloo import GlooFFNConnector

    fds = _fds_before()
    started = time.monotonic()
    with pytest.raises(AFDConnectionError) as failure:
        GlooFFNConnector("127.0.0.1", group, EXTRA, fingerprint)
    elapsed = time.monotonic() - started
    assert _open_fds() - fds == set()
    assert port_is_free(group.port)
    return str(failure.value), elapsed


def _outcomes(
    processes: list[multiprocessing.Process], results: multiprocessing.Queue
) -> list[tuple]:
    outcomes = sorted(results.get(timeout=60) for _ in processes)
    for process in processes:
        process.join(30)
        if process.is_alive():
            process.kill()
    return outcomes


#: (FFN A, F), (Attention A, F, rank), fields the Attention engine has otherwise, the mismatch text
MISMATCHES = {
    "num_ffn_ranks": (
        (4, 1),
        (4, 2, 1),
        {},
        "num_ffn_ranks: attention rank 1 has 2, the FFN rank 0 has 1",
    ),
    "gate placement": (
        (2, 1),
        (2, 1, 1),
        {"compute_gate_on_attention": True},
        "compute_gate_on_attention: attention rank 1 has true, the FFN rank 0 has false",
    ),
    "hidden size and dtype": (
        (2, 1),
        (2, 1, 1),
        {"hidden_size": 32, "dtype": "float16"},
        "hidden_size: attention rank 1 has 32, the FFN rank 0 has 16; "
        "dtype: attention rank 1 has float16, the FFN rank 0 has bfloat16",
    ),
    "layers": (
        (2, 1),
        (2, 1, 1),
        {"layers": (0, 1, 2)},
        "layers: attention rank 1 has [0-2], the FFN rank 0 has [0,2]",
    ),
    "tensor parallel size": (
        (2, 1),
        (2, 1, 1),
        {"tensor_parallel_size": 2},
        "tensor_parallel_size: attention rank 1 has 2, the FFN rank 0 has 1",
    ),
    "connector": (
        (2, 1),
        (2, 1, 1),
        {"connector": "NcclAFDConnector"},  # a CUDA Attention engine meeting a CPU FFN engine
        "connector: attention rank 1 has NcclAFDConnector, the FFN rank 0 has GlooAFDConnector",
    ),
}


@pytest.mark.parametrize("case", MISMATCHES)
def test_mismatched_engines_fail_both_sides_at_once(case: str) -> None:
    """An Attention engine that differs from its FFN worker is refused at connect time: both
    sides fail within seconds (not the 60 s connect timeout, nor the 30 s transfer timeout),
    both name the field and both values, and neither leaves a descriptor open."""
    (ffn_a, ffn_f), (a, f, rank), changes, mismatch = MISMATCHES[case]
    port = free_port()
    attention_group = next(g for g in groups(a, f, port) if rank in g.attention_ranks)
    processes, results = _start_peers(
        [(rank, attention_group, _fingerprint(rank, a, f, **changes))]
    )
    error, elapsed = _ffn_refuses(groups(ffn_a, ffn_f, port)[0], _fingerprint(0, ffn_a, ffn_f))
    assert error == f"AFD gloo ffn: refused attention rank {rank} at 127.0.0.1:{port}: {mismatch}"
    assert elapsed < FAST_S
    [(_, outcome, peer_elapsed, leaked)] = _outcomes(processes, results)
    assert outcome == (
        f"AFD gloo attention: the FFN worker at 127.0.0.1:{port} refused attention rank {rank}: {mismatch}"
    )
    assert peer_elapsed < FAST_S
    assert leaked == []


def test_duplicate_rank_is_refused() -> None:
    """Two Attention workers claiming the same rank: the FFN side names the rank, the later one is
    refused with the reason, the earlier one is told why the FFN side gave up; nobody overwrites
    anybody, and nobody waits out a timeout."""
    port = free_port()
    group = groups(2, 1, port)[0]
    processes, results = _start_peers([(0, group, _fingerprint(0)), (0, group, _fingerprint(0))])
    error, elapsed = _ffn_refuses(group, _fingerprint(0))
    duplicate = (
        "attention rank 0 is already connected: two Attention workers claim the same rank "
        "(give each Attention engine its own ranks)"
    )
    assert error == f"AFD gloo ffn: refused attention rank 0 at 127.0.0.1:{port}: {duplicate}"
    assert elapsed < FAST_S
    outcomes = _outcomes(processes, results)
    where = f"the FFN worker at 127.0.0.1:{port}"
    assert sorted(outcome for _, outcome, _, _ in outcomes) == [
        f"AFD gloo attention: {where} gave up before the group formed: {error}",
        f"AFD gloo attention: {where} refused attention rank 0: {duplicate}",
    ]
    assert all(peer_elapsed < FAST_S and leaked == [] for _, _, peer_elapsed, leaked in outcomes)


def _raw_peer(port: int, sends: bytes, answer: dict[str, object]) -> None:
    """A client that is not an AFD connector of this version: once the FFN side listens, it
    sends ``sends`` and records everything the FFN side sends until it closes the connection."""
    from afd_models.connectors.p2p.auth import HELLO

    with probes.connect_when_listening(port) as channel:
        channel.sendall(sends)
        answer["bytes"] = probes.received_until_closed(channel)[HELLO.size :]


def _rank_and(payload: bytes | None) -> bytes:
    """Group rank 1, then ``payload`` framed as a fingerprint is (nothing when None)."""
    rank = (1).to_bytes(8, "big")
    return rank if payload is None else rank + len(payload).to_bytes(4, "big") + payload


@pytest.mark.parametrize(
    ("sends", "timeout_s", "expected"),
    [
        (
            _rank_and(b"hello"),
            30,
            "received a malformed fingerprint: not JSON",
        ),
        (
            _rank_and(b'{"format": "afd-fingerprint/0", "version": "0.0.9"}'),
            30,
            "received a malformed fingerprint: format 'afd-fingerprint/0', expected "
            "'afd-fingerprint/5'; it says it runs vllm-afd-overlay 0.0.9",
        ),
        (
            _rank_and(
                None
            ),  # an Attention worker of a version before the handshake sends its rank only
            2,
            "it sent no whole handshake within 2 s (not an AFD peer, or an AFD version without "
            "this handshake?)",
        ),
    ],
    ids=["not-json", "other-format", "no-fingerprint"],
)
def test_peer_without_a_valid_fingerprint_is_dropped(
    sends: bytes, timeout_s: float, expected: str
) -> None:
    """A peer whose fingerprint is malformed or missing: the FFN side logs it with its address,
    tells it why when it can, and drops it within ``timeout_s``; its rendezvous goes on, and the
    real peer that connects next forms the group. Nothing is left open."""
    from afd_models.connectors.gloo import GlooAttentionConnector, GlooFFNConnector

    port = free_port()
    group = groups(1, 1, port)[0]
    extra = dataclasses.replace(EXTRA, timeout_s=timeout_s)
    answer: dict[str, object] = {}
    client = threading.Thread(target=_raw_peer, args=(port, sends, answer))
    client.start()
    real: dict[str, object] = {}

    def real_peer() -> None:
        client.join(60)  # after the stranger was dropped
        real["connector"] = GlooAttentionConnector("127.0.0.1", group, 0, extra)

    fds = _fds_before()
    started = time.monotonic()
    joining = threading.Thread(target=real_peer)
    joining.start()
    with AFDLines() as lines:
        ffn = GlooFFNConnector("127.0.0.1", group, extra)
    joining.join(30)
    assert time.monotonic() - started < timeout_s + FAST_S
    ffn.close()
    real["connector"].close()  # type: ignore[attr-defined]
    dropped = [line for line in lines if "dropped a connection from 127.0.0.1:" in line]
    assert len(dropped) == 1 and expected in dropped[0], lines
    if timeout_s == 30:  # a malformed fingerprint: the peer is told
        assert expected in bytes(answer["bytes"]).decode(errors="replace")
    assert _left_open(fds) == set()
    assert port_is_free(port)


def test_ffn_without_handshake_is_reported() -> None:
    """An FFN side that accepts and never answers: the Attention side says so within
    ``timeout_s`` and leaves nothing open."""
    from afd_models.connectors.gloo import GlooAttentionConnector

    port = free_port()
    with socket.create_server(("127.0.0.1", port)) as listener:
        fds = _fds_before()
        started = time.monotonic()
        with pytest.raises(
            AFDConnectionError,
            match=f"the FFN worker at 127.0.0.1:{port} did not answer the handshake within 2 s "
            r"\(is it an AFD FFN worker of the same vllm-afd-overlay version\?\)",
        ):
            GlooAttentionConnector(
                "127.0.0.1", groups(1, 1, port)[0], 0, dataclasses.replace(EXTRA, timeout_s=2)
            )
        assert time.monotonic() - started < FAST_S
        listener.accept()[0].close()  # the connection the Attention side had opened, and closed
        assert _left_open(fds) == set()


def _engine_config(path: str, quantization: str | None = None, **model: object) -> object:
    """What :mod:`afd_models.wiring.connect` reads of an engine config: a model read from
    ``path``, with ``model`` config values."""
    from transformers import DeepseekV2Config

    hf_config = DeepseekV2Config(
        name_or_path=path, hidden_size=64, num_hidden_layers=3, architectures=["X"], **model
    )
    model_config = SimpleNamespace(
        hf_config=hf_config,
        quantization=quantization,
        dtype=torch.bfloat16,
        get_hidden_size=lambda: hf_config.hidden_size,
    )
    return SimpleNamespace(
        model_config=model_config, parallel_config=SimpleNamespace(tensor_parallel_size=1)
    )


def test_fingerprint_of_an_engine() -> None:
    """The connect step's fingerprint (``wiring.connect``): the AFD config, the layers, the
    model's size and dtype, an identity that ignores where the model was read from, and the
    installed version."""
    from afd_models.config import AFDConfigError, parse_afd_config
    from afd_models.wiring.connect import fingerprint, model_identity, project_version

    afd = parse_afd_config(
        {
            "role": "attention",
            "num_attention_ranks": 4,
            "num_ffn_ranks": 2,
            "compute_gate_on_attention": True,
        }
    )
    engine = _engine_config("/models/a")
    identity = model_identity(engine)
    assert fingerprint(engine, afd, 3, [1, 2], [2]) == Fingerprint(
        3,
        4,
        2,
        1,
        True,
        (1, 2),
        64,
        "bfloat16",
        identity,
        project_version(),
        "GlooAFDConnector",
        (2,),
    )
    # a connector whose plane cannot carry token ids refuses a model with token-id layers, by name
    camp2p = dataclasses.replace(afd, connector="CAMP2PAFDConnector")
    assert fingerprint(engine, camp2p, 3, [1, 2], []).token_id_layers == ()
    with pytest.raises(
        AFDConfigError,
        match=r"connector='CAMP2PAFDConnector': the model routes "
        r"layers \[2\] by token id.*its cam-p2p plane moves hidden states only\); connectors "
        r"that can, on its platforms: LoopbackAFDConnector$",
    ):
        fingerprint(engine, camp2p, 3, [1, 2], [2])
    assert identity.startswith("X config-sha256:") and len(identity) == len("X config-sha256:") + 16
    assert model_identity(_engine_config("/elsewhere/b")) == identity
    assert model_identity(_engine_config("/models/a", n_routed_experts=8)) != identity
    assert model_identity(_engine_config("/models/a", quantization="fp8")) != identity
    assert project_version() == importlib.metadata.version("vllm-afd-overlay")


def _parallel_engine(
    role: str,
    a: int,
    f: int,
    offset: int,
    dp_size: int,
    dp_rank: int,
    tp_size: int = 1,
    port: int = 29650,
) -> tuple[Any, AFDConfig]:
    """What worker_role_rank reads of an engine config (with its AFD section parsed)."""
    parallel = SimpleNamespace(
        data_parallel_size=dp_size, data_parallel_rank=dp_rank, tensor_parallel_size=tp_size
    )
    afd = {
        "role": role,
        "num_attention_ranks": a,
        "num_ffn_ranks": f,
        "rank_offset": offset,
        "port": port,
    }
    return SimpleNamespace(parallel_config=parallel), parse_afd_config(afd)


@pytest.mark.parametrize(
    ("role", "a", "f", "offset", "dp_size", "tp_size", "ranks"),
    [
        ("attention", 3, 2, 0, 2, 1, [0, 1]),  # 3A2F: a DP 2 engine serves FFN rank 0's peers
        ("attention", 3, 2, 2, 1, 1, [2]),  # ... and a second engine FFN rank 1's
        ("attention", 2, 2, 1, 1, 1, [1]),  # 2A2F from two engines
        ("ffn", 3, 2, 1, 1, 1, [1]),  # one FFN engine per FFN rank
        ("attention", 2, 1, 0, 2, 2, [0, 1]),  # TP ranks are lanes, not role ranks
        ("ffn", 2, 1, 0, 1, 4, [0]),
    ],
)
def test_worker_role_rank_counts_dp_ranks_from_the_engines_offset(
    role: str, a: int, f: int, offset: int, dp_size: int, tp_size: int, ranks: list[int]
) -> None:
    from afd_models.wiring.connect import worker_role_rank

    got = [
        worker_role_rank(*_parallel_engine(role, a, f, offset, dp_size, dp_rank, tp_size))
        for dp_rank in range(dp_size)
    ]
    assert got == ranks


@pytest.mark.parametrize(
    ("role", "a", "f", "offset", "dp_size", "tp_size", "port", "message"),
    [
        (
            "attention",
            2,
            1,
            1,
            1,
            1,
            29650,
            "additional_config.afd.rank_offset=1: FFN rank 0 of 2A1F serves attention ranks "
            "[0, 1], but the engine of ranks 1..1 holds only [1]",
        ),
        (
            "attention",
            3,
            2,
            1,
            2,
            1,
            29650,
            "additional_config.afd.rank_offset=1: FFN rank 0 of 3A2F serves attention ranks "
            "[0, 1], but the engine of ranks 1..2 holds only [1]",
        ),
        (
            "attention",
            3,
            2,
            2,
            2,
            1,
            29650,
            "additional_config.afd.num_attention_ranks=3 with additional_config.afd.rank_offset=2, "
            "but this engine's 2 DP ranks take role ranks 2..3; allowed: "
            "rank_offset + --data-parallel-size <= num_attention_ranks",
        ),
        (
            "ffn",
            2,
            2,
            0,
            1,
            2,
            65533,
            "additional_config.afd.port=65533 with additional_config.afd.num_ffn_ranks=2 and "
            "--tensor-parallel-size=2: port=65533 with 2 FFN ranks x TP size 2 needs ports "
            "65533..65536; allowed: 1..65535 (each FFN rank hosts one group per TP rank)",
        ),
    ],
)
def test_engines_that_do_not_fit_the_topology_are_refused_before_loading(
    role: str, a: int, f: int, offset: int, dp_size: int, tp_size: int, port: int, message: str
) -> None:
    from afd_models.config import AFDConfigError
    from afd_models.wiring.connect import worker_role_rank

    with pytest.raises(AFDConfigError) as raised:
        worker_role_rank(*_parallel_engine(role, a, f, offset, dp_size, 0, tp_size, port))
    assert str(raised.value).startswith(message)


def _watched_attention_peer(port: int, results: multiprocessing.Queue) -> None:
    from afd_models.connectors.nccl import NcclAttentionConnector

    gone = threading.Event()

    def on_peer_gone(exc: BaseException) -> None:
        results.put(str(exc))
        gone.set()

    connector = NcclAttentionConnector(
        "127.0.0.1",
        groups(1, 1, port)[0],
        0,
        EXTRA,
        _fingerprint(0, 1, 1),
        device=torch.device("cpu"),
        make_communicator=GlooPlaysNccl,
        on_peer_gone=on_peer_gone,
    )
    results.put("connected")
    gone.wait(60)
    connector.close()


def test_an_attention_worker_whose_ffn_leaves_aborts_its_device_transfers() -> None:
    """NCCL transfers wait on the device (a graph replay), where no host timeout reaches them:
    when the FFN worker leaves, the Attention side sees its step channel end at once, aborts the
    data plane and reports it (the worker then exits)."""
    from afd_models.connectors.nccl import NcclFFNConnector

    context = multiprocessing.get_context("spawn")
    results, port = context.Queue(), free_port()
    peer = context.Process(target=_watched_attention_peer, args=(port, results))
    peer.start()
    try:
        ffn = NcclFFNConnector(
            "127.0.0.1",
            groups(1, 1, port)[0],
            EXTRA,
            _fingerprint(0, 1, 1),
            device=torch.device("cpu"),
            make_communicator=GlooPlaysNccl,
        )
        assert results.get(timeout=60) == "connected"
        left = time.monotonic()
        ffn.close()
        assert results.get(timeout=30) == (
            f"AFD nccl attention: the FFN worker at 127.0.0.1:{port} closed the step channel "
            "(it is gone); the nccl data plane is aborted"
        )
        assert time.monotonic() - left < 5
    finally:
        peer.join(30)
        if peer.is_alive():
            peer.kill()
    assert peer.exitcode == 0


#: DBO test: Attention rank 1 splits its step into two micro-batches, rank 0 sends it whole
SPLIT = {1: (2, 3)}


def _dbo_attention_peer(
    plane: str,
    rank: int,
    port: int,
    results: multiprocessing.Queue,
    release: multiprocessing.Event,
) -> None:
    """An Attention worker running one step, as vLLM's DBO runs a split one: each micro-batch in
    a thread of its own, the two taking turns, each yielding between a layer's send and receive
    (what ``vllm.v1.worker.ubatching`` does on CUDA, where it needs streams this CPU lacks)."""
    made: list[GlooPlaysNccl] = []
    connector = _attention_connector(plane, rank, port, made)
    connector.set_layers(LAYERS)
    exact: dict[tuple[int, int], bool] = {}
    parts = SPLIT.get(rank, (TOKENS[rank],))
    bounds = [(sum(parts[:u]), sum(parts[: u + 1])) for u in range(len(parts))]
    turns = [threading.Event() for _ in parts]

    def take_turn(ubatch: int) -> None:
        assert turns[ubatch].wait(60), f"micro-batch {ubatch} never got its turn back"
        turns[ubatch].clear()

    def micro_batch(ubatch: int) -> None:
        take_turn(ubatch)
        start, stop = bounds[ubatch]
        for layer in LAYERS:
            hidden, logits = (t[start:stop] for t in _step_input(rank, 0, layer))
            connector.send(layer, hidden, logits, ubatch=ubatch)
            if len(parts) > 1:  # dbo_yield: the other micro-batch runs until it yields
                turns[1 - ubatch].set()
                take_turn(ubatch)
            output = connector.recv(layer, hidden, ubatch=ubatch)
            exact[(ubatch, layer)] = torch.equal(output, _expected(hidden, logits))
        if len(parts) > 1:
            turns[1 - ubatch].set()  # done: the other runs to its end

    if len(parts) > 1:
        connector.split_next_step(parts)
    threads = [threading.Thread(target=micro_batch, args=(u,)) for u in range(len(parts))]
    for thread in threads:
        thread.start()
    turns[0].set()
    for thread in threads:
        thread.join(90)
    done = len(exact) == len(parts) * len(LAYERS) and all(exact.values())
    results.put((rank, done, connector.stats.steps, made[0].transfers if made else None))
    release.wait(60)
    connector.close()


@pytest.mark.parametrize(
    "plane",
    # the NCCL plane's ordering is played by gloo here
    PLANES,
)
def test_a_split_step_crosses_in_the_order_each_peer_posts_it(plane: str) -> None:
    """DBO in 2A1F: one peer splits its step, the other does not. The FFN server serves the
    step unit by unit, posting each peer's transfers in that peer's order; on the NCCL plane
    (gloo pairing transfers by order, and a send waiting for its receive, as NCCL may) any other
    order deadlocks into the timeout. Every micro-batch gets exactly its rows back, logits
    included."""
    from vllm.config import VllmConfig

    from afd_models.ffn_server import serve_step

    ffn, peers, results, release, _ = _start_pair(plane, _dbo_attention_peer)
    model = SimpleNamespace(
        compute_ffn_output=lambda layer, hidden, logits: _expected(hidden, logits)
    )
    try:
        headers = ffn.wait_step(threading.Event())
        assert [h.ubatches for h in headers] == [(3,), (2, 3)]
        rows, from_graphs, seconds = serve_step(
            model, VllmConfig(), ffn, LAYERS, headers, sum(TOKENS)
        )
        assert rows == [sum(TOKENS)] * len(LAYERS) and not from_graphs and not seconds
        outcomes = sorted(results.get(timeout=60) for _ in peers)
    finally:
        _stop_pair(ffn, peers, release)
    assert [outcome[:3] for outcome in outcomes] == [(0, True, 1), (1, True, 1)]
    if plane == "nccl":
        whole, split = (outcome[3] for outcome in outcomes)
        # the whole peer: per layer one group, its receive with its sends (hidden and logits)
        assert whole == [(False, 0, 3), (True, 0, 3), (True, 0, 3)] * len(LAYERS)
        sent = {u: [(True, 0, n)] * 2 for u, n in enumerate(SPLIT[1])}
        got = {u: [(False, 0, n)] for u, n in enumerate(SPLIT[1])}
        # send, yield, receive: S0 S1 R0 S0' R1 S1' R0' R1'
        assert split == sent[0] + sent[1] + got[0] + sent[0] + got[1] + sent[1] + got[0] + got[1]
