"""The FFN role's layers compiled by Inductor, graphs of each layer's own, guarded on the inputs only.

vLLM compiles a model's whole forward once; the FFN role never runs that forward, it calls one
layer at a time (``compute_ffn_output``). Compiling that call with ``torch.compile`` as is gives no
gain: every layer's graph hangs off the same code object, so each call walks every layer's
guards, deep into the module tree (measured: 125 us of guard lookups per call on the tiny
DeepSeek-V2, more than the layer's compute). Here each layer gets a code object of its own (the
same body, renamed), so Dynamo keeps one cache per layer, and the guards kept are those on the
call's own arguments (the token count's shape guards included). The modules' structure and
weights are fixed once loaded, so guards on them could only cost time.

Every layer is traced whole (``fullgraph``): a graph break would hand vLLM's own functions,
whose code objects the layers share, to Dynamo with these guards. A layer that cannot be compiled
runs eagerly, with a warning.

Dynamic shapes: a layer has two graphs, one for one token and one for any other count (Dynamo
specializes 0 and 1; marking the count unbacked instead breaks vLLM 0.32's MoE layers, which
branch on it). Compiling is mostly Dynamo tracing vLLM's deep MoE code, not Inductor.

Layers are compiled only by :meth:`CompiledLayers.warm_up`, on zeros, before the FFN worker
connects: a first compilation can take longer than the Attention role waits for a layer
(``timeout_s``). Each
layer is called eagerly once first, so that upstream state a layer fills on first use (for
example a MoE layer's quantization config) is set before Dynamo traces it. The warm-up feeds
hidden states only, so a layer is compiled only where that is all it takes (the gate on the FFN
role, no token ids; the FFN worker's config decides). A layer whose graph fails on zeros (vLLM
0.28's MoE layers do: a custom op's fake kernel gives the wrong shape) runs eagerly, with a
warning.
"""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from afd_models.ffn_server import vllm_forward_context
from afd_models.log import get_logger
from afd_models.models.ffn import token_id_layers
from afd_models.worker_config import compiles_ffn_layers

logger = get_logger(__name__)

#: the token counts of a layer's warm-up calls: eager, then its graph for any count, then for one
_WARM_UP_TOKENS = (2, 2, 1)

#: the arguments of :func:`_layer_output` whose guards the compiled layers keep
_ARGUMENTS = frozenset({"hidden_states", "router_logits", "token_ids", "layer_idx"})


def _layer_output(
    model: Any,
    layer_idx: int,
    hidden_states: torch.Tensor,
    router_logits: torch.Tensor | None,
    token_ids: torch.Tensor | None,
) -> torch.Tensor:
    if token_ids is None:
        output: torch.Tensor = model.compute_ffn_output(layer_idx, hidden_states, router_logits)
        return output
    with_ids: torch.Tensor = model.compute_ffn_output(
        layer_idx, hidden_states, router_logits, token_ids=token_ids
    )
    return with_ids


def kept_guards(entries: Sequence[Any]) -> list[bool]:
    """Dynamo's ``guard_filter_fn``: keep the guards on the call's arguments, the shape
    environment's and the global ones (grad mode and the like), drop those on the model."""
    return [
        entry.guard_type == "SHAPE_ENV" or entry.name == "" or entry.name in _ARGUMENTS
        for entry in entries
    ]


def _own_code(layer_idx: int) -> Callable[..., torch.Tensor]:
    """:func:`_layer_output` under a code object of its own, so Dynamo caches it apart."""
    name = f"afd_ffn_layer_{layer_idx}"
    code = _layer_output.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, _layer_output.__globals__, name)


class CompiledLayers:
    """An FFN model whose ``compute_ffn_output`` runs each layer :meth:`warm_up` compiled from its
    own graphs, and any other layer eagerly (:class:`~afd_models.ffn_server.FFNModel`, for the
    FFN server and the loopback connector)."""

    def __init__(self, model: Any):
        self.model = model
        self._compiled: dict[int, Callable[..., torch.Tensor]] = {}
        #: layers whose compilation failed, computed eagerly
        self.eager_layers: set[int] = set()

    def warm_up(
        self,
        layers: Sequence[int],
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        context: Callable[[int], contextlib.AbstractContextManager[Any]],
    ) -> None:
        """Compile both graphs of each of ``layers`` on zeros, each call in ``context(tokens)``
        (the forward context of that many tokens)."""
        started = time.perf_counter()
        with torch.inference_mode():
            for layer_idx in layers:
                self._compile(layer_idx, hidden_size, dtype, device, context)
        logger.info(
            "AFD ffn: compiled layers %s in %.1f s (%d eager)",
            list(layers),
            time.perf_counter() - started,
            len(self.eager_layers),
        )

    def _compile(
        self,
        layer_idx: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        context: Callable[[int], contextlib.AbstractContextManager[Any]],
    ) -> None:
        compiled = torch.compile(
            _own_code(layer_idx),
            dynamic=True,
            fullgraph=True,
            options={"guard_filter_fn": kept_guards},
        )
        for step, tokens in enumerate(_WARM_UP_TOKENS):
            zeros = torch.zeros(tokens, hidden_size, dtype=dtype, device=device)
            with context(tokens):
                if step == 0:
                    _layer_output(self.model, layer_idx, zeros, None, None)
                    continue
                try:
                    compiled(self.model, layer_idx, zeros, None, None)
                except Exception as error:  # any failure here means: run this layer eagerly
                    logger.warning(
                        "AFD ffn: layer %d cannot be compiled, it runs eagerly: %s",
                        layer_idx,
                        str(error).splitlines()[0] if str(error) else type(error).__name__,
                    )
                    self.eager_layers.add(layer_idx)
                    return
        self._compiled[layer_idx] = compiled

    def compute_ffn_output(
        self,
        layer_idx: int,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor | None = None,
        token_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        compute: Callable[..., torch.Tensor] = self._compiled.get(layer_idx, _layer_output)
        return compute(self.model, layer_idx, hidden_states, router_logits, token_ids)


def ffn_layer_model(model: Any, vllm_config: Any, device: torch.device) -> Any:
    """What computes the layers of FFN-role ``model``: the model itself, or, where its config
    says so (:func:`~afd_models.worker_config.compiles_ffn_layers`), its layers compiled and
    warmed up now (all but token-id layers: the warm-up has no token ids to give)."""
    if not compiles_ffn_layers(vllm_config):
        return model
    layers = CompiledLayers(model)
    with_ids = set(token_id_layers(model))
    layers.warm_up(
        [layer for layer in model.ffn_layer_indices() if layer not in with_ids],
        vllm_config.model_config.get_hidden_size(),
        vllm_config.model_config.dtype,
        device,
        lambda tokens: vllm_forward_context(vllm_config, tokens),
    )
    return layers
