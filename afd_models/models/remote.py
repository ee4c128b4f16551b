"""Parameter-free stand-ins for the parts of the model that run on the FFN role.

On the Attention role the generated model of every family puts a :class:`RemoteExperts` where
vLLM's ``FusedMoE`` experts would be, and (DeepSeek, when the gate, and with it the dense MLPs,
runs on the FFN role) a :class:`RemoteFFN` where a dense ``DeepseekV2MLP`` would be.
vLLM's native MoE block and decoder layer forwards (``DeepseekV2MoE``, ``Qwen3MoeSparseMoeBlock``
...) run unchanged and call them like the modules they replace; they send the activations (and the router logits when
the gate runs on Attention) through the connector and return what the FFN role computed.

Their forward is one call of the ``afd::exchange`` custom op (:mod:`afd_models.ops`), which
vLLM's compiler treats as opaque; the op finds the proxy again by its module prefix, under which
each proxy registers in the engine's ``static_forward_context`` when it is built.

They derive from vLLM's ``PPMissingLayer``: to vLLM's loader and pipeline utilities they are
layers this process does not own, which is exactly the case, so checkpoint tensors under them are
skipped by vLLM's own rules.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn
from vllm.config import get_current_vllm_config
from vllm.model_executor.models.utils import PPMissingLayer, extract_layer_index
from vllm.v1.worker.ubatching import dbo_current_ubatch_id, dbo_yield

from afd_models.ops import exchange

if TYPE_CHECKING:
    from afd_models.connectors.base import AFDConnector


class RemoteFFN(PPMissingLayer):
    """The FFN part of the layer at module path ``prefix``, computed by the FFN role."""

    def __init__(self, prefix: str):
        super().__init__()
        self.layer_name = prefix
        self.layer_idx = extract_layer_index(prefix)
        self.connector: AFDConnector | None = None
        # How the exchange op finds this proxy (vLLM's attention and MoE layers register alike).
        layers = get_current_vllm_config().compilation_config.static_forward_context
        if prefix in layers:
            raise ValueError(f"duplicate layer name {prefix!r} in the static forward context")
        layers[prefix] = self

    def extra_repr(self) -> str:
        return f"layer_name={self.layer_name!r}"

    def exchange(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor | None,
        token_ids: torch.Tensor | None,
    ) -> torch.Tensor:
        """Send through the connector and receive (what the ``afd::exchange`` op runs); the
        tokens' ids go along only if this layer routes by them (the connector's token-id
        layers: a model's forward may hand them to every MoE layer)."""
        if self.connector is None:
            raise RuntimeError(
                f"layer {self.layer_idx}: no AFD connector is bound; the AFD Attention runner binds one "
                "after loading the model (afd_models.models.remote.bind_connector)"
            )
        # under vLLM's DBO each micro-batch runs in a thread of its own (else: micro-batch 0)
        ubatch = dbo_current_ubatch_id()
        if self.layer_idx not in self.connector.token_id_layers:
            token_ids = None
        self.connector.send(
            self.layer_idx, hidden_states, router_logits, ubatch, token_ids=token_ids
        )
        # the other micro-batch computes while the FFN role computes this one's layer (a no-op
        # without DBO)
        dbo_yield()
        return self.connector.recv(self.layer_idx, hidden_states, ubatch)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return exchange(hidden_states, None, None, self.layer_name)


class RemoteExperts(RemoteFFN):
    """Shaped like vLLM's MoE runner at the ``self.experts`` boundary of a MoE block.

    It reports an internal router, so vLLM's native MoE forward passes it the hidden states (vLLM
    0.26 picks that branch by ``is_internal_router``; 0.28's runner always routes internally).
    With the gate on Attention it is given the MoE block's gate, runs it, and sends the router
    logits too; with the gate on FFN it sends the hidden states only.
    """

    is_internal_router = True

    def __init__(self, prefix: str, *, gate: nn.Module | None):
        super().__init__(prefix)
        # the MoE block's own gate (its parameters keep their checkpoint names under the block)
        self.gate = gate

    def forward(  # type: ignore[override]
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor,
        input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``input_ids``: the tokens' ids, which a family whose MoE layers may route by token id
        passes (DeepSeek-V4); they cross only for the layers that do."""
        logits = None if self.gate is None else self.gate(hidden_states)[0]
        return exchange(hidden_states, logits, input_ids, self.layer_name)

    def update_expert_map(self) -> None:
        """EPLB hook of the MoE runner interface: the experts are remote, nothing to remap here."""


def remote_dense_mlp(*, prefix: str, **_: object) -> RemoteFFN:
    """Stands in for ``DeepseekV2MLP(...)`` of a dense layer computed by the FFN role."""
    return RemoteFFN(prefix)


def remote_layers(model: nn.Module) -> Iterator[RemoteFFN]:
    for module in model.modules():
        if isinstance(module, RemoteFFN):
            yield module


def bind_connector(model: nn.Module, connector: AFDConnector) -> list[int]:
    """Give every proxy of ``model`` the connector; returns the remote layer indices, in order."""
    layers = []
    for proxy in remote_layers(model):
        proxy.connector = connector
        layers.append(proxy.layer_idx)
    return layers
