"""AFD edits to vLLM's DeepSeek-V3.2 for CUDA (``vllm/models/deepseek_v32/nvidia/model.py``, vLLM
0.30 and later; the package's ``__init__`` picks it on CUDA and keeps the V3 class elsewhere).

V3.2's CUDA decoder layer is a class of its own (its attention is the DSA sparse MLA with its
lightning indexer), but its MoE block and dense MLPs are DeepSeek-V2's. So the split is V2/V3's,
and the MoE halves are the ones generated from ``overlay/vllm/model_executor/models/deepseek_v2.py``:
vLLM's native model, decoder layer and MoE forwards run on the Attention role with a proxy of the
experts; the FFN role builds the experts, and nothing of attention or the indexer.

V3.2's layers leave the MoE and dense outputs unreduced across tensor-parallel ranks and fold the
all-reduce into the next layer's norm; AFD's exchange hands every lane the whole output, so these
classes serve one lane per role (their ``single_lane`` in ``afd_models.plugin.ARCHITECTURES``).
"""

from collections.abc import Iterable

import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.deepseek_v2 import DeepseekV2MLP  # noqa: F401 (edit code)
from vllm.model_executor.models.utils import PPMissingLayer
from vllm.models.deepseek_v32.nvidia.model import (
    DeepseekV32DecoderLayer,
    DeepseekV32ForCausalLM,
    DeepseekV32Model,
)
from vllm.v1.attention.backends.mla.index_group import SparseMLAIndexGroupBuilder

from afd_models._generated.vllm.model_executor.models.deepseek_v2 import (  # noqa: F401 (edit code)
    AFDAttentionDeepseekV2MoE,
    AFDFFNDeepseekV2MoE,
)
from afd_models.models.ffn import ffn_layers
from afd_models.models.loading import load_role_weights
from afd_models.models.plan import afd_plan  # noqa: F401 (edit code)
from codegen.markers import (
    contract,
    extend,
    fork,
    insert_after,
    override,
    override_attr,
    replace,
    subclass,
    wrap,
)

_PLAN = insert_after(
    "super().__init__()",
    "plan = afd_plan(vllm_config)",
    id="plan",
    why="the role decides what this module builds",
)


@subclass(
    when="vllm>=0.30",
    relies_on={
        "forward": (
            contract(
                "hidden_states, residual = fused_allreduce_rms_norm(hidden_states, residual, self.post_attention_layernorm)",
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
        ),
    },
)
class AFDDeepseekV32DecoderLayer(DeepseekV32DecoderLayer):
    """A decoder layer that builds the role's half; vLLM's native forward runs on Attention."""

    @fork(
        _PLAN,
        wrap(
            "self.self_attn = DeepseekV32Attention(...)",
            "if plan.is_attention:",
            orelse="self.self_attn = PPMissingLayer()",
            id="attention-on-attention-role",
            why="the FFN role constructs nothing of attention (nor the indexer)",
        ),
        replace(
            "DeepseekV2MoE",
            "plan.moe_class(AFDFFNDeepseekV2MoE, AFDAttentionDeepseekV2MoE)",
            id="role-moe",
            why="each role builds its own half of the MoE block, V2's",
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
    )
    def __init__(
        self,
        vllm_config: VllmConfig,
        prefix: str,
        config=None,
        topk_indices_buffer: torch.Tensor | None = None,
        index_group_builder: SparseMLAIndexGroupBuilder | None = None,
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
        return self.mlp(hidden_states)


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
    },
)
class AFDDeepseekV32Model(DeepseekV32Model):
    """The decoder stack with AFD layers; embedding, final norm and the indexer's top-k buffer
    on the Attention role only."""

    @fork(
        _PLAN,
        wrap(
            """
            self.topk_indices_buffer = torch.empty(...)
            index_group_builder = SparseMLAIndexGroupBuilder(...)
            """,
            "if plan.is_attention:",
            orelse="self.topk_indices_buffer = None\nindex_group_builder = None",
            id="indexer-buffers-on-attention-role",
            why="the sparse indexer is part of attention",
        ),
        replace(
            "get_pp_group().is_first_rank",
            "plan.is_attention and get_pp_group().is_first_rank",
            id="embedding-on-attention-role",
            why="token embedding runs on the Attention role only",
        ),
        replace(
            "DeepseekV32DecoderLayer",
            "AFDDeepseekV32DecoderLayer",
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
class AFDDeepseekV32ForCausalLM(DeepseekV32ForCausalLM):
    """The AFD causal LM: vLLM's class with the AFD model, lm_head on the Attention role only."""

    model_cls = override_attr(AFDDeepseekV32Model)

    @fork(
        insert_after(
            "super().__init__(...)",
            # DeepSeek-V2's __init__, which V3.2's runs first, builds the lm_head on every last
            # pipeline rank; the FFN role drops it before any weight is loaded or memory profiled
            "plan = afd_plan(vllm_config)\nself.afd_plan = plan\n"
            "if not plan.is_attention:\n    self.lm_head = PPMissingLayer()",
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
