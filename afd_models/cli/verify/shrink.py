"""A small config with the same routing structure as a big one, for ``verify --shrink``.

DeepSeek keeps its routing method, groups, correction bias, shared experts, dense-layer count and
scaling; Qwen3-MoE its top-k normalization, sparse step and dense layers. Sizes (hidden, experts,
layers, vocabulary, heads) shrink to what a CPU runs in seconds.
"""

from __future__ import annotations

from typing import Any

from afd_models.cli.hf_config import is_qwen3_moe, uses_mha


def shrink(config: dict[str, Any]) -> dict[str, Any]:
    """A small config with the same routing structure (see the module docstring)."""
    if is_qwen3_moe(config):
        return _shrink_qwen3_moe(config)
    small = dict(config)
    groups = config.get("n_group") or 1
    experts = max(groups * 2, min(config["n_routed_experts"], 16) // groups * groups)
    small.update(
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=512,
        n_routed_experts=experts,
        num_experts_per_tok=min(config["num_experts_per_tok"], experts // 2),
        num_hidden_layers=min(config["num_hidden_layers"], config["first_k_dense_replace"] + 2),
        max_position_embeddings=2048,
        rope_scaling=None,
    )
    if not uses_mha(config):
        small.update(qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32, kv_lora_rank=64)
        if config.get("q_lora_rank") is not None:
            small["q_lora_rank"] = 96
    small.pop("quantization_config", None)
    return small


def _shrink_qwen3_moe(config: dict[str, Any]) -> dict[str, Any]:
    experts = max(2, min(config["num_experts"], 16))
    step = config.get("decoder_sparse_step", 1)
    layers = min(config["num_hidden_layers"], max(4, 2 * step))
    grouped = config.get("num_key_value_heads", 4) < config["num_attention_heads"]
    small = {
        **config,
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2 if grouped else 4,
        "head_dim": 64,
        "vocab_size": 512,
        "num_experts": experts,
        "num_experts_per_tok": min(config["num_experts_per_tok"], experts // 2),
        "num_hidden_layers": layers,
        "mlp_only_layers": [i for i in config.get("mlp_only_layers") or [] if i < layers],
        "max_position_embeddings": 2048,
        "rope_scaling": None,
    }
    small.pop("quantization_config", None)
    return small
