"""AFD edits to Model Runner V2's micro-batch runner (``vllm/v1/worker/gpu/ubatch_utils.py``, DBO).

vLLM 0.30 gave Model Runner V2 its own ``UBatchRunner``: it splits a step into micro-batches, runs
each in a thread and hands the device between them. The AFD V2 runner builds this subclass in
its place (``afd_models.runner_roles.afd_ubatch_runner``, from a fork of ``initialize_kv_cache``).
It reserves no SMs for communication kernels (the exchange runs none), and tells the connector
how each step it runs is split before the micro-batches start
(:meth:`afd_models.graphs.AttentionGraphSteps.plan_split`); the FULL graphs of split steps are
captured and replayed by the AFD graph manager (``cudagraph_utils.py`` beside this file).
"""

import contextlib  # noqa: F401 (edit code)
from collections.abc import Callable
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.worker.gpu.model_states.interface import ModelState
from vllm.v1.worker.gpu.ubatch_utils import UBatchRunner, UBatchState
from vllm.v1.worker.utils import AttentionGroup

from afd_models.graphs import AttentionGraphSteps, bound_steps
from codegen.markers import extend, fork, override, replace, subclass


@subclass(when="vllm>=0.30", feature="DBO on Model Runner V2 (two or more DP ranks)")
class AFDUBatchRunner(UBatchRunner):
    """Model Runner V2's micro-batch runner, telling the AFD connector how each step is split."""

    @fork(
        replace(
            "self.sm_control = create_sm_control_context(self.parallel_config)",
            "self.sm_control = contextlib.nullcontext()",
            id="no-reserved-sms",
            why="the AFD exchange runs no all2all kernel, so compute keeps every SM (as in the "
            "AFD V1 micro-batch wrapper)",
        )
    )
    def __init__(
        self,
        vllm_config: VllmConfig,
        device: torch.device,
        model_state: ModelState,
        attn_groups: list[list[AttentionGroup]],
        kv_cache_config: KVCacheConfig,
        max_num_reqs: int,
    ): ...

    @extend
    def bind_afd_steps(self, steps: AttentionGraphSteps) -> None:
        """The Attention runner's graph steps (its connector and counters)."""
        self.afd_steps = steps

    @override
    def begin_capturable_run(
        self,
        model: Any,
        model_inputs: dict[str, Any],
        ubatch_state: UBatchState,
        for_capture: bool = False,
    ) -> Callable[[], Any]:
        # every split forward starts its threads here, eager steps, capture warm-ups and
        # captures alike: the connector learns the split before the first micro-batch sends
        tokens = [ubatch.num_tokens for ubatch in ubatch_state.slices]
        bound_steps(self).plan_split(tokens, for_capture=for_capture)
        return super().begin_capturable_run(
            model, model_inputs, ubatch_state, for_capture=for_capture
        )
