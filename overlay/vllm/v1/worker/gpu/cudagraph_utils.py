"""AFD edits to Model Runner V2's CUDA-graph manager (``vllm/v1/worker/gpu/cudagraph_utils.py``).

Model Runner V2 captures and replays the model's FULL graphs in its ``ModelCudaGraphManager``,
with the AFD exchange inside them. A replay runs no Python, so the exchange cannot announce its
step to the FFN role: this subclass announces each replay first, with the header the connector
kept when the graph was captured (:meth:`afd_models.graphs.AttentionGraphSteps.replay`), and runs
the capture of each FULL graph in the connector's capture mode, where the exchange is recorded
and nothing is announced. Warm-up forwards and piecewise captures run as eager steps, which the
FFN role computes. The AFD V2 runner builds this class in place of vLLM's from a fork of its
``initialize_kv_cache`` (``afd_models.runner_roles.afd_graph_manager``): no module global of
vLLM is touched, ``prepare_inputs_to_capture`` included.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
from vllm.sequence import IntermediateTensors
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.worker.gpu.block_table import BlockTables
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor, ModelCudaGraphManager
from vllm.v1.worker.gpu.input_batch import InputBuffers
from vllm.v1.worker.gpu.model_states.interface import ModelState
from vllm.v1.worker.gpu.pcp_manager import PCPManager
from vllm.v1.worker.utils import AttentionGroup

from afd_models.graphs import AttentionGraphSteps, bound_steps, capture_window  # noqa: F401 (edit code)
from codegen.markers import extend, fork, override, subclass, wrap

#: the forward of one capture-time call: a FULL graph's capture records the exchange (its
#: ``desc`` and ``warmup`` are create_forward_fn's)
_CAPTURE_WINDOW = "with capture_window(self, desc, warmup):"


@subclass(
    when="vllm>=0.30",
    feature="CUDA graphs of Model Runner V2, their replays announced to the FFN role",
)
class AFDModelCudaGraphManager(ModelCudaGraphManager):
    """Model Runner V2's graph manager, announcing each replayed step to the FFN role first."""

    @extend
    def bind_afd_steps(self, steps: AttentionGraphSteps) -> None:
        """The Attention runner's graph steps (its connector and counters)."""
        self.afd_steps = steps

    @fork(
        wrap(
            """
            with set_forward_context(...):
                ...
            """,
            _CAPTURE_WINDOW,
            id="capture-window",
            why="the capture of a FULL graph records the exchange and announces nothing; its "
            "replays announce the kept header (a warm-up or piecewise capture is an eager step)",
        ),
        wrap(
            "store_capture_output(num_tokens, finish())",
            _CAPTURE_WINDOW,
            id="split-capture-window",
            why="the same for the FULL graph of a split step (DBO), whose micro-batches run when "
            "finish() is called inside the capture",
        ),
    )
    def capture(
        self,
        model: nn.Module,
        model_state: ModelState,
        input_buffers: InputBuffers,
        intermediate_tensors: IntermediateTensors | None,
        block_tables: BlockTables,
        attn_groups: list[list[AttentionGroup]],
        kv_cache_config: KVCacheConfig,
        pcp_manager: "PCPManager | None" = None,
        has_lora: bool = False,
        use_aux_hidden_state_outputs: bool = False,
        lora_capture_hook: Callable[[int, int, int], None] | None = None,
        progress_bar_desc: str = "Capturing CUDA graphs",
    ) -> None: ...

    @override
    def run_fullgraph(
        self, desc: BatchExecutionDescriptor
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]] | IntermediateTensors:
        replay = super().run_fullgraph
        steps = bound_steps(self)
        return steps.replay(desc.num_tokens, desc.num_ubatches > 1, lambda: replay(desc))
