"""The ``vllm.platform_plugins`` entry point ``afd_npu``: vLLM-Ascend's NPU platform, as AFD's
subclass (generated from ``overlay/vllm_ascend/platform.py``).

vLLM activates exactly one platform plugin, and vLLM-Ascend's own (``ascend``) activates whenever it
is installed, so an operator names ours instead in ``VLLM_PLUGINS`` (:data:`NPU_PLUGINS`, which also
keeps vLLM-Ascend's general plugins). The AFD NPU workers refuse to run on any other platform.
"""

from __future__ import annotations

import importlib.util
import os

from afd_models.config import AFDConfigError

#: the AFD subclass of vLLM-Ascend's ``NPUPlatform``
AFD_NPU_PLATFORM = "afd_models._generated.vllm_ascend.platform.AFDNPUPlatform"
#: ``VLLM_PLUGINS`` for AFD on an Ascend NPU: our platform and general plugin, and vLLM-Ascend's
#: general plugins (not its platform plugin ``ascend``: only one platform may be active)
NPU_PLUGINS = (
    "afd_npu",
    "afd_models",
    "ascend_kv_connector",
    "ascend_model_loader",
    "ascend_service_profiling",
    "ascend_model",
)


def npu_platform() -> str | None:
    """The platform for vLLM (its plugin protocol: a class path, or None where not usable).

    Ours only when ``VLLM_PLUGINS`` names this plugin and vLLM-Ascend is installed: vLLM loads
    every platform plugin when ``VLLM_PLUGINS`` is unset, and two active ones are an error, so
    installing this package must never compete with vLLM-Ascend's own platform. Nothing is
    imported here: vLLM calls this while it is still choosing its platform.
    """
    named = NPU_PLUGINS[0] in os.environ.get("VLLM_PLUGINS", "").split(",")
    if named and importlib.util.find_spec("vllm_ascend") is not None:
        return AFD_NPU_PLATFORM
    return None


def require_afd_npu_platform() -> None:
    """Refuse an AFD NPU worker on any platform but :data:`AFD_NPU_PLATFORM`.

    Raises:
        AFDConfigError: another platform (vLLM-Ascend's own, say) was selected.
    """
    from vllm.platforms import current_platform

    selected = f"{type(current_platform).__module__}.{type(current_platform).__qualname__}"
    if selected != AFD_NPU_PLATFORM:
        raise AFDConfigError(
            f"the AFD NPU workers run on the platform {AFD_NPU_PLATFORM}, but vLLM selected "
            f"{selected}; set VLLM_PLUGINS={','.join(NPU_PLUGINS)} (see docs/npu.md)"
        )
