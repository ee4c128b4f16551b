"""What one role builds of a model, read from the engine's AFD config.

The generated subclasses of every family ask this plan which modules to construct; the rules
live here once (DeepSeek shown; Qwen3-MoE's released configs have no shared experts, and its
dense MLPs, built with ``attention_mlp_factory``, stay on Attention for either gate placement; its
FFN role builds the gate only when the gate runs there):

================  =====================  ============================  ==========================
module            Attention, gate on FFN  Attention, gate on Attention  FFN (either gate placement)
================  =====================  ============================  ==========================
attention, norms  built                  built                         missing
MoE gate          missing                built                         built (routing bias)
routed experts    remote proxy           remote proxy                  built
shared experts    missing                missing                       built (inside FusedMoE)
dense MLP         remote proxy           built (local)                 built / missing
embed, lm_head    built                  built                         missing
================  =====================  ============================  ==========================

"Missing" modules are vLLM ``PPMissingLayer``s: vLLM's own weight loader skips their checkpoint
tensors exactly as it does for layers owned by another pipeline stage, so each role loads only
its parameters with vLLM's unchanged mapping rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.models.utils import PPMissingLayer

from afd_models.config import AFDConfig, require_afd_config
from afd_models.models.remote import remote_dense_mlp


def _missing(**_: Any) -> nn.Module:
    return PPMissingLayer()


@dataclass(frozen=True)
class ModelPlan:
    """Construction decisions for one role."""

    config: AFDConfig

    @property
    def is_attention(self) -> bool:
        return self.config.is_attention

    @property
    def is_ffn(self) -> bool:
        return self.config.is_ffn

    @property
    def gate_on_attention(self) -> bool:
        return self.config.compute_gate_on_attention

    @property
    def dense_mlp_on_ffn(self) -> bool:
        """Dense MLP layers go to the FFN role with the gate; with the gate on Attention they stay."""
        return not self.gate_on_attention

    def moe_class(
        self, ffn_class: type[nn.Module], attention_class: type[nn.Module]
    ) -> type[nn.Module]:
        return attention_class if self.is_attention else ffn_class

    def dense_mlp_factory(self, native: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        """The dense-MLP constructor for this role: native, a remote proxy, or a missing layer."""
        if self.is_attention:
            return remote_dense_mlp if self.dense_mlp_on_ffn else native
        return native if self.dense_mlp_on_ffn else _missing

    def attention_mlp_factory(self, native: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        """The constructor of a dense MLP that runs on the Attention role whatever the gate
        placement: native there, a missing layer on the FFN role."""
        return native if self.is_attention else _missing


def afd_plan(vllm_config: VllmConfig) -> ModelPlan:
    """The plan of the engine whose config is ``vllm_config`` (AFD must be on). vLLM builds the
    model from the engine config alone, so the plan reads the AFD section there; the worker,
    its runner and its connector keep the config the worker parsed."""
    return ModelPlan(require_afd_config(vllm_config.additional_config))
