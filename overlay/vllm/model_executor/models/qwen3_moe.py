"""AFD edits to vLLM's Qwen3-MoE model (``vllm/model_executor/models/qwen3_moe.py``).

The same split as DeepSeek's (``deepseek_v2.py`` beside this file): vLLM's native model, decoder
layer and MoE forwards run unchanged on the Attention role, whose experts are a parameter-free
proxy; each role builds only what it runs, the rest are ``PPMissingLayer``s vLLM's loader skips.
Qwen3-MoE's released configs have no shared experts (a config with them keeps them on the FFN
role, inside its experts; untested), and its dense MLPs (``mlp_only_layers`` and the layers
``decoder_sparse_step`` leaves dense) stay on the Attention role for either gate placement.
"""

from collections.abc import Iterable

import torch
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.models.qwen3_moe import (
    Qwen3MoeDecoderLayer,
    Qwen3MoeForCausalLM,
    Qwen3MoeModel,
    Qwen3MoeSparseMoeBlock,
)
from vllm.model_executor.models.utils import PPMissingLayer  # noqa: F401 (edit code)

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
_PLAN = insert_after(
    "super().__init__()",
    "plan = afd_plan(vllm_config)",
    id="plan",
    why="the role decides what this module builds",
)
# vLLM 0.28 added the parameter (passed on to the experts); before, the generated constructors
# take it and leave it unused, so one overlay signature serves every release
_TRANSPOSED_BEFORE_028 = delta(
    "param_added",
    "is_fused_checkpoint_transposed",
    ours="is_fused_checkpoint_transposed: bool = False",
    why="vLLM 0.28 added it; earlier releases' bodies never read it",
    when="vllm<0.28",
)


@subclass(relies_on={"forward": (_EXPERTS_SEE_THE_HIDDEN_STATES,)})
class AFDAttentionQwen3MoeSparseMoeBlock(Qwen3MoeSparseMoeBlock):
    """The Attention role's MoE block: the gate (when it runs here) and a proxy of the experts."""

    @fork(
        _PLAN,
        wrap(
            "self.gate = $GATE(...)",
            "if plan.gate_on_attention:",
            orelse="self.gate = PPMissingLayer()",
            id="gate-only-on-gate-placement",
            why="the gate's weights belong to the Attention role only when the gate runs here",
        ),
        replace(
            "if shared_expert_intermediate_size > 0:\n    ...\nelse:\n    ...",
            "self.shared_expert_gate = PPMissingLayer()\nself.shared_expert = PPMissingLayer()",
            id="no-shared-experts",
            why="shared experts (of configs that have them) run on the FFN role, inside its FusedMoE",
        ),
        replace(
            # FusedMoE before vLLM 0.27, FusedMoEFactory since: the lock records which
            "self.experts = $MOE(...)",
            _REMOTE_EXPERTS,
            id="remote-experts",
            why="the experts run on the FFN role; the proxy exchanges activations through the connector",
        ),
        deltas=(_TRANSPOSED_BEFORE_028,),
    )
    def __init__(
        self,
        vllm_config: VllmConfig,
        prefix: str = "",
        is_fused_checkpoint_transposed: bool = False,
    ): ...


@subclass(relies_on={"forward": (_EXPERTS_SEE_THE_HIDDEN_STATES,)})
class AFDFFNQwen3MoeSparseMoeBlock(Qwen3MoeSparseMoeBlock):
    """The FFN role's MoE block: vLLM's own gate and experts; with the gate on Attention the
    experts route with the received router logits (an external router), and no gate is built
    (unlike DeepSeek's, it holds no routing bias the experts need)."""

    @fork(
        _PLAN,
        wrap(
            "self.gate = $GATE(...)",
            "if not plan.gate_on_attention:",
            orelse="self.gate = PPMissingLayer()",
            id="gate-only-on-gate-placement",
            why="the gate's weights belong to the FFN role only when the gate runs here",
        ),
        replace(
            # FusedMoE before vLLM 0.27, FusedMoEFactory since
            "$MOE($...BEFORE, gate=self.gate, $...AFTER)",
            "$MOE($...BEFORE, gate=None if plan.gate_on_attention else self.gate, $...AFTER)",
            id="external-router-on-gate-placement",
            why="with the gate on Attention the experts must use the router logits they receive",
        ),
        deltas=(_TRANSPOSED_BEFORE_028,),
    )
    def __init__(
        self,
        vllm_config: VllmConfig,
        prefix: str = "",
        is_fused_checkpoint_transposed: bool = False,
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
                "hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)\n"
                "hidden_states = self.mlp(hidden_states)",
                id="mlp-once-after-post-attention-norm",
                if_broken="the experts' proxy (and so the exchange with the FFN role) would not run once "
                "per layer on the normalized post-attention hidden states the FFN role computes on",
            ),
        )
    }
)
class AFDQwen3MoeDecoderLayer(Qwen3MoeDecoderLayer):
    """A decoder layer that builds the role's half; vLLM's native forward runs on Attention."""

    @fork(
        _PLAN,
        wrap(
            "self.self_attn = Qwen3MoeAttention(...)",
            "if plan.is_attention:",
            orelse="self.self_attn = PPMissingLayer()",
            id="attention-on-attention-role",
            why="the FFN role constructs nothing of attention",
        ),
        replace(
            "Qwen3MoeSparseMoeBlock",
            "plan.moe_class(AFDFFNQwen3MoeSparseMoeBlock, AFDAttentionQwen3MoeSparseMoeBlock)",
            id="role-moe",
            why="each role builds its own half of the MoE block",
        ),
        replace(
            "Qwen3MoeMLP",
            "plan.attention_mlp_factory(Qwen3MoeMLP)",
            id="dense-mlp-on-attention-role",
            why="dense MLPs run on the Attention role, for either gate placement",
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
            _TRANSPOSED_BEFORE_028,
            delta(
                "param_added",
                "mrope_positions_factor",
                ours="mrope_positions_factor: int = 4",
                why="vLLM 0.32 added it (multimodal rotary positions); earlier releases' bodies "
                "never read it",
                when="vllm<0.32",
            ),
        ),
    )
    def __init__(
        self,
        vllm_config: VllmConfig,
        prefix: str = "",
        is_fused_checkpoint_transposed: bool = False,
        mrope_positions_factor: int = 4,
    ) -> None: ...


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
        ),
        "load_weights": (
            contract(
                "AutoWeightsLoader(self, ...)",
                id="auto-loader-skips-missing-layers",
                if_broken="loading would no longer go through vLLM's AutoWeightsLoader, which skips the "
                "checkpoint weights of the modules a role does not build (PPMissingLayers)",
            ),
        ),
    }
)
class AFDQwen3MoeModel(Qwen3MoeModel):
    """The decoder stack with AFD layers; embedding and final norm on the Attention role only.

    Re-decorated with ``support_torch_compile`` because it defines its own ``__init__``.
    """

    @fork(
        _PLAN,
        wrap(
            "self.embed_tokens = VocabParallelEmbedding(...)",
            "if plan.is_attention:",
            orelse="self.embed_tokens = PPMissingLayer()",
            id="embedding-on-attention-role",
            why="token embedding runs on the Attention role only",
        ),
        wrap(
            "self.norm = RMSNorm(...)",
            "if plan.is_attention:",
            orelse="self.norm = PPMissingLayer()",
            id="final-norm-on-attention-role",
            why="the final norm runs on the Attention role only",
        ),
        deltas=(
            delta(
                "param_default",
                "decoder_layer_type",
                upstream="Qwen3MoeDecoderLayer",
                ours="AFDQwen3MoeDecoderLayer",
                why="build the role-aware decoder layers (vLLM's own parameter for the layer class)",
            ),
        ),
    )
    def __init__(
        self,
        *,
        vllm_config: VllmConfig,
        prefix: str = "",
        decoder_layer_type: type[torch.nn.Module] = AFDQwen3MoeDecoderLayer,
    ): ...


@subclass(
    relies_on={
        "forward": (
            contract(
                "self.model(input_ids, positions, intermediate_tensors, inputs_embeds)",
                id="runs-the-afd-model",
                if_broken="the causal LM would not run the AFD decoder stack",
            ),
        ),
        "compute_logits": (
            contract(
                "self.logits_processor(self.lm_head, hidden_states)",
                id="logits-from-lm-head",
                if_broken="logits would come from something other than the lm_head the Attention role builds",
            ),
        ),
        "update_physical_experts_metadata": (
            contract(
                "if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock):\n    $...BODY",
                id="moe-blocks-by-type",
                if_broken="vLLM's MoE bookkeeping would not find the AFD MoE blocks (subclasses of "
                "Qwen3MoeSparseMoeBlock)",
            ),
        ),
    }
)
class AFDQwen3MoeForCausalLM(Qwen3MoeForCausalLM):
    """The AFD causal LM: vLLM's class with the AFD model, lm_head on the Attention role only."""

    @fork(
        insert_after(
            "super().__init__()",
            "plan = afd_plan(vllm_config)\nself.afd_plan = plan",
            id="plan",
            why="the role decides what the model builds (kept for loading)",
        ),
        replace(
            "Qwen3MoeModel",
            "AFDQwen3MoeModel",
            id="afd-model",
            why="build the role-aware decoder stack",
        ),
        wrap(
            """
            self.lm_head = ParallelLMHead(...)
            if self.config.tie_word_embeddings:
                ...
            """,
            "if plan.is_attention:",
            orelse="self.lm_head = PPMissingLayer()",
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
        """FFN role: the layers whose MoE this role computes, in forward order."""
        return ffn_layers(self)

    @extend
    def compute_ffn_output(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: torch.Tensor | None = None
    ) -> torch.Tensor:
        """FFN role: layer ``layer_idx``'s MoE output for received activations."""
        mlp = self.model.layers[layer_idx].mlp
        if not isinstance(mlp, AFDFFNQwen3MoeSparseMoeBlock):
            raise RuntimeError(f"layer {layer_idx}: its MLP runs on the Attention role, not here")
        return mlp.afd_ffn_forward(hidden_states, router_logits)
