"""AFD edits to vLLM-Ascend's W8A8-dynamic fused-MoE scheme
(``vllm_ascend/quantization/methods/w8a8_dynamic.py``): force load balance on the FFN role.

With ``force_load_balance`` in the FFN engine's ``additional_config.afd.connector_extra_config``,
the routed experts of every token are replaced by a fixed cycle that gives each EP rank the same
share (:mod:`afd_models.force_load_balance`), a profiling aid that changes the outputs. vLLM-Ascend's
own random balancing in profile runs stays as it is. The FFN model selects this subclass through
its quantization config (``overlay/vllm_ascend/quantization/modelslim_config.py``).
"""

from collections.abc import Callable
from typing import Any

import torch
from vllm.config import get_current_vllm_config
from vllm_ascend.quantization.methods.w8a8_dynamic import AscendW8A8DynamicFusedMoEMethod

from afd_models.force_load_balance import ForceLoadBalancer, ForceLoadBalanceSettings
from codegen.markers import extend, fork, override, replace, subclass


@subclass()
class AFDAscendW8A8DynamicFusedMoEMethod(AscendW8A8DynamicFusedMoEMethod):
    """vLLM-Ascend's W8A8-dynamic MoE scheme, with AFD's force load balance."""

    @override
    def __init__(self):
        super().__init__()
        self.afd_balance = ForceLoadBalanceSettings.from_vllm_config(get_current_vllm_config())
        self.afd_balancer: ForceLoadBalancer | None = None

    @extend
    def afd_balanced_ids(
        self,
        layer: torch.nn.Module,
        topk_ids: torch.Tensor,
        top_k: int,
        num_experts: int,
        mix_placement: bool,
    ) -> torch.Tensor:
        """``topk_ids`` replaced by this EP rank's share of the balancing cycle (built on the
        first call, in an eager step: the FFN graphs run each step shape eagerly before they
        capture it)."""
        if self.afd_balancer is None:
            moe = layer.moe_config
            self.afd_balancer = ForceLoadBalancer(
                self.afd_balance,
                ep_rank=moe.ep_rank,
                ep_size=moe.ep_size,
                num_experts=num_experts,
                top_k=top_k,
            )
        return self.afd_balancer.topk_ids(topk_ids, mix_placement=mix_placement)

    @fork(
        replace(
            "if enable_force_load_balance:\n    $...RANDOM",
            "if enable_force_load_balance:\n    $...RANDOM\n"
            "elif self.afd_balance is not None:\n"
            "    topk_ids = self.afd_balanced_ids(layer, topk_ids, top_k, num_logical_experts, mix_placement)",
            id="afd-force-load-balance",
            why="outside profile runs, AFD's switch replaces the routed experts by the balancing cycle",
        )
    )
    def apply(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        router_logits: torch.Tensor,
        top_k: int,
        renormalize: bool,
        use_grouped_topk: bool = False,
        num_experts: int = -1,
        expert_map: torch.Tensor | None = None,
        topk_group: int | None = None,
        num_expert_group: int | None = None,
        custom_routing_function: Callable | None = None,
        scoring_func: str = "softmax",
        routed_scaling_factor: float = 1.0,
        e_score_correction_bias: torch.Tensor | None = None,
        is_prefill: bool = True,
        enable_force_load_balance: bool = False,
        log2phy: torch.Tensor | None = None,
        global_redundant_expert_num: int = 0,
        pertoken_scale: Any | None = None,
        activation: str = "silu",
        apply_router_weight_on_input: bool = False,
        mc2_mask: torch.Tensor | None = None,
        tid2eid: torch.Tensor | None = None,
    ) -> torch.Tensor: ...
