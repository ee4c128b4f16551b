"""afd_models.verify without running vLLM: config validation, shrinking, the comparison."""

from __future__ import annotations

import pytest
import torch

from afd_models.testing.tiny_models import VARIANTS, tiny_config
from afd_models.verify import VerifyError, compare, parameter_estimate, shrink, validate


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tiny_variants_are_valid(variant: str) -> None:
    validate(tiny_config(variant), mla_disabled=True)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, "not a DeepSeek architecture"),
        ({"n_routed_experts": None}, "no MoE layers"),
        ({"index_topk": 2048}, "V3.2 sparse attention"),
        ({"qk_rope_head_dim": 40}, "head size"),
        ({"n_group": 3}, "not a multiple of n_group"),
        ({"topk_group": 2}, "exceeds n_group"),
    ],
)
def test_bad_configs_are_refused(change: dict, fragment: str) -> None:
    config = {**tiny_config("v2"), **change}
    with pytest.raises(VerifyError, match=fragment):
        validate(config, mla_disabled=True)


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


def _run(values: list[float], tokens: list[int]) -> dict:
    return {
        "calls": [{0: (torch.tensor(values), torch.tensor(values))}],
        "tokens": [tokens],
        "params": {},
    }


def test_compare_reports_differences() -> None:
    """Identical runs compare to zero; a perturbed layer shows its absolute and relative difference."""
    same = compare(_run([1.0, 2.0], [5]), _run([1.0, 2.0], [5]))
    assert same["max_abs"] == 0.0 and same["tokens_equal"]
    off = compare(_run([1.0, 2.0], [5]), _run([1.0, 2.5], [6]))
    assert off["max_abs"] == pytest.approx(0.5) and off["max_rel"] == pytest.approx(0.25)
    assert not off["tokens_equal"]
    with pytest.raises(VerifyError, match="forward passes"):
        compare(_run([1.0], [1]), {"calls": [], "tokens": [], "params": {}})
