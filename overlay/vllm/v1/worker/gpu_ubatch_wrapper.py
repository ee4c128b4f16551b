"""AFD edits to vLLM's micro-batch wrapper (``vllm/v1/worker/gpu_ubatch_wrapper.py``, DBO).

With ``additional_config.afd.dbo`` vLLM wraps the Attention model in its ``UBatchWrapper``; the AFD
Attention runner puts this subclass in its place once the model is loaded. It reserves no SMs
for communication kernels (the exchange runs none), and differs in two places of ``__call__``:

- an engine of one DP rank has no DP metadata to slice (vLLM splits only across DP ranks, the
  AFD runner splits one rank alone), so each micro-batch gets none;
- the split step is told to the connector first (:meth:`AttentionGraphSteps.split_step`): the
  micro-batches' token counts for the step header, capture mode while vLLM captures the split
  step's FULL graph, the kept header announced before it replays.

Steps it does not split go, as in vLLM, to the model or to the FULL-graph wrapper it holds, which
is the AFD one (announcing its replays) once :meth:`bind_afd_steps` ran.
"""

import contextlib
from collections.abc import Callable

import torch
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.v1.worker.gpu_ubatch_wrapper import UBatchWrapper

from afd_models.generated_classes import generated_subclass
from afd_models.graphs import AttentionGraphSteps, split_step  # noqa: F401 (edit code)
from codegen.markers import extend, fork, override, replace, subclass, wrap


@subclass(feature="DBO on the V1 runners, one DP rank included (V1's micro-batch wrapper)")
class AFDUBatchWrapper(UBatchWrapper):
    """vLLM's micro-batch wrapper, telling the AFD connector how each step is split."""

    @extend
    def bind_afd_steps(self, steps: AttentionGraphSteps) -> None:
        """The Attention runner's graph steps (its connector and counters), also for the FULL
        graphs of the steps this wrapper does not split."""
        self.afd_steps = steps
        if self.cudagraph_wrapper is not None:
            from vllm.compilation.cuda_graph import CUDAGraphWrapper

            wrapper = generated_subclass("AFDCUDAGraphWrapper", CUDAGraphWrapper)
            self.cudagraph_wrapper = wrapper(
                self.runnable, self.vllm_config, runtime_mode=self.cudagraph_wrapper.runtime_mode
            )
            self.cudagraph_wrapper.bind_afd_steps(steps)

    @override(when="vllm<0.30")
    @staticmethod
    def _create_sm_control_context(vllm_config: VllmConfig):
        # vLLM reserves SMs for an all2all kernel during micro-batches and takes them from
        # DeepGEMM; the AFD exchange runs no such kernel, so compute keeps every SM
        return contextlib.nullcontext()

    @fork(
        replace(
            "self.sm_control = create_sm_control_context(vllm_config.parallel_config)",
            "self.sm_control = contextlib.nullcontext()",
            id="no-reserved-sms",
            why="the AFD exchange runs no all2all kernel, so compute keeps every SM (0.30 builds "
            "the SM reservation in __init__ instead of a static method)",
        ),
        when="vllm>=0.30",
    )
    def __init__(
        self,
        runnable: Callable,
        vllm_config: VllmConfig,
        runtime_mode: CUDAGraphMode,
        device: torch.cuda.device,
    ): ...

    @fork(
        wrap(
            """
            assert dp_metadata is not None
            ubatch_dp_metadata = []
            for ubatch_slice in ubatch_slices:
                ...
            """,
            "if dp_metadata is not None:",
            orelse="ubatch_dp_metadata = [None] * len(ubatch_slices)",
            id="one-dp-rank",
            why="an AFD Attention engine of one DP rank splits steps alone and has no DP metadata",
        ),
        wrap(
            """
            if ...:
                ...
            elif ...:
                ...
            else:
                ...
            """,
            "with split_step(self.__dict__.get('afd_steps'), ubatch_slices, cudagraph_runtime_mode, self.cudagraphs):",
            id="announce-split-step",
            why="the FFN role learns the split from the step header, and a replay runs no Python",
        ),
    )
    def __call__(self, *args, **kwargs): ...
