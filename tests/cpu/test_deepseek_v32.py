"""DeepSeek-V3.2's AFD classes (generated from ``vllm/models/deepseek_v32/nvidia/model.py``, vLLM
0.30+) in the real engine's modules, on the CPU platform.

From 0.30 vLLM gives V3.2 a CUDA class of its own (its DSA sparse attention, which the CPU platform
refuses to build), and AFD serves its overlay, on CUDA only. What runs here is the FFN role, which
builds nothing of attention: vLLM's loader builds the generated FFN-role causal LM and loads the
tiny-model builder's V3.2 checkpoint into it (skipping the attention and indexer tensors, and
filling every parameter the role has), and the FFN server's entry point computes each layer's MLP or MoE, compared bitwise with
vLLM's own modules run by their own forwards, with the gate on either role.
"""

from __future__ import annotations

import pytest
from vllm import __version__ as vllm_version

from afd_models.cli.serve import free_port
from afd_models.release_order import release_key
from tests.engine import run_python_result

pytestmark = [
    pytest.mark.every_release,
    pytest.mark.skipif(
        release_key(vllm_version) < release_key("0.30"),
        reason=f"vLLM {vllm_version}: DeepSeek-V3.2 has a class of its own (and AFD an overlay) "
        "from 0.30; before, AFD serves it with its V3 class",
    ),
]

_CHILD = """
import json, sys
from pathlib import Path

import torch
from vllm.forward_context import set_forward_context

from afd_models.cli.tiny_models import tiny_config, write_tiny_model
from afd_models.connectors.base import LayerInput
from afd_models.ffn_server import ffn_output
from tests.cpu.role_models import load_role_model, start_single_rank, worker_refusal

TINY_V32 = tiny_config("v32")
out = write_tiny_model(Path(sys.argv[1]), "v32")
LAYERS = range(TINY_V32["num_hidden_layers"])
start_single_rank(out, sys.argv[2])

# the workers refuse V3.2 here: AFD's class is of vLLM's CUDA implementation
result = {"worker_refusal": worker_refusal(out)}

def load(gate_on_attention):
    return load_role_model(out, "AFDDeepseekV32ForCausalLM", "ffn", gate_on_attention)

torch.manual_seed(1)
x = torch.randn(7, TINY_V32["hidden_size"]).to(torch.bfloat16)
# the reference: with the gate on FFN, the FFN role's layers are vLLM's own DeepseekV2MLP and
# DeepseekV2MoE as upstream builds them (the generated constructors change nothing then), each
# run by its own forward
reference_config, reference = load(False)
with torch.inference_mode(), set_forward_context(None, reference_config, num_tokens=7):
    # MoE kernels may work in place: every call gets its own input and keeps its own output
    expected = {i: reference.model.layers[i].mlp(x.clone()).clone() for i in LAYERS}
for gate_on_attention in (False, True):
    config, model = load(gate_on_attention)
    layers = model.model.layers
    with torch.inference_mode(), set_forward_context(None, config, num_tokens=7):
        got = {}
        for i in model.ffn_layer_indices():
            # with the gate on Attention the MoE blocks' gates are still built here (they own
            # the routing bias): they give the logits the Attention role would send
            logits = layers[i].mlp.gate(x.clone())[0] if gate_on_attention else None
            got[i] = ffn_output(model, i, LayerInput(x.clone(), logits, None)).clone()
    result["gate_on_attention" if gate_on_attention else "gate_on_ffn"] = {
        "class": type(model).__name__,
        "ffn_layers": model.ffn_layer_indices(),
        "mlp": [type(layer.mlp).__name__ for layer in layers],
        "attention": [type(layer.self_attn).__name__ for layer in layers],
        "head": [type(m).__name__ for m in (model.model.embed_tokens, model.model.norm, model.lm_head)],
        "indexer_buffer": model.model.topk_indices_buffer is not None,
        "equal": [torch.equal(got[i], expected[i]) for i in got],
        "max_diff": [float((got[i].float() - expected[i].float()).abs().max()) for i in got],
    }
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def v32(vllm_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    model_dir = tmp_path_factory.mktemp("tiny-v32") / "model"
    return run_python_result(_CHILD, vllm_env, ["v32", str(model_dir), str(free_port())])


@pytest.mark.parametrize("placement", ["gate_on_ffn", "gate_on_attention"])
def test_the_ffn_role_builds_only_its_half(v32: dict, placement: str) -> None:
    """vLLM's loader builds the generated V3.2 causal LM on the FFN role: no attention, indexer
    buffer, embedding, final norm or lm_head; the MoE blocks, and the dense MLP when the gate
    (with which dense layers go) runs here."""
    model = v32[placement]
    assert model["class"] == "AFDDeepseekV32ForCausalLM"
    assert model["attention"] == ["PPMissingLayer"] * 3
    assert model["head"] == ["PPMissingLayer"] * 3
    assert not model["indexer_buffer"]
    moe = ["AFDFFNDeepseekV2MoE"] * 2
    if placement == "gate_on_ffn":
        assert model["ffn_layers"] == [0, 1, 2]
        assert model["mlp"] == ["DeepseekV2MLP", *moe]
    else:
        assert model["ffn_layers"] == [1, 2]
        assert model["mlp"] == ["PPMissingLayer", *moe]


@pytest.mark.parametrize("placement", ["gate_on_ffn", "gate_on_attention"])
def test_the_ffn_server_computes_what_vllms_modules_do(v32: dict, placement: str) -> None:
    """The FFN server's entry point (with the router logits the Attention role would send, when
    the gate runs there) equals vLLM's own modules' forwards bitwise, layer by layer."""
    model = v32[placement]
    assert model["equal"] == [True] * len(model["ffn_layers"]), model["max_diff"]


def test_the_workers_refuse_v32_off_cuda(v32: dict) -> None:
    assert v32["worker_refusal"].endswith(
        "architecture 'DeepseekV32ForCausalLM' has an AFD model for vLLM's cuda implementation "
        "only, not for this platform ('cpu')"
    )
