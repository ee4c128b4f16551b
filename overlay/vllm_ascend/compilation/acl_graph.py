"""AFD edits to vLLM-Ascend's ACL-graph wrapper (``vllm_ascend/compilation/acl_graph.py``).

The NPU counterpart of ``overlay/vllm/compilation/cuda_graph.py``: vLLM-Ascend captures and replays
the Attention model's FULL graphs in its ``ACLGraphWrapper``, with the AFD exchange inside them. A
replay runs no Python, so this subclass hands each FULL call to
``afd_models.graphs.AttentionGraphSteps``, which announces a replay to the FFN role first and keeps
a capture from announcing anything (the same rule as on CUDA). The AFD Attention NPU runner puts it
in place of vLLM-Ascend's wrapper once the model is loaded.
"""

from vllm_ascend.compilation.acl_graph import ACLGraphWrapper

from afd_models.graphs import AttentionGraphSteps, full_graph_call
from codegen.markers import extend, override, subclass


@subclass()
class AFDACLGraphWrapper(ACLGraphWrapper):
    """vLLM-Ascend's FULL-graph wrapper, announcing each replayed step to the FFN role first."""

    @extend
    def bind_afd_steps(self, steps: AttentionGraphSteps) -> None:
        """The Attention runner's graph steps (its connector and counters)."""
        self.afd_steps = steps

    @override
    def __call__(self, *args, **kwargs):
        call = super().__call__
        steps: AttentionGraphSteps | None = self.__dict__.get("afd_steps")
        # vLLM-Ascend's rule, read just before it applies it: a batch shape without a graph yet
        # is captured, one with a graph replayed (a renamed attribute fails here, loudly)
        what = full_graph_call(
            self.runtime_mode, self.concrete_aclgraph_entries, graph_attribute="aclgraph"
        )
        if steps is None or what is None:
            return call(*args, **kwargs)
        captured, num_tokens = what
        return steps.run(captured, num_tokens, lambda: call(*args, **kwargs))
