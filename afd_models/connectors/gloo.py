"""The gloo connector: CPU tensors over a process group formed between the two engines' workers.

One group per FFN rank (see :mod:`afd_models.topology`): the FFN worker is group rank 0 and hosts
the rendezvous store on ``host:port + ffn_rank``; its Attention peers connect to it. Either side
may start first: the store accepts the peers for ``connect_timeout_s``. The group is built with
vLLM's stateless gloo helper on a public ``TCPStore``, so it never touches either engine's own
torch.distributed world.

Connecting is a handshake before the group forms. Each Attention peer opens a plain TCP "step
channel" to the FFN worker (its port travels through the store) and sends its group rank and its
:class:`~afd_models.connectors.base.Fingerprint`. The FFN worker answers at once: accepted, or
refused with the reason (a field on which the engines differ, naming both values; a group rank
another peer already holds; a malformed fingerprint), and a refusal ends the connect on both
sides within ``timeout_s``. Once every peer is accepted the FFN worker tells them all to form the
gloo group; if it gives up first, it tells the peers it had accepted why. The group forms only
between engines that agree, so a mismatch never waits out ``connect_timeout_s``. A constructor
that fails closes whatever it had opened (store, sockets, process group) before it raises.

Per step each Attention peer sends a :class:`StepHeader`, followed by the step's first layer,
over its step channel. The FFN side waits for steps there, not in gloo, because a pending gloo
receive cannot be woken: only a socket wait lets a stop end the idle FFN loop, and it sees a
vanished peer at once. The first layer rides with the header because gloo moves data only once
the receiver has posted its receive, and the FFN side can post it only after reading the header:
by gloo that layer would take three hops instead of one. Every later layer goes over gloo, where
the FFN side has already posted its receive: hidden states (and router logits) as raw bytes,
tagged with the layer so that a mismatch in layer order times out loudly instead of mixing
layers; the FFN side answers each peer with its rows by gloo. Bytes round-trip every dtype bit for
bit. Every transfer waits at most ``timeout_s``; the FFN side waits for the next step up to
``idle_timeout_s``.
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
from afd_models.connectors.base import (
    AFDConnectionError,
    AFDConnector,
    FFNConnector,
    Fingerprint,
    StepHeader,
    compare_fingerprints,
    peer_counts,
)
from afd_models.log import get_logger
from afd_models.topology import Group, peer_slices

logger = get_logger(__name__)

#: store key under which the FFN worker publishes the port of its step-header listener
STEPS_KEY = "step-channel-port"
_RANK = struct.Struct("!q")
#: an FFN worker's answer on a step channel during the handshake: a kind, then a UTF-8 text
_ANSWER = struct.Struct("!cI")
#: the peer is accepted (no text)
ACCEPTED = b"A"
#: the peer is refused; the text says why
REFUSED = b"R"
#: every peer is accepted: form the gloo group (no text)
READY = b"G"
#: the FFN worker gave up after accepting this peer; the text says why
GAVE_UP = b"X"


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(torch.uint8)


def _layer_tag(layer_idx: int, logits: bool = False) -> int:
    return 2 * layer_idx + (1 if logits else 0)


def _answer(channel: socket.socket, kind: bytes, text: str = "") -> None:
    data = text.encode()
    channel.sendall(_ANSWER.pack(kind, len(data)) + data)


def _tell(channel: socket.socket, kind: bytes, text: str) -> None:
    """Best effort: a peer that is already gone cannot be told."""
    try:
        _answer(channel, kind, text)
    except OSError:
        pass


def _read_answer(channel: socket.socket) -> tuple[bytes, str]:
    head = bytearray(_ANSWER.size)
    read_into(channel, memoryview(head))
    kind, length = _ANSWER.unpack(head)
    if kind not in (ACCEPTED, REFUSED, READY, GAVE_UP) or length > Fingerprint.MAX_BYTES:
        raise AFDConnectionError(
            f"received a malformed handshake answer {bytes(head)!r} (is the FFN side an AFD "
            "connector of the same vllm-afd-overlay version?)"
        )
    text = bytearray(length)
    read_into(channel, memoryview(text))
    return kind, text.decode(errors="replace")


def _read_fingerprint(channel: socket.socket) -> Fingerprint:
    prefix = bytearray(Fingerprint.LENGTH.size)
    read_into(channel, memoryview(prefix))
    (length,) = Fingerprint.LENGTH.unpack(prefix)
    if length > Fingerprint.MAX_BYTES:  # not read: decode names the announced length
        return Fingerprint.decode(bytes(prefix))
    payload = bytearray(length)
    read_into(channel, memoryview(payload))
    return Fingerprint.decode(bytes(prefix + payload))


class _GlooGroup:
    """The rendezvous store and, once formed, the process group of one connector group; every
    transfer waits at most ``timeout_s``."""

    def __init__(self, host: str, group: Group, group_rank: int, extra: GlooExtraConfig, role: str):
        self.host = host
        self.where = f"{host}:{group.port}"
        self.group = group
        self.group_rank = group_rank
        self.role = role
        self.timeout = timedelta(seconds=extra.timeout_s)
        self.connect_timeout_s = extra.connect_timeout_s
        self.started = time.monotonic()
        self.pg: ProcessGroup | None = None
        logger.info(
            "AFD gloo %s: %s group %d at %s, waiting up to %.0f s for %d peer(s)",
            role,
            "hosting" if group_rank == 0 else "joining",
            group.ffn_rank,
            self.where,
            extra.connect_timeout_s,
            group.size - 1,
        )
        # Nobody waits for a worker count here: the engines agree on the group size only once
        # the handshake has compared their fingerprints.
        try:
            self.store: TCPStore | None = TCPStore(
                host,
                group.port,
                is_master=group_rank == 0,
                timeout=timedelta(seconds=extra.connect_timeout_s),
                wait_for_workers=False,
            )
        except (RuntimeError, OSError) as exc:
            raise self._no_group(exc) from None

    def _no_group(self, exc: BaseException) -> AFDConnectionError:
        return AFDConnectionError(
            f"AFD gloo {self.role}: no connector group at {self.where} within "
            f"{self.connect_timeout_s:.0f} s (is the other role running with the same host/port?): {exc}"
        )

    def form(self) -> None:
        """Form the process group (every member calls this once the handshake accepted them all)."""
        assert self.store is not None, "formed during construction only"
        try:
            self.pg = init_gloo_process_group(
                PrefixStore("afd", self.store), self.group_rank, self.group.size, self.timeout
            )
        except (RuntimeError, OSError) as exc:
            raise self._no_group(exc) from None
        logger.info(
            "AFD gloo %s: group %d at %s ready in %.1f s",
            self.role,
            self.group.ffn_rank,
            self.where,
            time.monotonic() - self.started,
        )

    def publish_step_port(self, port: int) -> None:
        """FFN side: tell the Attention peers where to send step headers."""
        assert self.store is not None, "published during construction only"
        self.store.set(STEPS_KEY, str(port))

    def step_port(self) -> int:
        """Attention side: the FFN worker's step-header port (waits up to ``connect_timeout_s``)."""
        assert self.store is not None, "looked up during construction only"
        try:
            return int(self.store.get(STEPS_KEY))
        except (RuntimeError, OSError) as exc:
            raise self._no_group(exc) from None

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
        """Abort pending transfers and release sockets and ports (the store's with its last
        reference); safe to call twice."""
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
    land as soon as the FFN side sends it. ``fingerprint`` describes this worker's engine (see
    :func:`afd_models.connectors.factory.fingerprint`); without one the connector presents a
    bare fingerprint, which only a bare FFN connector accepts (benchmarks, tests).
    """

    def __init__(
        self,
        host: str,
        group: Group,
        attention_rank: int,
        extra: GlooExtraConfig,
        fingerprint: Fingerprint | None = None,
    ):
        super().__init__()
        self._pending: dict[int, tuple[torch.Tensor, Work]] = {}
        self._header: StepHeader | None = None
        self._steps: socket.socket | None = None
        self.fingerprint = fingerprint or Fingerprint.bare(attention_rank)
        self._group = _GlooGroup(
            host, group, group.group_rank_of_attention(attention_rank), extra, "attention"
        )
        try:
            self._steps = self._connect_step_channel(extra)
            self._group.form()
        except BaseException:
            self.close()
            raise

    def _connect_step_channel(self, extra: GlooExtraConfig) -> socket.socket:
        """Open the step channel and pass the handshake; the channel is closed if either fails."""
        where, rank = self._group.where, self.fingerprint.role_rank
        port = self._group.step_port()
        try:
            channel = socket.create_connection((self._group.host, port), extra.connect_timeout_s)
        except OSError as exc:
            raise AFDConnectionError(
                f"AFD gloo attention: no step channel from the FFN worker at {where}: {exc}"
            ) from None
        try:
            channel.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            channel.settimeout(extra.timeout_s)
            channel.sendall(_RANK.pack(self._group.group_rank) + self.fingerprint.encode())
            kind, text = self._answer(channel, where, f"within {extra.timeout_s:.0f} s")
            if kind == REFUSED:
                raise AFDConnectionError(
                    f"AFD gloo attention: the FFN worker at {where} refused attention rank {rank}: {text}"
                )
            if kind != ACCEPTED:
                raise AFDConnectionError(
                    f"AFD gloo attention: the FFN worker at {where} answered {kind!r} to the "
                    "fingerprint, expected accepted or refused"
                )
            # accepted: wait for the other peers of the group, as long as connecting may take
            channel.settimeout(extra.connect_timeout_s)
            kind, text = self._answer(
                channel, where, f"(every peer of the group) within {extra.connect_timeout_s:.0f} s"
            )
            if kind != READY:
                raise AFDConnectionError(
                    f"AFD gloo attention: the FFN worker at {where} gave up before the group "
                    f"formed: {text or repr(kind)}"
                )
            channel.settimeout(extra.timeout_s)
        except BaseException:
            channel.close()
            raise
        return channel

    @staticmethod
    def _answer(channel: socket.socket, where: str, within: str) -> tuple[bytes, str]:
        try:
            return _read_answer(channel)
        except TimeoutError:
            raise AFDConnectionError(
                f"AFD gloo attention: the FFN worker at {where} did not answer the handshake "
                f"{within} (is it an AFD FFN worker of the same vllm-afd-overlay version?)"
            ) from None
        except OSError as exc:
            raise AFDConnectionError(
                f"AFD gloo attention: the FFN worker at {where} closed the step channel during "
                f"the handshake: {exc}"
            ) from None

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
                self._live_steps.sendall(message)
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

    @property
    def _live_steps(self) -> socket.socket:
        if self._steps is None:
            raise AFDConnectionError(f"AFD gloo connector at {self._group.where} is closed")
        return self._steps

    def _recv_layer(self, layer_idx: int, like: torch.Tensor) -> torch.Tensor:
        out, work = self._pending.pop(layer_idx)
        self._group.wait(work, f"receive of layer {layer_idx}")
        return out

    def close(self) -> None:
        if self._steps is not None:
            self._steps.close()
        self._group.close()


class GlooFFNConnector(FFNConnector):
    """FFN side: group rank 0, serving the Attention peers of its group.

    Each peer must present a fingerprint equal to ``fingerprint`` in every field but the role
    rank (a bare one when not given, as :class:`GlooAttentionConnector` presents).
    """

    def __init__(
        self,
        host: str,
        group: Group,
        extra: GlooExtraConfig,
        fingerprint: Fingerprint | None = None,
    ):
        self.group = group
        self.idle_timeout_s = extra.idle_timeout_s
        self.peers = list(range(1, group.size))
        self.headers: list[StepHeader] = []
        self._rows: list[slice] = []  # each peer's rows of the step's batch
        self.fingerprint = fingerprint or Fingerprint.bare(group.ffn_rank)
        self._first_layer = False
        self._channels: list[socket.socket] = []
        self._group = _GlooGroup(host, group, 0, extra, "ffn")
        try:
            # a stop writes to this pair to wake a wait_step blocked in select()
            self._wake_reader, self._wake_writer = socket.socketpair()
        except BaseException:
            self._group.close()
            raise
        try:
            self._channels = self._accept_step_channels(host, extra)
            self._group.form()
        except BaseException:
            self.close()
            raise

    def _accept_step_channels(self, host: str, extra: GlooExtraConfig) -> list[socket.socket]:
        """One TCP connection per Attention peer, in peer order, each past the handshake; on
        failure every channel is closed, and the peers accepted so far are told why."""
        channels: dict[int, socket.socket] = {}
        try:
            with socket.create_server((host, 0)) as listener:
                self._group.publish_step_port(listener.getsockname()[1])
                listener.settimeout(extra.connect_timeout_s)
                while len(channels) < len(self.peers):
                    try:
                        channel, _ = listener.accept()
                    except OSError as exc:
                        raise AFDConnectionError(
                            f"AFD gloo ffn: Attention peers {sorted(set(self.peers) - set(channels))} did "
                            f"not open their step channel within {extra.connect_timeout_s:.0f} s: {exc}"
                        ) from None
                    try:
                        rank = self._admit(channel, channels, extra)
                    except BaseException:
                        channel.close()
                        raise
                    channels[rank] = channel
            for rank, channel in channels.items():
                try:
                    _answer(channel, READY)
                except OSError as exc:
                    raise AFDConnectionError(
                        f"AFD gloo ffn: the Attention peer of group rank {rank} at "
                        f"{self._group.where} left before the group formed: {exc}"
                    ) from None
        except BaseException as exc:
            for channel in channels.values():
                _tell(channel, GAVE_UP, str(exc) or type(exc).__name__)
                channel.close()
            raise
        return [channels[peer] for peer in self.peers]

    def _admit(
        self, channel: socket.socket, channels: dict[int, socket.socket], extra: GlooExtraConfig
    ) -> int:
        """Read a peer's group rank and fingerprint and accept it, or refuse it (telling it why)
        and raise."""
        where = self._group.where
        channel.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        channel.settimeout(extra.timeout_s)
        rank_bytes = bytearray(_RANK.size)
        try:
            read_into(channel, memoryview(rank_bytes))
            (rank,) = _RANK.unpack(rank_bytes)
            theirs = _read_fingerprint(channel)
        except AFDConnectionError as exc:  # malformed: say so to the peer too
            _tell(channel, REFUSED, str(exc))
            raise AFDConnectionError(
                f"AFD gloo ffn: a peer of group {self._group.group.ffn_rank} at {where}: {exc}"
            ) from None
        except TimeoutError:
            raise AFDConnectionError(
                f"AFD gloo ffn: a peer at {where} sent no group rank and fingerprint within "
                f"{extra.timeout_s:.0f} s (an AFD version without the connect handshake, or not an AFD peer?)"
            ) from None
        except OSError as exc:
            raise AFDConnectionError(
                f"AFD gloo ffn: a peer at {where} left during the handshake: {exc}"
            ) from None
        reason = self._refusal(rank, theirs, channels)
        if reason is not None:
            _tell(channel, REFUSED, reason)
            raise AFDConnectionError(
                f"AFD gloo ffn: refused attention rank {theirs.role_rank} at {where}: {reason}"
            )
        try:
            _answer(channel, ACCEPTED)
        except OSError as exc:
            raise AFDConnectionError(
                f"AFD gloo ffn: attention rank {theirs.role_rank} left during the handshake at {where}: {exc}"
            ) from None
        return rank

    def _refusal(
        self, rank: int, theirs: Fingerprint, channels: dict[int, socket.socket]
    ) -> str | None:
        """Why a peer with group rank ``rank`` and fingerprint ``theirs`` cannot join, or None."""
        mismatches = compare_fingerprints(theirs, self.fingerprint)
        if mismatches:
            return "; ".join(mismatches)
        group = self._group.group
        if theirs.role_rank not in group.attention_ranks:
            return (
                f"attention rank {theirs.role_rank} is not served by the FFN rank {group.ffn_rank} "
                f"(it serves attention ranks {list(group.attention_ranks)})"
            )
        if rank != group.group_rank_of_attention(theirs.role_rank):
            return (
                f"attention rank {theirs.role_rank} claims group rank {rank}, but its group rank "
                f"is {group.group_rank_of_attention(theirs.role_rank)}"
            )
        if rank in channels:
            return (
                f"attention rank {theirs.role_rank} is already connected: two Attention workers "
                "claim the same rank (give each Attention engine its own ranks)"
            )
        return None

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
        self._rows = peer_slices(peer_counts(self.group, headers), self.group)
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
            read_into(channel, memoryview(out.view(torch.uint8).numpy()))
        except OSError as exc:
            raise AFDConnectionError(
                f"AFD gloo connector at {self._group.where}: {what} failed: {exc}"
            ) from exc

    def send(self, layer_idx: int, output: torch.Tensor) -> None:
        works = [
            self._group.post_send(output[rows], peer, _layer_tag(layer_idx))
            for peer, rows in zip(self.peers, self._rows, strict=True)
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


def read_into(channel: socket.socket, buffer: memoryview) -> None:
    """Fill ``buffer`` from ``channel``; a closed connection is an error, not a short read."""
    view = buffer.cast("B")
    filled = 0
    while filled < len(view):
        received = channel.recv_into(view[filled:])
        if not received:
            raise ConnectionError("the peer closed the connection")
        filled += received
