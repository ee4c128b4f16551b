"""The Attention side's watch on its step channel, for data planes whose transfers wait on the
device (docs/design.md, section "Wire protocol")."""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable

from afd_models.connectors.base import AFDConnectionError
from afd_models.connectors.p2p.rendezvous import Rendezvous
from afd_models.log import get_logger

logger = get_logger(__name__)


class PeerWatchdog:
    """Watches an Attention worker's step channel, on which the FFN worker never writes after the
    handshake: end of stream (or anything else) means it left. Transfers that wait on the device
    (a CUDA-graph replay) would then wait forever, so the watchdog closes the data plane (an
    NCCL abort ends them) and calls ``on_peer_gone``."""

    def __init__(
        self,
        channel: socket.socket,
        group: Rendezvous,
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
