"""The Attention side of the point-to-point protocol: join the group, pass the handshake, send
each step's header and exchange its layers (docs/design.md, section "Wire protocol")."""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Callable, Sequence

import torch

from afd_models.connectors.base import (
    AFDConnectionError,
    AFDConnector,
    AFDPeerGoneError,
    Fingerprint,
    StepHeader,
)
from afd_models.connectors.p2p.auth import respond
from afd_models.connectors.p2p.channel_store import ChannelStore
from afd_models.connectors.p2p.plane import (
    DataPlane,
    Transfer,
    Wait,
    layer_parts,
    layer_tag,
    ubatch_label,
)
from afd_models.connectors.p2p.rendezvous import (
    PROBE_EVERY_S,
    PROGRESS_EVERY_S,
    Rendezvous,
    probe,
)
from afd_models.connectors.p2p.watchdog import PeerWatchdog
from afd_models.connectors.p2p.wire import (
    ACCEPTED,
    RANK,
    READY,
    REFUSED,
    as_bytes,
    read_answer,
)
from afd_models.connectors.specs import P2PExtraConfig
from afd_models.log import get_logger
from afd_models.metrics import PeerMetrics
from afd_models.topology import Group

logger = get_logger(__name__)


class P2PAttentionConnector(AFDConnector):
    """Attention side: one worker, talking to the FFN rank of its group (group rank 0) over
    ``plane``.

    ``fingerprint`` describes this worker's engine (see
    :func:`afd_models.wiring.connect.fingerprint`); without one the connector presents a bare
    fingerprint, which only a bare FFN connector accepts (benchmarks, tests). ``secret`` is the
    deployment's shared secret, which the FFN side must ask for and prove (None: it must not).
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
        secret: bytes | None = None,
    ):
        super().__init__()
        #: transfers in flight by (micro-batch, layer): the output buffer (None until a split
        #: step's receive is posted) and the wait
        self._pending: dict[tuple[int, int], tuple[torch.Tensor | None, Wait]] = {}
        self._header: StepHeader | None = None
        self._steps: socket.socket | None = None
        self._watchdog: PeerWatchdog | None = None
        self.fingerprint = fingerprint or Fingerprint.bare(attention_rank)
        self._host, self._extra, self._on_peer_gone = host, extra, on_peer_gone
        #: the deployment's shared secret (None: the FFN side must not ask for one)
        self._secret = secret
        self._group = self._connect(group, plane, extra)
        try:
            self.metrics = PeerMetrics(
                "attention", attention_rank, group.lane, f"ffn{group.ffn_rank}"
            )
            self.metrics.connected(True)
        except BaseException:
            self.close()
            raise

    def _connect(self, group: Group, plane: DataPlane, extra: P2PExtraConfig) -> Rendezvous:
        """Join the group's rendezvous, pass the handshake and form the data plane (within
        ``extra.connect_timeout_s``); whatever was opened is closed if any of it fails."""
        rendezvous = Rendezvous(
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
            self._form(rendezvous, self._steps, extra)
            if plane.waits_on_device:
                self._watchdog = PeerWatchdog(self._steps, rendezvous, self._on_peer_gone)
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

    def set_layers(self, layers: Sequence[int], token_id_layers: Sequence[int] = ()) -> None:
        """As :meth:`AFDConnector.set_layers`; the token-id layers must be those this connector
        presented at connect time, which the FFN side sizes its receives by."""
        if tuple(token_id_layers) != self.fingerprint.token_id_layers:
            raise ValueError(
                f"token-id layers {list(token_id_layers)}, but this connector presented "
                f"{list(self.fingerprint.token_id_layers)} at connect time"
            )
        super().set_layers(layers, token_id_layers)

    @property
    def data_plane(self) -> str:
        """What moves the layers, and why (the plane chosen when the group formed)."""
        return self._group.plane.description

    def ffn_is_hosting(self) -> bool:
        """Whether an FFN worker hosts this connector's group now (one probe of its store)."""
        return probe(self._group.host, self._group.group.port, PROBE_EVERY_S) is None

    def _connect_step_channel(self, extra: P2PExtraConfig) -> socket.socket:
        """Open the step channel and pass the handshake; the channel is closed if either fails."""
        where, rank = self._group.where, self.fingerprint.role_rank
        channel = self._opened_channel(extra)
        try:
            try:
                channel.sendall(RANK.pack(self._group.group_rank) + self.fingerprint.encode())
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

    def _opened_channel(self, extra: P2PExtraConfig) -> socket.socket:
        """A step channel past its opening (:meth:`_authenticate`). An FFN worker that closes
        the connection before it (one leaving, or one busy with as many openings as it takes at
        once) is tried again until the connect timeout."""
        deadline = self._group.started + extra.connect_timeout_s
        while True:
            channel = self._group.connect()
            try:
                channel.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                channel.settimeout(extra.timeout_s)
                self._authenticate(channel, self._group.where, extra)
                return channel
            except AFDPeerGoneError as exc:
                channel.close()
                if time.monotonic() + PROBE_EVERY_S >= deadline:
                    raise
                logger.info("%s: %s; trying again", self._prefix, exc)
            except BaseException:
                channel.close()
                raise
            time.sleep(PROBE_EVERY_S)

    def _form(self, rendezvous: Rendezvous, channel: socket.socket, extra: P2PExtraConfig) -> None:
        """Form the data plane through the group's store, reached over ``channel``
        (:class:`~afd_models.connectors.p2p.channel_store.ChannelStore`), then hand the channel
        back to the steps."""
        channel.settimeout(rendezvous.remaining_s())
        store = ChannelStore(channel)
        try:
            rendezvous.form(store)
            store.done()
        except OSError as exc:
            raise AFDPeerGoneError(
                f"{self._prefix}: the FFN worker at {rendezvous.where} left while the data plane "
                f"formed: {exc}"
            ) from None
        channel.settimeout(extra.timeout_s)

    def _authenticate(self, channel: socket.socket, where: str, extra: P2PExtraConfig) -> None:
        """Pass the step channel's opening (:func:`~afd_models.connectors.p2p.auth.respond`)."""
        try:
            respond(channel, self._secret)
        except AFDConnectionError as exc:
            raise AFDConnectionError(f"{self._prefix}: the FFN worker at {where}: {exc}") from None
        except TimeoutError:
            raise AFDConnectionError(
                f"{self._prefix}: the FFN worker at {where} did not answer the handshake within "
                f"{extra.timeout_s:.0f} s (is it an AFD FFN worker of the same vllm-afd-overlay "
                "version?)"
            ) from None
        except OSError as exc:
            raise AFDPeerGoneError(
                f"{self._prefix}: the FFN worker at {where} closed the step channel before "
                f"the handshake: {exc}"
            ) from None

    def _answer(self, channel: socket.socket, where: str, within: str) -> tuple[bytes, str]:
        try:
            return read_answer(channel)
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
                b"".join([header.encode(), *(as_bytes(t).numpy() for t in tensors)])
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
        token_ids: torch.Tensor | None,
    ) -> None:
        header, self._header = self._header, None
        parts = layer_parts(hidden_states, router_logits, token_ids)
        if header is not None:
            self._write_step(header, [tensor for _, tensor in parts])
        sends = [
            Transfer(True, tensor, 0, layer_tag(layer_idx, part, ubatch))
            for part, tensor in ([] if header is not None else parts)
        ]
        what = f"exchange of layer {layer_idx}{ubatch_label(ubatch)}"
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
                self._group.start([receive], f"receive of layer {layer_idx}{ubatch_label(ubatch)}"),
            )
            sent()
        started = time.perf_counter()
        wait()
        if not self.is_capturing:
            self.stats.waited(time.perf_counter() - started)
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
