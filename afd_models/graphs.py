"""CUDA graphs of the two roles: which steps run from a graph, and counters that show it.

**Attention.** vLLM captures and replays the Attention model's FULL graphs itself (its
``CUDAGraphWrapper``; decode batches in ``FULL_DECODE_ONLY``), and the exchange op is captured
with them. A replay runs no Python, so the AFD wrapper (generated from
``overlay/vllm/compilation/cuda_graph.py``) hands each FULL call to :class:`AttentionGraphSteps`:
the first call for a batch shape is a capture, run inside ``connector.capturing()`` (the exchange
is recorded, nothing is announced); every later one is a replay, announced to the FFN side first
with the header kept from the capture (``graph`` set). Eager steps, prefill and mixed batches among
them, announce themselves as before, with ``graph`` unset. Under DBO vLLM's micro-batch wrapper
(the AFD one, ``overlay/vllm/v1/worker/gpu_ubatch_wrapper.py``) captures and replays the split
steps' graphs, and hands each split step to :meth:`AttentionGraphSteps.split_step` alike.

**FFN.** A step may run from the FFN's own graphs only when every peer's header says it replays a
graph (:func:`replays_graphs`); any other step runs eagerly, whatever graphs exist. FFN graphs are
per layer and keyed by :class:`FFNGraphKey`: the layer, each peer's token count in group order and
the router-logit width, never the step's total alone (a graph keyed by the total would replay
for another split of the same total between peers). The first step of a key runs eagerly (it
warms the kernels for that shape); the second captures the layer's receive, compute and send and
replays it; later ones replay. Steps a peer split into micro-batches run eagerly
(:mod:`afd_models.dbo`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch
from vllm.forward_context import get_forward_context, is_forward_context_available

from afd_models.connectors.base import AFDConnector, StepHeader
from afd_models.log import get_logger

logger = get_logger(__name__)
T = TypeVar("T")


@dataclass
class GraphCounters:
    """What ran from graphs on one worker (``collective_rpc("afd_counters")``)."""

    graph_captures: int = 0
    graph_replays: int = 0
    #: steps run as two micro-batches (DBO), eagerly or replayed
    ubatch_splits: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "graph_captures": self.graph_captures,
            "graph_replays": self.graph_replays,
            "ubatch_splits": self.ubatch_splits,
        }


def full_graph_call(
    runtime_mode: Any, entries: Mapping[Any, Any], *, graph_attribute: str = "cudagraph"
) -> tuple[bool, int] | None:
    """What a call of vLLM's graph wrapper for ``runtime_mode`` (with graph ``entries`` by batch
    descriptor) is about to do, read from the forward context: None when it neither captures nor
    replays (another mode, no forward context), else whether a graph exists for the batch shape
    (a replay; without one vLLM captures) and the batch's padded token count. An entry holds its
    graph in ``graph_attribute`` (vLLM: ``cudagraph``; vLLM-Ascend's ACL entries: ``aclgraph``)."""
    if not is_forward_context_available():
        return None
    context = get_forward_context()
    descriptor = context.batch_descriptor
    if context.cudagraph_runtime_mode != runtime_mode or descriptor is None:
        return None
    entry = entries.get(descriptor)
    return entry is not None and getattr(entry, graph_attribute) is not None, descriptor.num_tokens


class AttentionGraphSteps:
    """The Attention side's part in a FULL CUDA-graph call (see the module docstring)."""

    def __init__(self, connector: AFDConnector):
        self.connector = connector
        self.counters = GraphCounters()

    def run(self, captured: bool, num_tokens: int, call: Callable[[], T]) -> T:
        """Run ``call`` (vLLM's wrapper), which replays the graph of ``num_tokens`` (padded)
        tokens if ``captured``, else captures it."""
        with self._graph_step(captured, num_tokens):
            return call()

    @contextlib.contextmanager
    def _graph_step(self, captured: bool, num_tokens: int, split: bool = False) -> Iterator[None]:
        if captured:
            self.connector.announce_graph_step(num_tokens, split=split)
            self.counters.graph_replays += 1
            yield
            return
        with self.connector.capturing():
            yield
        self.counters.graph_captures += 1

    # --- Model Runner V2: its graph manager captures and replays, its micro-batch runner splits

    def replay(self, num_tokens: int, split: bool, call: Callable[[], T]) -> T:
        """Run ``call``, V2's replay of the FULL graph of ``num_tokens`` (padded) tokens, split
        into micro-batches if ``split``: the step is announced first, with the header kept at
        capture."""
        if split:
            self.counters.ubatch_splits += 1
        with self._graph_step(True, num_tokens, split):
            return call()

    def capture_forward(self, captures: bool) -> contextlib.AbstractContextManager[None]:
        """What V2's graph manager runs one capture-time forward in: the capture of a FULL
        graph (``captures``) records the exchange and announces nothing; a warm-up or a
        piecewise capture runs as an eager step."""
        return self._graph_step(False, 0) if captures else contextlib.nullcontext()

    def plan_split(self, ubatch_tokens: Sequence[int], *, for_capture: bool) -> None:
        """V2's micro-batch runner is about to run one step as micro-batches of
        ``ubatch_tokens`` (padded): the connector's next step is split so. A step run for a
        capture (its warm-up, or the capture itself) is not counted as a split step."""
        self.connector.split_next_step(ubatch_tokens)
        if not for_capture:
            self.counters.ubatch_splits += 1

    @contextlib.contextmanager
    def split_step(self, ubatch_tokens: Sequence[int], graph: bool | None) -> Iterator[None]:
        """Around vLLM's micro-batch wrapper running a step as micro-batches of ``ubatch_tokens``
        (padded): eagerly (``graph`` None), capturing their FULL graph (False) or replaying it
        (True; the header kept at capture carries the split)."""
        if not graph:  # the forward runs (eagerly or captured): its first send opens the step
            self.connector.split_next_step(ubatch_tokens)
        if graph is not False:
            self.counters.ubatch_splits += 1
        if graph is None:
            yield
            return
        with self._graph_step(graph, sum(ubatch_tokens), split=True):
            yield

    def report(self) -> None:
        """Log the counters (at shutdown)."""
        logger.info("AFD attention graphs: %s", self.counters.as_dict())


def split_step(
    steps: AttentionGraphSteps | None,
    ubatch_slices: Sequence[Any],
    runtime_mode: Any,
    graphs: Mapping[int, Any],
) -> contextlib.AbstractContextManager[None]:
    """What vLLM's micro-batch wrapper runs a split step in (``ubatch_slices``, in
    ``runtime_mode``, with its FULL ``graphs`` by token count): :meth:`AttentionGraphSteps.split_step`
    of ``steps`` (nothing before the runner binds them)."""
    if steps is None:
        return contextlib.nullcontext()
    from vllm.config import CUDAGraphMode

    tokens = [s.num_tokens for s in ubatch_slices]
    graph = sum(tokens) in graphs if runtime_mode is CUDAGraphMode.FULL else None
    return steps.split_step(tokens, graph)


def bound_steps(helper: Any) -> AttentionGraphSteps:
    """The graph steps bound to ``helper``, Model Runner V2's AFD graph manager or micro-batch
    runner (``bind_afd_steps``).

    Raises:
        RuntimeError: none are bound: ``helper`` was not built through
            ``afd_models.runner_roles`` (``afd_graph_manager`` / ``afd_ubatch_runner``), and the
            steps it ran would reach the FFN role unannounced (it would wait for them in vain).
    """
    steps: AttentionGraphSteps | None = helper.__dict__.get("afd_steps")
    if steps is None:
        raise RuntimeError(
            f"{type(helper).__name__} has no AFD graph steps bound; build it with "
            "afd_models.runner_roles.afd_graph_manager or afd_ubatch_runner, which bind the "
            "Attention runner's (without them the FFN role would not learn of its steps)"
        )
    return steps


def capture_window(
    manager: Any, desc: Any, warmup: bool
) -> contextlib.AbstractContextManager[None]:
    """What Model Runner V2's graph manager (the AFD one, ``manager``) runs one capture-time
    forward of batch ``desc`` in (``warmup``: the pass before the capture):
    :meth:`AttentionGraphSteps.capture_forward` of its :func:`bound_steps`."""
    from vllm.config import CUDAGraphMode

    captures = not warmup and desc.cg_mode == CUDAGraphMode.FULL
    return bound_steps(manager).capture_forward(captures)


@dataclass(frozen=True)
class FFNGraphKey:
    """Everything that fixes the transfers and shapes of one FFN layer's graph."""

    layer: int
    #: each peer's tokens, in the group's peer order
    peer_tokens: tuple[int, ...]
    #: router-logit width (0 when the gate runs on FFN)
    logits_width: int

    @classmethod
    def of(cls, layer: int, headers: Sequence[StepHeader]) -> FFNGraphKey:
        widths = {h.logits_width for h in headers}
        if len(widths) != 1:
            raise ValueError(f"peers announce different router-logit widths {sorted(widths)}")
        return cls(layer, tuple(h.num_tokens for h in headers), widths.pop())


def replays_graphs(headers: Sequence[StepHeader]) -> bool:
    """Whether every peer replays a graph in this step (only then may the FFN side)."""
    return bool(headers) and all(h.graph for h in headers)


class GraphBackend(Protocol):
    """Captures and replays device graphs (:class:`DeviceGraphs`; fakes in tests)."""

    def capture(self, run: Callable[[], object]) -> Any: ...

    def replay(self, graph: Any) -> None: ...


#: device type -> the graph class of its torch device module (``torch.npu`` exists once
#: torch_npu is imported, which vLLM-Ascend does)
GRAPH_CLASSES: dict[str, str] = {"cuda": "CUDAGraph", "npu": "NPUGraph"}


class DeviceGraphs:
    """Graphs of one device type (:data:`GRAPH_CLASSES`) on the current device and stream, all
    from one memory pool (the FFN server replays one layer at a time, so its graphs never run
    concurrently). ``torch.cuda`` and ``torch.npu`` share this interface."""

    def __init__(self, device_type: str, device_module: Any = None) -> None:
        if device_type not in GRAPH_CLASSES:
            raise ValueError(
                f"no device graphs on {device_type!r}; allowed: {', '.join(GRAPH_CLASSES)}"
            )
        self.module = device_module or getattr(torch, device_type)
        self.graph_class = getattr(self.module, GRAPH_CLASSES[device_type])
        self.pool = self.module.graph_pool_handle()

    def capture(self, run: Callable[[], object]) -> Any:
        graph = self.graph_class()
        with self.module.graph(graph, pool=self.pool, stream=self.module.current_stream()):
            run()
        return graph

    def replay(self, graph: Any) -> None:
        graph.replay()


@dataclass
class FFNGraphs:
    """The FFN server's graphs, by key (see the module docstring)."""

    backend: GraphBackend
    counters: GraphCounters = field(default_factory=GraphCounters)
    _graphs: dict[FFNGraphKey, Any] = field(default_factory=dict)
    _warm: set[FFNGraphKey] = field(default_factory=set)

    def run(self, key: FFNGraphKey, layer: Callable[[], object]) -> None:
        """Run one layer of a step every peer replays: eagerly the first time for ``key``, then
        captured and replayed."""
        graph = self._graphs.get(key)
        if graph is None:
            if key not in self._warm:
                self._warm.add(key)
                layer()
                return
            graph = self._graphs[key] = self.backend.capture(layer)
            self.counters.graph_captures += 1
        self.backend.replay(graph)
        self.counters.graph_replays += 1
