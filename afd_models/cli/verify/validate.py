"""Refuse a config ``verify`` cannot check on the CPU platform, naming the field and the fix.

A config must be of an architecture with an AFD model, carry the fields its family needs, be
accepted by transformers' own config class, run on vLLM's CPU platform (MLA disabled, a head size
CPU attention supports) and be small enough for a CPU (or be shrunk first: :mod:`.shrink`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from afd_models.cli.hf_config import (
    effective_config,
    is_moe_layer,
    is_qwen3_moe,
    routed_experts,
    uses_mha,
)
from afd_models.cli.verify.errors import VerifyError
from afd_models.freshness import installed_vllm
from afd_models.plugin import BY_NATIVE, afd_architecture, served_on

#: attention head sizes vLLM's CPU attention backend supports
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
MAX_PARAMS = 1_000_000_000
_COMMON = (
    "architectures",
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "intermediate_size",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "rms_norm_eps",
)
REQUIRED = (*_COMMON, "n_routed_experts", "first_k_dense_replace")
QWEN3_MOE_REQUIRED = (*_COMMON, "num_experts")
MLA_FIELDS = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank")


def load_config(path: Path) -> dict[str, Any]:
    file = path / "config.json" if path.is_dir() else path
    try:
        config: dict[str, Any] = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise VerifyError(f"--hf-config {path}: cannot read a JSON config: {exc}") from exc
    return config


def check_fields(config: dict[str, Any]) -> None:
    """Refuse an architecture without an AFD model, or a config without the fields its family
    needs (before ``--shrink``, which reads them)."""
    architectures = config.get("architectures") or []
    vllm_version = installed_vllm()
    if vllm_version is None:
        raise VerifyError("vLLM is not installed here; verify runs in a CPU env with vLLM")
    served = served_on(vllm_version)
    if len(architectures) == 1 and architectures[0] in BY_NATIVE:
        # served on this release and the CPU platform, or refused saying why not
        try:
            afd_architecture(architectures[0], vllm_version, "cpu")
        except ValueError as exc:
            raise VerifyError(f"architectures={architectures!r}: {exc}") from None
    if len(architectures) != 1 or architectures[0] not in served:
        raise VerifyError(
            f"architectures={architectures!r} is not an architecture with an AFD model; "
            f"allowed: one of {sorted(served)}"
        )
    qwen3 = architectures[0] == "Qwen3MoeForCausalLM"
    if qwen3 != is_qwen3_moe(config):
        raise VerifyError(
            f"model_type={config.get('model_type')!r} does not match architectures={architectures!r}"
            + ("; allowed: 'qwen3_moe'" if qwen3 else "")
        )
    if qwen3:
        missing = [key for key in QWEN3_MOE_REQUIRED if key not in config]
    else:
        missing = [key for key in REQUIRED if key not in config]
        if not uses_mha(config):
            missing += [key for key in MLA_FIELDS if key not in config]
    if missing:
        family = "Qwen3-MoE" if qwen3 else f"DeepSeek {config.get('model_type')!r}"
        raise VerifyError(f"the config lacks {missing}, which a {family} config needs")


def validate(config: dict[str, Any], *, mla_disabled: bool) -> None:
    """Refuse what cannot be verified on the CPU platform, naming the field and the fix."""
    check_fields(config)
    if is_qwen3_moe(config):
        _validate_qwen3_moe(config)
        return
    if "index_topk" in config:
        raise VerifyError(
            "index_topk is set: DeepSeek-V3.2 sparse attention cannot run on vLLM's CPU platform"
        )
    if config["n_routed_experts"] is None:
        raise VerifyError(
            "n_routed_experts=None: the model has no MoE layers, AFD has nothing to split"
        )
    transformers_accepts(config)
    if not uses_mha(config):
        if not mla_disabled:
            raise VerifyError(
                "this is an MLA config, which vLLM's CPU platform cannot run: set VLLM_MLA_DISABLE=1"
            )
        head = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
        if head not in CPU_HEAD_SIZES:
            raise VerifyError(
                f"qk_nope_head_dim + qk_rope_head_dim = {head} is not a head size CPU attention supports "
                f"({', '.join(map(str, CPU_HEAD_SIZES))}); use --shrink"
            )
    experts, group = config["n_routed_experts"], config.get("n_group") or 1
    if experts % group:
        raise VerifyError(f"n_routed_experts={experts} is not a multiple of n_group={group}")
    if (config.get("topk_group") or 1) > group:
        raise VerifyError(f"topk_group={config.get('topk_group')} exceeds n_group={group}")


def _validate_qwen3_moe(config: dict[str, Any]) -> None:
    transformers_accepts(config)
    experts, top_k = config["num_experts"], config["num_experts_per_tok"]
    if not experts:
        raise VerifyError(
            f"num_experts={experts!r}: the model has no MoE layers, AFD has nothing to split"
        )
    if not 1 <= top_k <= experts:
        raise VerifyError(
            f"num_experts_per_tok={top_k} is not allowed; allowed: 1 to num_experts={experts}"
        )
    step = config.get("decoder_sparse_step", 1)
    if step < 1:
        raise VerifyError(f"decoder_sparse_step={step} is not allowed; allowed: an integer >= 1")
    layers = config["num_hidden_layers"]
    outside = [i for i in config.get("mlp_only_layers") or [] if not 0 <= i < layers]
    if outside:
        raise VerifyError(
            f"mlp_only_layers={config['mlp_only_layers']} names layers {outside} the model does not "
            f"have; allowed: 0 to {layers - 1}"
        )
    if not any(is_moe_layer(config, i) for i in range(layers)):
        raise VerifyError(
            f"decoder_sparse_step={step} and mlp_only_layers={config.get('mlp_only_layers')} leave "
            f"no MoE layer in {layers} layers: AFD has nothing to split"
        )
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if head not in CPU_HEAD_SIZES:
        raise VerifyError(
            f"head_dim={head} is not a head size CPU attention supports "
            f"({', '.join(map(str, CPU_HEAD_SIZES))}); use --shrink"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise VerifyError(
            f"hidden_act={config['hidden_act']!r} is not allowed (vLLM's Qwen3-MoE MLP); allowed: 'silu'"
        )


def transformers_accepts(config: dict[str, Any]) -> None:
    """Refuse, in one line naming the field, a config transformers' own config class rejects."""
    from huggingface_hub.errors import StrictDataclassError

    try:
        effective_config(config)
    except (ValueError, TypeError, KeyError, StrictDataclassError) as exc:
        reason = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        if len(reason) > 300:  # an unknown model_type lists every one transformers knows
            reason = reason[:300] + " ..."
        raise VerifyError(f"transformers rejects the config: {reason}") from None


def parameter_estimate(config: dict[str, Any]) -> int:
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    expert = 3 * hidden * config["moe_intermediate_size"]
    moe_layers = sum(is_moe_layer(config, i) for i in range(layers))
    per_moe = expert * ((routed_experts(config) or 0) + (config.get("n_shared_experts") or 0))
    dense = 3 * hidden * config["intermediate_size"] * (layers - moe_layers)
    return int(
        2 * config["vocab_size"] * hidden
        + moe_layers * per_moe
        + dense
        + layers * 4 * hidden * hidden
    )


def check_size(config: dict[str, Any]) -> None:
    """Refuse a config too big to verify on a CPU."""
    estimate = parameter_estimate(config)
    if estimate > MAX_PARAMS:
        raise VerifyError(
            f"about {estimate / 1e9:.1f}e9 parameters is too big to verify on a CPU; add --shrink"
        )
