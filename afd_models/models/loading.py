"""Role-aware weight loading checks the generated causal LM runs around vLLM's own loader.

vLLM's loader (kept unchanged) skips checkpoint tensors under layers this role does not own. Its
strict check for parameters the checkpoint never filled does not catch linear layers in 0.26 (it
counts every module with a ``process_weights_after_loading`` method as loaded) nor single experts
(fused into one parameter per projection). So before loading, every floating-point parameter of
the role is filled with NaN; afterwards, any NaN left marks rows the checkpoint lacked, and the
error names the parameter (and the experts) concerned.

Parameters vLLM initialises itself are left alone: those of a module whose quant method is vLLM's
KV-cache method (``BaseKVCacheMethod`` and its FP8 and compressed-tensors subclasses), the KV-cache
scales and zero points every attention layer of a quantized model carries. They start at vLLM's
own "not loaded" values and are resolved after loading, since checkpoints (FP8 DeepSeek ones among
them) rarely hold them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn
from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod

from afd_models.log import get_logger

logger = get_logger(__name__)


def _checked(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The parameters the checkpoint must fill: floating point, and not vLLM's own KV-cache
    method's (it resolves those after loading)."""
    vllms = {
        id(parameter)
        for module in model.modules()
        if isinstance(getattr(module, "quant_method", None), BaseKVCacheMethod)
        for parameter in module.parameters(recurse=False)
    }
    return [
        (name, parameter)
        for name, parameter in model.named_parameters()
        if parameter.is_floating_point() and id(parameter) not in vllms
    ]


def mark_unloaded(model: nn.Module) -> None:
    """Fill every checked parameter with NaN: whatever the checkpoint does not overwrite stays NaN."""
    with torch.no_grad():
        for _, parameter in _checked(model):
            parameter.fill_(float("nan"))


def _counting(
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
    unfilled = [_describe(n, p) for n, p in _checked(model) if bool(torch.isnan(p).any())]
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


def load_role_weights(
    model: nn.Module,
    load: Callable[[Iterable[tuple[str, torch.Tensor]]], set[str]],
    weights: Iterable[tuple[str, torch.Tensor]],
    role: str,
) -> set[str]:
    """Run vLLM's loader ``load`` (the causal LM's own ``load_weights``) on ``weights``, plus the
    check it cannot make: every parameter of the role was filled.

    Raises:
        ValueError: the checkpoint lacks tensors this role needs; the message names them.
    """
    mark_unloaded(model)
    read = [0]
    loaded = load(_counting(weights, read))
    return finish_loading(model, role, read[0], loaded)
