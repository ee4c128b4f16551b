"""AFD edits to vLLM-Ascend's platform (``vllm_ascend/platform.py``), selected through the
``vllm.platform_plugins`` entry point ``afd_npu`` (:mod:`afd_models.platforms`).

vLLM-Ascend fills in the worker only when it is ``auto``, and with it sets the all2all backend that
keeps vLLM's sequence-parallel MoE off (``flashinfer_all2allv``, unless sequence parallelism is on).
An AFD engine names its worker (``--worker-cls``), which skips that setting; this platform applies
it to AFD engines as well, so an AFD engine's MoE layers run as in a native vLLM-Ascend engine.
"""

# vLLM-Ascend imports VllmConfig for type checking only (None at run time); so does this module
from vllm_ascend.platform import NPUPlatform, VllmConfig

from afd_models.config import afd_config_from
from codegen.markers import override, subclass


@subclass()
class AFDNPUPlatform(NPUPlatform):
    """vLLM-Ascend's NPU platform, with its all2all setting for AFD engines too."""

    @override
    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        super().check_and_update_config(vllm_config)
        # vLLM-Ascend's rule for a worker it picks itself (worker_cls "auto"); read again on a
        # version bump (drift shows check_and_update_config's changes)
        if (
            afd_config_from(vllm_config.additional_config) is not None
            and not vllm_config.compilation_config.pass_config.enable_sp
        ):
            vllm_config.parallel_config.all2all_backend = "flashinfer_all2allv"
