"""What a DeepSeek or Qwen3-MoE HF config (``config.json`` as a dict) says about its model.

The family, the attention kind, the routed experts and which layers are MoE blocks, by the same
rules as vLLM's model code, plus the defaults transformers' config class fills in. The tiny model
builder and ``verify`` read configs through these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def effective_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config with the defaults its HF config class supplies for absent keys."""
    from transformers import AutoConfig

    values = {k: v for k, v in config.items() if k != "model_type"}
    resolved: dict[str, Any] = AutoConfig.for_model(config["model_type"], **values).to_dict()
    return {**resolved, **config}


def is_deepseek_v4(config: Mapping[str, Any]) -> bool:
    return config.get("model_type") == "deepseek_v4"


def is_qwen3_moe(config: Mapping[str, Any]) -> bool:
    return config.get("model_type") == "qwen3_moe"


def uses_mha(config: Mapping[str, Any]) -> bool:
    """Multi-head (not MLA) attention: Qwen3-MoE, DeepSeek-V1 style (same rule as vLLM's
    DeepseekV2DecoderLayer)."""
    return (
        is_qwen3_moe(config)
        or config.get("model_type") == "deepseek"
        or all(config.get(k, 0) == 0 for k in ("qk_nope_head_dim", "qk_rope_head_dim"))
    )


def routed_experts(config: Mapping[str, Any]) -> int | None:
    """The number of routed experts (``num_experts`` in Qwen3-MoE configs, which transformers
    resolves as ``num_local_experts``)."""
    experts: int | None
    if is_qwen3_moe(config):
        experts = config.get("num_experts", config.get("num_local_experts"))
    else:
        experts = config.get("n_routed_experts")
    return experts


def is_moe_layer(config: Mapping[str, Any], layer: int) -> bool:
    """Whether vLLM builds layer ``layer`` as an MoE block (same rules as vLLM's
    Qwen3MoeDecoderLayer and DeepseekV2DecoderLayer)."""
    if is_qwen3_moe(config):
        return bool(
            layer not in (config.get("mlp_only_layers") or [])
            and (routed_experts(config) or 0) > 0
            and (layer + 1) % config.get("decoder_sparse_step", 1) == 0
        )
    return bool(
        config.get("n_routed_experts") is not None
        and layer >= config["first_k_dense_replace"]
        and layer % config.get("moe_layer_freq", 1) == 0
    )
