"""What an AFD worker checks and changes in its own copy of the engine config, before anything is built.

* the AFD section must be valid and name this worker's role;
* the model must be a DeepSeek architecture with an AFD model; the worker asks vLLM for the AFD
  architecture (``AFDDeepseekV2ForCausalLM`` ...) through ``VllmConfig.with_hf_config``, a public
  vLLM API returning a new config, so the engine's own config and every non-AFD engine keep
  vLLM's classes;
* MLA cannot run on the CPU platform: say ``VLLM_MLA_DISABLE=1`` instead of failing deep inside;
* the FFN role holds no KV cache; vLLM's scheduler then needs prefix caching off
  (``--no-enable-prefix-caching``), which only the engine command line can set.
"""

from __future__ import annotations

from vllm.config import VllmConfig

from afd_models.config import AFDConfig, AFDConfigError, Role, require_afd_config
from afd_models.plugin import afd_architecture


def prepare_worker_config(vllm_config: VllmConfig, role: Role) -> tuple[VllmConfig, AFDConfig]:
    """Validate the engine config for an AFD worker of ``role``; a copy that builds the AFD model.

    Raises:
        AFDConfigError: the AFD section, the model or an engine flag is not usable for this role.
    """
    afd = require_afd_config(vllm_config.additional_config, role=role)
    model_config = vllm_config.model_config
    architectures = list(getattr(model_config.hf_config, "architectures", None) or [])
    if len(architectures) != 1:
        raise AFDConfigError(
            f"model {model_config.model!r}: expected one architecture, got {architectures}"
        )
    try:
        target = afd_architecture(architectures[0])
    except ValueError as exc:
        raise AFDConfigError(f"model {model_config.model!r}: {exc}") from exc
    from vllm.platforms import current_platform

    if model_config.use_mla and current_platform.is_cpu():
        raise AFDConfigError(
            f"model {model_config.model!r} uses MLA, which vLLM's CPU platform cannot run; set VLLM_MLA_DISABLE=1"
        )
    if vllm_config.use_v2_model_runner:
        raise AFDConfigError("AFD runs on vLLM's V1 model runner: set VLLM_USE_V2_MODEL_RUNNER=0")
    if role is Role.FFN and vllm_config.cache_config.enable_prefix_caching:
        raise AFDConfigError(
            "the FFN role holds no KV cache, so vLLM's scheduler needs prefix caching off: "
            "add --no-enable-prefix-caching to the FFN engine"
        )
    return vllm_config.with_hf_config(model_config.hf_config, architectures=[target]), afd
