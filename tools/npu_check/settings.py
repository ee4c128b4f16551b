"""What the NPU check runs: the versions it checks, the ``VLLM_PLUGINS`` of each engine, the tiny
model, the engine arguments and environment, and how long each helper process may take."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from afd_models.config import Role
from afd_models.launch import worker_class

FORMAT = "afd-npu-check/1"
VLLM_VERSION = "0.26.0"
VLLM_ASCEND_VERSION = "0.26.0rc1"

#: AFD's platform plugin (pyproject.toml, ``vllm.platform_plugins``) and general plugin
PLATFORM_PLUGIN = "afd_npu"
GENERAL_PLUGIN = "afd_models"
#: vLLM-Ascend's platform plugin, which must stay out: vLLM activates one platform plugin only
ASCEND_PLATFORM_PLUGIN = "ascend"
#: vLLM-Ascend's general plugins (its patches and registrations), needed with either platform
ASCEND_GENERAL_PLUGINS = (
    "ascend_kv_connector",
    "ascend_model_loader",
    "ascend_service_profiling",
    "ascend_model",
)
#: ``VLLM_PLUGINS`` selecting AFD's platform (what docs/npu.md tells operators to set)
AFD_PLUGINS = ",".join((PLATFORM_PLUGIN, GENERAL_PLUGIN, *ASCEND_GENERAL_PLUGINS))
#: ``VLLM_PLUGINS`` of the native engine: vLLM-Ascend as shipped, nothing of AFD
NATIVE_PLUGINS = ",".join((ASCEND_PLATFORM_PLUGIN, *ASCEND_GENERAL_PLUGINS))

#: the AFD worker the parity check runs (its ``path`` is the engine's ``--worker-cls``)
ATTENTION_WORKER = worker_class("npu", Role.ATTENTION)
LOOPBACK = "LoopbackAFDConnector"
NATIVE_CLASSES = "NPUWorker/NPUModelRunner"
NPU_PLATFORM = "vllm_ascend.platform.NPUPlatform"

#: the tiny model: DeepSeek-V2-Lite's layout (no q LoRA) and MLA head sizes, one MoE layer
MODEL_VARIANT = "v2-lite"
MODEL_OVERRIDES: Mapping[str, Any] = {
    "num_hidden_layers": 1,
    "first_k_dense_replace": 0,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
#: engine arguments of both engines
ENGINE_ARGS: Mapping[str, Any] = {
    "dtype": "bfloat16",
    "max_model_len": 256,
    "max_num_seqs": 8,
    "seed": 0,
    "gpu_memory_utilization": 0.3,
    "enforce_eager": True,
}
#: environment of every process this check starts, on top of the operator's
ENGINE_ENV: Mapping[str, str] = {
    # the engine core in the LLM's own process: collective_rpc calls the worker directly
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # AFD's NPU runners derive from vLLM-Ascend's MRv1 NPUModelRunner; the native engine too
    "VLLM_USE_V2_MODEL_RUNNER": "0",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
#: seconds each helper process may take: the probe, writing the model, ``codegen check``
PROBE_TIMEOUT_S = 300
MODEL_TIMEOUT_S = 300
CODEGEN_TIMEOUT_S = 900
CODEGEN_COMMAND = ("-m", "codegen", "check", "--format", "json")
#: the findings ``codegen check`` emits when its runtime checks did not run (RT001)
RUNTIME_UNAVAILABLE = "runtime_unavailable"
