"""Role-aware loading: each role needs only its own tensors; a missing one is an error naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from afd_models.testing.tiny_models import write_tiny_model
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
