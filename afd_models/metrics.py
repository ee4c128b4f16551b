"""AFD's Prometheus series, served by vLLM's own ``/metrics``.

The connectors live in vLLM's worker processes, and vLLM's API server serves the series of other
processes only in ``prometheus_client``'s multiprocess mode: when ``PROMETHEUS_MULTIPROC_DIR``
names a directory (the operator sets it, a fresh empty directory per server; docs/user-guide.md
says why also with several API servers). Without it the series stay in the worker and
:func:`warn_if_unexported` says so once. Every series carries the worker's ``role``, role ``rank``
and TP ``lane`` and the ``peer`` it talks to (``ffn0``, ``attention1``): multiprocess mode adds up
the series of processes with equal labels, and each worker process counts its own exchanges.

==========================  =========  ===============================================================
series                      type       what
==========================  =========  ===============================================================
``afd_exchange_seconds``    histogram  Attention side, per ``layer``: from sending a layer's activations
                                       to receiving its FFN output
``afd_steps_total``         counter    forward steps exchanged with the peer
``afd_tokens_total``        counter    tokens of those steps (the peer's rows on the FFN side)
``afd_bytes_total``         counter    activation bytes ``sent`` to or ``received`` from the peer
``afd_peer_connected``      gauge      1 once the peer passed the handshake, 0 after the connector closed
``afd_reconnects_total``    counter    connections formed again after the peer left and a restarted
                                       one passed the handshake (``peer_restart_timeout_s``)
==========================  =========  ===============================================================
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram

from afd_models.log import get_logger

if TYPE_CHECKING:
    import torch

logger = get_logger(__name__)

#: exchange-latency bucket bounds, seconds: 100 µs to 10 s
LATENCY_BUCKETS = (
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)
PEER_LABELS = ("role", "rank", "lane", "peer")

EXCHANGE_SECONDS = Histogram(
    "afd_exchange_seconds",
    "AFD Attention side: seconds from sending a layer's activations to receiving its FFN output",
    (*PEER_LABELS, "layer"),
    buckets=LATENCY_BUCKETS,
)
STEPS = Counter("afd_steps", "AFD forward steps exchanged with the peer", PEER_LABELS)
TOKENS = Counter("afd_tokens", "AFD tokens of the steps exchanged with the peer", PEER_LABELS)
BYTES = Counter(
    "afd_bytes",
    "AFD activation bytes sent to or received from the peer",
    (*PEER_LABELS, "direction"),
)
# the value last written for these labels (a count of processes would be meaningless here)
PEER_CONNECTED = Gauge(
    "afd_peer_connected",
    "AFD: 1 once the peer passed the connect handshake, 0 after the connector closed",
    PEER_LABELS,
    multiprocess_mode="mostrecent",
)

RECONNECTS = Counter(
    "afd_reconnects",
    "AFD: connections formed again after the peer left and a restarted one passed the handshake",
    PEER_LABELS,
)

_warned = False


def warn_if_unexported() -> None:
    """Say once per process that ``/metrics`` will not show AFD's series, and how to fix it."""
    global _warned
    if not _warned and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        _warned = True
        logger.info(
            "AFD metrics stay in this worker process: export PROMETHEUS_MULTIPROC_DIR (a new empty "
            "directory) before `vllm serve` to see them in its /metrics (docs/user-guide.md)"
        )


class PeerMetrics:
    """The series of one connection: this worker (its role, role rank and TP lane) and one peer."""

    def __init__(self, role: str, rank: int, lane: int, peer: str):
        labels = {"role": role, "rank": str(rank), "lane": str(lane), "peer": peer}
        self._labels = labels
        self._steps = STEPS.labels(**labels)
        self._tokens = TOKENS.labels(**labels)
        self._sent = BYTES.labels(**labels, direction="sent")
        self._received = BYTES.labels(**labels, direction="received")
        self._connected = PEER_CONNECTED.labels(**labels)
        self._reconnects = RECONNECTS.labels(**labels)
        #: each layer's latency histogram, looked up once (the lookup costs as much as a sample)
        self._exchanges: dict[int, Any] = {}
        warn_if_unexported()

    def connected(self, up: bool) -> None:
        self._connected.set(1 if up else 0)

    def reconnected(self) -> None:
        """The connection formed again with a restarted peer (and is up)."""
        self._reconnects.inc()
        self.connected(True)

    def step(self, tokens: int) -> None:
        self._steps.inc()
        self._tokens.inc(tokens)

    def sent(self, nbytes: int) -> None:
        self._sent.inc(nbytes)

    def received(self, nbytes: int) -> None:
        self._received.inc(nbytes)

    def exchanged(self, layer: int, seconds: float) -> None:
        histogram = self._exchanges.get(layer)
        if histogram is None:
            histogram = EXCHANGE_SECONDS.labels(**self._labels, layer=str(layer))
            self._exchanges[layer] = histogram
        histogram.observe(seconds)


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    """Bytes of the tensors given (``None`` counts 0)."""
    return sum(t.nbytes for t in tensors if t is not None)
