"""A data plane: the point-to-point transfers of one layer between the members of a connector
group, and how they are tagged (docs/design.md, section "Wire protocol")."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.distributed import Store


@dataclass(frozen=True)
class Transfer:
    """One point-to-point transfer of a data plane: ``tensor`` to (``send``) or into group rank
    ``peer``."""

    send: bool
    tensor: torch.Tensor
    peer: int
    #: what the transfer carries (:func:`layer_tag`): gloo matches transfers by it, NCCL by order
    tag: int


class Part(enum.IntEnum):
    """What a transfer of a layer carries, in the order a layer's transfers are posted."""

    #: hidden states to the FFN side, or its output back
    HIDDEN = 0
    ROUTER_LOGITS = 1
    TOKEN_IDS = 2


def layer_tag(layer_idx: int, part: Part = Part.HIDDEN, ubatch: int = 0) -> int:
    """The tag of one transfer: unique per layer, micro-batch (0 or 1) and part."""
    return (layer_idx * 2 + ubatch) * len(Part) + part


def tag_part(tag: int) -> Part:
    """What the transfer tagged ``tag`` carries."""
    return Part(tag % len(Part))


def layer_parts(
    hidden_states: torch.Tensor,
    router_logits: torch.Tensor | None,
    token_ids: torch.Tensor | None,
) -> list[tuple[Part, torch.Tensor]]:
    """A layer's tensors to the FFN side, in the order both sides post them (absent ones left out)."""
    parts = (
        (Part.HIDDEN, hidden_states),
        (Part.ROUTER_LOGITS, router_logits),
        (Part.TOKEN_IDS, token_ids),
    )
    return [(part, tensor) for part, tensor in parts if tensor is not None]


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
        #: what moves the tensors, as the start-up report says it
        self.description = self.name

    @abstractmethod
    def form(self, store: Store, group_rank: int, size: int) -> None:
        """Join the group (every member calls this together, after the handshake)."""

    @abstractmethod
    def start(self, transfers: Sequence[Transfer], what: str) -> Wait:
        """Start ``transfers`` as one batch; the returned callable waits for all of them."""

    @abstractmethod
    def close(self) -> None:
        """Abort pending transfers and release the plane; safe to call twice."""


def ubatch_label(ubatch: int) -> str:
    """How messages name micro-batch ``ubatch`` (nothing for an unsplit step's only one)."""
    return f" (micro-batch {ubatch})" if ubatch else ""
