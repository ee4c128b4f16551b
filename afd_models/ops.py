"""The AFD exchange as a torch custom op: all that vLLM's compiler sees of the connector.

``torch.ops.afd.exchange(hidden_states, router_logits, token_ids, layer_name)`` sends one layer's
activations (its router logits when the gate runs on Attention, its tokens' ids when its routing
needs them; else ``None``) to the FFN role and returns the FFN output, shaped and typed like
``hidden_states``.

To Dynamo and Inductor the op is opaque: its fake implementation gives the output from the inputs'
shapes alone, so ``fullgraph=True`` tracing never enters the connector (sockets, timers, numpy),
and the real implementation runs at the same place in the compiled graph as in eager mode. The
connector is reached through the layer name, not traced: each remote proxy registers itself under
its module prefix in the engine's ``static_forward_context``, as vLLM's attention and MoE layers
do, and the op looks it up in the forward context of the running step.

The workers add :data:`SPLITTING_OPS` to ``compilation_config.splitting_ops`` of their own config
copy, so vLLM's piecewise compilation splits the graph at every exchange, and a piecewise CUDA
graph leaves it out. For a later capture *inside* a graph the op is already suited: its output
shape comes from its inputs, and nothing in its traced surface reads tensor values on the host.

The library is this project's own namespace (``afd``), never ``vllm``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
from torch.library import Library
from vllm.forward_context import get_forward_context
from vllm.utils.torch_utils import direct_register_custom_op

if TYPE_CHECKING:
    from collections.abc import Mapping

#: the torch library namespace of every AFD op
LIBRARY_NAME = "afd"
#: qualified name of the exchange op
EXCHANGE = f"{LIBRARY_NAME}::exchange"
#: ops the AFD workers add to ``compilation_config.splitting_ops``
SPLITTING_OPS: tuple[str, ...] = (EXCHANGE,)


class Exchanger(Protocol):
    """What the op calls: a remote proxy with its connector bound."""

    def exchange(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor | None,
        token_ids: torch.Tensor | None,
    ) -> torch.Tensor: ...


def find_exchanger(layers: Mapping[str, object], layer_name: str) -> Exchanger:
    """The proxy registered as ``layer_name`` in a forward context's layers."""
    proxy = layers.get(layer_name)
    if proxy is None or not hasattr(proxy, "exchange"):
        raise RuntimeError(
            f"{EXCHANGE}: no AFD remote layer {layer_name!r} in the forward context; remote proxies "
            "register under their module prefix when the AFD Attention model is built"
        )
    return proxy


def _exchange(
    hidden_states: torch.Tensor,
    router_logits: torch.Tensor | None,
    token_ids: torch.Tensor | None,
    layer_name: str,
) -> torch.Tensor:
    proxy = find_exchanger(get_forward_context().no_compile_layers, layer_name)
    return proxy.exchange(hidden_states, router_logits, token_ids)


def _exchange_fake(
    hidden_states: torch.Tensor,
    router_logits: torch.Tensor | None,
    token_ids: torch.Tensor | None,
    layer_name: str,
) -> torch.Tensor:
    return torch.empty_like(hidden_states)


# The library object owns the op: it must live as long as the process (a module global does).
_library = Library(LIBRARY_NAME, "FRAGMENT")
direct_register_custom_op(
    "exchange", _exchange, mutates_args=[], fake_impl=_exchange_fake, target_lib=_library
)


def exchange(
    hidden_states: torch.Tensor,
    router_logits: torch.Tensor | None,
    token_ids: torch.Tensor | None,
    layer_name: str,
) -> torch.Tensor:
    """Send ``layer_name``'s activations to the FFN role and return its output (the op's entry point)."""
    return torch.ops.afd.exchange(hidden_states, router_logits, token_ids, layer_name)
