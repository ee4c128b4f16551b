"""AFD edits to vLLM's DeepSeek-V4 for the CPU platform (``vllm/models/deepseek_v4/cpu/model.py``,
vLLM 0.30 and later; the package's ``__init__`` picks this implementation on CPU).

The split is where DeepSeek-V2/V3's is (``overlay/vllm/model_executor/models/deepseek_v2.py``):
the experts boundary of each decoder layer's ``ffn``. vLLM's native model, decoder layer and MoE
forwards run unchanged on the Attention role, with its multi-stream (``hc``) mixing and its
sparse attention; the experts there are a parameter-free proxy. The FFN role builds the routed
and shared experts, the routed scaling and ``swiglu_limit`` inside vLLM's own ``FusedMoE``.

V4's first ``num_hash_layers`` MoE layers pick their experts from the token ids (the gate's
``tid2eid`` table), so those layers' exchanges carry the step's token ids
(:meth:`AFDDeepseekV4ForCausalLM.token_id_layers`); the other layers send none. Every V4 layer is
a MoE layer: there are no dense MLPs to place.
"""

from collections.abc import Iterable

import torch
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.models.utils import PPMissingLayer
from vllm.models.deepseek_v4.cpu.model import (
    DeepseekV4DecoderLayer,
    DeepseekV4ForCausalLM,
    DeepseekV4Model,
    DeepseekV4MoE,
)

from afd_models.models.ffn import ffn_layers, moe_output
from afd_models.models.loading import load_role_weights
from afd_models.models.plan import afd_plan  # noqa: F401 (edit code)
from afd_models.models.remote import RemoteExperts  # noqa: F401 (edit code)
from codegen.markers import (
    contract,
    delete,
    extend,
    fork,
    insert_after,
    override,
    override_attr,
    replace,
    subclass,
    wrap,
)

_EXPERTS_SEE_THE_TOKENS = contract(
    "self.experts(hidden_states=hidden_states, router_logits=hidden_states, input_ids=input_ids)",
    id="internal-router-gets-hidden-states-and-ids",
    if_broken="the experts would no longer be handed the hidden states and token ids to route: the FFN "
    "role's with their own gate and hash table, the Attention role's proxy with the gate it runs",
)
_PLAN = insert_after(
    "super().__init__()",
    "plan = afd_plan(vllm_config)",
    id="plan",
    why="the role decides what this module builds",
)


@subclass(when="vllm>=0.30", relies_on={"forward": (_EXPERTS_SEE_THE_TOKENS,)})
class AFDAttentionDeepseekV4MoE(DeepseekV4MoE):
    """The Attention role's MoE block: the gate (when it runs here) and a proxy of the experts.

    vLLM's native ``forward`` is inherited: it checks that a hash layer got token ids and hands
    the proxy the hidden states and the ids; the proxy runs the gate when it is here, and sends
    the ids at the hash layers only.
    """

    @fork(
        _PLAN,
        wrap(
            # the anchor spells out which layers route by token id: token_id_layers (below)
            # repeats that rule for both roles, so a change of it is a block
            """
            self.gate = GateLinear(...)
            self.gate.e_score_correction_bias = None
            self.gate.tid2eid = None
            is_hash_moe = extract_layer_index(prefix) < config.num_hash_layers
            self.hash_indices_dtype = torch.int32
            if is_hash_moe:
                ...
            elif ...:
                ...
            """,
            "if plan.gate_on_attention:",
            orelse="self.gate = PPMissingLayer()\nself.gate.tid2eid = None",
            id="gate-only-on-gate-placement",
            why="the gate's weights (and a hash layer's table) belong to the Attention role only when "
            "the gate runs here; the native forward reads `gate.tid2eid`, None on a missing gate",
        ),
        replace(
            """
            if config.n_shared_experts is None or self.is_fused_shared_expert_enabled:
                self.shared_experts = None
            else:
                ...
            """,
            "self.shared_experts = PPMissingLayer()",
            id="no-shared-experts",
            why="shared experts run on the FFN role, inside its FusedMoE",
        ),
        replace(
            "self.experts = FusedMoEFactory(...)",
            "self.experts = RemoteExperts(f'{prefix}.experts', gate=self.gate if plan.gate_on_attention else None)",
            id="remote-experts",
            why="the experts run on the FFN role; the proxy exchanges activations (and a hash "
            "layer's token ids) through the connector",
        ),
        delete(
            "if is_hash_moe:\n    object.__setattr__(...)",
            id="no-routed-experts-table",
            why="the hash table is handed to the routed experts, which run on the FFN role",
        ),
    )
    def __init__(
        self,
        vllm_config: VllmConfig,
        prefix: str = "",
    ): ...


@subclass(when="vllm>=0.30", relies_on={"forward": (_EXPERTS_SEE_THE_TOKENS,)})
class AFDFFNDeepseekV4MoE(DeepseekV4MoE):
    """The FFN role's MoE block: vLLM's own gate, hash table, routed and shared experts.

    With the gate on Attention the experts route with the received router logits (an external
    router); the gate module is still built, it owns the routing bias and the hash table.
    """

    @fork(
        _PLAN,
        replace(
            "FusedMoEFactory($...BEFORE, gate=self.gate, $...AFTER)",
            "FusedMoEFactory($...BEFORE, gate=None if plan.gate_on_attention else self.gate, $...AFTER)",
            id="external-router-on-gate-placement",
            why="with the gate on Attention the experts must use the router logits they receive",
        ),
    )
    def __init__(
        self,
        vllm_config: VllmConfig,
        prefix: str = "",
    ): ...

    @extend
    def afd_ffn_forward(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor | None,
        token_ids: torch.Tensor | None,
    ) -> torch.Tensor:
        """This layer's MoE output for received hidden states (router logits, token ids)."""
        return moe_output(self, hidden_states, router_logits, token_ids)


@subclass(
    when="vllm>=0.30",
    relies_on={
        "forward": (
            contract(
                "return self._forward_unfused_post_pre($...ARGS)",
                id="dispatches-to-the-two-paths",
                if_broken="the decoder layer would run a path other than the two whose MoE call "
                "the other contracts pin",
            ),
        ),
        "_forward_unfused_post_pre": (
            contract(
                "x = self.ffn(x, input_ids)",
                id="moe-called-with-ids",
                if_broken="the MoE proxy (and so the exchange with the FFN role) would not run once "
                "per layer with the normalized hidden states and the token ids",
            ),
        ),
        "_forward_fused_post_pre": (
            contract(
                "x = self.ffn(x, input_ids)",
                id="moe-called-with-ids",
                if_broken="the MoE proxy (and so the exchange with the FFN role) would not run once "
                "per layer with the normalized hidden states and the token ids",
            ),
        ),
    },
)
class AFDDeepseekV4DecoderLayer(DeepseekV4DecoderLayer):
    """A decoder layer that builds the role's half; vLLM's native forward runs on Attention.

    The multi-stream mixing parameters (``hc_*``) and the two norms are built on both roles:
    they are small, and vLLM's loader then finds every checkpoint tensor it expects.
    """

    @fork(
        _PLAN,
        wrap(
            "self.attn = DeepseekV4CPUAttention(...)",
            "if plan.is_attention:",
            orelse="self.attn = PPMissingLayer()",
            id="attention-on-attention-role",
            why="the FFN role constructs nothing of attention (nor its KV cache)",
        ),
        replace(
            "DeepseekV4MoE",
            "plan.moe_class(AFDFFNDeepseekV4MoE, AFDAttentionDeepseekV4MoE)",
            id="role-moe",
            why="each role builds its own half of the MoE block",
        ),
    )
    def __init__(
        self,
        vllm_config,
        prefix,
        topk_indices_buffer: torch.Tensor | None = None,
    ): ...

    @extend
    def afd_ffn_forward(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor | None,
        token_ids: torch.Tensor | None,
    ) -> torch.Tensor:
        """FFN role: this layer's MoE output for received activations."""
        if isinstance(self.ffn, PPMissingLayer):
            raise RuntimeError("this decoder layer's MoE is not built on this role")
        return self.ffn.afd_ffn_forward(hidden_states, router_logits, token_ids)


@support_torch_compile(
    dynamic_arg_dims={
        "input_ids": 0,
        "positions": -1,
        "intermediate_tensors": 0,
        "inputs_embeds": 0,
    }
)
@subclass(
    when="vllm>=0.30",
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
                "hidden_states, residual, post_mix, res_mix = layer(hidden_states, positions, input_ids, post_mix, res_mix, residual)",
                id="layers-get-the-ids",
                if_broken="the hash-routed layers would not be handed the step's token ids",
            ),
        ),
    },
)
class AFDDeepseekV4Model(DeepseekV4Model):
    """The decoder stack with AFD layers; embedding, final norm and the indexer's buffer on the
    Attention role only.

    Re-decorated with ``support_torch_compile`` (the dims upstream's decorator gives) because it
    defines its own ``__init__``.
    """

    @fork(
        _PLAN,
        wrap(
            "self.topk_indices_buffer = torch.empty(...)",
            "if plan.is_attention:",
            orelse="self.topk_indices_buffer = None",
            id="indexer-buffer-on-attention-role",
            why="the sparse indexer is part of attention",
        ),
        replace(
            "get_pp_group().is_first_rank",
            "plan.is_attention and get_pp_group().is_first_rank",
            id="embedding-on-attention-role",
            why="token embedding runs on the Attention role only",
        ),
        replace(
            "DeepseekV4DecoderLayer",
            "AFDDeepseekV4DecoderLayer",
            id="afd-layers",
            why="build the role-aware decoder layers",
        ),
        replace(
            "get_pp_group().is_last_rank",
            "plan.is_attention and get_pp_group().is_last_rank",
            count=2,
            id="head-on-attention-role",
            why="the final norm (and a draft model's hidden-state buffer) are the Attention role's",
        ),
    )
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""): ...


@subclass(
    when="vllm>=0.30",
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
    },
)
class AFDDeepseekV4ForCausalLM(DeepseekV4ForCausalLM):
    """The AFD causal LM: vLLM's class with the AFD model, lm_head on the Attention role only."""

    model_cls = override_attr(AFDDeepseekV4Model)

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
        """FFN role: the layers whose MoE this role computes, in forward order."""
        return ffn_layers(self, block="ffn")

    @extend
    def token_id_layers(self) -> list[int]:
        """Either role: the hash-routed layers, whose exchanges carry the step's token ids (the
        rule vLLM builds their tables by, which the Attention MoE's gate edit anchors on)."""
        return list(range(min(self.config.num_hash_layers, self.config.num_hidden_layers)))

    @extend
    def compute_ffn_output(
        self,
        layer_idx: int,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor | None = None,
        token_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """FFN role: layer ``layer_idx``'s MoE output for received activations."""
        return self.model.layers[layer_idx].afd_ffn_forward(hidden_states, router_logits, token_ids)
