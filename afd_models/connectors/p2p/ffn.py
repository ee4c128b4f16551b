"""The FFN side of the point-to-point protocol: host the group, admit the Attention peers by
their fingerprints, wait for steps and serve their layers (docs/design.md, section
"Wire protocol")."""

from __future__ import annotations

import queue
import select
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch.distributed import HashStore

from afd_models.connectors.base import (
    TOKEN_ID_DTYPE,
    AFDConnectionError,
    AFDPeerGoneError,
    FFNConnector,
    Fingerprint,
    LayerInput,
    StepHeader,
    compare_fingerprints,
    peers_with,
)
from afd_models.connectors.p2p.auth import AuthenticationError, check_proof, send_hello
from afd_models.connectors.p2p.channel_store import StoreServer
from afd_models.connectors.p2p.plane import (
    DataPlane,
    Part,
    Transfer,
    Wait,
    layer_tag,
    ubatch_label,
)
from afd_models.connectors.p2p.rendezvous import (
    PROBE_EVERY_S,
    PROGRESS_EVERY_S,
    Rendezvous,
)
from afd_models.connectors.p2p.wire import (
    ACCEPTED,
    GAVE_UP,
    RANK,
    READY,
    REFUSED,
    byte_view,
    read_fingerprint,
    read_into,
    send_answer,
    tell,
)
from afd_models.connectors.specs import P2PExtraConfig
from afd_models.log import get_logger
from afd_models.metrics import PeerMetrics, tensor_bytes
from afd_models.topology import Group

logger = get_logger(__name__)

#: the most step-channel openings an FFN worker runs at once; a connection beyond them is closed
MAX_OPENINGS = 32
#: seconds an ending rendezvous waits for an opening's thread, woken by the shutdown of its socket
CLOSE_WAIT_S = 5.0


class P2PFFNConnector(FFNConnector):
    """FFN side: group rank 0, serving the Attention peers of its group over ``plane``.

    Each peer must present a fingerprint equal to ``fingerprint`` in every field but the role
    rank (a bare one when not given, as :class:`P2PAttentionConnector` presents), after proving
    ``secret``, the deployment's shared secret, where there is one.
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
        secret: bytes | None = None,
    ):
        self.group = group
        #: the deployment's shared secret, which every peer must prove (None: no one is asked)
        self._secret = secret
        self.idle_timeout_s = extra.idle_timeout_s
        self.peers = list(range(1, group.size))
        self.headers: list[StepHeader] = []
        #: receives posted by start_recv, by (layer, micro-batch): each peer's buffers by part,
        #: by its position
        self._incoming: dict[tuple[int, int], dict[int, dict[Part, torch.Tensor]]] = {}
        self.fingerprint = fingerprint or Fingerprint.bare(group.ffn_rank)
        #: positions of the peers whose next layer rides behind their header (its first layer)
        self._on_channel: set[int] = set()
        self._channels: list[socket.socket] = []
        #: the Prometheus series of each peer, in peer order, once all of them are connected
        self.metrics: list[PeerMetrics] = []
        self._group = Rendezvous(host, group, 0, extra, "ffn", plane, self.progress_every_s)
        self._prefix = self._group.prefix
        self._connector = f"AFD {plane.name} connector at {self._group.where}"
        logger.info(
            "%s: %s",
            self._prefix,
            "peers must prove the deployment's shared secret"
            if secret is not None
            else "peers are not authenticated (no shared secret set)",
        )
        try:
            # a stop writes to this pair to wake a wait_step blocked in select()
            self._wake_reader, self._wake_writer = socket.socketpair()
        except BaseException:
            self._group.close()
            raise
        try:
            self._channels = self._accept_step_channels(extra, stop)
            self._form()
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
        self, extra: P2PExtraConfig, stop: threading.Event | None
    ) -> list[socket.socket]:
        """One TCP connection per Attention peer, in peer order, each past the handshake; on
        failure (or once ``stop`` is set) every channel is closed, and the peers accepted so far
        are told why. A connection that fails its opening is dropped (:class:`_Openings`)."""
        channels: dict[int, socket.socket] = {}
        # one connect timeout for the whole rendezvous, as the progress lines count it
        deadline = self._group.started + extra.connect_timeout_s
        report = self._group.started + self.progress_every_s
        openings = _Openings(self._prefix, self._secret, extra.timeout_s)
        try:
            listener = self._group.listener
            assert listener is not None, "accepted during construction only"
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
                if time.monotonic() >= report:
                    report += self.progress_every_s
                    self._still_waiting(channels, extra)
                # short slices: a stop is seen within one, progress is said every interval
                ready, _, _ = select.select(
                    [listener, openings.ready], [], [], min(remaining, PROBE_EVERY_S)
                )
                if listener in ready:
                    try:
                        channel, address = listener.accept()
                    except OSError as exc:
                        raise AFDConnectionError(
                            f"{self._prefix}: the listener at {self._group.where} failed while "
                            f"attention ranks {self._missing(channels)} had not connected: {exc}"
                        ) from None
                    openings.start(channel, f"{address[0]}:{address[1]}")
                for arrival in openings.arrived():
                    try:
                        channels[self._admit(arrival, channels)] = arrival.channel
                    except BaseException:
                        arrival.channel.close()
                        raise
            for rank, channel in channels.items():
                try:
                    send_answer(channel, READY)
                except OSError as exc:
                    raise AFDConnectionError(
                        f"{self._prefix}: the Attention peer of group rank {rank} at "
                        f"{self._group.where} left before the group formed: {exc}"
                    ) from None
        except BaseException as exc:
            for channel in channels.values():
                tell(channel, GAVE_UP, str(exc) or type(exc).__name__)
                channel.close()
            openings.close(str(exc) or type(exc).__name__)
            raise
        openings.close("the group formed without it")
        return [channels[peer] for peer in self.peers]

    def _form(self) -> None:
        """Form the data plane through the group's store: this worker's own, which each peer
        reaches over its step channel until its side formed (:class:`StoreServer`)."""
        store = HashStore()
        store.set_timeout(timedelta(seconds=self._group.remaining_s()))
        servers = [
            StoreServer(channel, store, f"the Attention peer of group rank {peer}")
            for peer, channel in zip(self.peers, self._channels, strict=True)
        ]
        try:
            self._group.form(store)
        except BaseException as exc:
            # a peer whose request ended its store's service is why the wait for it failed: say
            # so (read before the stop, which ends the others' service too)
            failed = [server.error for server in servers if server.error is not None]
            for server in servers:
                server.stop()
            if failed and isinstance(exc, AFDConnectionError):
                raise self._not_formed(failed) from exc
            raise
        for server in servers:
            server.join(self._group.remaining_s())
        failed = [server.error for server in servers if server.error is not None]
        if failed:
            raise self._not_formed(failed)

    def _not_formed(self, failed: list[str]) -> AFDConnectionError:
        """The group did not form because of the store service's ``failed`` peers."""
        return AFDConnectionError(
            f"{self._prefix}: group {self.group.ffn_rank} at {self._group.where} did not form: "
            f"{'; '.join(failed)}"
        )

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

    def _admit(self, arrival: _Arrival, channels: dict[int, socket.socket]) -> int:
        """Accept a peer past its opening, by its group rank and fingerprint, or refuse it
        (telling it why) and raise: a real peer configured unlike this engine fails fast."""
        where, theirs = self._group.where, arrival.fingerprint
        reason = self._refusal(arrival.rank, theirs, channels)
        if reason is not None:
            tell(arrival.channel, REFUSED, reason)
            raise AFDConnectionError(
                f"{self._prefix}: refused attention rank {theirs.role_rank} at {where}: {reason}"
            )
        try:
            send_answer(arrival.channel, ACCEPTED)
        except OSError as exc:
            raise AFDConnectionError(
                f"{self._prefix}: attention rank {theirs.role_rank} left during the handshake at {where}: {exc}"
            ) from None
        return arrival.rank

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

    @property
    def data_plane(self) -> str:
        """What moves the layers, and why (the plane chosen when the group formed)."""
        return self._group.plane.description

    def wait_step(self, stop: threading.Event) -> list[StepHeader] | None:
        self.lost_step = None
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
            values = bytearray(StepHeader.WIRE.size)
            self._read_bytes(channel, memoryview(values), f"step header from rank {peer}")
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
        it, from the step channel behind the header. A step that lost its peer while
        :attr:`holds_lost_steps` receives zeros."""
        parts = self._incoming.setdefault((layer_idx, ubatch), {})
        for index in peers:  # all of them first: a held step still computes every peer's rows
            header = self.headers[index]
            parts[index] = self._buffers(layer_idx, header, header.ubatches[ubatch])
        try:
            wait = self._post_receives(layer_idx, ubatch, peers, parts)
        except AFDPeerGoneError as exc:
            if not self.holds_lost_steps:
                raise
            self.lost_step, wait = str(exc), _nothing
        if not self.holds_lost_steps:
            return wait

        def held() -> None:
            if self.lost_step is None:
                try:
                    wait()
                    return
                except AFDPeerGoneError as exc:
                    self.lost_step = str(exc)
            for buffers in parts.values():
                for tensor in buffers.values():
                    tensor.zero_()

        return held

    def _post_receives(
        self,
        layer_idx: int,
        ubatch: int,
        peers: Sequence[int],
        parts: dict[int, dict[Part, torch.Tensor]],
    ) -> Wait:
        transfers = []
        for index in peers:
            peer = self.peers[index]
            on_channel = index in self._on_channel
            self._on_channel.discard(index)
            if self.lost_step is not None:  # the peer went away earlier in the step
                continue
            for part, tensor in parts[index].items():
                if on_channel:
                    self._read(self._channels[index], tensor, f"layer {layer_idx} from rank {peer}")
                else:
                    tag = layer_tag(layer_idx, part, ubatch)
                    transfers.append(Transfer(False, tensor, peer, tag))
        if not transfers:
            return _nothing
        return self._group.start(transfers, f"receive of layer {layer_idx}{ubatch_label(ubatch)}")

    def _buffers(self, layer_idx: int, header: StepHeader, rows: int) -> dict[Part, torch.Tensor]:
        """Empty buffers for what a peer with ``header`` sends of ``layer_idx`` (``rows`` tokens),
        in the order of :func:`~afd_models.connectors.p2p.plane.layer_parts`."""
        device = self._group.plane.device
        buffers = {
            Part.HIDDEN: torch.empty(rows, header.hidden_size, dtype=header.dtype, device=device)
        }
        if header.logits_width:
            buffers[Part.ROUTER_LOGITS] = torch.empty(
                rows, header.logits_width, dtype=header.logits_dtype, device=device
            )
        if header.token_ids and layer_idx in self.fingerprint.token_id_layers:
            buffers[Part.TOKEN_IDS] = torch.empty(rows, dtype=TOKEN_ID_DTYPE, device=device)
        return buffers

    def received(self, layer_idx: int, ubatch: int) -> LayerInput:
        parts = self._incoming.pop((layer_idx, ubatch))
        for index, buffers in parts.items():
            self.metrics[index].received(tensor_bytes(*buffers.values()))
        ordered = [parts[index] for index in sorted(parts)]
        hidden = _joined([buffers[Part.HIDDEN] for buffers in ordered])
        logits = [
            buffers[Part.ROUTER_LOGITS] for buffers in ordered if Part.ROUTER_LOGITS in buffers
        ]
        ids = [buffers[Part.TOKEN_IDS] for buffers in ordered if Part.TOKEN_IDS in buffers]
        return LayerInput(
            hidden, _joined(logits) if logits else None, _joined(ids) if ids else None
        )

    def _read(self, channel: socket.socket, out: torch.Tensor, what: str) -> None:
        self._read_bytes(channel, byte_view(out), what)

    def _read_bytes(self, channel: socket.socket, out: memoryview, what: str) -> None:
        try:
            read_into(channel, out)
        except OSError as exc:
            raise AFDPeerGoneError(f"{self._connector}: {what} failed: {exc}") from exc

    def send(self, layer_idx: int, output: torch.Tensor, ubatch: int = 0) -> None:
        if self.lost_step is not None:  # held: the peer went away earlier in the step
            return
        transfers, start = [], 0
        for index in peers_with(self.headers, ubatch):
            rows = self.headers[index].ubatches[ubatch]
            tag = layer_tag(layer_idx, ubatch=ubatch)
            transfers.append(Transfer(True, output[start : start + rows], self.peers[index], tag))
            self.metrics[index].sent(tensor_bytes(transfers[-1].tensor))
            start += rows
        try:
            self._group.start(transfers, f"send of layer {layer_idx}{ubatch_label(ubatch)}")()
        except AFDPeerGoneError as exc:
            if not self.holds_lost_steps:
                raise
            self.lost_step = str(exc)

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


def _nothing() -> None:
    """The wait of a receive that posted no transfer."""


def _joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


@dataclass(frozen=True)
class _Arrival:
    """A connection past its opening, with the group rank and fingerprint it sent."""

    channel: socket.socket
    #: where it came from (``host:port``), for the log
    address: str
    rank: int
    fingerprint: Fingerprint


class _Openings:
    """The step-channel openings in progress, a thread each: the hello, the shared secret's
    challenge (:mod:`~afd_models.connectors.p2p.auth`), then the group rank and
    fingerprint, all within ``timeout_s``. A connection that fails any of it (no or another
    secret, a replayed exchange, garbage, silence, a malformed fingerprint) is logged with its
    address and dropped; the rendezvous goes on. One that passes waits in :meth:`arrived`, and
    :attr:`ready` turns readable."""

    def __init__(self, prefix: str, secret: bytes | None, timeout_s: float):
        self._prefix, self._secret, self._timeout_s = prefix, secret, timeout_s
        self._lock = threading.Lock()
        #: connections whose opening runs now (closed by :meth:`close`)
        self._running: set[socket.socket] = set()
        self._arrivals: queue.SimpleQueue[_Arrival] = queue.SimpleQueue()
        self._closed = False
        self._threads: list[threading.Thread] = []
        #: readable once an arrival waits (a byte per arrival)
        self.ready, self._wake = socket.socketpair()
        self.ready.setblocking(False)

    def start(self, channel: socket.socket, address: str) -> None:
        with self._lock:
            if len(self._running) >= MAX_OPENINGS:
                logger.warning(
                    "%s: dropped a connection from %s: %d handshakes in progress already",
                    self._prefix,
                    address,
                    MAX_OPENINGS,
                )
                channel.close()
                return
            self._running.add(channel)
            self._threads = [thread for thread in self._threads if thread.is_alive()]
            thread = threading.Thread(
                target=self._open, args=(channel, address), name="afd-step-opening", daemon=True
            )
            self._threads.append(thread)
        thread.start()

    def _open(self, channel: socket.socket, address: str) -> None:
        reason, arrival = self._pass(channel, address)
        with self._lock:
            self._running.discard(channel)
            if arrival is not None and not self._closed:
                self._arrivals.put(arrival)
                self._wake.send(b"\0")
                return
        channel.close()
        if reason is not None:
            logger.warning("%s: dropped a connection from %s: %s", self._prefix, address, reason)

    def _pass(self, channel: socket.socket, address: str) -> tuple[str | None, _Arrival | None]:
        """The arrival, or why the connection is dropped (None once closed: nothing to say)."""
        deadline = time.monotonic() + self._timeout_s
        try:
            channel.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            ffn_nonce = send_hello(channel, self._secret)
            channel.settimeout(self._timeout_s)
            if not channel.recv(1, socket.MSG_PEEK):
                logger.debug("%s: %s closed without a word (a probe)", self._prefix, address)
                return None, None
            if self._secret is not None:
                check_proof(channel, self._secret, ffn_nonce, deadline)
            rank_bytes = bytearray(RANK.size)
            read_into(channel, memoryview(rank_bytes), deadline)
            rank = int(RANK.unpack(rank_bytes)[0])
            theirs = read_fingerprint(channel, deadline)
        except AuthenticationError as exc:
            return f"it failed authentication: {exc}", None
        except AFDConnectionError as exc:  # a malformed fingerprint: say so to the peer too
            tell(channel, REFUSED, str(exc))
            return str(exc), None
        except TimeoutError:
            return (
                f"it sent no whole handshake within {self._timeout_s:.0f} s (not an AFD peer, "
                "or an AFD version without this handshake?)",
                None,
            )
        except OSError as exc:
            return (None if self._closed else f"it left during the handshake: {exc}"), None
        channel.settimeout(self._timeout_s)
        return None, _Arrival(channel, address, rank, theirs)

    def arrived(self) -> list[_Arrival]:
        """The connections that passed their opening since the last call."""
        try:
            while self.ready.recv(4096):
                pass
        except BlockingIOError:
            pass
        found = []
        while not self._arrivals.empty():
            found.append(self._arrivals.get())
        return found

    def close(self, why: str) -> None:
        """End every opening in progress and tell each arrival not taken ``why`` it is closed."""
        with self._lock:
            self._closed = True
            running = list(self._running)
        for channel in running:
            try:  # wakes the opening's thread, which closes the channel
                channel.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(CLOSE_WAIT_S)
        for arrival in self.arrived():
            tell(arrival.channel, GAVE_UP, why)
            arrival.channel.close()
        self.ready.close()
        self._wake.close()
