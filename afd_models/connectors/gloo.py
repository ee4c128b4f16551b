"""The gloo connector: CPU tensors over a process group formed between the two engines' workers.

One group per FFN rank (see :mod:`afd_models.topology`): the FFN worker is group rank 0 and hosts
the rendezvous store on ``host:port + ffn_rank``; its Attention peers connect to it. Either side
may start first: the store accepts the peers for ``connect_timeout_s``. The group is built with
vLLM's stateless gloo helper on a public ``TCPStore``, so it never touches either engine's own
torch.distributed world.

Per step each Attention peer sends a :class:`StepHeader`, followed by the step's first layer,
over a plain TCP connection to the FFN worker (its port travels through the store). The FFN side
waits for steps there, not in gloo, because a pending gloo receive cannot be woken: only a socket
wait lets a stop end the idle FFN loop, and it sees a vanished peer at once. The first layer rides
with the header because gloo moves data only once the receiver has posted its receive, and the FFN
side can post it only after reading the header: by gloo that layer would take three hops instead of
one. Every later layer goes over gloo, where the FFN side has already posted its receive: hidden
states (and router logits) as raw bytes, tagged with the layer so that a mismatch in layer order
times out loudly instead of mixing layers; the FFN side answers each peer with its rows by gloo.
Bytes round-trip every dtype bit for bit. Every transfer waits at most ``timeout_s``; the FFN side
waits for the next step up to ``idle_timeout_s``.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from datetime import timedelta

import torch
from torch.distributed import PrefixStore, ProcessGroup, TCPStore, Work
from vllm.distributed.utils import init_gloo_process_group

from afd_models.config import GlooExtraConfig
from afd_models.connectors.base import AFDConnectionError, AFDConnector, FFNConnector, StepHeader
from afd_models.log import get_logger
from afd_models.topology import Group, peer_slices

logger = get_logger(__name__)

#: store key under which the FFN worker publishes the port of its step-header listener
STEPS_KEY = "step-channel-port"
_RANK = struct.Struct("!q")


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(torch.uint8)


def _layer_tag(layer_idx: int, logits: bool = False) -> int:
    return 2 * layer_idx + (1 if logits else 0)


class _GlooGroup:
    """The rendezvous store and process group of one connector group; every transfer waits at
    most ``timeout_s``."""

    def __init__(self, host: str, group: Group, group_rank: int, extra: GlooExtraConfig, role: str):
        self.host = host
        self.where = f"{host}:{group.port}"
        self.group = group
        self.group_rank = group_rank
        self.timeout = timedelta(seconds=extra.timeout_s)
        started = time.monotonic()
        logger.info(
            "AFD gloo %s: %s group %d at %s, waiting up to %.0f s for %d peer(s)",
            role,
            "hosting" if group_rank == 0 else "joining",
            group.ffn_rank,
            self.where,
            extra.connect_timeout_s,
            group.size - 1,
        )
        try:
            self.store: TCPStore | None = TCPStore(
                host,
                group.port,
                world_size=group.size,
                is_master=group_rank == 0,
                timeout=timedelta(seconds=extra.connect_timeout_s),
                wait_for_workers=True,
            )
            self.pg: ProcessGroup | None = init_gloo_process_group(
                PrefixStore("afd", self.store), group_rank, group.size, self.timeout
            )
        except (RuntimeError, OSError) as exc:
            raise AFDConnectionError(
                f"AFD gloo {role}: no connector group at {self.where} within {extra.connect_timeout_s:.0f} s "
                f"(is the other role running with the same host/port?): {exc}"
            ) from exc
        logger.info(
            "AFD gloo %s: group %d at %s ready in %.1f s",
            role,
            group.ffn_rank,
            self.where,
            time.monotonic() - started,
        )

    def publish_step_port(self, port: int) -> None:
        """FFN side: tell the Attention peers where to send step headers."""
        assert self.store is not None, "published during construction only"
        self.store.set(STEPS_KEY, str(port))

    def step_port(self) -> int:
        """Attention side: the FFN worker's step-header port (waits up to ``connect_timeout_s``)."""
        assert self.store is not None, "looked up during construction only"
        return int(self.store.get(STEPS_KEY))

    @property
    def live(self) -> ProcessGroup:
        if self.pg is None:
            raise AFDConnectionError(f"AFD gloo connector at {self.where} is closed")
        return self.pg

    def wait(self, work: Work, what: str) -> None:
        try:
            work.wait(self.timeout)
        except RuntimeError as exc:
            raise AFDConnectionError(
                f"AFD gloo connector at {self.where}: {what} failed: the peer is gone, "
                f"or sent nothing for {self.timeout.total_seconds():.0f} s ({exc})"
            ) from exc

    def post_send(self, tensor: torch.Tensor, peer: int, tag: int) -> Work:
        try:
            return self.live.send([_as_bytes(tensor)], peer, tag)
        except RuntimeError as exc:
            raise AFDConnectionError(
                f"AFD gloo connector at {self.where}: send to rank {peer} failed (peer gone): {exc}"
            ) from exc

    def post_recv(self, out: torch.Tensor, peer: int, tag: int) -> Work:
        try:
            return self.live.recv([out.view(torch.uint8)], peer, tag)
        except RuntimeError as exc:
            raise AFDConnectionError(
                f"AFD gloo connector at {self.where}: receive from rank {peer} failed (peer gone): {exc}"
            ) from exc

    def close(self) -> None:
        """Abort pending transfers and release sockets and ports."""
        pg, self.pg = self.pg, None
        if pg is not None:
            try:
                pg.abort()
            except RuntimeError:
                pass
        self.store = None


class GlooAttentionConnector(AFDConnector):
    """Attention side: one worker, talking to the FFN rank of its group (group rank 0).

    The receive of a layer's output is posted before its activations are sent, so the answer can
    land as soon as the FFN side sends it.
    """

    def __init__(self, host: str, group: Group, attention_rank: int, extra: GlooExtraConfig):
        super().__init__()
        self._group = _GlooGroup(
            host, group, group.group_rank_of_attention(attention_rank), extra, "attention"
        )
        self._pending: dict[int, tuple[torch.Tensor, Work]] = {}
        self._header: StepHeader | None = None
        self._steps = self._connect_step_channel(extra)

    def _connect_step_channel(self, extra: GlooExtraConfig) -> socket.socket:
        where = self._group.where
        try:
            channel = socket.create_connection(
                (self._group.host, self._group.step_port()), extra.connect_timeout_s
            )
            channel.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            channel.settimeout(extra.timeout_s)
            channel.sendall(_RANK.pack(self._group.group_rank))
        except (RuntimeError, OSError, ValueError) as exc:
            raise AFDConnectionError(
                f"AFD gloo attention: no step channel from the FFN worker at {where}: {exc}"
            ) from exc
        return channel

    def _send_header(self, header: StepHeader) -> None:
        self._header = header  # leaves with the step's first layer

    def _send_layer(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: torch.Tensor | None
    ) -> None:
        out = torch.empty_like(hidden_states, memory_format=torch.contiguous_format)
        self._pending[layer_idx] = (out, self._group.post_recv(out, 0, _layer_tag(layer_idx)))
        header, self._header = self._header, None
        if header is not None:
            tensors = [hidden_states] if router_logits is None else [hidden_states, router_logits]
            message = b"".join([header.encode().numpy(), *(_as_bytes(t).numpy() for t in tensors)])
            try:
                self._steps.sendall(message)
            except OSError as exc:
                raise AFDConnectionError(
                    f"AFD gloo connector at {self._group.where}: step {header.step} failed "
                    f"(the FFN worker is gone): {exc}"
                ) from exc
            return
        self._group.wait(
            self._group.post_send(hidden_states, 0, _layer_tag(layer_idx)),
            f"send of layer {layer_idx}",
        )
        if router_logits is not None:
            logits = self._group.post_send(router_logits, 0, _layer_tag(layer_idx, logits=True))
            self._group.wait(logits, f"send of layer {layer_idx} logits")

    def _recv_layer(self, layer_idx: int, like: torch.Tensor) -> torch.Tensor:
        out, work = self._pending.pop(layer_idx)
        self._group.wait(work, f"receive of layer {layer_idx}")
        return out

    def close(self) -> None:
        self._steps.close()
        self._group.close()


class GlooFFNConnector(FFNConnector):
    """FFN side: group rank 0, serving the Attention peers of its group."""

    def __init__(self, host: str, group: Group, extra: GlooExtraConfig):
        self._group = _GlooGroup(host, group, 0, extra, "ffn")
        self.idle_timeout_s = extra.idle_timeout_s
        self.peers = list(range(1, group.size))
        self.headers: list[StepHeader] = []
        self._first_layer = False
        # a stop writes to this pair to wake a wait_step blocked in select()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._channels = self._accept_step_channels(host, extra)

    def _accept_step_channels(self, host: str, extra: GlooExtraConfig) -> list[socket.socket]:
        """One TCP connection per Attention peer, in peer order."""
        channels: dict[int, socket.socket] = {}
        with socket.create_server((host, 0)) as listener:
            self._group.publish_step_port(listener.getsockname()[1])
            listener.settimeout(extra.connect_timeout_s)
            try:
                while len(channels) < len(self.peers):
                    channel, _ = listener.accept()
                    channel.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    channel.settimeout(extra.timeout_s)
                    rank_bytes = bytearray(_RANK.size)
                    _read_into(channel, memoryview(rank_bytes))
                    (rank,) = _RANK.unpack(rank_bytes)
                    channels[rank] = channel
            except OSError as exc:
                raise AFDConnectionError(
                    f"AFD gloo ffn: Attention peers {sorted(set(self.peers) - set(channels))} did "
                    f"not open their step channel within {extra.connect_timeout_s:.0f} s: {exc}"
                ) from exc
        if sorted(channels) != self.peers:
            raise AFDConnectionError(
                f"AFD gloo ffn: step channels from ranks {sorted(channels)}, expected {self.peers}"
            )
        return [channels[peer] for peer in self.peers]

    def wait_step(self, stop: threading.Event) -> list[StepHeader] | None:
        deadline = time.monotonic() + self.idle_timeout_s
        headers = []
        for peer, channel in zip(self.peers, self._channels, strict=True):
            while True:
                ready, _, _ = select.select(
                    [channel, self._wake_reader], [], [], max(0.0, deadline - time.monotonic())
                )
                if stop.is_set():
                    return None
                if channel in ready:
                    break
                if not ready:
                    raise AFDConnectionError(
                        f"AFD gloo connector at {self._group.where}: no step from rank {peer} "
                        f"for {self.idle_timeout_s:.0f} s (idle_timeout_s)"
                    )
            values = StepHeader.empty()
            self._read(channel, values, f"step header from rank {peer}")
            headers.append(StepHeader.decode(values))
        self.headers = headers
        self._first_layer = True
        return headers

    def recv(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The step's first layer follows its header on the step channel; later ones come by gloo."""
        on_channel, self._first_layer = self._first_layer, False
        received: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        works = []
        for index, (peer, header) in enumerate(zip(self.peers, self.headers, strict=True)):
            hidden = torch.empty(header.num_tokens, header.hidden_size, dtype=header.dtype)
            logits = (
                torch.empty(header.num_tokens, header.logits_width, dtype=header.logits_dtype)
                if header.logits_width
                else None
            )
            received.append((hidden, logits))
            for tensor, logits_part in ((hidden, False), (logits, True)):
                if tensor is None:
                    continue
                if on_channel:
                    what = f"layer {layer_idx} from rank {peer}"
                    self._read(self._channels[index], tensor, what)
                else:
                    tag = _layer_tag(layer_idx, logits=logits_part)
                    works.append(self._group.post_recv(tensor, peer, tag))
        for work in works:
            self._group.wait(work, f"receive of layer {layer_idx}")
        hidden_all = [hidden for hidden, _ in received]
        logits_all = [logits for _, logits in received if logits is not None]
        merged_hidden = hidden_all[0] if len(hidden_all) == 1 else torch.cat(hidden_all)
        merged_logits = (
            (logits_all[0] if len(logits_all) == 1 else torch.cat(logits_all))
            if logits_all
            else None
        )
        return merged_hidden, merged_logits

    def _read(self, channel: socket.socket, out: torch.Tensor, what: str) -> None:
        try:
            _read_into(channel, memoryview(out.view(torch.uint8).numpy()))
        except OSError as exc:
            raise AFDConnectionError(
                f"AFD gloo connector at {self._group.where}: {what} failed: {exc}"
            ) from exc

    def send(self, layer_idx: int, output: torch.Tensor) -> None:
        group = self._group.group
        counts = {
            rank: h.num_tokens for rank, h in zip(group.attention_ranks, self.headers, strict=True)
        }
        works = [
            self._group.post_send(output[rows], peer, _layer_tag(layer_idx))
            for peer, rows in zip(self.peers, peer_slices(counts, group), strict=True)
        ]
        for work in works:
            self._group.wait(work, f"send of layer {layer_idx}")

    def interrupt(self) -> None:
        self._wake_writer.send(b"\0")

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        self._wake_reader.close()
        self._wake_writer.close()
        self._group.close()


def _read_into(channel: socket.socket, buffer: memoryview) -> None:
    """Fill ``buffer`` from ``channel``; a closed connection is an error, not a short read."""
    view = buffer.cast("B")
    filled = 0
    while filled < len(view):
        received = channel.recv_into(view[filled:])
        if not received:
            raise ConnectionError("the peer closed the connection")
        filled += received
