"""GPU tier: the generated CUDA worker and runner (``AFDAttentionWorker`` on vLLM's GPU ``Worker``,
``AFDAttentionGPUModelRunner`` on ``GPUModelRunner``) inside vLLM's engine on a CUDA device, with
the FFN half in-process behind the loopback connector, against the native model.

Needs a CUDA device and vLLM 0.26.0's CUDA build (the ``gpu`` extra); skipped elsewhere with the
reason (tests/conftest.py). Eager, and compiled with piecewise CUDA graphs (the exchange op is a
splitting op, so it runs between the captured pieces); full CUDA graphs are refused by the worker.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from afd_models.testing.tiny_models import write_tiny_model
from tests.engine import VLLM_ENV, run_python

PROMPTS = ["Hello world, the license", "Once upon a time", "The experts of layer"]


#: engine arguments per mode, for the native and the AFD engine alike
MODES = {
    "eager": "enforce_eager=True",
    "piecewise-cuda-graphs": "compilation_config={'cudagraph_mode': 'PIECEWISE'}",
}


def _generate(model: Path, env: dict[str, str], afd: dict[str, object] | None, mode: str) -> list:
    """[worker class/runner class, greedy tokens per prompt] from a fresh interpreter."""
    afd_args = (
        f"worker_cls='afd_models.workers.AFDAttentionWorker', additional_config={{'afd': {afd!r}}}"
        if afd
        else ""
    )
    result = run_python(
        f"""
        import json
        from vllm import LLM, SamplingParams
        from vllm.platforms import current_platform
        assert current_platform.is_cuda(), type(current_platform).__name__
        llm = LLM(model={str(model)!r}, dtype="float32", max_model_len=256, {MODES[mode]},
                  seed=0, gpu_memory_utilization=0.3, {afd_args})
        classes = llm.collective_rpc(
            lambda worker: f"{{type(worker).__name__}}/{{type(worker.model_runner).__name__}}"
        )[0]
        params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        outputs = llm.generate({PROMPTS!r}, params, use_tqdm=False)
        print(json.dumps([classes, [list(o.outputs[0].token_ids) for o in outputs]]))
        """,
        env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize(
    "gate_on_attention", [True, False], ids=["gate-on-attention", "gate-on-ffn"]
)
def test_cuda_worker_in_loopback_equals_native(
    gate_on_attention: bool, mode: str, tmp_path: Path
) -> None:
    model = write_tiny_model(tmp_path / "tiny", "v2", seed=0)
    env = {**os.environ, **VLLM_ENV, "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    if mode != "eager":
        env.pop("TORCHDYNAMO_DISABLE")
    afd = {
        "role": "attention",
        "connector": "LoopbackAFDConnector",
        "compute_gate_on_attention": gate_on_attention,
    }
    native_classes, native = _generate(model, env, None, mode)
    afd_classes, split = _generate(model, env, afd, mode)
    assert native_classes == "Worker/GPUModelRunner"
    assert afd_classes == "AFDAttentionWorker/AFDAttentionGPUModelRunner"
    assert split == native
