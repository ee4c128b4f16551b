"""The Attention role's Model Runner V2 classes (generated from vLLM 0.30+) without a GPU.

The generated subclasses of V2's CUDA-graph manager and micro-batch runner run with stand-ins
only where CUDA would be needed: a graph that records its replay, and, under the generated
method, a test base that records what upstream's would be handed (placed in the MRO between
the generated class and upstream's, never patched into upstream). Checked here: each FULL replay
is announced before it runs, with the header kept at capture (split or not); a capture window
records the exchange and announces nothing; each split is told to the connector before the
micro-batches start; the counters; a lost step leaves its failed output; the worker picks the
AFD runner of the runner vLLM chose. On releases before 0.30 AFD has no V2 classes.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm import __version__ as vllm_version
from vllm.config import CUDAGraphMode

from afd_models.connectors.base import AFDConnectionError, AFDPeerLostError, StepHeader
from afd_models.generated_classes import generated_subclass
from afd_models.graphs import AttentionGraphSteps, capture_window
from afd_models.release_order import release_key
from afd_models.runner_roles import afd_ubatch_runner, attention_runner_class, failing_lost_step
from afd_models.step_failures import FailedStepOutput
from afd_models.wiring.loopback import LoopbackConnector

pytestmark = [
    pytest.mark.every_release,
    pytest.mark.skipif(
        release_key(vllm_version) < release_key("0.30"),
        reason=f"vLLM {vllm_version}: the AFD Attention role runs on Model Runner V2 from 0.30",
    ),
]


class Announcing(LoopbackConnector):
    """A loopback connector keeping the step headers it announces."""

    def __init__(self) -> None:
        super().__init__(lambda layer, received: received.hidden_states * layer)
        self.announced: list[StepHeader] = []
        self.set_layers([1])

    def _send_header(self, header: StepHeader) -> None:
        self.announced.append(header)
        super()._send_header(header)

    def forward(self, ubatch_tokens: tuple[int, ...]) -> None:
        """One forward of the model's one remote layer, as micro-batches of ``ubatch_tokens``."""
        for ubatch, rows in enumerate(ubatch_tokens):
            self.send(1, torch.ones(rows, 8), None, ubatch=ubatch)
        for ubatch, rows in enumerate(ubatch_tokens):
            self.recv(1, torch.ones(rows, 8), ubatch=ubatch)


def _v2(name: str, module: str, upstream: str) -> type:
    import importlib

    return generated_subclass(name, getattr(importlib.import_module(module), upstream))


def graph_manager_class() -> type:
    return _v2(
        "AFDModelCudaGraphManager", "vllm.v1.worker.gpu.cudagraph_utils", "ModelCudaGraphManager"
    )


def ubatch_runner_class() -> type:
    return _v2("AFDUBatchRunner", "vllm.v1.worker.gpu.ubatch_utils", "UBatchRunner")


def descriptor(
    num_tokens: int, num_ubatches: int = 1, mode: CUDAGraphMode = CUDAGraphMode.FULL
) -> Any:
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    return BatchExecutionDescriptor(
        cg_mode=mode, num_tokens=num_tokens, num_reqs=num_tokens, num_ubatches=num_ubatches
    )


class RecordingGraph:
    """A captured graph whose replay records what the connector had announced by then."""

    def __init__(self, connector: Announcing) -> None:
        self.connector = connector
        self.seen_at_replay: list[int] = []

    def replay(self) -> None:
        self.seen_at_replay.append(len(self.connector.announced))


def manager_with(connector: Announcing, graphs: dict[Any, RecordingGraph]) -> Any:
    """The generated V2 graph manager around stand-in graphs: upstream's ``run_fullgraph``
    runs as is (its offloader sync is a no-op without offloading) and returns the hidden states
    it keeps for the replayed size."""
    manager = object.__new__(graph_manager_class())
    manager.graphs = graphs
    manager.is_last_pp_rank = True
    manager.use_aux_hidden_state_outputs = False
    manager.hidden_states = torch.arange(16.0).reshape(8, 2)
    steps = AttentionGraphSteps(connector)
    manager.bind_afd_steps(steps)
    return manager


def test_each_full_replay_is_announced_before_it_runs_with_the_captured_header() -> None:
    """The header kept at capture (graph set, the split included) goes out before the graph
    replays, once per replay; a split and an unsplit graph of one size keep their own."""
    connector = Announcing()
    with connector.capturing():
        connector.forward((4,))
    connector.split_next_step([2, 2])
    with connector.capturing():
        connector.forward((2, 2))
    whole, split = descriptor(4), descriptor(4, num_ubatches=2)
    graphs = {whole: RecordingGraph(connector), split: RecordingGraph(connector)}
    manager = manager_with(connector, graphs)

    output = manager.run_fullgraph(whole)
    manager.run_fullgraph(split)
    manager.run_fullgraph(whole)

    assert torch.equal(output, torch.arange(8.0).reshape(4, 2))
    assert graphs[whole].seen_at_replay == [1, 3] and graphs[split].seen_at_replay == [2]
    assert [(h.step, h.num_tokens, h.ubatches, h.graph) for h in connector.announced] == [
        (0, 4, (4,), True),
        (1, 4, (2, 2), True),
        (2, 4, (4,), True),
    ]
    counters = manager.afd_steps.counters.as_dict()
    assert counters == {"graph_captures": 0, "graph_replays": 3, "ubatch_splits": 1}


def test_a_replay_of_a_graph_never_captured_through_the_connector_fails_before_it_runs() -> None:
    connector = Announcing()
    graph = RecordingGraph(connector)
    manager = manager_with(connector, {descriptor(4): graph})
    with pytest.raises(
        AFDConnectionError,
        match="replay of 4 tokens, but this connector captured graphs for no size",
    ):
        manager.run_fullgraph(descriptor(4))
    assert graph.seen_at_replay == []


def test_without_bound_steps_the_manager_refuses_to_replay() -> None:
    """A graph manager not built by the AFD V2 runner would replay steps the FFN role never
    hears of (it would wait for them until its timeout): it fails at once, naming the builder."""
    connector = Announcing()
    graph = RecordingGraph(connector)
    manager = manager_with(connector, {descriptor(4): graph})
    del manager.afd_steps
    with pytest.raises(RuntimeError, match="no AFD graph steps bound; build it with afd_models"):
        manager.run_fullgraph(descriptor(4))
    assert graph.seen_at_replay == [] and connector.announced == []


@pytest.mark.parametrize(
    ("mode", "warmup", "records"),
    [
        (CUDAGraphMode.FULL, False, True),  # the FULL graph's capture
        (CUDAGraphMode.FULL, True, False),  # its warm-up: an eager step the FFN role computes
        (CUDAGraphMode.PIECEWISE, False, False),  # the exchange splits a piecewise graph
    ],
)
def test_only_a_full_capture_records_the_exchange_instead_of_announcing_it(
    mode: CUDAGraphMode, warmup: bool, records: bool
) -> None:
    desc = descriptor(4, mode=mode)
    connector = Announcing()
    manager = manager_with(connector, {})
    with capture_window(manager, desc, warmup):
        connector.forward((4,))
    assert (connector.announced == []) is records
    assert manager.afd_steps.counters.graph_captures == int(records)
    if records:  # kept for the replays
        connector.announce_graph_step(4)
        assert connector.announced[-1].graph


def test_a_capture_window_without_bound_steps_is_refused() -> None:
    connector = Announcing()
    manager = manager_with(connector, {})
    del manager.afd_steps
    with pytest.raises(RuntimeError, match="AFDModelCudaGraphManager has no AFD graph steps"):
        capture_window(manager, descriptor(4), False)


def ubatch_runner_with(connector: Announcing, bound: bool = True) -> Any:
    """The generated V2 micro-batch runner over a test base that stands where upstream's
    ``begin_capturable_run`` is (it starts CUDA streams and threads), recording the split the
    connector knew when the threads would start."""
    from vllm.v1.worker.gpu.ubatch_utils import UBatchRunner

    class RecordingRun(UBatchRunner):
        def begin_capturable_run(
            self, model: Any, model_inputs: Any, ubatch_state: Any, for_capture: bool = False
        ) -> Any:
            self.planned = connector._plan
            return lambda: (model, for_capture)

    recording = type("RecordingUBatchRunner", (ubatch_runner_class(), RecordingRun), {})
    assert recording.__mro__[2] is RecordingRun  # between the generated class and upstream's
    runner = object.__new__(recording)
    if bound:
        runner.bind_afd_steps(AttentionGraphSteps(connector))
    return runner


def test_each_split_is_told_to_the_connector_before_the_micro_batches_start() -> None:
    """An eager split step and a capture's split both reach the connector first (the header of
    the forward that follows carries the split); only the eager one counts as a split step."""
    from vllm.v1.worker.gpu.ubatch_utils import UBatchState

    connector = Announcing()
    runner = ubatch_runner_with(connector)
    state = UBatchState(
        slices=[SimpleNamespace(num_tokens=3), SimpleNamespace(num_tokens=5)], forward_contexts=[]
    )
    finish = runner.begin_capturable_run("model", {}, state)
    assert runner.planned == (3, 5) and finish() == ("model", False)
    connector.forward((3, 5))
    runner.begin_capturable_run("model", {}, state, for_capture=True)
    assert runner.planned == (3, 5)
    assert [(h.ubatches, h.graph) for h in connector.announced] == [((3, 5), False)]
    assert runner.afd_steps.counters.ubatch_splits == 1


def test_a_micro_batch_runner_without_bound_steps_starts_no_thread() -> None:
    from vllm.v1.worker.gpu.ubatch_utils import UBatchState

    runner = ubatch_runner_with(Announcing(), bound=False)
    state = UBatchState(slices=[SimpleNamespace(num_tokens=2)] * 2, forward_contexts=[])
    with pytest.raises(RuntimeError, match="UBatchRunner has no AFD graph steps bound"):
        runner.begin_capturable_run("model", {}, state)
    assert not hasattr(runner, "planned")


def test_no_micro_batch_runner_where_vllm_builds_none() -> None:
    """vLLM alone decides whether there is a micro-batch runner (DBO, two or more DP ranks)."""
    assert afd_ubatch_runner(None, AttentionGraphSteps(Announcing()), "any", "args") is None


def test_the_v2_runner_builds_afds_helpers_and_guards_each_forward() -> None:
    """The generated forks of the V2 runner (which need CUDA to run): its KV-cache set-up builds
    AFD's graph manager and micro-batch runner with the runner's graph steps, and each of the
    four forward calls of execute_model runs across restarts, inside the lost-step guard, whose
    failed output returns before the KV connector's forward ends."""
    import inspect

    runner = attention_runner_class(_v2_runner())
    setup = inspect.getsource(runner.initialize_kv_cache)
    assert "self.cudagraph_manager = afd_graph_manager(\n" in setup
    assert "self.ubatch_runner = afd_ubatch_runner(\n" in setup
    assert setup.count("self.afd_graph_steps,") == 2
    assert "ModelCudaGraphManager(" not in setup.replace("afd_graph_manager(\n", "")
    forward = inspect.getsource(runner.execute_model)
    assert forward.count("forward_across_restarts(") == 4
    assert forward.count("model_output = ") == 4
    guard = forward.index("with failing_lost_step(scheduler_output, dummy_run) as afd_lost:")
    returned = forward.index("return afd_lost.output")
    assert guard < returned < forward.index("self.kv_connector.finish_forward()")


def test_the_v2_micro_batch_runner_reserves_no_sms() -> None:
    """Upstream reserves SMs for an all2all kernel while micro-batches overlap; the AFD exchange
    runs none, so the generated constructor keeps every SM for compute."""
    import inspect

    source = inspect.getsource(ubatch_runner_class().__init__)
    assert "self.sm_control = contextlib.nullcontext()" in source
    assert "create_sm_control_context" not in source


def test_a_lost_step_leaves_its_failed_output_and_other_errors_go_up() -> None:
    """A dummy run (profiling, warm-up) has no request to fail: its loss goes up as it came
    (vLLM's _dummy_run would otherwise fail later on a missing step state, hiding the cause)."""
    scheduler_output = SimpleNamespace(num_scheduled_tokens={"a": 1, "b": 2})
    with failing_lost_step(scheduler_output, False) as lost:
        raise AFDPeerLostError("no FFN engine came back")
    assert isinstance(lost.output, FailedStepOutput) and lost.output.req_ids == ["a", "b"]
    with failing_lost_step(scheduler_output, False) as ran:
        pass
    assert ran.output is None
    with pytest.raises(RuntimeError, match="a live peer's error"):
        with failing_lost_step(scheduler_output, False):
            raise RuntimeError("a live peer's error")
    with pytest.raises(AFDPeerLostError, match="during a warm-up"):
        with failing_lost_step(scheduler_output, True):
            raise AFDPeerLostError("no FFN engine came back during a warm-up")


def _v2_runner() -> type:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return GPUModelRunner


def test_the_attention_worker_builds_the_afd_runner_of_vllms_choice() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as ModelRunnerV1

    ModelRunnerV2 = _v2_runner()
    v2 = attention_runner_class(ModelRunnerV2)
    v1 = attention_runner_class(ModelRunnerV1)
    assert v2.__name__ == "AFDAttentionGPUModelRunnerV2" and issubclass(v2, ModelRunnerV2)
    assert v1.__name__ == "AFDAttentionGPUModelRunner" and issubclass(v1, ModelRunnerV1)
