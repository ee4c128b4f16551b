"""The FFN role's layers compiled one by one (``afd_models.ffn_compile``), in the real engine's
modules on the CPU platform.

A child process builds the tiny DeepSeek-V2's FFN-role model with the config an FFN worker of a
compiled engine gets, warms it up as the FFN server does, and computes every layer compiled and
eagerly (the same plain-torch implementations), calling the layers in turn at changing token
counts: a compiled graph reused for the wrong layer or token count would give another layer's
output or fail.
"""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch

from afd_models.cli.serve import free_port
from afd_models.ffn_compile import CompiledLayers
from tests.engine import run_python_result

pytestmark = pytest.mark.every_release

_CHILD = """
import json, logging, sys
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from vllm.config import set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.model_executor.model_loader import get_model_loader

from afd_models.cli.tiny_models import write_tiny_model
from afd_models.ffn_compile import CompiledLayers
from afd_models.worker_config import compiles_ffn_layers, ffn_worker_config
from tests.cpu.role_models import engine_config, start_single_rank

out = write_tiny_model(Path(sys.argv[1]), "v2", seed=0)
start_single_rank(out, sys.argv[2])
config = engine_config(out, "ffn")
config = config.with_hf_config(config.model_config.hf_config, architectures=["AFDDeepseekV2ForCausalLM"])
config.model_config.enforce_eager = False
ffn = ffn_worker_config(config, "cpu", False)
with set_current_vllm_config(ffn):
    model = get_model_loader(ffn.load_config).load_model(vllm_config=ffn, model_config=ffn.model_config)

class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())

warned = Warnings()
logging.getLogger("vllm.afd.ffn_compile").addHandler(warned)
compiled = CompiledLayers(model)
layers = model.ffn_layer_indices()
# as the FFN server does before its first step
compiled.warm_up(
    layers, 256, torch.bfloat16, torch.device("cpu"),
    lambda tokens: set_forward_context(None, ffn, num_tokens=tokens),
)
graphs, diffs, scales = [counters["stats"]["unique_graphs"]], [], []
torch.manual_seed(0)
for tokens in [7, 1, 32, 1, 7, 13]:
    x = torch.randn(tokens, 256).to(torch.bfloat16)
    with torch.inference_mode(), set_forward_context(None, ffn, num_tokens=tokens):
        for i in layers:
            expected = model.compute_ffn_output(i, x.clone()).clone()
            got = compiled.compute_ffn_output(i, x.clone()).clone()
            diffs.append(float((got.float() - expected.float()).abs().max()))
            scales.append(float(expected.float().abs().max()))
    graphs.append(counters["stats"]["unique_graphs"])
result = {"layers": layers, "diffs": diffs, "scale": min(scales), "graphs": graphs,
          "eager_layers": sorted(compiled.eager_layers), "warnings": warned.messages}

def kernels(enforce_eager, device, gate_on_attention):
    config.model_config.enforce_eager = enforce_eager
    made = ffn_worker_config(config, device, gate_on_attention)
    return [compiles_ffn_layers(made), list(made.compilation_config.custom_ops), made.model_config.enforce_eager]

result["config"] = {
    "compiled engine": kernels(False, "cpu", False),
    "eager engine": kernels(True, "cpu", False),
    "gate on attention": kernels(False, "cpu", True),
    "cuda": kernels(False, "cuda", False),
}
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def compiled(vllm_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    model_dir = tmp_path_factory.mktemp("tiny-v2") / "model"
    with_dynamo = {k: v for k, v in vllm_env.items() if k != "TORCHDYNAMO_DISABLE"}
    return run_python_result(
        _CHILD, with_dynamo, ["ffn_compile", str(model_dir), str(free_port())], timeout=600
    )


def test_compiled_layers_compute_what_the_eager_ones_do(compiled: dict) -> None:
    """Every layer, called in turn at token counts 7, 1, 32, 1, 7, 13 after the warm-up, gives
    its own eager output up to Inductor's bf16 rounding (a layer's graph reused for another layer,
    or a one-token graph for 32 tokens, would not). Which layers compile is the machine's and the
    release's business (vLLM 0.28's MoE layers compile on some CPUs and not on others): what AFD
    guarantees is that a layer that does not runs eagerly, with its warning naming it."""
    assert set(compiled["eager_layers"]) <= set(compiled["layers"]), compiled["eager_layers"]
    warned = sorted(
        layer
        for layer in compiled["layers"]
        if any(f"layer {layer} cannot be compiled" in m for m in compiled["warnings"])
    )
    assert warned == compiled["eager_layers"], compiled["warnings"]
    assert max(compiled["diffs"]) <= 0.02 * compiled["scale"], compiled["diffs"]


def test_the_warm_up_compiles_every_graph_before_the_first_step(compiled: dict) -> None:
    """The warm-up compiles each compiled layer's two graphs (one token, any other count) on
    zeros (a layer that failed may have left one); then no real call compiles again."""
    graphs = compiled["graphs"]
    compiled_layers = len(compiled["layers"]) - len(compiled["eager_layers"])
    assert 2 * compiled_layers <= graphs[0] <= 2 * len(compiled["layers"]), graphs
    assert graphs[1:] == [graphs[0]] * len(graphs[1:]), graphs


def test_only_a_compiled_engine_with_its_gate_on_ffn_compiles_its_ffn_layers(
    compiled: dict,
) -> None:
    """An FFN worker of a compiled engine on the CPU platform, its gate on the FFN role, compiles
    its layers over vLLM's plain-torch implementations; one of an engine with ``--enforce-eager``,
    with the gate on Attention (no router logits to warm up with) or on CUDA runs vLLM's eager
    kernels. vLLM itself compiles nothing on the FFN role."""
    assert compiled["config"] == {
        "compiled engine": [True, ["none"], True],
        "eager engine": [False, ["all"], True],
        "gate on attention": [False, ["all"], True],
        "cuda": [False, ["all"], True],
    }


class _TwoLayers:
    """An FFN model of two layers: layer 0 compiles, layer 1 breaks Dynamo's graph, so its
    whole-graph compilation fails on every machine."""

    def compute_ffn_output(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: object = None
    ) -> torch.Tensor:
        if layer_idx == 1:
            torch._dynamo.graph_break()
        return hidden_states * 2 + layer_idx


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_layer_that_cannot_be_compiled_runs_eagerly_with_its_warning() -> None:
    """The warm-up compiles what compiles; a layer whose compilation fails is computed eagerly,
    its warning naming it, and each layer still gives its own output."""
    records = _Records()
    logger = logging.getLogger("vllm.afd.ffn_compile")
    logger.addHandler(records)
    try:
        layers = CompiledLayers(_TwoLayers())
        layers.warm_up([0, 1], 8, torch.float32, torch.device("cpu"), contextlib.nullcontext)
    finally:
        logger.removeHandler(records)
    assert layers.eager_layers == {1}
    failures = [m for m in records.messages if "cannot be compiled" in m]
    assert len(failures) == 1, records.messages
    assert failures[0].startswith("AFD ffn: layer 1 cannot be compiled, it runs eagerly"), failures
    hidden = torch.randn(3, 8)
    for layer in (0, 1):
        assert torch.equal(layers.compute_ffn_output(layer, hidden), hidden * 2 + layer)
