"""AFD edits to vLLM-Ascend's MRv1 model runner (``vllm_ascend/worker/model_runner_v1.py``): both
roles on an Ascend NPU, as ``overlay/vllm/v1/worker/cpu_model_runner.py`` declares them for the CPU
and CUDA runners (the shared part is :mod:`afd_models.runner_roles`).

The Attention runner swaps vLLM-Ascend's FULL-graph ``ACLGraphWrapper`` for the AFD one that
announces replays (``overlay/vllm_ascend/compilation/acl_graph.py``). The FFN runner computes each
layer in vLLM-Ascend's forward context, which picks the MoE communication method and its mask
from the step's token count, as a native forward of that many tokens would.
"""

import contextlib

from vllm.config import CUDAGraphMode, VllmConfig
from vllm_ascend.ascend_forward_context import set_ascend_forward_context
from vllm_ascend.compilation.acl_graph import ACLGraphWrapper
from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

from afd_models.ffn_server import FFNServer
from afd_models.generated_classes import generated_subclass
from afd_models.runner_roles import load_attention, load_ffn, start_ffn_server, stop_role
from codegen.markers import extend, override, subclass


@subclass(name="AFDAttention{base}")
class AFDAttentionNPUModelRunner(NPUModelRunner):
    """vLLM-Ascend's runner with the AFD Attention model and its connector."""

    @override
    def load_model(self) -> None:
        self.afd_connector, self.afd_graph_steps = load_attention(self, super().load_model)
        if type(self.model) is ACLGraphWrapper:
            # vLLM-Ascend's FULL-graph wrapper, replaced by the AFD one that announces replays
            wrapper = generated_subclass("AFDACLGraphWrapper", ACLGraphWrapper)
            self.model = wrapper(
                self.model.unwrap(),
                self.vllm_config,
                runtime_mode=CUDAGraphMode.FULL,
                use_eagle=self.use_eagle,
                enable_enpu=self.enable_enpu,
            )
            self.model.bind_afd_steps(self.afd_graph_steps)

    @override
    def shutdown(self) -> None:
        try:
            stop_role(self)
        finally:
            super().shutdown()

    @extend
    def afd_connector_stats(self) -> dict[str, float]:
        """Round trips through the connector so far (for the demo and benchmarks)."""
        return self.afd_connector.stats.as_dict()

    @extend
    def afd_counters(self) -> dict[str, int]:
        """Graph captures and replays of this runner's steps."""
        return self.afd_graph_steps.counters.as_dict()


@subclass(name="AFDFFN{base}")
class AFDFFNNPUModelRunner(NPUModelRunner):
    """vLLM-Ascend's runner loading the FFN half of the model; it serves steps instead of batches."""

    @override
    def load_model(self) -> None:
        self.afd_connector = load_ffn(self, super().load_model)
        self.afd_server: FFNServer | None = None

    @extend
    def afd_forward_context(
        self, vllm_config: VllmConfig, num_tokens: int
    ) -> contextlib.AbstractContextManager[object]:
        """vLLM-Ascend's forward context for one layer's FFN over ``num_tokens`` received rows."""
        return set_ascend_forward_context(
            None, vllm_config, num_tokens=num_tokens, num_actual_tokens=num_tokens
        )

    @extend
    def start_afd_server(self, device_graphs: bool) -> FFNServer:
        """Start serving the Attention peers (:func:`afd_models.runner_roles.start_ffn_server`)."""
        self.afd_server = start_ffn_server(
            self, self.afd_connector, device_graphs, self.afd_forward_context
        )
        return self.afd_server

    @override
    def shutdown(self) -> None:
        try:
            stop_role(self)
        finally:
            super().shutdown()
