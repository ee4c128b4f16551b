"""The in-process loopback connector: the FFN half of the model lives in the Attention worker.

For tests, ``python -m afd_models.cli.verify`` and benchmarks: the same generated Attention model,
proxies and connector interface as a real deployment, with the transport replaced by a direct
call into an FFN-role model built in the same process (its own copy of the engine config, so the
two models never share vLLM's per-config layer registry).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import torch
from torch import nn
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.forward_context import ForwardContext, create_forward_context, override_forward_context
from vllm.model_executor.model_loader import get_model_loader
from vllm.platforms import current_platform

from afd_models.config import AFD_KEY, AFDConfig
from afd_models.connectors.base import AFDConnector, LayerInput, StepHeader
from afd_models.ffn_compile import ffn_layer_model
from afd_models.ffn_server import ffn_output
from afd_models.worker_config import ffn_worker_config

#: the FFN half: a layer's output for what it received
Compute = Callable[[int, LayerInput], torch.Tensor]


class LoopbackConnector(AFDConnector):
    """Attention side whose "FFN peer" is a function call.

    ``compute(layer_idx, received)`` runs the FFN half; ``step_context`` (if
    given) builds the forward context it runs in, once per step (the header), and every layer only
    swaps it in, as the gloo FFN server does once per step.
    """

    def __init__(
        self, compute: Compute, step_context: Callable[[StepHeader], ForwardContext] | None = None
    ):
        super().__init__()
        self.compute = compute
        self.step_context = step_context
        #: the header of the step in progress
        self.header: StepHeader | None = None
        #: the in-process FFN-role model, when built by :meth:`with_ffn_model`
        self.ffn_model: nn.Module | None = None
        self._context: ForwardContext | None = None
        #: FFN outputs by (micro-batch, layer)
        self._results: dict[tuple[int, int], torch.Tensor] = {}

    def in_process_weight_bytes(self) -> int:
        if self.ffn_model is None:
            return 0
        tensors = [*self.ffn_model.parameters(), *self.ffn_model.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def _send_header(self, header: StepHeader) -> None:
        self._begin(header)

    def _capture_header(self, header: StepHeader) -> None:
        # the in-process FFN half is captured with the graph, in its own forward context
        self._begin(header)

    def _begin(self, header: StepHeader) -> None:
        self.header = header
        self._context = self.step_context(header) if self.step_context is not None else None

    def _send_layer(
        self,
        layer_idx: int,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor | None,
        ubatch: int,
        token_ids: torch.Tensor | None,
    ) -> None:
        received = LayerInput(hidden_states, router_logits, token_ids)
        if self._context is None:
            output = self.compute(layer_idx, received)
        else:
            with torch.inference_mode(), override_forward_context(self._context):
                output = self.compute(layer_idx, received)
        self._results[(ubatch, layer_idx)] = output

    def _recv_layer(self, layer_idx: int, like: torch.Tensor, ubatch: int) -> torch.Tensor:
        return self._results.pop((ubatch, layer_idx))

    @classmethod
    def with_ffn_model(cls, vllm_config: VllmConfig, afd: AFDConfig) -> LoopbackConnector:
        """Build the FFN-role model of this engine's checkpoint in-process and serve it directly.

        Call before the Attention model is built: the FFN model gets a deep copy of the config
        (its AFD section in the FFN role, with the default connector), made as an FFN worker's
        is: its layers compiled one by one (and warmed up now) unless the engine is eager
        (``--enforce-eager``) or its gate runs on Attention.
        """
        ffn_config = copy.deepcopy(vllm_config)
        section = dict(ffn_config.additional_config[AFD_KEY])
        section["role"] = "ffn"
        # The in-process FFN model uses no connector; its section takes the default one, since
        # an FFN section naming the loopback connector is refused.
        section.pop("connector", None)
        section.pop("connector_extra_config", None)
        ffn_config.additional_config = {**ffn_config.additional_config, AFD_KEY: section}
        # the gate runs where the Attention worker's parsed section says (the copy's says the same)
        ffn_config = ffn_worker_config(
            ffn_config, current_platform.device_type, afd.compute_gate_on_attention
        )
        with set_current_vllm_config(ffn_config):
            model = get_model_loader(ffn_config.load_config).load_model(
                vllm_config=ffn_config, model_config=ffn_config.model_config
            )
        layers = ffn_layer_model(model, ffn_config, torch.device(current_platform.device_type))
        connector = cls(
            functools.partial(ffn_output, layers),
            lambda _: create_forward_context(None, ffn_config),
        )
        connector.ffn_model = model
        return connector


def in_process_attention(vllm_config: VllmConfig, afd: AFDConfig) -> LoopbackConnector:
    """The loopback Attention side, its FFN half built now (the spec's builder)."""
    return LoopbackConnector.with_ffn_model(vllm_config, afd)
