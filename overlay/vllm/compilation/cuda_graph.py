"""AFD edits to vLLM's CUDA-graph wrapper (``vllm/compilation/cuda_graph.py``).

vLLM captures and replays the Attention model's FULL graphs in its ``CUDAGraphWrapper``, with the
AFD exchange inside them. A replay runs no Python, so the exchange cannot announce its step to the
FFN role: this subclass hands each FULL call to ``afd_models.graphs.AttentionGraphSteps``, which
announces a replay first and keeps a capture from announcing anything. The AFD Attention runner
puts it in place of vLLM's wrapper once the model is loaded.
"""

from typing import Any

from vllm.compilation.cuda_graph import CUDAGraphWrapper

from afd_models.graphs import AttentionGraphSteps, full_graph_call
from codegen.markers import extend, override, subclass


@subclass(feature="FULL CUDA graphs of the V1 runners, their replays announced to the FFN role")
class AFDCUDAGraphWrapper(CUDAGraphWrapper):
    """vLLM's FULL-graph wrapper, announcing each replayed step to the FFN role first."""

    @extend
    def bind_afd_steps(self, steps: AttentionGraphSteps) -> None:
        """The Attention runner's graph steps (its connector and counters)."""
        self.afd_steps = steps

    @override
    def __call__(self, *args: Any, **kwargs: Any) -> Any | None:
        call = super().__call__
        steps: AttentionGraphSteps | None = self.__dict__.get("afd_steps")
        # vLLM's own rule, read just before it applies it: a batch shape without a graph yet
        # is captured, one with a graph replayed (a renamed attribute fails here, loudly)
        what = full_graph_call(self.runtime_mode, self.concrete_cudagraph_entries)
        if steps is None or what is None:
            return call(*args, **kwargs)
        captured, num_tokens = what
        return steps.run(captured, num_tokens, lambda: call(*args, **kwargs))
