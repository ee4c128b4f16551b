"""A connector group's rendezvous: the listener the FFN worker hosts on the group's address, the
Attention side's connect to it, and the data plane formed once the handshake accepted every peer
(docs/design.md, sections "Wire protocol" and "Authentication")."""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence

from torch.distributed import Store

from afd_models.connectors.base import AFDConnectionError
from afd_models.connectors.p2p.plane import DataPlane, Transfer, Wait
from afd_models.connectors.specs import P2PExtraConfig
from afd_models.log import get_logger
from afd_models.topology import Group

logger = get_logger(__name__)


#: seconds between two "still waiting" lines while a rendezvous waits for the other role
PROGRESS_EVERY_S = 30.0
#: seconds between two connect attempts while the Attention side waits for the FFN worker, and
#: the longest the FFN side waits in one accept before it looks at its stop event again
PROBE_EVERY_S = 0.5


def connected_to_itself(sock: socket.socket) -> bool:
    """Whether a TCP connection to a local port no one listened on, made from an ephemeral port
    equal to it, joined the socket to itself (TCP's simultaneous open)."""
    return bool(sock.getsockname() == sock.getpeername())


class Rendezvous:
    """Where a group meets: the FFN worker's listener on the group's address and port, where
    every step channel opens (only until the group formed), and the group's data plane."""

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
        #: the FFN worker's listener, until the group formed
        self.listener: socket.socket | None = self._listen() if group_rank == 0 else None

    def _listen(self) -> socket.socket:
        """FFN side: listen on the group's address only, never on every interface."""
        try:
            family = socket.getaddrinfo(self.host, self.group.port, type=socket.SOCK_STREAM)[0][0]
            return socket.create_server((self.host, self.group.port), family=family)
        except OSError as exc:
            raise AFDConnectionError(
                f"{self.prefix}: cannot host group {self.group.ffn_rank} at {self.where} (is "
                f"another engine on this port, or the address another machine's?): {exc}"
            ) from None

    def remaining_s(self) -> float:
        """What is left of the connect timeout, at least a second to finish a step of it."""
        return max(self.started + self.connect_timeout_s - time.monotonic(), 1.0)

    def connect(self) -> socket.socket:
        """Attention side: a connection to the FFN worker's listener (it listens once its model
        is loaded), trying every ``PROBE_EVERY_S`` and saying every ``progress_every_s`` whom it
        waits for.

        Raises:
            AFDConnectionError: nothing accepted within the connect timeout.
        """
        deadline = self.started + self.connect_timeout_s
        report = self.started + self.progress_every_s
        while True:
            # each try at most one progress interval, so a network that drops packets (a
            # firewall) still gets its progress lines
            wait_s = min(max(deadline - time.monotonic(), 0.01), self.progress_every_s)
            try:
                sock = socket.create_connection((self.host, self.group.port), wait_s)
            except OSError as exc:
                last = str(exc)  # the text only: the error's frames would keep its socket alive
            else:
                if not connected_to_itself(sock):
                    return sock
                # nothing listened there yet, and the kernel picked the dialled port as this
                # socket's own: TCP connected it to itself, which would also keep the FFN
                # worker from binding that port
                sock.close()
                last = f"connected to itself on {self.where}: nothing listens there yet"
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

    def form(self, store: Store) -> None:
        """Form the data plane through the group's ``store`` (every member calls this once the
        handshake accepted them all); the FFN worker stops listening once it formed."""
        try:
            self.plane.form(store, self.group_rank, self.group.size)
        except AFDConnectionError:
            raise
        except (RuntimeError, OSError) as exc:
            raise AFDConnectionError(
                f"{self.prefix}: the {self.plane.name} data plane of group {self.group.ffn_rank} "
                f"at {self.where} did not form after the handshake: {exc}"
            ) from None
        self.formed = True
        self._stop_listening()
        logger.info(
            "%s: group %d at %s ready in %.1f s; data plane: %s",
            self.prefix,
            self.group.ffn_rank,
            self.where,
            time.monotonic() - self.started,
            self.plane.description,
        )

    def start(self, transfers: Sequence[Transfer], what: str) -> Wait:
        if not self.formed:
            raise AFDConnectionError(f"AFD {self.plane.name} connector at {self.where} is closed")
        return self.plane.start(transfers, what)

    def _stop_listening(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def close(self) -> None:
        """Abort pending transfers and release sockets and ports; safe to call twice."""
        self.formed = False
        self._stop_listening()
        self.plane.close()


def probe(host: str, port: int, timeout_s: float) -> str | None:
    """None when something accepts connections at ``host:port`` within ``timeout_s``, else why
    not."""
    try:
        with socket.create_connection((host, port), timeout_s) as sock:
            if connected_to_itself(sock):
                return f"connected to itself on {host}:{port}: nothing listens there"
            return None
    except OSError as exc:
        return str(exc)  # the text only: the error's frames would keep its socket alive
