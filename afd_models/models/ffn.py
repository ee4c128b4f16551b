"""The FFN role's entry points, shared by every model family's generated classes.

The FFN server asks the causal LM which layers it computes (:func:`ffn_layers`), which of them
take token ids (:func:`token_id_layers`) and for one layer's output on received activations; a
family's MoE block answers with :func:`moe_output`.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.model_executor.models.utils import PPMissingLayer


def ffn_layers(model: nn.Module, block: str = "mlp") -> list[int]:
    """The layers of causal LM ``model`` whose MLP or MoE this role computes, in forward order;
    ``block``: the decoder layer's attribute that holds it (``ffn`` in DeepSeek-V4)."""
    return [
        index
        for index, layer in enumerate(model.model.layers)
        if not isinstance(layer, PPMissingLayer)
        and not isinstance(getattr(layer, block), PPMissingLayer)
    ]


def token_id_layers(model: nn.Module) -> list[int]:
    """The layers of causal LM ``model`` (either role) whose routing needs the tokens' ids, so
    that their exchange carries them: those its family declares by a ``token_id_layers()``
    method (DeepSeek-V4's hash-routed MoE layers), none for a family that declares none."""
    declared = getattr(model, "token_id_layers", None)
    return [] if declared is None else list(declared())


def moe_output(
    moe: nn.Module,
    hidden_states: torch.Tensor,
    router_logits: torch.Tensor | None,
    token_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """MoE block ``moe``'s output for received hidden states, routed by its own gate, or by the
    received router logits when the gate runs on Attention (its experts then take an external
    router). ``token_ids``: the tokens' ids at a layer that routes by them (DeepSeek-V4's hash
    layers), passed as the block's forward and experts take them (``input_ids``)."""
    by_ids = {} if token_ids is None else {"input_ids": token_ids}
    if router_logits is None:
        output: torch.Tensor = moe.forward(hidden_states, **by_ids)
        return output
    num_tokens, hidden_dim = hidden_states.shape
    output = moe.experts(
        hidden_states=hidden_states.view(-1, hidden_dim), router_logits=router_logits, **by_ids
    )
    return output.view(num_tokens, hidden_dim)
