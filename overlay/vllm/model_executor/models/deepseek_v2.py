"""AFD edits to vLLM's DeepSeek model (``vllm/model_executor/models/deepseek_v2.py``).

The split is at the remote-experts boundary: vLLM's native ``DeepseekV2Model.forward``,
``DeepseekV2DecoderLayer.forward`` and ``DeepseekV2MoE.forward`` run unchanged on the Attention
role; its experts (and its dense MLPs when the gate runs on FFN) are parameter-free proxies that
exchange activations with the FFN role. Each role constructs only what it runs; the rest are vLLM
``PPMissingLayer``s, which vLLM's own loader skips. Which module each role builds is decided in
one place, ``afd_models.models.plan``.
"""

from collections.abc import Iterable

import torch
from transformers import DeepseekV2Config, DeepseekV3Config
from vllm.compilation.decorators import support_torch_compile
from vllm.config import ParallelConfig, VllmConfig, get_current_vllm_config  # noqa: F401 (edit code)
from vllm.model_executor.layers.quantization import QuantizationConfig
from vllm.model_executor.models.deepseek_v2 import (
    DeepseekV2DecoderLayer,
    DeepseekV2ForCausalLM,
    DeepseekV2Model,
    DeepseekV2MoE,
)
from vllm.model_executor.models.utils import PPMissingLayer

from afd_models.models.ffn import ffn_layers, moe_output
from afd_models.models.loading import load_role_weights
from afd_models.models.plan import afd_plan  # noqa: F401 (edit code)
from afd_models.models.remote import RemoteExperts  # noqa: F401 (edit code)
from codegen.markers import (
    contract,
    delta,
    extend,
    fork,
    insert_after,
    override,
    override_attr,
    replace,
    subclass,
    wrap,
)

_EXPERTS_SEE_THE_HIDDEN_STATES = contract(
    "self.experts(hidden_states=hidden_states, router_logits=hidden_states)",
    id="internal-router-gets-hidden-states",
    if_broken="the experts would no longer be handed the hidden states to route: the FFN role's with their "
    "own gate, the Attention role's proxy with the gate it runs",
)
_REMOTE_EXPERTS = "self.experts = RemoteExperts(f'{prefix}.experts', gate=self.gate if plan.gate_on_attention else None)"
_PLAN_FROM_CONTEXT = insert_after(
    "super().__init__()",
    "plan = afd_plan(get_current_vllm_config())",
    id="plan",
    why="the role decides what this module builds; vLLM sets the current config while it builds a model",
)


@subclass(relies_on={"forward": (_EXPERTS_SEE_THE_HIDDEN_STATES,)})
class AFDAttentionDeepseekV2MoE(DeepseekV2MoE):
    """The Attention role's MoE block: the gate (when it runs here) and a proxy of the experts.

    vLLM's native ``forward`` is inherited. The proxy reports an internal router, so that forward
    hands it the hidden states (vLLM 0.28's MoE runner always routes internally); when the gate
    runs here, the proxy runs it and sends the router logits too.
    """

    @fork(
        _PLAN_FROM_CONTEXT,
        wrap(
            """
            self.gate = GateLinear(...)
            if getattr(config, "topk_method", None) == "noaux_tc":
                ...
            else:
                ...
            """,
            "if plan.gate_on_attention:",
            orelse="self.gate = PPMissingLayer()",
            id="gate-only-on-gate-placement",
            why="the gate's weights belong to the Attention role only when the gate runs here",
        ),
        replace(
            """
            if config.n_shared_experts is None or $FUSED_SHARED_EXPERTS:
                self.shared_experts = None
            else:
                ...
            """,
            "self.shared_experts = PPMissingLayer()",
            id="no-shared-experts",
            why="shared experts run on the FFN role, inside its FusedMoE",
        ),
        replace(
            # FusedMoE before vLLM 0.27, FusedMoEFactory since: the lock records which
            "self.experts = $MOE(...)",
            _REMOTE_EXPERTS,
            id="remote-experts",
            why="the experts run on the FFN role; the proxy exchanges activations through the connector",
        ),
    )
    def __init__(
        self,
        config: DeepseekV2Config | DeepseekV3Config,
        parallel_config: ParallelConfig,
        quant_config: QuantizationConfig | None = None,
        reduce_results: bool = True,
        prefix: str = "",
        apply_routed_scale_to_output: bool = False,
    ): ...


@subclass(relies_on={"forward": (_EXPERTS_SEE_THE_HIDDEN_STATES,)})
class AFDFFNDeepseekV2MoE(DeepseekV2MoE):
    """The FFN role's MoE block: vLLM's own gate, routed and shared experts.

    With the gate on Attention the experts route with the received router logits (an external
    router); the gate module is still built because it owns the routing correction bias.
    """

    @fork(
        _PLAN_FROM_CONTEXT,
        replace(
            # FusedMoE before vLLM 0.27, FusedMoEFactory since
            "$MOE($...BEFORE, gate=self.gate, $...AFTER)",
            "$MOE($...BEFORE, gate=None if plan.gate_on_attention else self.gate, $...AFTER)",
            id="external-router-on-gate-placement",
            why="with the gate on Attention the experts must use the router logits they receive",
        ),
    )
    def __init__(
        self,
        config: DeepseekV2Config | DeepseekV3Config,
        parallel_config: ParallelConfig,
        quant_config: QuantizationConfig | None = None,
        reduce_results: bool = True,
        prefix: str = "",
        apply_routed_scale_to_output: bool = False,
    ): ...

    @extend
    def afd_ffn_forward(
        self, hidden_states: torch.Tensor, router_logits: torch.Tensor | None
    ) -> torch.Tensor:
        """This layer's MoE output for received hidden states (and router logits)."""
        return moe_output(self, hidden_states, router_logits)


@subclass(
    relies_on={
        "forward": (
            contract(
                "hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)",
                id="mlp-after-post-attention-norm",
                if_broken="the MLP proxy would be sent activations other than the normalized "
                "post-attention hidden states the FFN role computes on",
            ),
            contract(
                "hidden_states = self.mlp(hidden_states)",
                id="mlp-called-once",
                if_broken="the MLP proxy (and so the exchange with the FFN role) would not run once "
                "per layer with the hidden states",
            ),
            contract(
                """
                if isinstance(self.mlp, DeepseekV2MLP) and hidden_states.dtype == torch.float16:
                    hidden_states *= 1.0 / self.routed_scaling_factor
                """,
                id="fp16-rescale-only-for-native-dense-mlp",
                if_broken="the fp16 rescale of dense layers that afd_ffn_forward applies on the FFN role "
                "would be missing or applied twice",
            ),
        )
    }
)
class AFDDeepseekV2DecoderLayer(DeepseekV2DecoderLayer):
    """A decoder layer that builds the role's half; vLLM's native forward runs on Attention."""

    @fork(
        insert_after(
            "super().__init__()",
            "plan = afd_plan(vllm_config)",
            id="plan",
            why="the role decides what this layer builds",
        ),
        wrap(
            "self.self_attn = attn_cls(...)",
            "if plan.is_attention:",
            orelse="self.self_attn = PPMissingLayer()",
            id="attention-on-attention-role",
            why="the FFN role constructs nothing of attention",
        ),
        replace(
            "DeepseekV2MoE",
            "plan.moe_class(AFDFFNDeepseekV2MoE, AFDAttentionDeepseekV2MoE)",
            id="role-moe",
            why="each role builds its own half of the MoE block",
        ),
        replace(
            "DeepseekV2MLP",
            "plan.dense_mlp_factory(DeepseekV2MLP)",
            id="role-dense-mlp",
            why="dense MLPs run on the role that runs the gate",
        ),
        wrap(
            """
            self.input_layernorm = RMSNorm(...)
            self.post_attention_layernorm = RMSNorm(...)
            """,
            "if plan.is_attention:",
            orelse="self.input_layernorm = PPMissingLayer()\nself.post_attention_layernorm = PPMissingLayer()",
            id="norms-on-attention-role",
            why="the norms run in the native forward, on the Attention role only",
        ),
        deltas=(
            # vLLM 0.30 added the parameter (sparse-MLA index groups, handed to the attention
            # class); its annotation is a string here because earlier releases lack the class
            delta(
                "param_added",
                "index_group_builder",
                ours="index_group_builder: 'SparseMLAIndexGroupBuilder | None' = None",
                why="earlier releases' bodies never read it",
                when="vllm<0.30",
            ),
            delta(
                "param_annotation",
                "index_group_builder",
                upstream="SparseMLAIndexGroupBuilder | None",
                ours="'SparseMLAIndexGroupBuilder | None'",
                why="a string, so the one signature also holds where the class does not exist",
                when="vllm>=0.30",
            ),
        ),
    )
    def __init__(
        self,
        vllm_config: VllmConfig,
        prefix: str,
        config: DeepseekV2Config | None = None,
        topk_indices_buffer: torch.Tensor | None = None,
        index_group_builder: "SparseMLAIndexGroupBuilder | None" = None,  # noqa: F821 (0.30+)
    ) -> None: ...

    @extend
    def afd_ffn_forward(
        self, hidden_states: torch.Tensor, router_logits: torch.Tensor | None
    ) -> torch.Tensor:
        """FFN role: this layer's MLP or MoE output for received activations."""
        if isinstance(self.mlp, AFDFFNDeepseekV2MoE):
            return self.mlp.afd_ffn_forward(hidden_states, router_logits)
        if isinstance(self.mlp, PPMissingLayer):
            raise RuntimeError(
                f"layer {self.layer_idx}: its MLP runs on the Attention role, not here"
            )
        if router_logits is not None:
            raise RuntimeError(f"layer {self.layer_idx} is dense: it takes no router logits")
        output = self.mlp(hidden_states)
        if output.dtype == torch.float16:
            # The native forward rescales a dense MLP's fp16 output right after `self.mlp`, but only
            # when that is a DeepseekV2MLP; on the Attention role it is the remote proxy, so the
            # rescale happens here, once (a contract of the relied-on `forward` pins that condition).
            output *= 1.0 / self.routed_scaling_factor
        return output


@support_torch_compile
@subclass(
    relies_on={
        "forward": (
            contract(
                """
                for $IDX, $LAYER in enumerate(islice(self.layers, self.start_layer, self.end_layer), start=self.start_layer):
                    $...BODY
                """,
                id="every-layer-in-order",
                if_broken="the decoder layers, and with them the exchanges with the FFN role, would not "
                "run once each in layer order, which the FFN role serves them in",
            ),
            contract(
                "if get_pp_group().is_first_rank:\n    $...EMBED\nelse:\n    $...RECEIVE",
                id="embedding-on-first-rank-only",
                if_broken="the forward would use the embedding the FFN role does not build",
            ),
        ),
        "load_weights": (
            contract(
                "if is_pp_missing_parameter($NAME, self):\n    continue",
                id="skips-missing-layers",
                count=3,
                if_broken="loading would fail on the checkpoint weights of the modules a role does not "
                "build (vLLM PPMissingLayers)",
            ),
        ),
    }
)
class AFDDeepseekV2Model(DeepseekV2Model):
    """The decoder stack with AFD layers; embedding and final norm on the Attention role only.

    Re-decorated with ``support_torch_compile`` because it defines its own ``__init__``.
    """

    @fork(
        insert_after(
            "super().__init__()",
            "plan = afd_plan(vllm_config)",
            id="plan",
            why="the role decides what the model builds",
        ),
        replace(
            "if self.is_v32:\n    $...BODY\nelse:\n    topk_indices_buffer = None",
            "if self.is_v32 and plan.is_attention:\n    $...BODY\nelse:\n    topk_indices_buffer = None",
            id="indexer-buffer-on-attention-role",
            why="the V3.2 indexer is part of attention",
        ),
        replace(
            "get_pp_group().is_first_rank",
            "plan.is_attention and get_pp_group().is_first_rank",
            id="embedding-on-attention-role",
            why="token embedding runs on the Attention role only",
        ),
        replace(
            "DeepseekV2DecoderLayer",
            "AFDDeepseekV2DecoderLayer",
            id="afd-layers",
            why="build the role-aware decoder layers",
        ),
        replace(
            "get_pp_group().is_last_rank",
            "plan.is_attention and get_pp_group().is_last_rank",
            id="final-norm-on-attention-role",
            why="the final norm runs on the Attention role only",
        ),
    )
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""): ...


@subclass(
    bases=("DeepseekV2ForCausalLM", "DeepseekForCausalLM", "DeepseekV3ForCausalLM"),
    name="AFD{base}",
    relies_on={
        "forward": (
            contract(
                "self.model(input_ids, positions, intermediate_tensors, inputs_embeds)",
                id="runs-the-afd-model",
                if_broken="the causal LM would not run the AFD decoder stack (model_cls)",
            ),
        ),
        "compute_logits": (
            contract(
                "self.logits_processor(self.lm_head, hidden_states)",
                id="logits-from-lm-head",
                if_broken="logits would come from something other than the lm_head the Attention role builds",
            ),
        ),
        "set_moe_parameters": (
            contract(
                """
                if isinstance(layer.mlp, DeepseekV2MoE):
                    $...BODY
                """,
                id="moe-blocks-by-type",
                if_broken="vLLM's MoE bookkeeping would not find the AFD MoE blocks (subclasses of "
                "DeepseekV2MoE) or would read the experts of the FFN role's missing layers",
            ),
        ),
    },
)
class AFDDeepseekV2ForCausalLM(DeepseekV2ForCausalLM):
    """The AFD causal LM: vLLM's class with the AFD model, lm_head on the Attention role only."""

    model_cls = override_attr(AFDDeepseekV2Model)

    @fork(
        insert_after(
            "super().__init__()",
            "plan = afd_plan(vllm_config)\nself.afd_plan = plan",
            id="plan",
            why="the role decides what the model builds (kept for loading)",
        ),
        replace(
            "get_pp_group().is_last_rank",
            "plan.is_attention and get_pp_group().is_last_rank",
            id="lm-head-on-attention-role",
            why="logits are computed on the Attention role only",
        ),
    )
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""): ...

    @override
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """vLLM's loader, plus the check it cannot make: every parameter of the role was filled."""
        return load_role_weights(
            self, super().load_weights, weights, self.afd_plan.config.role.value
        )

    @extend
    def ffn_layer_indices(self) -> list[int]:
        """FFN role: the layers whose MLP or MoE this role computes, in forward order."""
        return ffn_layers(self)

    @extend
    def compute_ffn_output(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: torch.Tensor | None = None
    ) -> torch.Tensor:
        """FFN role: layer ``layer_idx``'s MLP or MoE output for received activations."""
        return self.model.layers[layer_idx].afd_ffn_forward(hidden_states, router_logits)
