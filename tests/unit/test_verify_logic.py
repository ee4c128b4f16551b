"""afd_models.cli.verify without running vLLM: config validation, shrinking, the comparison."""

from __future__ import annotations

import pytest
import torch

from afd_models.cli.tiny_models import VARIANTS, tiny_config
from afd_models.cli.verify.capture import Capture
from afd_models.cli.verify.compare import compare
from afd_models.cli.verify.errors import VerifyError
from afd_models.cli.verify.shrink import shrink
from afd_models.cli.verify.validate import parameter_estimate, validate


@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - {"v32", "v4"}))
def test_tiny_variants_are_valid(variant: str) -> None:
    validate(tiny_config(variant), mla_disabled=True)


@pytest.mark.parametrize(
    ("variant", "fragment"),
    [
        # served with vLLM's own V4 from 0.30, which runs no step on the CPU releases
        ("v4", r"^architectures=\['DeepseekV4ForCausalLM'\]: "),
        # before 0.30 its sparse attention, from 0.30 its own CUDA class
        ("v32", r"V3.2 sparse attention|'DeepseekV32ForCausalLM' has an AFD model for vLLM's cuda"),
    ],
)
def test_the_variants_verify_cannot_run_are_refused_naming_why(variant: str, fragment: str) -> None:
    with pytest.raises(VerifyError, match=fragment):
        validate(tiny_config(variant), mla_disabled=True)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, "not an architecture with an AFD model"),
        ({"n_routed_experts": None}, "no MoE layers"),
        ({"index_topk": 2048}, "V3.2 sparse attention"),
        ({"qk_rope_head_dim": 40}, "head size"),
        ({"n_group": 3}, "not a multiple of n_group"),
        ({"topk_group": 2}, "exceeds n_group"),
        # transformers 5 refuses it; the one line names the field
        (
            {"n_shared_experts": None},
            "^transformers rejects the config: Validation error for field 'n_shared_experts'",
        ),
    ],
)
def test_bad_configs_are_refused(change: dict, fragment: str) -> None:
    config = {**tiny_config("v2"), **change}
    with pytest.raises(VerifyError, match=fragment):
        validate(config, mla_disabled=True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"architectures": ["LlamaForCausalLM"]},
            "architectures=['LlamaForCausalLM'] is not an architecture with an AFD model; allowed: one of "
            "['DeepseekForCausalLM', 'DeepseekV2ForCausalLM', 'DeepseekV32ForCausalLM', "
            "'DeepseekV3ForCausalLM', 'Qwen3MoeForCausalLM']",
        ),
        (
            {"model_type": "qwen2_moe"},
            "model_type='qwen2_moe' does not match architectures=['Qwen3MoeForCausalLM']; allowed: 'qwen3_moe'",
        ),
        (
            {"num_experts": 0},
            "num_experts=0: the model has no MoE layers, AFD has nothing to split",
        ),
        (
            {"num_experts_per_tok": 9},
            "num_experts_per_tok=9 is not allowed; allowed: 1 to num_experts=8",
        ),
        (
            {"decoder_sparse_step": 0},
            "decoder_sparse_step=0 is not allowed; allowed: an integer >= 1",
        ),
        (
            {"mlp_only_layers": [0, 7]},
            "mlp_only_layers=[0, 7] names layers [7] the model does not have; allowed: 0 to 2",
        ),
        (
            {"mlp_only_layers": [0, 1, 2]},
            "decoder_sparse_step=1 and mlp_only_layers=[0, 1, 2] leave no MoE layer in 3 layers: "
            "AFD has nothing to split",
        ),
        ({"head_dim": 48}, "head_dim=48 is not a head size CPU attention supports"),
        (
            {"hidden_act": "gelu"},
            "hidden_act='gelu' is not allowed (vLLM's Qwen3-MoE MLP); allowed: 'silu'",
        ),
        (
            {"num_experts_per_tok": "two"},
            "transformers rejects the config: Validation error for field 'num_experts_per_tok': TypeError:",
        ),
        (
            {"mlp_only_layers": "0"},
            "transformers rejects the config: Validation error for field 'mlp_only_layers': TypeError:",
        ),
    ],
)
def test_bad_qwen3_moe_configs_are_refused_in_one_line(change: dict, message: str) -> None:
    with pytest.raises(VerifyError) as refused:
        validate({**tiny_config("qwen3-moe"), **change}, mla_disabled=True)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_missing_qwen3_moe_fields_are_named() -> None:
    config = tiny_config("qwen3-moe")
    del config["num_experts"]
    with pytest.raises(
        VerifyError, match=r"lacks \['num_experts'\], which a Qwen3-MoE config needs"
    ):
        validate(config, mla_disabled=True)


def test_shrink_keeps_qwen3_moe_structure() -> None:
    """A Qwen3-MoE-235B-sized config shrinks to a CPU-sized one with the same routing structure."""
    big = {
        **tiny_config("qwen3-moe"),
        "hidden_size": 4096,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 94,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "moe_intermediate_size": 1536,
        "intermediate_size": 12288,
        "vocab_size": 151936,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [0, 3, 90],
        "norm_topk_prob": False,
    }
    assert parameter_estimate(big) > 1e9
    small = shrink(big)
    validate(small, mla_disabled=True)
    assert parameter_estimate(small) < 1e8
    assert (small["decoder_sparse_step"], small["norm_topk_prob"]) == (2, False)
    assert (small["num_hidden_layers"], small["mlp_only_layers"]) == (4, [0, 3])
    assert (small["num_experts"], small["num_experts_per_tok"], small["num_key_value_heads"]) == (
        16,
        8,
        2,
    )


def test_missing_fields_are_named() -> None:
    config = tiny_config("v2")
    del config["moe_intermediate_size"], config["kv_lora_rank"]
    with pytest.raises(VerifyError, match=r"\['moe_intermediate_size', 'kv_lora_rank'\]"):
        validate(config, mla_disabled=True)


def test_mla_needs_the_cpu_switch() -> None:
    with pytest.raises(VerifyError, match="VLLM_MLA_DISABLE=1"):
        validate(tiny_config("v3"), mla_disabled=False)


def test_shrink_keeps_structure() -> None:
    """A DeepSeek-V3-sized config shrinks to a CPU-sized one with the same routing structure."""
    big = {
        **tiny_config("v3"),
        "hidden_size": 7168,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "n_group": 8,
        "topk_group": 4,
        "num_hidden_layers": 61,
        "first_k_dense_replace": 3,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "moe_intermediate_size": 2048,
        "intermediate_size": 18432,
        "vocab_size": 129280,
    }
    assert parameter_estimate(big) > 1e9
    small = shrink(big)
    validate(small, mla_disabled=True)
    assert parameter_estimate(small) < 1e8
    for key in (
        "topk_method",
        "scoring_func",
        "n_group",
        "topk_group",
        "first_k_dense_replace",
        "routed_scaling_factor",
    ):
        assert small[key] == big[key]
    assert small["n_routed_experts"] % small["n_group"] == 0 and small["num_hidden_layers"] == 5


def _run(values: list[float], tokens: list[int]) -> Capture:
    return Capture(
        calls=[{0: (torch.tensor(values), torch.tensor(values))}], tokens=[tokens], params={}
    )


def test_compare_reports_differences() -> None:
    """Identical runs compare to zero; a perturbed layer shows its absolute and relative difference."""
    same = compare(_run([1.0, 2.0], [5]), _run([1.0, 2.0], [5]))
    assert same.max_abs == 0.0 and same.tokens_equal
    off = compare(_run([1.0, 2.0], [5]), _run([1.0, 2.5], [6]))
    assert off.max_abs == pytest.approx(0.5) and off.max_rel == pytest.approx(0.25)
    assert not off.tokens_equal
    with pytest.raises(VerifyError, match="forward passes"):
        compare(_run([1.0], [1]), Capture(calls=[], tokens=[], params={}))
