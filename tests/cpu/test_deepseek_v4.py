"""DeepSeek-V4's AFD classes (generated from ``vllm/models/deepseek_v4/cpu/model.py``, vLLM 0.30+)
in the real engine's modules, on the CPU platform.

vLLM's own V4 does not run a forward step on its CPU releases (``docs/reports/deepseek-v4-on-cpu.md``:
Triton-only attention metadata kernels), so neither a V4 pair nor ``verify`` can run here. What runs
is everything on AFD's side of the split, in both roles' models built by vLLM's loader from the
tiny V4 checkpoint of ``afd_models.cli.tiny_models`` (so vLLM's V4 weight loading and AFD's check
that it filled every parameter of the role run for both roles): the Attention role's MoE blocks (vLLM's native forward around the generated proxy)
exchanging through a loopback connector with the FFN role's model, against vLLM's own V4 MoE
(the FFN role's blocks with the gate there, which the generated constructor leaves as upstream
builds them), for a hash-routed layer and two bias-corrected ones, with the gate on either role.
On releases before 0.30 vLLM has no V4 class of its own, nor AFD one.
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
        reason=f"vLLM {vllm_version}: DeepSeek-V4 has a model class (and AFD an overlay) from 0.30",
    ),
]

_CHILD = """
import json, sys
from pathlib import Path

import torch
from vllm.forward_context import create_forward_context, set_forward_context

from afd_models.cli.tiny_models import tiny_config, write_tiny_model
from afd_models.connectors.base import AFDConnectionError, LayerInput
from afd_models.wiring.loopback import LoopbackConnector
from afd_models.ffn_server import ffn_output
from afd_models.models.remote import bind_connector
from tests.cpu.role_models import load_role_model, start_single_rank, worker_refusal

TINY_V4 = tiny_config("v4")
out = write_tiny_model(Path(sys.argv[1]), "v4")
LAYERS = range(TINY_V4["num_hidden_layers"])
start_single_rank(out, sys.argv[2])

# the workers refuse V4 on this release: vLLM's own V4 cannot run a step on CPU
result = {"worker_refusal": worker_refusal(out)}

def load(role, gate_on_attention):
    return load_role_model(out, "AFDDeepseekV4ForCausalLM", role, gate_on_attention)

torch.manual_seed(1)
x = torch.randn(7, TINY_V4["hidden_size"]).to(torch.bfloat16)
ids = torch.randint(0, TINY_V4["vocab_size"], (7,))
other_ids = (ids + 1) % TINY_V4["vocab_size"]

# the reference: with the gate on FFN, the FFN role's MoE blocks are vLLM's DeepseekV4MoE as
# upstream builds them (the generated constructor changes nothing then), run by its own forward
reference_config, reference = load("ffn", False)
blocks = [reference.model.layers[i].ffn for i in LAYERS]
with torch.inference_mode(), set_forward_context(None, reference_config, num_tokens=7):
    # MoE kernels may work in place: every call gets its own input and keeps its own output
    expected = [blocks[i](x.clone(), ids).clone() for i in LAYERS]
    with_other_ids = [blocks[i](x.clone(), other_ids).clone() for i in LAYERS]
    hash_output = ffn_output(reference, 0, LayerInput(x.clone(), None, ids)).clone()
    try:
        ffn_output(reference, 0, LayerInput(x.clone(), None, None))
        hash_without_ids = None
    except ValueError as error:
        hash_without_ids = str(error)
result["ids_matter"] = [not torch.equal(a, b) for a, b in zip(expected, with_other_ids)]
result["model"] = {
    "class": type(reference).__name__,
    "ffn_layers": reference.ffn_layer_indices(),
    "token_id_layers": reference.token_id_layers(),
    "attention_built": [type(layer.attn).__name__ for layer in reference.model.layers],
    "server_equals_forward": torch.equal(hash_output, expected[0]),
    "hash_without_ids": hash_without_ids,
}

for gate_on_attention in (False, True):
    ffn_config, ffn = load("ffn", gate_on_attention)
    attention_config, attention = load("attention", gate_on_attention)
    sent = {}

    def compute(layer, received):
        sent[layer] = (received.router_logits is not None, received.token_ids is not None)
        return ffn_output(ffn, layer, received)

    connector = LoopbackConnector(compute, lambda _: create_forward_context(None, ffn_config))
    connector.set_layers(
        bind_connector(attention, connector), token_id_layers=attention.token_id_layers()
    )
    moe = [attention.model.layers[i].ffn for i in LAYERS]
    with torch.inference_mode(), set_forward_context(None, attention_config, num_tokens=7):
        got = [moe[i](x.clone(), ids).clone() for i in LAYERS]
        try:
            moe[0](x.clone())
            refused = None
        except (ValueError, AFDConnectionError) as error:
            refused = str(error)
    key = "gate_on_attention" if gate_on_attention else "gate_on_ffn"
    result[key] = {
        "equal": [torch.equal(a, b) for a, b in zip(got, expected)],
        "max_diff": [float((a.float() - b.float()).abs().max()) for a, b in zip(got, expected)],
        "sent": [sent[i] for i in LAYERS],
        "moe_params": sorted(
            {n.split(".ffn.", 1)[1] for n, _ in attention.named_parameters() if ".ffn." in n}
        ),
        "without_ids": refused,
    }
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def v4(vllm_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    model_dir = tmp_path_factory.mktemp("tiny-v4") / "model"
    return run_python_result(_CHILD, vllm_env, ["v4", str(model_dir), str(free_port())])


def test_the_tiny_v4_routes_its_hash_layer_by_token_id(v4: dict) -> None:
    """The reference itself: other token ids change the hash layer's output only, so a test that
    dropped or scrambled the ids could not pass."""
    assert v4["ids_matter"] == [True, False, False]


@pytest.mark.parametrize("placement", ["gate_on_ffn", "gate_on_attention"])
def test_the_afd_moe_blocks_equal_vllms_bitwise(v4: dict, placement: str) -> None:
    """vLLM's native V4 MoE forward on the Attention role, through the generated proxy and a
    loopback connector into the generated FFN block, equals vLLM's own ``DeepseekV4MoE`` exactly,
    for the hash layer and the scored ones; token ids cross for the hash layer only, router logits
    only with the gate on Attention, which is the only placement that builds the gate there."""
    seen = v4[placement]
    assert seen["equal"] == [True, True, True], seen["max_diff"]
    on_attention = placement == "gate_on_attention"
    assert seen["sent"] == [[on_attention, True], [on_attention, False], [on_attention, False]]
    gate = {"gate.weight", "gate.tid2eid", "gate.e_score_correction_bias"}
    assert set(seen["moe_params"]) == (gate if on_attention else set())
    # a hash layer without ids: vLLM's forward refuses where the gate (and its table) is built,
    # the connector where it is not
    refusal = (
        "hash MoE routing requires input_ids"
        if on_attention
        else "layer 0 routes by token id, but was sent without token ids"
    )
    assert refusal in seen["without_ids"]


def test_the_workers_refuse_v4_on_a_cpu_release_whose_own_v4_cannot_run(v4: dict) -> None:
    assert f"cannot be served on vLLM {vllm_version} (cpu)" in v4["worker_refusal"]
    assert "docs/reports/deepseek-v4-on-cpu.md" in v4["worker_refusal"]


def test_the_ffn_role_model_builds_no_attention_and_serves_token_id_layers(v4: dict) -> None:
    """vLLM's loader builds the generated FFN-role causal LM: every layer's MoE here, no
    attention, layer 0 declared a token-id layer, and the FFN server's entry point hands a
    hash layer its ids (without them vLLM's forward refuses)."""
    model = v4["model"]
    assert model["class"] == "AFDDeepseekV4ForCausalLM"
    assert model["ffn_layers"] == [0, 1, 2]
    assert model["token_id_layers"] == [0]
    assert model["attention_built"] == ["PPMissingLayer"] * 3
    assert model["server_equals_forward"]
    assert "hash MoE routing requires input_ids" in model["hash_without_ids"]
