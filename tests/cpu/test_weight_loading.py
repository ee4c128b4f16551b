"""Role-aware loading: each role needs only its own tensors; a missing one is an error naming it;
parameters vLLM initialises itself (KV-cache scales of quantized checkpoints) are not required."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod

from afd_models.cli.tiny_models import write_tiny_model
from afd_models.models.loading import finish_loading, mark_unloaded
from tests.engine import run_python

AFD_RUN = """
from vllm import LLM
LLM(model={model!r}, dtype="bfloat16", max_model_len=256, enforce_eager=True, max_num_batched_tokens=256,
    max_num_seqs=4, worker_cls="afd_models.workers.AFDAttentionCPUWorker",
    additional_config={{"afd": {{"role": "attention", "connector": "LoopbackAFDConnector"}}}})
print("LOADED")
"""


def _without(tmp_path: Path, tensor: str) -> Path:
    model = write_tiny_model(tmp_path / "model", "v2", seed=0)
    weights = load_file(model / "model.safetensors")
    del weights[tensor]
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    return model


@pytest.mark.parametrize(
    "tensor",
    ["model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.2.self_attn.kv_b_proj.weight"],
)
def test_missing_tensor_is_named(tensor: str, tmp_path: Path, vllm_env: dict[str, str]) -> None:
    """A checkpoint without a tensor one role needs fails to load, naming the parameter."""
    result = run_python(AFD_RUN.format(model=str(_without(tmp_path, tensor))), vllm_env)
    assert result.returncode != 0 and "LOADED" not in result.stdout
    # vLLM's loader names uninitialized parameters; AFD's check names missing expert slices,
    # which vLLM cannot see (experts share one fused parameter per projection).
    reported = [
        line
        for line in result.stderr.splitlines()
        if "were not initialized from checkpoint" in line or "lacks" in line
    ]
    assert reported and tensor in reported[-1]


class FP8Layer(nn.Module):
    """The parameters of one layer of an FP8 block-quantized DeepSeek checkpoint: an FP8 weight,
    its block scales, and the attention's KV-cache scales as vLLM's quant method creates them."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.zeros(4, 4, dtype=torch.float8_e4m3fn), requires_grad=False
        )
        self.weight_scale_inv = nn.Parameter(torch.zeros(1, 1), requires_grad=False)
        self.attn = nn.Module()
        self.attn.quant_method = BaseKVCacheMethod(None)  # type: ignore[arg-type]
        self.attn.quant_method.create_weights(self.attn)


def _load(layer: FP8Layer, names: list[str]) -> set[str]:
    """What vLLM's loader does for a checkpoint holding ``names`` (and no KV-cache scale)."""
    mark_unloaded(layer)
    with torch.no_grad():
        for name in names:
            layer.get_parameter(name).copy_(torch.ones(layer.get_parameter(name).shape))
    return finish_loading(layer, "ffn", len(names), set(names))


def test_kv_cache_scales_are_left_to_vllm() -> None:
    layer = FP8Layer()
    loaded = _load(layer, ["weight", "weight_scale_inv"])
    assert loaded == {"weight", "weight_scale_inv"}
    scales = {n: p.item() for n, p in layer.attn.named_parameters()}
    # untouched: still vLLM's "not loaded" value, which it resolves after loading
    assert scales == {"q_scale": -1.0, "k_scale": -1.0, "v_scale": -1.0, "prob_scale": -1.0}


def test_kv_cache_parameters_of_any_kv_cache_method_are_left_to_vllm() -> None:
    """Compressed-tensors' KV-cache method creates plain parameters (zero points among them) on
    the attention layer: they are vLLM's too."""
    layer = FP8Layer()
    layer.attn.k_zero_point = nn.Parameter(torch.zeros(1), requires_grad=False)
    _load(layer, ["weight", "weight_scale_inv"])
    assert layer.attn.k_zero_point.item() == 0.0


def test_a_missing_fp8_scale_is_still_named() -> None:
    with pytest.raises(ValueError, match=r"not loaded: weight_scale_inv$"):
        _load(FP8Layer(), ["weight"])


def test_an_in_process_ffn_half_counts_its_weights() -> None:
    """The loopback connector reports its FFN model's bytes (parameters and buffers), which the
    GPU runner adds to the weights it budgets; a connector without an FFN half reports none."""
    from afd_models.wiring.loopback import LoopbackConnector

    connector = LoopbackConnector(lambda layer, received: received.hidden_states)
    assert connector.in_process_weight_bytes() == 0
    ffn = nn.Linear(4, 3, dtype=torch.bfloat16)
    ffn.register_buffer("bias_correction", torch.zeros(5, dtype=torch.float32))
    connector.ffn_model = ffn
    assert connector.in_process_weight_bytes() == (4 * 3 + 3) * 2 + 5 * 4
