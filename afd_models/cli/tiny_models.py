"""Tiny random DeepSeek (V2, V3, V3.2, V4) and Qwen3-MoE checkpoints (HF layout) with a locally trained tokenizer.

Operators (``docs/user-guide.md``), the demo, ``verify``, benchmarks and tests build their models
here; nothing comes from a hub.

    python -m afd_models.cli.tiny_models OUT_DIR [--variant v2] [--seed 0] [--dtype bfloat16]
        [--margin-scale 1.0]

Each variant is a small config that exercises one part of vLLM's DeepSeek or Qwen3-MoE code path.
Tensor names follow the original checkpoints (per-expert ``experts.E.{gate,up,down}_proj``;
DeepSeek's ``q_a_proj``/``kv_a_proj_with_mqa``/``kv_b_proj``, ``e_score_correction_bias``;
Qwen3's ``q_norm``/``k_norm``), so vLLM's real loader (stacked projections, expert mapping) runs
on them. With MLA disabled (``VLLM_MLA_DISABLE=1``, required on CPU) DeepSeek's attention head
size is ``qk_nope_head_dim + qk_rope_head_dim`` and must be one CPU attention supports (64 here).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from afd_models.cli.hf_config import (
    effective_config,
    is_deepseek_v4,
    is_moe_layer,
    is_qwen3_moe,
    routed_experts,
    uses_mha,
)
from afd_models.commandline import CommandParser

#: The config every variant starts from: DeepSeek-V2 style, 3 layers (1 dense + 2 MoE).
BASE_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "greedy",
    "scoring_func": "softmax",
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.0,
    "q_lora_rank": 96,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 32,
    "v_head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 3,
    "initializer_range": 0.02,
    "use_cache": True,
}

#: The config the Qwen3-MoE variants start from: 3 layers, the first dense (``mlp_only_layers``),
#: grouped-query attention with per-head q/k norms, renormalized top-k, no shared experts.
QWEN3_MOE_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [0],
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 3,
    "initializer_range": 0.02,
    "use_cache": True,
}

#: DeepSeek-V4 (vLLM 0.30+, ``vllm/models/deepseek_v4``), at the smallest sizes vLLM's CPU kernels
#: take (docs/reports/deepseek-v4-on-cpu.md): layer 0 routes by token id (``num_hash_layers``),
#: layers 1 and 2 by bias-corrected scores; the layers' attention is sliding-window only,
#: compressed 4x with the sparse indexer, and compressed 128x (``compress_ratios``).
DEEPSEEK_V4_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "vocab_size": 512,
    "hidden_size": 256,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 128,
    "o_lora_rank": 128,
    "o_groups": 2,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "n_shared_experts": 1,
    "num_hash_layers": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "index_head_dim": 128,
    "index_n_heads": 4,
    "index_topk": 512,
    "compress_ratios": [0, 4, 128],
    "sliding_window": 128,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "initializer_range": 0.02,
}

#: A variant value that removes the key from the config.
ABSENT = object()

#: DeepSeek-V3's changes to the base config, which V3.2 shares.
V3_CHANGES: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "n_group": 4,
    "topk_group": 2,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
}

#: Named variants: the config each starts from and the changes it makes to it.
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # DeepSeek-V2: softmax greedy routing, one shared expert.
    "v2": (BASE_CONFIG, {}),
    # DeepSeek-V3: sigmoid scores with correction bias (noaux_tc), grouped top-k over 4 groups,
    # renormalized top-k weights and a routed scaling factor.
    "v3": (BASE_CONFIG, V3_CHANGES),
    # DeepSeek-V3.2: V3 with the sparse-attention (DSA) indexer's fields and weights; vLLM 0.30+
    # serves it with a CUDA class of its own, whose attention the CPU platform cannot build.
    "v32": (
        BASE_CONFIG,
        {
            **V3_CHANGES,
            "architectures": ["DeepseekV32ForCausalLM"],
            "model_type": "deepseek_v32",
            "index_topk": 64,
            "index_n_heads": 4,
            "index_head_dim": 32,
        },
    ),
    # V2-Lite style: no q LoRA, two dense layers first, `n_shared_experts` absent from the config
    # (the HF config class supplies its default), renormalized top-k, a routed scaling factor.
    "v2-lite": (
        BASE_CONFIG,
        {
            "num_hidden_layers": 4,
            "first_k_dense_replace": 2,
            "n_shared_experts": ABSENT,
            "q_lora_rank": None,
            "norm_topk_prob": True,
            "routed_scaling_factor": 1.5,
        },
    ),
    # Grouped greedy routing with two shared experts.
    "v2-grouped": (
        BASE_CONFIG,
        {
            "topk_method": "group_limited_greedy",
            "n_group": 2,
            "topk_group": 1,
            "n_shared_experts": 2,
        },
    ),
    # Qwen3-MoE: one dense layer (mlp_only_layers), two MoE layers.
    "qwen3-moe": (QWEN3_MOE_CONFIG, {}),
    # DeepSeek-V4: a hash-routed MoE layer and two scored ones (vLLM 0.30+).
    "v4": (DEEPSEEK_V4_CONFIG, {}),
    # Qwen3-MoE with every second layer dense (decoder_sparse_step), plain softmax top-3 weights.
    "qwen3-moe-sparse": (
        QWEN3_MOE_CONFIG,
        {
            "num_hidden_layers": 4,
            "decoder_sparse_step": 2,
            "mlp_only_layers": [],
            "num_experts": 6,
            "num_experts_per_tok": 3,
            "norm_topk_prob": False,
        },
    ),
}

SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<pad>")

# Text the tokenizer is trained on: our own words, fixed, so every build gives the same vocabulary.
_CORPUS = """
Attention-FFN disaggregation serves one mixture-of-experts model as two cooperating deployments.
The attention ranks own the scheduler, the key-value cache and the attention layers; the FFN ranks
own the experts. For every MoE layer the hidden states cross a connector and come back, and the
router logits travel with them when the gate runs on the attention side. A tiny model keeps the
tests fast: a few layers, a handful of experts, random weights from a fixed seed, and a small
byte-level vocabulary trained on this very paragraph. The quick brown fox jumps over the lazy dog.
Hello world, the license grants permission to use, copy, modify and distribute this software.
Numbers like 0 1 2 3 4 5 6 7 8 9 10 100 1000 and words like model, layer, expert, token, batch,
prefill, decode, sample, greedy, request, response, server, client, engine, worker, runner, rank,
tensor, shape, dtype, float, bfloat16, float32, connector, gloo, process, group, timeout, error.
"""


def tiny_config(variant: str = "v2", overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The HF config dict of a variant, with optional key overrides.

    Raises:
        ValueError: unknown variant name.
    """
    if variant not in VARIANTS:
        raise ValueError(
            f"variant={variant!r} is not a tiny model variant; allowed: {sorted(VARIANTS)}"
        )
    base, changes = VARIANTS[variant]
    config = {**base, **changes}
    config.update(overrides or {})
    return {key: value for key, value in config.items() if value is not ABSENT}


def build_weights(
    config: Mapping[str, Any], seed: int, dtype: str = "bfloat16", margin_scale: float = 1.0
) -> dict[str, Any]:
    """Random checkpoint tensors for ``config``, reproducible from ``seed``.

    ``margin_scale`` multiplies the output head and the MoE router weights. With the default
    initializer a random model has near-tied logits and near-tied expert scores, so greedy tokens
    (and expert choices) depend on the last bits of batch-shape dependent rounding; a scale of
    ~50 makes both decisions robust, and greedy decoding a stable signal for end-to-end tests
    whose batches may be formed differently.
    """
    import torch

    if is_deepseek_v4(config):
        return _deepseek_v4_weights(config, seed, dtype, margin_scale)
    generator = torch.Generator().manual_seed(seed)
    torch_dtype = getattr(torch, dtype)
    std = config["initializer_range"]
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    heads = config["num_attention_heads"]
    qk_head = config.get("qk_nope_head_dim", 0) + config.get("qk_rope_head_dim", 0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * std).to(torch_dtype)

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, dtype=torch_dtype)

    weights: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": rand(vocab, hidden),
        "model.norm.weight": ones(hidden),
        "lm_head.weight": (rand(vocab, hidden).float() * margin_scale).to(torch_dtype),
    }
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        weights[prefix + "input_layernorm.weight"] = ones(hidden)
        weights[prefix + "post_attention_layernorm.weight"] = ones(hidden)
        attn = prefix + "self_attn."
        if uses_mha(config):
            head_dim = config.get("head_dim") or hidden // heads
            kv_heads = config.get("num_key_value_heads", heads)
            weights[attn + "q_proj.weight"] = rand(heads * head_dim, hidden)
            weights[attn + "k_proj.weight"] = rand(kv_heads * head_dim, hidden)
            weights[attn + "v_proj.weight"] = rand(kv_heads * head_dim, hidden)
            weights[attn + "o_proj.weight"] = rand(hidden, heads * head_dim)
            if is_qwen3_moe(config):
                weights[attn + "q_norm.weight"] = ones(head_dim)
                weights[attn + "k_norm.weight"] = ones(head_dim)
                if config.get("attention_bias"):
                    weights[attn + "q_proj.bias"] = rand(heads * head_dim)
                    weights[attn + "k_proj.bias"] = rand(kv_heads * head_dim)
                    weights[attn + "v_proj.bias"] = rand(kv_heads * head_dim)
        elif config.get("q_lora_rank") is None:
            weights[attn + "q_proj.weight"] = rand(heads * qk_head, hidden)
        else:
            weights[attn + "q_a_proj.weight"] = rand(config["q_lora_rank"], hidden)
            weights[attn + "q_a_layernorm.weight"] = ones(config["q_lora_rank"])
            weights[attn + "q_b_proj.weight"] = rand(heads * qk_head, config["q_lora_rank"])
        if not uses_mha(config):
            rope, nope, v_dim, kv_rank = (
                config["qk_rope_head_dim"],
                config["qk_nope_head_dim"],
                config["v_head_dim"],
                config["kv_lora_rank"],
            )
            weights[attn + "kv_a_proj_with_mqa.weight"] = rand(kv_rank + rope, hidden)
            weights[attn + "kv_a_layernorm.weight"] = ones(kv_rank)
            weights[attn + "kv_b_proj.weight"] = rand(heads * (nope + v_dim), kv_rank)
            weights[attn + "o_proj.weight"] = rand(hidden, heads * v_dim)
        if "index_topk" in config:  # DeepSeek-V3.2's sparse-attention indexer
            indexer, index_dim = attn + "indexer.", config["index_head_dim"]
            index_heads = config["index_n_heads"]
            weights[indexer + "wq_b.weight"] = rand(index_heads * index_dim, config["q_lora_rank"])
            weights[indexer + "wk.weight"] = rand(index_dim, hidden)
            weights[indexer + "weights_proj.weight"] = rand(index_heads, hidden)
            weights[indexer + "k_norm.weight"] = ones(index_dim)
            weights[indexer + "k_norm.bias"] = torch.zeros(index_dim, dtype=torch_dtype)
        mlp = prefix + "mlp."
        if not is_moe_layer(config, layer):
            inner = config["intermediate_size"]
            weights[mlp + "gate_proj.weight"] = rand(inner, hidden)
            weights[mlp + "up_proj.weight"] = rand(inner, hidden)
            weights[mlp + "down_proj.weight"] = rand(hidden, inner)
            continue
        experts, inner = routed_experts(config), config["moe_intermediate_size"]
        assert experts is not None, "an MoE layer has routed experts (is_moe_layer)"
        weights[mlp + "gate.weight"] = (rand(experts, hidden).float() * margin_scale).to(
            torch_dtype
        )
        if config.get("topk_method") == "noaux_tc":
            bias = torch.randn(experts, generator=generator) * 0.1
            weights[mlp + "gate.e_score_correction_bias"] = bias.to(torch.float32)
        for expert in range(experts):
            name = f"{mlp}experts.{expert}."
            weights[name + "gate_proj.weight"] = rand(inner, hidden)
            weights[name + "up_proj.weight"] = rand(inner, hidden)
            weights[name + "down_proj.weight"] = rand(hidden, inner)
        if config.get("n_shared_experts"):
            shared = inner * config["n_shared_experts"]
            weights[mlp + "shared_experts.gate_proj.weight"] = rand(shared, hidden)
            weights[mlp + "shared_experts.up_proj.weight"] = rand(shared, hidden)
            weights[mlp + "shared_experts.down_proj.weight"] = rand(hidden, shared)
    return weights


def _deepseek_v4_weights(
    config: Mapping[str, Any], seed: int, dtype: str, margin_scale: float
) -> dict[str, Any]:
    """DeepSeek-V4's checkpoint tensors in the original names (vLLM's V4 weights mapper reads
    them): the multi-stream (``hc``) mixing, MLA with its output LoRA groups and sinks, each
    compressed layer's compressor (and the 4x layers' indexer), the MoE gate with its hash
    table (hash layers) or score bias (the others), shared and routed experts ``w1``/``w2``/``w3``.
    The mixing, sink, compressor position and gate bias tensors are float32, as vLLM keeps them."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    torch_dtype = getattr(torch, dtype)
    std = config["initializer_range"]
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    heads, head_dim = config["num_attention_heads"], config["head_dim"]
    q_rank, o_rank, o_groups = config["q_lora_rank"], config["o_lora_rank"], config["o_groups"]
    streams = config["hc_mult"]
    mix = (2 + streams) * streams  # per stream: pre and post weights, and the stream mixing
    experts, top_k = config["n_routed_experts"], config["num_experts_per_tok"]
    inner = config["moe_intermediate_size"]
    index_heads, index_dim = config["index_n_heads"], config["index_head_dim"]

    def rand(*shape: int, scale: float = 1.0, float32: bool = False) -> torch.Tensor:
        values = torch.randn(*shape, generator=generator) * std * scale
        return values if float32 else values.to(torch_dtype)

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, dtype=torch_dtype)

    def hc(prefix: str, rows: int, scales: int) -> dict[str, torch.Tensor]:
        return {
            prefix + "_fn": rand(rows, streams * hidden, float32=True),
            prefix + "_base": rand(rows, float32=True),
            prefix + "_scale": torch.ones(scales),
        }

    def compressor(prefix: str, ratio: int, dim: int) -> dict[str, torch.Tensor]:
        width = (2 if ratio == 4 else 1) * dim  # 4x compression overlaps its windows
        return {
            prefix + "wkv.weight": rand(width, hidden),
            prefix + "wgate.weight": rand(width, hidden),
            prefix + "ape": rand(ratio, width, float32=True),
            prefix + "norm.weight": ones(dim),
        }

    weights: dict[str, torch.Tensor] = {
        "embed.weight": rand(vocab, hidden),
        "head.weight": rand(vocab, hidden, scale=margin_scale),
        "norm.weight": ones(hidden),
        **hc("hc_head", streams, 1),
    }
    for layer in range(config["num_hidden_layers"]):
        prefix = f"layers.{layer}."
        weights |= hc(prefix + "hc_attn", mix, 3) | hc(prefix + "hc_ffn", mix, 3)
        weights[prefix + "attn_norm.weight"] = ones(hidden)
        weights[prefix + "ffn_norm.weight"] = ones(hidden)
        attn = prefix + "attn."
        weights |= {
            attn + "wq_a.weight": rand(q_rank, hidden),
            attn + "q_norm.weight": ones(q_rank),
            attn + "wq_b.weight": rand(heads * head_dim, q_rank),
            attn + "wkv.weight": rand(head_dim, hidden),
            attn + "kv_norm.weight": ones(head_dim),
            attn + "wo_a.weight": rand(o_groups * o_rank, heads * head_dim // o_groups),
            attn + "wo_b.weight": rand(hidden, o_groups * o_rank),
            attn + "attn_sink": rand(heads, float32=True),
        }
        ratio = config["compress_ratios"][layer]
        if ratio > 1:
            weights |= compressor(attn + "compressor.", ratio, head_dim)
        if ratio == 4:
            indexer = attn + "indexer."
            weights[indexer + "wq_b.weight"] = rand(index_heads * index_dim, q_rank)
            weights[indexer + "weights_proj.weight"] = rand(index_heads, hidden)
            weights |= compressor(indexer + "compressor.", ratio, index_dim)
        ffn = prefix + "ffn."
        weights[ffn + "gate.weight"] = rand(experts, hidden, scale=margin_scale)
        if layer < config["num_hash_layers"]:
            table = torch.randint(0, experts, (vocab, top_k), generator=generator)
            weights[ffn + "gate.tid2eid"] = table.to(torch.int32)
        else:
            weights[ffn + "gate.bias"] = rand(experts, scale=5.0, float32=True)
        shared = inner * config["n_shared_experts"]
        weights[ffn + "shared_experts.w1.weight"] = rand(shared, hidden)
        weights[ffn + "shared_experts.w3.weight"] = rand(shared, hidden)
        weights[ffn + "shared_experts.w2.weight"] = rand(hidden, shared)
        for expert in range(experts):
            name = f"{ffn}experts.{expert}."
            weights[name + "w1.weight"] = rand(inner, hidden)
            weights[name + "w3.weight"] = rand(inner, hidden)
            weights[name + "w2.weight"] = rand(hidden, inner)
    return weights


def build_tokenizer(out_dir: Path, vocab_size: int) -> int:
    """Train a byte-level BPE tokenizer on the fixed corpus and save it; returns its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS.strip().splitlines(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    fast.save_pretrained(str(out_dir))
    return int(tokenizer.get_vocab_size())


def write_tiny_model(
    out_dir: str | Path,
    variant: str = "v2",
    *,
    seed: int = 0,
    dtype: str = "bfloat16",
    overrides: Mapping[str, Any] | None = None,
    margin_scale: float = 1.0,
) -> Path:
    """Write config, safetensors weights, tokenizer and generation config to ``out_dir``.

    Returns:
        The model directory, ready for ``vllm serve`` / ``vllm.LLM``.
    """
    return write_checkpoint(
        out_dir, tiny_config(variant, overrides), seed=seed, dtype=dtype, margin_scale=margin_scale
    )


def write_checkpoint(
    out_dir: str | Path,
    config: Mapping[str, Any],
    *,
    seed: int = 0,
    dtype: str = "bfloat16",
    margin_scale: float = 1.0,
) -> Path:
    """Write ``config`` with random weights (reproducible from ``seed``) and the local tokenizer."""
    from safetensors.torch import save_file

    if dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype={dtype!r} is not supported; allowed: bfloat16, float16, float32")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {**config, "torch_dtype": dtype}
    token_count = build_tokenizer(out, config["vocab_size"])
    if token_count > config["vocab_size"]:
        raise ValueError(
            f"tokenizer has {token_count} tokens, more than vocab_size={config['vocab_size']}"
        )
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": 0, "eos_token_id": 1, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    # transformers has no DeepSeek-V4 config class (vLLM brings its own): its config is complete
    full = config if is_deepseek_v4(config) else effective_config(config)
    weights = build_weights(full, seed, dtype, margin_scale)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="python -m afd_models.cli.tiny_models",
        description="Write a tiny random DeepSeek or Qwen3-MoE checkpoint (weights, config, local tokenizer).",
    )
    parser.add_argument("out_dir", type=Path, help="directory to write; created if missing")
    parser.add_argument("--variant", default="v2", choices=sorted(VARIANTS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument(
        "--margin-scale",
        type=float,
        default=1.0,
        help="multiply the output head and the MoE routers, widening the margins of greedy tokens "
        "and expert choices (50 makes them robust to batch-dependent rounding; see build_weights)",
    )
    args = parser.parse_args(argv)
    if not args.margin_scale > 0:
        parser.error(f"--margin-scale={args.margin_scale} is not allowed; allowed: a number > 0")
    path = write_tiny_model(
        args.out_dir, args.variant, seed=args.seed, dtype=args.dtype, margin_scale=args.margin_scale
    )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
