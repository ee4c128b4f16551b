"""Role-aware weight loading checks the generated causal LM runs around vLLM's own loader.

vLLM's loader (kept unchanged) skips checkpoint tensors under layers this role does not own. Its
strict check for parameters the checkpoint never filled does not catch linear layers in 0.26 (it
counts every module with a ``process_weights_after_loading`` method as loaded) nor single experts
(fused into one parameter per projection). So before loading, every floating-point parameter of
the role is filled with NaN; afterwards, any NaN left marks rows the checkpoint lacked, and the
error names the parameter (and the experts) concerned.

Parameters vLLM initialises itself are left alone (:data:`SELF_INITIALISED`): the KV-cache scales
that every attention layer of a quantized model carries start at vLLM's own "not loaded" value
(-1.0) and are resolved after loading, since checkpoints (FP8 DeepSeek ones among them) rarely
hold them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn
from vllm.model_executor.layers.quantization.kv_cache import KVCacheScaleParameter

from afd_models.log import get_logger

logger = get_logger(__name__)

#: parameter types vLLM gives a sentinel of its own and resolves after loading when the
#: checkpoint has no value: never marked, never reported
SELF_INITIALISED: tuple[type, ...] = (KVCacheScaleParameter,)


def _checked(parameter: torch.Tensor) -> bool:
    """Whether the checkpoint must fill ``parameter``."""
    return parameter.is_floating_point() and not isinstance(parameter, SELF_INITIALISED)


def mark_unloaded(model: nn.Module) -> None:
    """Fill every checked parameter with NaN: whatever the checkpoint does not overwrite stays NaN."""
    with torch.no_grad():
        for parameter in model.parameters():
            if _checked(parameter):
                parameter.fill_(float("nan"))


def counting(
    weights: Iterable[tuple[str, torch.Tensor]], seen: list[int]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass checkpoint tensors through in one pass (vLLM streams them), counting them."""
    for item in weights:
        seen[0] += 1
        yield item


#: vLLM's fused expert parameters -> the checkpoint projections stacked in them, in row order
_FUSED_EXPERTS = {"w13_weight": ("gate_proj", "up_proj"), "w2_weight": ("down_proj",)}


def _describe(name: str, parameter: torch.Tensor) -> str:
    """The parameter's name, or for fused experts the checkpoint tensors that were missing."""
    missing = torch.isnan(parameter)
    stacked = _FUSED_EXPERTS.get(name.rsplit(".", 1)[-1])
    if stacked is None or parameter.dim() != 3 or ".mlp.experts." not in name:
        return name
    layer = name.split(".mlp.experts.")[0]
    names = []
    for expert in range(parameter.shape[0]):
        for part, rows in zip(stacked, missing[expert].chunk(len(stacked)), strict=True):
            if bool(rows.any()):
                names.append(f"{layer}.mlp.experts.{expert}.{part}.weight")
    return ", ".join(names)


def finish_loading(model: nn.Module, role: str, tensors_read: int, loaded: set[str]) -> set[str]:
    """Fail on parameters the checkpoint left unfilled; return this role's loaded parameter names.

    Raises:
        ValueError: the checkpoint lacks tensors this role needs; the message names them.
    """
    own = dict(model.named_parameters())
    unfilled = [
        _describe(n, p) for n, p in own.items() if _checked(p) and bool(torch.isnan(p).any())
    ]
    if unfilled:
        shown = ", ".join(unfilled[:8]) + (
            f" and {len(unfilled) - 8} more" if len(unfilled) > 8 else ""
        )
        raise ValueError(f"the checkpoint lacks tensors the {role} role needs; not loaded: {shown}")
    exact = loaded & set(own)
    logger.info(
        "AFD %s role loaded %d parameters from %d checkpoint tensors",
        role,
        len(exact),
        tensors_read,
    )
    return exact
