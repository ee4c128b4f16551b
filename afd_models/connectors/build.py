"""What the connect steps (:mod:`afd_models.wiring.connect`) hand a connector's builders (named
by its row of :data:`afd_models.connectors.specs.SPECS`), and what they return.

A builder runs before the model is built, so that whatever can fail without weights (a CAM
kernel library off an NPU) fails first; what it returns is called with the loaded model's
fingerprint and connects.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from afd_models.connectors.base import AFDConnector, FFNConnector, Fingerprint
from afd_models.topology import Group

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Site:
    """Where a worker's connector joins its group."""

    #: the address its group's rendezvous listens on (the group's FFN rank hosts it)
    host: str
    #: the connector group of this worker's TP lane
    group: Group
    #: this worker's role rank
    rank: int
    #: the connector's ``connector_extra_config``, validated (its spec's ``extra_config`` type)
    extra: Any
    #: the worker's device, where received tensors are allocated
    device: torch.device
    #: the deployment's shared secret, which its step channels authenticate with (None: none)
    secret: bytes | None = None


class ConnectAttention(Protocol):
    """The Attention side's connect: with the loaded model's fingerprint, join and handshake."""

    def __call__(self, fingerprint: Fingerprint) -> AFDConnector: ...


class ConnectFFN(Protocol):
    """The FFN side's connect: with the loaded model's fingerprint, host the group and wait for
    the Attention peers; again, with ``connect_timeout_s`` and ``stop``, once they left (a
    restart, which only a connector with ``peer_restart`` takes: the config refuses the others)."""

    def __call__(
        self,
        fingerprint: Fingerprint,
        *,
        connect_timeout_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> FFNConnector: ...


class PrepareAttention(Protocol):
    """A peer connector's Attention builder (its spec's ``attention``)."""

    def __call__(self, site: Site) -> ConnectAttention: ...


class PrepareFFN(Protocol):
    """A connector's FFN builder (its spec's ``ffn``)."""

    def __call__(self, site: Site) -> ConnectFFN: ...
