"""AFD edits to Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``), the CUDA default since
vLLM 0.29: the Attention role's runner when vLLM picks V2 (``VllmConfig.use_v2_model_runner``).

It does what the AFD V1 Attention runner does (``overlay/vllm/v1/worker/cpu_model_runner.py``),
where V2 keeps each piece:

- ``load_model`` prepares the connector, loads the Attention half and connects it;
- ``initialize_kv_cache`` builds AFD subclasses of V2's helpers where vLLM builds its own: the
  micro-batch runner (``ubatch_utils.py`` beside this file), which tells the connector each
  split, and the CUDA-graph manager (``cudagraph_utils.py``), which announces each FULL replay
  and captures with the connector in capture mode;
- ``execute_model`` runs each of its forward calls (a FULL replay, a piecewise graph, eager)
  again once a restarted FFN engine connected (``peer_restart_timeout_s``), and returns a failed
  step's output when none came back in time. V2 samples in ``sample_tokens``; an engine core does
  not sample a step whose ``execute_model`` returned an output. The micro-batch call is wrapped
  alike but never retried: a restart needs one DP rank and DBO on V2 two, and a micro-batch
  thread's error reaches it as vLLM's own ``RuntimeError``.

V2 micro-batches only across more than one DP rank; the AFD workers refuse DBO on V2 with one
(``afd_models/worker_config.py``).
"""

import functools
from contextlib import AbstractContextManager

import torch
from torch import nn
from vllm.sequence import IntermediateTensors
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.gpu.model_runner import GPUModelRunner

from afd_models.runner_roles import (  # noqa: F401 (edit code)
    afd_graph_manager,
    afd_ubatch_runner,
    failing_lost_step,
    forward_across_restarts,
    load_attention,
    refuse_preloaded_model,
    stop_role,
)
from codegen.markers import (
    delta,
    extend,
    fork,
    insert_before,
    override,
    replace,
    subclass,
    wrap,
)


@subclass(when="vllm>=0.30")
class AFDAttentionGPUModelRunnerV2(GPUModelRunner):
    """vLLM's Model Runner V2 with the AFD Attention model and its connector."""

    @override(
        deltas=(
            delta(
                "param_added",
                "model",
                ours="model: nn.Module | None = None",
                why="vLLM 0.32 added it; AFD's override refuses a pre-loaded model",
                when="vllm<0.32",
            ),
        )
    )
    def load_model(
        self,
        load_dummy_weights: bool = False,
        *args,
        model: nn.Module | None = None,
        **kwargs,
    ) -> None:
        refuse_preloaded_model(model)
        load = functools.partial(super().load_model, load_dummy_weights, *args, **kwargs)
        self.afd_connector, self.afd_graph_steps = load_attention(self, load)

    @fork(
        replace(
            "self.ubatch_runner = maybe_build_ubatch_runner($...ARGS)",
            "self.ubatch_runner = afd_ubatch_runner(maybe_build_ubatch_runner($...ARGS), self.afd_graph_steps, $...ARGS)",
            id="afd-ubatch-runner",
            why="micro-batches tell the connector how each step is split; vLLM still decides "
            "whether there is a micro-batch runner",
        ),
        replace(
            "self.cudagraph_manager = ModelCudaGraphManager($...ARGS)",
            "self.cudagraph_manager = afd_graph_manager(ModelCudaGraphManager, self.afd_graph_steps, $...ARGS)",
            id="afd-graph-manager",
            why="a FULL replay runs no Python: the manager announces each replayed step to the "
            "FFN role first, and captures with the connector in capture mode",
        ),
    )
    def initialize_kv_cache(
        self,
        kv_cache_config: KVCacheConfig,
        is_profiling: bool = False,
        kv_cache_allocation_context: AbstractContextManager | None = None,
    ) -> None: ...

    @fork(
        replace(
            "model_output = $FORWARD",
            "model_output = forward_across_restarts(self, lambda: $FORWARD)",
            count=4,
            id="forward-across-restarts",
            why="a step whose FFN peer went away runs its forward again once a restarted one "
            "connected (the inputs are prepared before, sampling comes after)",
        ),
        wrap(
            """
            if batch_desc.cg_mode == CUDAGraphMode.FULL:
                ...
            else:
                ...
            """,
            "with failing_lost_step(scheduler_output, dummy_run) as afd_lost:",
            id="lost-step",
            why="no FFN engine came back within peer_restart_timeout_s: the step's requests "
            "fail (the AFD scheduler finishes them with an error) and the engine stays up; a "
            "dummy run has none, and fails as before",
        ),
        insert_before(
            "self.kv_connector.finish_forward()",
            "if afd_lost.output is not None:\n    return afd_lost.output",
            id="return-lost-step",
            why="the failed step's output goes to the scheduler unsampled",
        ),
        deltas=(
            delta(
                "param_added",
                "randomize_inputs",
                ours="randomize_inputs: bool = False",
                why="vLLM 0.32 added it (dummy runs); the forked body is 0.30's there",
                when="vllm<0.32",
            ),
        ),
    )
    @torch.inference_mode()
    def execute_model(
        self,
        scheduler_output: SchedulerOutput,
        intermediate_tensors: IntermediateTensors | None = None,
        dummy_run: bool = False,
        skip_attn_for_dummy_run: bool = False,
        is_profile: bool = False,
        context_len: int = 0,
        valid_dummy_state_slots: bool = False,
        randomize_inputs: bool = False,
    ) -> ModelRunnerOutput | IntermediateTensors | None: ...

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
