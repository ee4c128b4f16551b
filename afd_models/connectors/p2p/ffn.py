"""The FFN side of the point-to-point protocol: host the group, admit the Attention peers by
their fingerprints, wait for steps and serve their layers (docs/design.md, section
"Wire protocol")."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Sequence

import torch

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
        rank_bytes = bytearray(RANK.size)
        try:
            read_into(channel, memoryview(rank_bytes))
            rank = int(RANK.unpack(rank_bytes)[0])
            theirs = read_fingerprint(channel)
        except AFDConnectionError as exc:  # malformed: say so to the peer too
            tell(channel, REFUSED, str(exc))
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
            tell(channel, REFUSED, reason)
            raise AFDConnectionError(
                f"{self._prefix}: refused attention rank {theirs.role_rank} at {where}: {reason}"
            )
        try:
            send_answer(channel, ACCEPTED)
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

    @property
    def data_plane(self) -> str:
        """What moves the layers, and why (the plane chosen when the group formed)."""
        return self._group.plane.description

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
        it, from the step channel behind the header."""
        parts = self._incoming.setdefault((layer_idx, ubatch), {})
        transfers = []
        for index in peers:
            peer, header = self.peers[index], self.headers[index]
            parts[index] = self._buffers(layer_idx, header, header.ubatches[ubatch])
            on_channel = index in self._on_channel
            self._on_channel.discard(index)
            for part, tensor in parts[index].items():
                if on_channel:
                    self._read(self._channels[index], tensor, f"layer {layer_idx} from rank {peer}")
                else:
                    tag = layer_tag(layer_idx, part, ubatch)
                    transfers.append(Transfer(False, tensor, peer, tag))
        if not transfers:
            return lambda: None
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
        transfers, start = [], 0
        for index in peers_with(self.headers, ubatch):
            rows = self.headers[index].ubatches[ubatch]
            tag = layer_tag(layer_idx, ubatch=ubatch)
            transfers.append(Transfer(True, output[start : start + rows], self.peers[index], tag))
            self.metrics[index].sent(tensor_bytes(transfers[-1].tensor))
            start += rows
        self._group.start(transfers, f"send of layer {layer_idx}{ubatch_label(ubatch)}")()

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


def _joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)
