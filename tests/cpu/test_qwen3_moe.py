"""Qwen3-MoE: the tiny builder, ``python -m afd_models.cli.verify`` on several configs (bitwise in
float32, both gate placements, each role's parameters) and the one-line refusals of the command."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Hashable
from pathlib import Path

import pytest
from safetensors.torch import load_file

from afd_models.cli.hf_config import is_moe_layer
from afd_models.cli.tiny_models import tiny_config, write_tiny_model
from tests.verify_runs import VERIFY, Cases, VerifyRun, runs_of, selected

#: experts / top-k / norm_topk_prob / decoder_sparse_step / mlp_only_layers vary between the cases
CASES = {
    # 8 experts, top-2, renormalized, layer 0 dense by mlp_only_layers
    "qwen3-moe": tiny_config("qwen3-moe"),
    # 6 experts, top-3, not renormalized, layers 0 and 2 dense by decoder_sparse_step=2
    "qwen3-moe-sparse": tiny_config("qwen3-moe-sparse"),
    # 4 experts, top-1, a dense layer between two MoE layers, q/k/v biases, MHA
    "top1-dense-middle": tiny_config(
        "qwen3-moe",
        {
            "num_experts": 4,
            "num_experts_per_tok": 1,
            "mlp_only_layers": [1],
            "attention_bias": True,
            "num_key_value_heads": 4,
        },
    ),
}


def test_builder_is_reproducible_and_names_qwen3_tensors(tmp_path: Path) -> None:
    """Same seed, same bytes; per-expert and q/k-norm tensors under their checkpoint names; the
    config loads with transformers' own class."""
    from transformers import AutoConfig

    first = write_tiny_model(tmp_path / "a", "qwen3-moe", seed=3, dtype="float32")
    second = write_tiny_model(tmp_path / "b", "qwen3-moe", seed=3, dtype="float32")
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    weights = load_file(first / "model.safetensors")
    # layer 0 is dense (mlp_only_layers), layers 1 and 2 are MoE with 8 experts
    assert weights["model.layers.0.mlp.gate_proj.weight"].shape == (512, 256)
    assert "model.layers.0.mlp.gate.weight" not in weights
    assert weights["model.layers.1.mlp.gate.weight"].shape == (8, 256)
    assert weights["model.layers.2.mlp.experts.7.down_proj.weight"].shape == (256, 128)
    assert weights["model.layers.1.self_attn.k_proj.weight"].shape == (2 * 64, 256)
    assert weights["model.layers.1.self_attn.q_norm.weight"].shape == (64,)
    assert not any("shared" in name for name in weights)
    config = AutoConfig.from_pretrained(first)
    assert (config.model_type, config.num_experts, config.mlp_only_layers) == ("qwen3_moe", 8, [0])


def verify_cases(session: pytest.Session) -> Cases:
    """This module's selected cases, for the session's verify runs (tests/verify_runs.py)."""
    cases = selected(session, __name__, "test_verify_is_bitwise_for_both_gate_placements", "case")
    return {case: (CASES[case], ()) for (case,) in cases}


@pytest.fixture(scope="module")
def runs(verify_runs: dict[Hashable, VerifyRun]) -> dict[Hashable, VerifyRun]:
    return runs_of(verify_runs, __name__)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param("qwen3-moe", marks=pytest.mark.every_release),
        # further cases of the same logic: the primary release only (as in test_equivalence.py)
        "qwen3-moe-sparse",
        "top1-dense-middle",
    ],
)
def test_verify_is_bitwise_for_both_gate_placements(
    case: str, runs: dict[Hashable, VerifyRun]
) -> None:
    data = runs[case].data()
    layers = range(CASES[case]["num_hidden_layers"])
    dense = [i for i in layers if not is_moe_layer(CASES[case], i)]
    for gate in ("ffn", "attention"):
        entry = data[f"gate_on_{gate}"]
        assert entry["tokens_equal"] and entry["forwards"] >= 2 and entry["max_abs"] == 0.0
        split = entry["params"]
        assert split["missing"] == [] and split["extra"] == [] and split["both"] == []
        # the FFN role holds the experts, and the gate only when it runs there; nothing else
        assert all(".mlp.experts." in n or ".mlp.gate." in n for n in split["ffn"])
        assert any(".mlp.gate." in n for n in split["ffn"]) == (gate == "ffn")
        assert not any(".mlp.experts." in n for n in split["attention"])
        # dense MLPs stay on Attention for either gate placement
        assert dense and all(
            any(f"layers.{i}.mlp.gate_up_proj" in n for n in split["attention"]) for i in dense
        )


def _refusal(config: dict, tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = subprocess.run(
        [*VERIFY, "--hf-config", str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 3 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_verify_refuses_another_architecture_in_one_line(tmp_path: Path) -> None:
    line = _refusal({**tiny_config("qwen3-moe"), "architectures": ["MixtralForCausalLM"]}, tmp_path)
    assert line == (
        "verify: architectures=['MixtralForCausalLM'] is not an architecture with an AFD model; "
        "allowed: one of ['DeepseekForCausalLM', 'DeepseekV2ForCausalLM', 'DeepseekV32ForCausalLM', "
        "'DeepseekV3ForCausalLM', 'Qwen3MoeForCausalLM']"
    )


def test_verify_names_the_field_transformers_rejects(tmp_path: Path) -> None:
    line = _refusal({**tiny_config("qwen3-moe"), "num_experts_per_tok": "two"}, tmp_path)
    assert line.startswith(
        "verify: transformers rejects the config: Validation error for field 'num_experts_per_tok':"
    )
