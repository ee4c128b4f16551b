"""The point-to-point connector protocol, over one of two data planes (gloo for CPU tensors,
NCCL for CUDA tensors; :mod:`afd_models.connectors.gloo`, :mod:`afd_models.connectors.nccl`).

One group per FFN rank and TP lane (see :mod:`afd_models.topology`): the FFN worker is group rank
0 and hosts the rendezvous store on its group's port; its Attention peers connect to it. Either
side may start first: the store accepts the peers for ``connect_timeout_s``. The store is a public
``TCPStore`` of this group's own, so nothing touches either engine's torch.distributed world.

The control plane stays on the CPU whatever the data plane. Connecting is a handshake before the
data plane forms. Each Attention peer opens a plain TCP "step channel" to the FFN worker (its port
travels through the store) and sends its group rank and its
:class:`~afd_models.connectors.base.Fingerprint`. The FFN worker answers at once: accepted, or
refused with the reason (a field on which the engines differ, naming both values; a group rank
another peer already holds; a malformed fingerprint), and a refusal ends the connect on both
sides within ``timeout_s``. Once every peer is accepted the FFN worker tells them all to form the
data plane; if it gives up first, it tells the peers it had accepted why. The data plane forms
only between engines that agree, so a mismatch never waits out ``connect_timeout_s``. A
constructor that fails closes whatever it had opened (store, sockets, data plane) before it raises.

Per step each Attention peer sends a :class:`StepHeader` over its step channel. The FFN side
waits for steps there, not in the data plane, because a pending gloo or NCCL receive cannot be
woken: only a socket wait lets a stop end the idle FFN loop, and it sees a vanished peer at once.
Each layer then crosses the data plane: hidden states (and router logits) from every peer, the
FFN output back to each peer, as one batch of transfers per side and layer
(:meth:`DataPlane.start`), in the same order on both sides, so that NCCL (which matches transfers
by order) and gloo (which matches them by tag) pair them alike. A data plane that moves CPU
tensors may carry the step's first layer on the step channel with its header
(:attr:`DataPlane.first_layer_on_step_channel`): gloo moves data only once the receiver has posted
its receive, and the FFN side can post it only after reading the header, so by gloo that layer
would take three hops instead of one. Bytes round-trip every dtype bit for bit. Every host wait
lasts at most ``timeout_s``; the FFN side waits for the next step up to ``idle_timeout_s``.
Transfers that wait on the device (NCCL inside a graph replay) are beyond any host timeout, so
there the Attention side watches its step channel and aborts the data plane when the FFN worker
leaves (:class:`_PeerWatchdog`).

A CUDA graph captures a step's transfers, not its header: at each replay the header alone goes
out first (``graph`` set; :meth:`~afd_models.connectors.base.AFDConnector.announce_graph_step`),
then the replay runs the transfers. Only a data plane whose transfers a graph can record (NCCL)
serves graphs.
"""

from __future__ import annotations

import dataclasses
import select
import socket
import struct
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch.distributed import Store, TCPStore

from afd_models.config import P2PExtraConfig
from afd_models.connectors.base import (
    AFDConnectionError,
    AFDConnector,
    AFDPeerGoneError,
    FFNConnector,
    Fingerprint,
    StepHeader,
    compare_fingerprints,
    peers_with,
)
from afd_models.log import get_logger
from afd_models.metrics import PeerMetrics, tensor_bytes
from afd_models.topology import Group

logger = get_logger(__name__)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(torch.uint8)


#: store key under which the FFN worker publishes the port of its step-header listener
STEPS_KEY = "step-channel-port"
#: seconds between two "still waiting" lines while a rendezvous waits for the other role
PROGRESS_EVERY_S = 30.0
#: seconds between two probes of the FFN worker's store while the Attention side waits for it,
#: and the longest the FFN side waits in one accept before it looks at its stop event again
PROBE_EVERY_S = 0.5
_RANK = struct.Struct("!q")
#: an FFN worker's answer on a step channel during the handshake: a kind, then a UTF-8 text
_ANSWER = struct.Struct("!cI")
#: the peer is accepted (no text)
ACCEPTED = b"A"
#: the peer is refused; the text says why
REFUSED = b"R"
#: every peer is accepted: form the data plane (no text)
READY = b"G"
#: the FFN worker gave up after accepting this peer; the text says why
GAVE_UP = b"X"


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


@dataclass(frozen=True)
class Transfer:
    """One point-to-point transfer of a data plane: ``tensor`` to (``send``) or into group rank
    ``peer``."""

    send: bool
    tensor: torch.Tensor
    peer: int
    #: what the transfer carries (:func:`layer_tag`): gloo matches transfers by it, NCCL by order
    tag: int


def layer_tag(layer_idx: int, logits: bool = False, ubatch: int = 0) -> int:
    return 4 * layer_idx + 2 * ubatch + (1 if logits else 0)


#: waits until a batch of transfers is done (raising :class:`AFDConnectionError` past the timeout)
Wait = Callable[[], None]


class DataPlane(ABC):
    """Moves a layer's tensors between the members of one connector group.

    The connector calls :meth:`form` once every peer passed the handshake, then :meth:`start` once
    per side and layer with the layer's transfers, in the same order on both sides.
    """

    #: names the plane in messages (``AFD gloo ffn: ...``)
    name = "?"
    #: whether a step's first layer may ride on the step channel with its header (CPU tensors only)
    first_layer_on_step_channel = False
    #: whether transfers wait on the device, where no host timeout reaches them (a CUDA-graph
    #: replay): the Attention side then watches its step channel for the FFN worker leaving
    waits_on_device = False

    def __init__(self, device: torch.device, timeout_s: float):
        #: where this plane's tensors live (buffers it receives into are allocated there)
        self.device = device
        self.timeout_s = timeout_s
        #: ``host:port`` of the group, for messages
        self.where = "?"

    @abstractmethod
    def form(self, store: Store, group_rank: int, size: int) -> None:
        """Join the group (every member calls this together, after the handshake)."""

    @abstractmethod
    def start(self, transfers: Sequence[Transfer], what: str) -> Wait:
        """Start ``transfers`` as one batch; the returned callable waits for all of them."""

    @abstractmethod
    def close(self) -> None:
        """Abort pending transfers and release the plane; safe to call twice."""


class _Rendezvous:
    """The group's store (hosted by the FFN worker) and its data plane."""

    def __init__(
        self,
        host: str,
        group: Group,
        group_rank: int,
        extra: P2PExtraConfig,
        role: str,
        plane: DataPlane,
        progress_every_s: float,
    ):
        self.host = host
        self.progress_every_s = progress_every_s
        self.where = f"{host}:{group.port}"
        self.group = group
        self.group_rank = group_rank
        self.role = role
        self.plane = plane
        plane.where = self.where
        self.connect_timeout_s = extra.connect_timeout_s
        self.started = time.monotonic()
        self.formed = False
        #: how messages of this side begin: ``AFD gloo attention``
        self.prefix = f"AFD {plane.name} {role}"
        logger.info(
            "%s: %s group %d at %s, waiting up to %.0f s for %d peer(s)",
            self.prefix,
            "hosting" if group_rank == 0 else "joining",
            group.ffn_rank,
            self.where,
            extra.connect_timeout_s,
            group.size - 1,
        )
        self.store: TCPStore | None = self._open_store()

    def _open_store(self) -> TCPStore:
        """Host the group's store (FFN), or connect to it (Attention) within the connect timeout;
        either way its operations then wait up to the connect timeout."""
        hosting = self.group_rank == 0
        timeout_s = self.connect_timeout_s
        if not hosting:
            self._wait_for_host()
            timeout_s = self.remaining_s()
        # Nobody waits for a worker count here: the engines agree on the group size only once
        # the handshake has compared their fingerprints.
        try:
            store = TCPStore(
                self.host,
                self.group.port,
                is_master=hosting,
                timeout=timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
        except (RuntimeError, OSError) as exc:
            raise self._no_group(exc) from None
        store.set_timeout(timedelta(seconds=self.remaining_s()))
        return store

    def remaining_s(self) -> float:
        """What is left of the connect timeout, at least a second to finish a step of it."""
        return max(self.started + self.connect_timeout_s - time.monotonic(), 1.0)

    def _wait_for_host(self) -> None:
        """Attention side: wait until the FFN worker's store accepts connections (it hosts the
        store once its model is loaded), saying every ``progress_every_s`` whom it waits for.
        Plain probes: a ``TCPStore`` client that gives up logs a C++ stack trace.

        Raises:
            AFDConnectionError: nothing accepted within the connect timeout.
        """
        deadline = self.started + self.connect_timeout_s
        report = self.started + self.progress_every_s
        while True:
            # each probe at most one progress interval, so a network that drops packets (a
            # firewall) still gets its progress lines
            wait_s = min(max(deadline - time.monotonic(), 0.01), self.progress_every_s)
            last = _probe(self.host, self.group.port, wait_s)
            if last is None:
                return
            if time.monotonic() >= deadline:
                raise self._no_group(last)
            if time.monotonic() >= report:
                report += self.progress_every_s
                logger.info(
                    "%s: still waiting for FFN rank %d to host group %d at %s (it does once its "
                    "model is loaded), %.0f s of %.0f s; last try: %s",
                    self.prefix,
                    self.group.ffn_rank,
                    self.group.ffn_rank,
                    self.where,
                    time.monotonic() - self.started,
                    self.connect_timeout_s,
                    last,
                )
            time.sleep(max(min(PROBE_EVERY_S, deadline - time.monotonic()), 0.0))

    def _no_group(self, exc: BaseException | str) -> AFDConnectionError:
        return AFDConnectionError(
            f"{self.prefix}: no connector group at {self.where} within "
            f"{self.connect_timeout_s:.0f} s (is the other role running with the same host/port?): {exc}"
        )

    def form(self) -> None:
        """Form the data plane (every member calls this once the handshake accepted them all)."""
        assert self.store is not None, "formed during construction only"
        try:
            self.plane.form(self.store, self.group_rank, self.group.size)
        except AFDConnectionError:
            raise
        except (RuntimeError, OSError) as exc:
            raise AFDConnectionError(
                f"{self.prefix}: the {self.plane.name} data plane of group {self.group.ffn_rank} "
                f"at {self.where} did not form after the handshake: {exc}"
            ) from None
        self.formed = True
        logger.info(
            "%s: group %d at %s ready in %.1f s",
            self.prefix,
            self.group.ffn_rank,
            self.where,
            time.monotonic() - self.started,
        )

    def publish_step_port(self, port: int) -> None:
        """FFN side: tell the Attention peers where to send step headers."""
        assert self.store is not None, "published during construction only"
        self.store.set(STEPS_KEY, str(port))

    def step_port(self) -> int:
        """Attention side: the FFN worker's step-header port (waits for what is left of
        ``connect_timeout_s``)."""
        assert self.store is not None, "looked up during construction only"
        try:
            return int(self.store.get(STEPS_KEY))
        except (RuntimeError, OSError) as exc:
            raise self._no_group(exc) from None

    def start(self, transfers: Sequence[Transfer], what: str) -> Wait:
        if not self.formed:
            raise AFDConnectionError(f"AFD {self.plane.name} connector at {self.where} is closed")
        return self.plane.start(transfers, what)

    def close(self) -> None:
        """Abort pending transfers and release sockets and ports (the store's with its last
        reference); safe to call twice."""
        self.formed = False
        self.plane.close()
        self.store = None


class P2PAttentionConnector(AFDConnector):
    """Attention side: one worker, talking to the FFN rank of its group (group rank 0) over
    ``plane``.

    ``fingerprint`` describes this worker's engine (see
    :func:`afd_models.connectors.factory.fingerprint`); without one the connector presents a bare
    fingerprint, which only a bare FFN connector accepts (benchmarks, tests).
    """

    #: seconds between two "still waiting" lines while connecting (PROGRESS_EVERY_S)
    progress_every_s = PROGRESS_EVERY_S

    def __init__(
        self,
        host: str,
        group: Group,
        attention_rank: int,
        extra: P2PExtraConfig,
        fingerprint: Fingerprint | None = None,
        *,
        plane: DataPlane,
        on_peer_gone: Callable[[BaseException], None] | None = None,
    ):
        super().__init__()
        #: transfers in flight by (micro-batch, layer): the output buffer (None until a split
        #: step's receive is posted) and the wait
        self._pending: dict[tuple[int, int], tuple[torch.Tensor | None, Wait]] = {}
        self._header: StepHeader | None = None
        self._steps: socket.socket | None = None
        self._watchdog: _PeerWatchdog | None = None
        self.fingerprint = fingerprint or Fingerprint.bare(attention_rank)
        self._host, self._extra, self._on_peer_gone = host, extra, on_peer_gone
        self._group = self._connect(group, plane, extra)
        try:
            self.metrics = PeerMetrics(
                "attention", attention_rank, group.lane, f"ffn{group.ffn_rank}"
            )
            self.metrics.connected(True)
        except BaseException:
            self.close()
            raise

    def _connect(self, group: Group, plane: DataPlane, extra: P2PExtraConfig) -> _Rendezvous:
        """Join the group's rendezvous, pass the handshake and form the data plane (within
        ``extra.connect_timeout_s``); whatever was opened is closed if any of it fails."""
        rendezvous = _Rendezvous(
            self._host,
            group,
            group.group_rank_of_attention(self.fingerprint.role_rank),
            extra,
            "attention",
            plane,
            self.progress_every_s,
        )
        self._group, self._prefix = rendezvous, rendezvous.prefix
        try:
            self._steps = self._connect_step_channel(extra)
            rendezvous.form()
            if plane.waits_on_device:
                self._watchdog = _PeerWatchdog(self._steps, rendezvous, self._on_peer_gone)
        except BaseException:
            self.close()
            raise
        return rendezvous

    def reconnect(self, connect_timeout_s: float) -> None:
        """Close the connection to a vanished FFN worker and connect again to whichever FFN
        worker hosts the group next (a restarted one), waiting up to ``connect_timeout_s``; an
        FFN worker that leaves during the handshake is tried again within that time. The step in
        progress is dropped: the caller runs its forward again from the first layer.

        Raises:
            AFDConnectionError: no FFN worker passed the handshake within ``connect_timeout_s``,
                or one refused this worker.
        """
        deadline = time.monotonic() + connect_timeout_s
        self.close()
        self._watchdog = None
        self._pending.clear()
        self._header = None
        self._reset_steps()
        group, plane = self._group.group, self._group.plane
        while True:
            left_s = max(deadline - time.monotonic(), 0.01)
            try:
                self._connect(
                    group, plane, dataclasses.replace(self._extra, connect_timeout_s=left_s)
                )
                break
            except AFDPeerGoneError as exc:  # a leaving FFN worker's store answered
                if time.monotonic() + PROBE_EVERY_S >= deadline:
                    raise
                logger.info("%s: %s; trying again", self._prefix, exc)
            time.sleep(PROBE_EVERY_S)
        if self.metrics is not None:
            self.metrics.reconnected()

    def ffn_is_hosting(self) -> bool:
        """Whether an FFN worker hosts this connector's group now (one probe of its store)."""
        return _probe(self._group.host, self._group.group.port, PROBE_EVERY_S) is None

    def _connect_step_channel(self, extra: P2PExtraConfig) -> socket.socket:
        """Open the step channel and pass the handshake; the channel is closed if either fails."""
        where, rank = self._group.where, self.fingerprint.role_rank
        port = self._group.step_port()
        try:
            channel = socket.create_connection((self._group.host, port), self._group.remaining_s())
        except OSError as exc:  # a store whose FFN worker is leaving
            raise AFDPeerGoneError(
                f"{self._prefix}: no step channel from the FFN worker at {where}: {exc}"
            ) from None
        try:
            channel.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            channel.settimeout(extra.timeout_s)
            try:
                channel.sendall(_RANK.pack(self._group.group_rank) + self.fingerprint.encode())
            except OSError as exc:
                raise AFDPeerGoneError(
                    f"{self._prefix}: the FFN worker at {where} closed the step channel before "
                    f"the handshake: {exc}"
                ) from None
            kind, text = self._answer(channel, where, f"within {extra.timeout_s:.0f} s")
            if kind == REFUSED:
                raise AFDConnectionError(
                    f"{self._prefix}: the FFN worker at {where} refused attention rank {rank}: {text}"
                )
            if kind != ACCEPTED:
                raise AFDConnectionError(
                    f"{self._prefix}: the FFN worker at {where} answered {kind!r} to the "
                    "fingerprint, expected accepted or refused"
                )
            # accepted: wait for the other peers of the group, as long as connecting may take
            others = [r for r in self._group.group.attention_ranks if r != rank]
            if others:
                logger.info(
                    "%s: accepted by the FFN worker at %s; waiting for the group's other "
                    "attention ranks %s (the FFN worker reports them)",
                    self._prefix,
                    where,
                    others,
                )
            channel.settimeout(self._group.remaining_s())
            kind, text = self._answer(
                channel, where, f"(every peer of the group) within {extra.connect_timeout_s:.0f} s"
            )
            if kind != READY:
                raise AFDConnectionError(
                    f"{self._prefix}: the FFN worker at {where} gave up before the group "
                    f"formed: {text or repr(kind)}"
                )
            channel.settimeout(extra.timeout_s)
        except BaseException:
            channel.close()
            raise
        return channel

    def _answer(self, channel: socket.socket, where: str, within: str) -> tuple[bytes, str]:
        try:
            return _read_answer(channel)
        except TimeoutError:
            raise AFDConnectionError(
                f"{self._prefix}: the FFN worker at {where} did not answer the handshake "
                f"{within} (is it an AFD FFN worker of the same vllm-afd-overlay version?)"
            ) from None
        except OSError as exc:
            raise AFDPeerGoneError(
                f"{self._prefix}: the FFN worker at {where} closed the step channel during "
                f"the handshake: {exc}"
            ) from None

    def _send_header(self, header: StepHeader) -> None:
        if self._group.plane.first_layer_on_step_channel and not header.ubatch_tokens:
            self._header = header  # leaves with the step's first layer
        else:
            self._write_step(header, [])

    def _write_step(self, header: StepHeader, tensors: list[torch.Tensor]) -> None:
        try:
            self._live_steps.sendall(
                b"".join([header.encode().numpy(), *(as_bytes(t).numpy() for t in tensors)])
            )
        except OSError as exc:
            raise AFDPeerGoneError(
                f"AFD {self._group.plane.name} connector at {self._group.where}: step "
                f"{header.step} failed (the FFN worker is gone): {exc}"
            ) from exc

    def _send_layer(
        self,
        layer_idx: int,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor | None,
        ubatch: int,
    ) -> None:
        header, self._header = self._header, None
        tensors = [hidden_states] if router_logits is None else [hidden_states, router_logits]
        if header is not None:
            self._write_step(header, tensors)
        sends = [
            Transfer(True, tensor, 0, layer_tag(layer_idx, index == 1, ubatch))
            for index, tensor in enumerate([] if header is not None else tensors)
        ]
        what = f"exchange of layer {layer_idx}{_of(ubatch)}"
        if self.is_split:
            # the receive is posted after the other micro-batch's send (see _recv_layer): on
            # the device it would hold up everything queued behind it until the FFN answers
            self._pending[(ubatch, layer_idx)] = (None, self._group.start(sends, what))
            return
        out = torch.empty_like(hidden_states, memory_format=torch.contiguous_format)
        # the receive first: gloo can land the answer as soon as the FFN side sends it
        receive = Transfer(False, out, 0, layer_tag(layer_idx))
        self._pending[(0, layer_idx)] = (out, self._group.start([receive, *sends], what))

    @property
    def _live_steps(self) -> socket.socket:
        if self._steps is None:
            # closed: its FFN worker went away (or the runner shut down, and no step follows)
            raise AFDPeerGoneError(
                f"AFD {self._group.plane.name} connector at {self._group.where} is closed "
                "(no FFN worker is connected)"
            )
        return self._steps

    def _recv_layer(self, layer_idx: int, like: torch.Tensor, ubatch: int) -> torch.Tensor:
        out, wait = self._pending.pop((ubatch, layer_idx))
        if out is None:  # a split step's receive, posted now
            out = torch.empty_like(like, memory_format=torch.contiguous_format)
            receive = Transfer(False, out, 0, layer_tag(layer_idx, ubatch=ubatch))
            sent, wait = (
                wait,
                self._group.start([receive], f"receive of layer {layer_idx}{_of(ubatch)}"),
            )
            sent()
        wait()
        return out

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._steps is not None:
            self._steps.close()
            self._steps = None
        self._group.close()
        if self.metrics is not None:
            self.metrics.connected(False)


def _probe(host: str, port: int, timeout_s: float) -> str | None:
    """None when something accepts connections at ``host:port`` within ``timeout_s``, else why
    not. A plain TCP probe: a ``TCPStore`` client that gives up logs a C++ stack trace."""
    try:
        with socket.create_connection((host, port), timeout_s):
            return None
    except OSError as exc:
        return str(exc)  # the text only: the error's frames would keep its socket alive


class _PeerWatchdog:
    """Watches an Attention worker's step channel, on which the FFN worker never writes after the
    handshake: end of stream (or anything else) means it left. Transfers that wait on the device
    (a CUDA-graph replay) would then wait forever, so the watchdog closes the data plane (an
    NCCL abort ends them) and calls ``on_peer_gone``."""

    def __init__(
        self,
        channel: socket.socket,
        group: _Rendezvous,
        on_peer_gone: Callable[[BaseException], None] | None,
    ):
        self._channel = channel
        self._group = group
        self._on_peer_gone = on_peer_gone
        self._stop = threading.Event()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._thread = threading.Thread(target=self._watch, name="AFD-peer-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        ready, _, _ = select.select([self._channel, self._wake_reader], [], [])
        if self._stop.is_set() or self._channel not in ready:
            return
        error = AFDConnectionError(
            f"{self._group.prefix}: the FFN worker at {self._group.where} closed the step channel "
            f"(it is gone); the {self._group.plane.name} data plane is aborted"
        )
        logger.critical("%s", error)
        self._group.plane.close()
        if self._on_peer_gone is not None:
            self._on_peer_gone(error)

    def stop(self) -> None:
        self._stop.set()
        self._wake_writer.send(b"\0")
        self._thread.join(5)
        self._wake_reader.close()
        self._wake_writer.close()


class P2PFFNConnector(FFNConnector):
    """FFN side: group rank 0, serving the Attention peers of its group over ``plane``.

    Each peer must present a fingerprint equal to ``fingerprint`` in every field but the role
    rank (a bare one when not given, as :class:`P2PAttentionConnector` presents).
    """

    #: seconds between two "still waiting" lines while connecting (PROGRESS_EVERY_S)
    progress_every_s = PROGRESS_EVERY_S

    def __init__(
        self,
        host: str,
        group: Group,
        extra: P2PExtraConfig,
        fingerprint: Fingerprint | None = None,
        *,
        plane: DataPlane,
        stop: threading.Event | None = None,
    ):
        self.group = group
        self.idle_timeout_s = extra.idle_timeout_s
        self.peers = list(range(1, group.size))
        self.headers: list[StepHeader] = []
        #: receives posted by start_recv, by (layer, micro-batch): each peer's buffers by position
        self._incoming: dict[tuple[int, int], dict[int, list[torch.Tensor]]] = {}
        self.fingerprint = fingerprint or Fingerprint.bare(group.ffn_rank)
        #: positions of the peers whose next layer rides behind their header (its first layer)
        self._on_channel: set[int] = set()
        self._channels: list[socket.socket] = []
        #: the Prometheus series of each peer, in peer order, once all of them are connected
        self.metrics: list[PeerMetrics] = []
        self._group = _Rendezvous(host, group, 0, extra, "ffn", plane, self.progress_every_s)
        self._prefix = self._group.prefix
        self._connector = f"AFD {plane.name} connector at {self._group.where}"
        try:
            # a stop writes to this pair to wake a wait_step blocked in select()
            self._wake_reader, self._wake_writer = socket.socketpair()
        except BaseException:
            self._group.close()
            raise
        try:
            self._channels = self._accept_step_channels(host, extra, stop)
            self._group.form()
            self.metrics = [
                PeerMetrics("ffn", group.ffn_rank, group.lane, f"attention{r}")
                for r in group.attention_ranks
            ]
            for metrics in self.metrics:
                metrics.connected(True)
        except BaseException:
            self.close()
            raise

    def _accept_step_channels(
        self, host: str, extra: P2PExtraConfig, stop: threading.Event | None
    ) -> list[socket.socket]:
        """One TCP connection per Attention peer, in peer order, each past the handshake; on
        failure (or once ``stop`` is set) every channel is closed, and the peers accepted so far
        are told why."""
        channels: dict[int, socket.socket] = {}
        # one connect timeout for the whole rendezvous, as the progress lines count it
        deadline = self._group.started + extra.connect_timeout_s
        report = self._group.started + self.progress_every_s
        try:
            with socket.create_server((host, 0)) as listener:
                self._group.publish_step_port(listener.getsockname()[1])
                while len(channels) < len(self.peers):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise AFDConnectionError(
                            f"{self._prefix}: attention ranks {self._missing(channels)} did not "
                            f"open their step channel within {extra.connect_timeout_s:.0f} s"
                        )
                    if stop is not None and stop.is_set():
                        raise AFDConnectionError(
                            f"{self._prefix}: stopped while waiting for attention ranks "
                            f"{self._missing(channels)}"
                        )
                    # short slices: a stop is seen within one, progress is said every interval
                    listener.settimeout(min(remaining, PROBE_EVERY_S))
                    try:
                        channel, _ = listener.accept()
                    except TimeoutError:
                        if time.monotonic() >= report:
                            report += self.progress_every_s
                            self._still_waiting(channels, extra)
                        continue
                    except OSError as exc:
                        raise AFDConnectionError(
                            f"{self._prefix}: the step-channel listener at {self._group.where} "
                            f"failed while attention ranks {self._missing(channels)} had not "
                            f"connected: {exc}"
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
                        f"{self._prefix}: the Attention peer of group rank {rank} at "
                        f"{self._group.where} left before the group formed: {exc}"
                    ) from None
        except BaseException as exc:
            for channel in channels.values():
                _tell(channel, GAVE_UP, str(exc) or type(exc).__name__)
                channel.close()
            raise
        return [channels[peer] for peer in self.peers]

    def _missing(self, channels: dict[int, socket.socket]) -> list[int]:
        """The attention ranks of the peers not yet admitted."""
        return [self.group.attention_ranks[rank - 1] for rank in self.peers if rank not in channels]

    def _still_waiting(self, channels: dict[int, socket.socket], extra: P2PExtraConfig) -> None:
        missing = self._missing(channels)
        admitted = [r for r in self.group.attention_ranks if r not in missing]
        logger.info(
            "%s: group %d at %s still waiting for attention ranks %s (admitted: %s), %.0f s of %.0f s",
            self._prefix,
            self.group.ffn_rank,
            self._group.where,
            missing,
            admitted or "none",
            time.monotonic() - self._group.started,
            extra.connect_timeout_s,
        )

    def _admit(
        self, channel: socket.socket, channels: dict[int, socket.socket], extra: P2PExtraConfig
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
                f"{self._prefix}: a peer of group {self._group.group.ffn_rank} at {where}: {exc}"
            ) from None
        except TimeoutError:
            raise AFDConnectionError(
                f"{self._prefix}: a peer at {where} sent no group rank and fingerprint within "
                f"{extra.timeout_s:.0f} s (an AFD version without the connect handshake, or not an AFD peer?)"
            ) from None
        except OSError as exc:
            raise AFDConnectionError(
                f"{self._prefix}: a peer at {where} left during the handshake: {exc}"
            ) from None
        reason = self._refusal(rank, theirs, channels)
        if reason is not None:
            _tell(channel, REFUSED, reason)
            raise AFDConnectionError(
                f"{self._prefix}: refused attention rank {theirs.role_rank} at {where}: {reason}"
            )
        try:
            _answer(channel, ACCEPTED)
        except OSError as exc:
            raise AFDConnectionError(
                f"{self._prefix}: attention rank {theirs.role_rank} left during the handshake at {where}: {exc}"
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
                        f"{self._connector}: no step from rank {peer} "
                        f"for {self.idle_timeout_s:.0f} s (idle_timeout_s)"
                    )
            values = StepHeader.empty()
            self._read(channel, values, f"step header from rank {peer}")
            headers.append(StepHeader.decode(values))
        for metrics, header in zip(self.metrics, headers, strict=True):
            metrics.step(header.num_tokens)
        self.headers = headers
        self._incoming.clear()
        # a split step's header leaves alone (the Attention side sends none of its layers with it)
        self._on_channel = (
            {index for index, header in enumerate(headers) if not header.ubatch_tokens}
            if self._group.plane.first_layer_on_step_channel
            else set()
        )
        return headers

    def start_recv(self, layer_idx: int, ubatch: int, peers: Sequence[int]) -> Wait:
        """Post the receives of ``layer_idx``'s micro-batch ``ubatch`` from ``peers`` (positions
        in peer order): by the data plane, or for the step's first layer on a plane that allows
        it, from the step channel behind the header."""
        plane = self._group.plane
        parts = self._incoming.setdefault((layer_idx, ubatch), {})
        transfers = []
        for index in peers:
            peer, header = self.peers[index], self.headers[index]
            rows = header.ubatches[ubatch]
            tensors = [
                torch.empty(rows, header.hidden_size, dtype=header.dtype, device=plane.device)
            ]
            if header.logits_width:
                tensors.append(
                    torch.empty(
                        rows, header.logits_width, dtype=header.logits_dtype, device=plane.device
                    )
                )
            parts[index] = tensors
            on_channel = index in self._on_channel
            self._on_channel.discard(index)
            for part, tensor in enumerate(tensors):
                if on_channel:
                    self._read(self._channels[index], tensor, f"layer {layer_idx} from rank {peer}")
                else:
                    tag = layer_tag(layer_idx, part == 1, ubatch)
                    transfers.append(Transfer(False, tensor, peer, tag))
        if not transfers:
            return lambda: None
        return self._group.start(transfers, f"receive of layer {layer_idx}{_of(ubatch)}")

    def received(self, layer_idx: int, ubatch: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        parts = self._incoming.pop((layer_idx, ubatch))
        for index, tensors in parts.items():
            self.metrics[index].received(tensor_bytes(*tensors))
        ordered = [parts[index] for index in sorted(parts)]
        hidden = [tensors[0] for tensors in ordered]
        logits = [tensors[1] for tensors in ordered if len(tensors) > 1]
        return _joined(hidden), _joined(logits) if logits else None

    def _read(self, channel: socket.socket, out: torch.Tensor, what: str) -> None:
        try:
            read_into(channel, memoryview(out.view(torch.uint8).numpy()))
        except OSError as exc:
            raise AFDPeerGoneError(f"{self._connector}: {what} failed: {exc}") from exc

    def send(self, layer_idx: int, output: torch.Tensor, ubatch: int = 0) -> None:
        transfers, start = [], 0
        for index in peers_with(self.headers, ubatch):
            rows = self.headers[index].ubatches[ubatch]
            tag = layer_tag(layer_idx, ubatch=ubatch)
            transfers.append(Transfer(True, output[start : start + rows], self.peers[index], tag))
            self.metrics[index].sent(tensor_bytes(transfers[-1].tensor))
            start += rows
        self._group.start(transfers, f"send of layer {layer_idx}{_of(ubatch)}")()

    def interrupt(self) -> None:
        try:
            self._wake_writer.send(b"\0")
        except OSError:  # closed: nothing waits on it
            pass

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        self._wake_reader.close()
        self._wake_writer.close()
        self._group.close()
        for metrics in self.metrics:
            metrics.connected(False)


def _of(ubatch: int) -> str:
    return f" (micro-batch {ubatch})" if ubatch else ""


def _joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def read_into(channel: socket.socket, buffer: memoryview) -> None:
    """Fill ``buffer`` from ``channel``; a closed connection is an error, not a short read."""
    view = buffer.cast("B")
    filled = 0
    while filled < len(view):
        received = channel.recv_into(view[filled:])
        if not received:
            raise ConnectionError("the peer closed the connection")
        filled += received
