"""AFD edits to vLLM's model runners: the CPU runner and the GPU runner it derives from.

One declaration per role generates a subclass of each base. The Attention runner prepares its
connector before loading the model (config checks; a loopback connector builds its FFN half
first), connects to the FFN role once the model is loaded (the handshake compares the loaded
models; the FFN role computes during vLLM's profiling forward, which comes later) and binds the
connector to the model's remote proxies, and runs a step again when its FFN peer was restarted
during it (``peer_restart_timeout_s``), or fails the step's requests when none came back in time;
the FFN runner loads the FFN half, connects and serves steps.
"""

import functools
from typing import Any

import numpy as np
import torch
from torch import nn
from vllm.compilation.cuda_graph import CUDAGraphStat, CUDAGraphWrapper
from vllm.config import CUDAGraphMode
from vllm.forward_context import BatchDescriptor
from vllm.sequence import IntermediateTensors
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.gpu_ubatch_wrapper import UBatchWrapper

from afd_models.connectors.base import AFDPeerLostError
from afd_models.dbo import split_single_rank
from afd_models.ffn_server import FFNServer
from afd_models.generated_classes import generated_subclass
from afd_models.runner_roles import (
    fail_lost_step,
    forward_across_restarts,
    load_attention,
    load_ffn,
    refuse_preloaded_model,
    start_ffn_server,
    stop_role,
)
from codegen.markers import delta, extend, fork, override, replace, subclass

RUNNER_BASES = ("CPUModelRunner", "vllm.v1.worker.gpu_model_runner:GPUModelRunner")
LOAD_SPANS = (
    delta(
        "decorators",
        upstream="@instrument(span_name='Loading (CPU)')",
        ours=None,
        base="CPUModelRunner",
        why="calls super().load_model(), which opens the tracing span",
    ),
    delta(
        "decorators",
        upstream="@instrument(span_name='Loading (GPU)')",
        ours=None,
        base="GPUModelRunner",
        why="calls super().load_model(), which opens the tracing span",
    ),
    # vLLM 0.32's GPU runner takes a pre-loaded model (its weight cache); AFD refuses one
    delta(
        "param_added",
        "model",
        ours="model: nn.Module | None = None",
        base="CPUModelRunner",
        why="the CPU runner has no such parameter; AFD's override refuses a pre-loaded model",
    ),
    delta(
        "param_added",
        "model",
        ours="model: nn.Module | None = None",
        base="GPUModelRunner",
        why="vLLM 0.32 added it; AFD's override refuses a pre-loaded model",
        when="vllm<0.32",
    ),
)


@subclass(bases=RUNNER_BASES, name="AFDAttention{base}")
class AFDAttentionCPUModelRunner(CPUModelRunner):
    """vLLM's runner with the AFD Attention model and its connector."""

    @override(deltas=LOAD_SPANS)
    def load_model(
        self, load_dummy_weights: bool = False, *, model: nn.Module | None = None
    ) -> None:
        refuse_preloaded_model(model)
        load = functools.partial(super().load_model, load_dummy_weights=load_dummy_weights)
        self.afd_connector, self.afd_graph_steps = load_attention(self, load)
        if type(self.model) is CUDAGraphWrapper:
            # vLLM's FULL-graph wrapper, replaced by the AFD one that announces replays
            wrapper = generated_subclass("AFDCUDAGraphWrapper", CUDAGraphWrapper)
            self.model = wrapper(
                self.model.unwrap(), self.vllm_config, runtime_mode=self.model.runtime_mode
            )
            self.model.bind_afd_steps(self.afd_graph_steps)
        elif type(self.model) is UBatchWrapper:
            # DBO: vLLM's micro-batch wrapper, replaced by the AFD one that tells the connector
            # how each step is split (and announces replays)
            mode = (
                CUDAGraphMode.NONE if self.model.cudagraph_wrapper is None else CUDAGraphMode.FULL
            )
            wrapper = generated_subclass("AFDUBatchWrapper", UBatchWrapper)
            self.model = wrapper(self.model.unwrap(), self.vllm_config, mode, self.device)
            self.model.bind_afd_steps(self.afd_graph_steps)

    @override
    def _model_forward(
        self,
        input_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **model_kwargs: dict[str, Any],
    ) -> Any:
        # upstream's override point for the forward alone: a step whose FFN peer went away runs
        # again here, once a restarted one connected (execute_model around it must not repeat)
        forward = functools.partial(
            super()._model_forward,
            input_ids=input_ids,
            positions=positions,
            intermediate_tensors=intermediate_tensors,
            inputs_embeds=inputs_embeds,
            **model_kwargs,
        )
        return forward_across_restarts(self, forward)

    @fork(
        replace(
            "outputs = self.model($...ARGS)",
            "outputs = self._model_forward($...ARGS)",
            id="dummy-forward-across-restarts",
            why="an idle DP rank's dummy step reaches the FFN rank like the busy ranks' steps: "
            "only its model call is held and run again with theirs, not the DP batch "
            "coordination before it, which the busy ranks do not repeat",
        ),
        deltas=(
            delta(
                "param_added",
                "randomize_inputs",
                ours="randomize_inputs: bool = False",
                why="vLLM 0.27 added it; the forked body is each release's own",
                when="vllm<0.27",
            ),
        ),
    )
    @torch.inference_mode()
    def _dummy_run(
        self,
        num_tokens: int,
        cudagraph_runtime_mode: CUDAGraphMode | None = None,
        force_attention: bool = False,
        uniform_decode: bool = False,
        allow_microbatching: bool = True,
        skip_eplb: bool = False,
        is_profile: bool = False,
        create_mixed_batch: bool = False,
        remove_lora: bool = True,
        is_graph_capturing: bool = False,
        num_active_loras: int = 0,
        profile_seq_lens: int | None = None,
        randomize_inputs: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    @override
    @torch.inference_mode()
    def execute_model(
        self,
        scheduler_output: "SchedulerOutput",
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | IntermediateTensors | None:
        try:
            return super().execute_model(scheduler_output, intermediate_tensors)
        except AFDPeerLostError as lost:
            # no FFN engine came back within peer_restart_timeout_s: the step's requests fail
            # (the AFD scheduler finishes them with an error) and the engine stays up
            return fail_lost_step(scheduler_output, lost)

    @override(
        deltas=(
            delta(
                "param_default",
                "use_cascade_attn",
                upstream=None,
                ours="False",
                why="vLLM 0.32 gave it a default (it ignores it now); we pass it on either way",
                when="vllm<0.32",
            ),
        )
    )
    def _determine_batch_execution_and_padding(
        self,
        num_tokens: int,
        num_reqs: int,
        num_scheduled_tokens_np: np.ndarray,
        max_num_scheduled_tokens: int,
        use_cascade_attn: bool = False,
        allow_microbatching: bool = True,
        force_eager: bool = False,
        force_uniform_decode: bool | None = None,
        force_has_lora: bool | None = None,
        force_num_active_loras: int | None = None,
        num_encoder_reqs: int = 0,
    ) -> tuple[
        CUDAGraphMode,
        BatchDescriptor,
        bool,
        torch.Tensor | None,
        CUDAGraphStat | None,
    ]:
        decided = super()._determine_batch_execution_and_padding(
            num_tokens,
            num_reqs,
            num_scheduled_tokens_np,
            max_num_scheduled_tokens,
            use_cascade_attn,
            allow_microbatching=allow_microbatching,
            force_eager=force_eager,
            force_uniform_decode=force_uniform_decode,
            force_has_lora=force_has_lora,
            force_num_active_loras=force_num_active_loras,
            num_encoder_reqs=num_encoder_reqs,
        )
        if not self.parallel_config.use_ubatching or self.parallel_config.data_parallel_size > 1:
            return decided  # vLLM decides across its DP ranks
        mode, descriptor, _, across_dp, stats = decided
        # one DP rank: vLLM never splits, the AFD engine decides by vLLM's own thresholds
        uniform_decode = self._is_uniform_decode(
            max_num_scheduled_tokens=max_num_scheduled_tokens,
            uniform_decode_query_len=self.uniform_decode_query_len,
            num_tokens=num_tokens,
            num_reqs=num_reqs,
            force_uniform_decode=force_uniform_decode,
        )
        split = split_single_rank(
            self.parallel_config,
            allow_microbatching=allow_microbatching,
            num_tokens=num_tokens,
            num_tokens_padded=descriptor.num_tokens,
            uniform_decode=uniform_decode,
            full_graph=mode is CUDAGraphMode.FULL,
        )
        return mode, descriptor, split, across_dp, stats

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
        """Graph captures and replays, and micro-batch splits, of this runner's steps."""
        return self.afd_graph_steps.counters.as_dict()


@subclass(bases=RUNNER_BASES, name="AFDFFN{base}")
class AFDFFNCPUModelRunner(CPUModelRunner):
    """vLLM's runner loading the FFN half of the model; it serves steps instead of batches."""

    @override(deltas=LOAD_SPANS)
    def load_model(
        self, load_dummy_weights: bool = False, *, model: nn.Module | None = None
    ) -> None:
        refuse_preloaded_model(model)
        load = functools.partial(super().load_model, load_dummy_weights=load_dummy_weights)
        self.afd_connector = load_ffn(self, load)
        self.afd_server: FFNServer | None = None

    @extend
    def start_afd_server(self, device_graphs: bool) -> FFNServer:
        """Start serving the Attention peers (:func:`afd_models.runner_roles.start_ffn_server`)."""
        self.afd_server = start_ffn_server(self, self.afd_connector, device_graphs)
        return self.afd_server

    @override
    def shutdown(self) -> None:
        try:
            stop_role(self)
        finally:
            super().shutdown()
