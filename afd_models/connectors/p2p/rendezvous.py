"""A connector group's rendezvous: the store the FFN worker hosts, the Attention side's probes of
it, and the data plane formed once the handshake accepted every peer (docs/design.md, section
"Wire protocol")."""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from datetime import timedelta

from torch.distributed import TCPStore

from afd_models.connectors.base import AFDConnectionError
from afd_models.connectors.p2p.plane import DataPlane, Transfer, Wait
from afd_models.connectors.specs import P2PExtraConfig
from afd_models.log import get_logger
from afd_models.topology import Group

logger = get_logger(__name__)


#: store key under which the FFN worker publishes the port of its step-header listener
STEPS_KEY = "step-channel-port"
#: seconds between two "still waiting" lines while a rendezvous waits for the other role
PROGRESS_EVERY_S = 30.0
#: seconds between two probes of the FFN worker's store while the Attention side waits for it,
#: and the longest the FFN side waits in one accept before it looks at its stop event again
PROBE_EVERY_S = 0.5


class Rendezvous:
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
            last = probe(self.host, self.group.port, wait_s)
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
            "%s: group %d at %s ready in %.1f s; data plane: %s",
            self.prefix,
            self.group.ffn_rank,
            self.where,
            time.monotonic() - self.started,
            self.plane.description,
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


def probe(host: str, port: int, timeout_s: float) -> str | None:
    """None when something accepts connections at ``host:port`` within ``timeout_s``, else why
    not. A plain TCP probe: a ``TCPStore`` client that gives up logs a C++ stack trace."""
    try:
        with socket.create_connection((host, port), timeout_s):
            return None
    except OSError as exc:
        return str(exc)  # the text only: the error's frames would keep its socket alive
