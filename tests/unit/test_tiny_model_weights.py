"""The tiny DeepSeek-V4 and V3.2 checkpoints' tensors (vLLM's loaders read them in
``tests/cpu/test_deepseek_v4.py`` and ``test_deepseek_v32.py``; these are the layout rules they
cannot see fail one by one)."""

from __future__ import annotations

import torch

from afd_models.cli.hf_config import effective_config
from afd_models.cli.tiny_models import build_weights, tiny_config

CONFIG = tiny_config("v4")


def test_the_weights_are_reproducible_from_the_seed() -> None:
    first, again, other = (build_weights(CONFIG, seed) for seed in (0, 0, 1))
    assert first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["layers.1.ffn.gate.weight"], other["layers.1.ffn.gate.weight"])


def test_hash_layers_carry_a_table_and_the_others_a_score_bias() -> None:
    weights = build_weights(CONFIG, 0)
    table = weights["layers.0.ffn.gate.tid2eid"]
    assert table.dtype == torch.int32
    assert table.shape == (CONFIG["vocab_size"], CONFIG["num_experts_per_tok"])
    assert 0 <= int(table.min()) and int(table.max()) < CONFIG["n_routed_experts"]
    assert "layers.0.ffn.gate.bias" not in weights
    for layer in (1, 2):
        assert f"layers.{layer}.ffn.gate.tid2eid" not in weights
        assert weights[f"layers.{layer}.ffn.gate.bias"].dtype == torch.float32


def test_compressors_follow_the_ratios_and_only_4x_layers_have_an_indexer() -> None:
    weights = build_weights(CONFIG, 0)
    head_dim, index_dim = CONFIG["head_dim"], CONFIG["index_head_dim"]
    assert not any(name.startswith("layers.0.attn.compressor.") for name in weights)
    # 4x compression overlaps its windows: twice the width
    assert weights["layers.1.attn.compressor.ape"].shape == (4, 2 * head_dim)
    assert weights["layers.1.attn.indexer.compressor.wkv.weight"].shape[0] == 2 * index_dim
    assert weights["layers.2.attn.compressor.ape"].shape == (128, head_dim)
    assert not any(
        name.startswith(("layers.0.attn.indexer.", "layers.2.attn.indexer.")) for name in weights
    )


def test_the_margin_scale_widens_the_head_and_the_gates_only() -> None:
    plain, wide = build_weights(CONFIG, 0), build_weights(CONFIG, 0, margin_scale=50.0)
    for name in ("head.weight", "layers.2.ffn.gate.weight"):
        assert torch.allclose(wide[name].float(), plain[name].float() * 50, rtol=1e-2)
    assert torch.equal(wide["embed.weight"], plain["embed.weight"])


def test_the_v32_checkpoint_is_v3_plus_the_indexer_of_every_layer() -> None:
    v3, v32 = tiny_config("v3"), tiny_config("v32")
    v3_weights = build_weights(effective_config(v3), 0)
    v32_weights = build_weights(effective_config(v32), 0)
    indexer = {name for name in v32_weights if ".self_attn.indexer." in name}
    assert set(v32_weights) - indexer == set(v3_weights)
    dim, heads = v32["index_head_dim"], v32["index_n_heads"]
    for layer in range(v32["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.self_attn.indexer."
        assert v32_weights[prefix + "wq_b.weight"].shape == (heads * dim, v32["q_lora_rank"])
        assert v32_weights[prefix + "wk.weight"].shape == (dim, v32["hidden_size"])
        assert v32_weights[prefix + "weights_proj.weight"].shape == (heads, v32["hidden_size"])
        assert v32_weights[prefix + "k_norm.bias"].shape == (dim,)
