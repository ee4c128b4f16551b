"""AFD edits to vLLM-Ascend's ModelSlim quantization config
(``vllm_ascend/quantization/modelslim_config.py``): the FFN role's W8A8-dynamic MoE layers get
AFD's scheme (force load balance, ``overlay/vllm_ascend/quantization/methods/w8a8_dynamic.py``).

The FFN NPU worker builds the model with this config in place of vLLM-Ascend's own when
``force_load_balance`` is on (:func:`afd_models.force_load_balance.with_balanced_moe`), so the
model's own construction picks the scheme; every other layer gets what vLLM-Ascend's config
gives it.
"""

from typing import Optional

import torch
from vllm.model_executor.layers.quantization.base_config import (
    QuantizeMethodBase,
)
from vllm_ascend.quantization.methods.w8a8_dynamic import (  # noqa: F401 (edit code)
    AscendW8A8DynamicFusedMoEMethod,
)
from vllm_ascend.quantization.modelslim_config import AscendModelSlimConfig

from afd_models.generated_classes import generated_subclass  # noqa: F401 (edit code)
from codegen.markers import fork, insert_after, subclass


@subclass()
class AFDAscendModelSlimConfig(AscendModelSlimConfig):
    """vLLM-Ascend's ModelSlim config, giving W8A8-dynamic MoE layers AFD's scheme."""

    @fork(
        insert_after(
            'scheme = create_scheme_for_layer(self.quant_description, prefix, "moe", self.packed_modules_mapping)',
            "if type(scheme) is AscendW8A8DynamicFusedMoEMethod:\n"
            "    scheme = generated_subclass('AFDAscendW8A8DynamicFusedMoEMethod', AscendW8A8DynamicFusedMoEMethod)()",
            id="afd-w8a8-moe-scheme",
            why="the FFN role's W8A8-dynamic MoE layers balance their load with AFD's scheme",
        )
    )
    def get_quant_method(
        self, layer: torch.nn.Module, prefix: str, tid2eid=None
    ) -> Optional["QuantizeMethodBase"]: ...
