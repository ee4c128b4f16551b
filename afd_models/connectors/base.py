"""The connector contract between the two roles.

Attention side (what the remote proxies call, in forward order, once per remote layer)::

    connector.send(layer_idx, hidden_states, router_logits_or_None)
    output = connector.recv(layer_idx, like=hidden_states)

A forward step starts when the first remote layer is sent; the connector then announces the
step to the FFN side (a :class:`StepHeader`: token count, hidden size, dtype, router-logit width),
so the FFN side can size its buffers. The FFN side serves steps in a loop::

    header = ffn.wait_step(stop_event)            # None once stop_event is set
    for layer_idx in layers:
        hidden, logits = ffn.recv(layer_idx)      # concatenated over the Attention peers
        ffn.send(layer_idx, compute(layer_idx, hidden, logits))

Every wait is bounded: a peer that stops answering raises :class:`AFDConnectionError` within
the configured timeout, never a hang.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

#: dtypes a step may carry, by wire code
DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)


class AFDConnectionError(RuntimeError):
    """The peer role did not answer in time, closed the connection, or sent something unexpected."""


@dataclass(frozen=True)
class StepHeader:
    """What the FFN side needs to know before a step's tensors arrive."""

    #: step number, counting from 0 per connector
    step: int
    #: tokens in the step on the sending Attention worker
    num_tokens: int
    hidden_size: int
    dtype: torch.dtype
    #: width of the router logits sent with each MoE layer, 0 when the gate runs on FFN
    logits_width: int = 0
    #: dtype of the router logits (the router may compute in float32)
    logits_dtype: torch.dtype = torch.float32

    MAGIC = 0xAFD0

    def encode(self) -> torch.Tensor:
        return torch.tensor(
            [
                self.MAGIC,
                self.step,
                self.num_tokens,
                self.hidden_size,
                DTYPES.index(self.dtype),
                self.logits_width,
                DTYPES.index(self.logits_dtype),
            ],
            dtype=torch.int64,
        )

    @classmethod
    def decode(cls, values: torch.Tensor) -> StepHeader:
        magic, step, tokens, hidden, dtype_code, width, logits_code = (
            int(v) for v in values.tolist()
        )
        if magic != cls.MAGIC or not all(0 <= c < len(DTYPES) for c in (dtype_code, logits_code)):
            raise AFDConnectionError(
                f"received a malformed step header {values.tolist()} (is the peer an AFD connector?)"
            )
        return cls(step, tokens, hidden, DTYPES[dtype_code], width, DTYPES[logits_code])

    @staticmethod
    def empty() -> torch.Tensor:
        return torch.zeros(7, dtype=torch.int64)


@dataclass
class ExchangeStats:
    """Round-trip times of the Attention side (send of a layer to its recv), for reports."""

    exchanges: int = 0
    total_s: float = 0.0
    bytes_sent: int = 0
    #: forward steps announced to the FFN side
    steps: int = 0
    _started: dict[int, float] = field(default_factory=dict)

    def started(self, layer_idx: int, nbytes: int) -> None:
        self._started[layer_idx] = time.perf_counter()
        self.bytes_sent += nbytes

    def finished(self, layer_idx: int) -> None:
        began = self._started.pop(layer_idx, None)
        if began is not None:
            self.exchanges += 1
            self.total_s += time.perf_counter() - began

    def as_dict(self) -> dict[str, float]:
        mean = self.total_s / self.exchanges if self.exchanges else 0.0
        return {
            "steps": self.steps,
            "exchanges": self.exchanges,
            "mean_round_trip_s": mean,
            "bytes_sent": self.bytes_sent,
        }


class AFDConnector(ABC):
    """Attention side of the transport."""

    def __init__(self) -> None:
        self.layers: tuple[int, ...] = ()
        self.stats = ExchangeStats()
        self._next = 0
        self._step = -1

    def set_layers(self, layers: list[int]) -> None:
        """The remote layers, in forward order (from :func:`afd_models.models.remote.bind_connector`)."""
        if not layers:
            raise ValueError("the model has no remote layers: is it an AFD Attention model?")
        self.layers = tuple(layers)

    def send(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: torch.Tensor | None
    ) -> None:
        """Send one layer's activations; the first remote layer of a forward opens a new step."""
        if not self.layers:
            raise AFDConnectionError(
                "send before set_layers: bind the connector to the model first"
            )
        if layer_idx == self.layers[0]:
            self._step += 1
            self.stats.steps += 1
            self._next = 0
            width, logits_dtype = (
                (0, torch.float32)
                if router_logits is None
                else (router_logits.shape[-1], router_logits.dtype)
            )
            tokens, hidden = hidden_states.shape[0], hidden_states.shape[-1]
            self._send_header(
                StepHeader(self._step, tokens, hidden, hidden_states.dtype, width, logits_dtype)
            )
        expected = self.layers[self._next] if self._next < len(self.layers) else None
        if layer_idx != expected:
            raise AFDConnectionError(
                f"layer {layer_idx} sent out of order; the FFN side expects layer {expected}"
            )
        self._next += 1
        self.stats.started(layer_idx, hidden_states.numel() * hidden_states.element_size())
        self._send_layer(layer_idx, hidden_states, router_logits)

    def recv(self, layer_idx: int, like: torch.Tensor) -> torch.Tensor:
        """The FFN output of ``layer_idx``, shaped and typed like ``like``."""
        output = self._recv_layer(layer_idx, like)
        self.stats.finished(layer_idx)
        return output

    @abstractmethod
    def _send_header(self, header: StepHeader) -> None: ...

    @abstractmethod
    def _send_layer(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: torch.Tensor | None
    ) -> None: ...

    @abstractmethod
    def _recv_layer(self, layer_idx: int, like: torch.Tensor) -> torch.Tensor: ...

    def close(self) -> None:
        """Release sockets and ports; safe to call twice. Nothing to release by default."""
        return None


class FFNConnector(ABC):
    """FFN side of the transport: receives steps from one or more Attention peers."""

    @abstractmethod
    def wait_step(self, stop: threading.Event) -> list[StepHeader] | None:
        """Block until every peer announced its next step (one header per peer), or ``stop`` is set."""

    @abstractmethod
    def recv(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Hidden states (and router logits) of ``layer_idx`` from all peers, concatenated in peer order."""

    @abstractmethod
    def send(self, layer_idx: int, output: torch.Tensor) -> None:
        """Split ``output`` by peer and send each peer its rows."""

    def interrupt(self) -> None:
        """Make a ``wait_step`` blocked in another thread return (called on stop, with the event set)."""
        return None

    def close(self) -> None:
        """Release sockets and ports; safe to call twice. Nothing to release by default."""
        return None
