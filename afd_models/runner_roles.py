"""What the generated workers and model runners of each role do, whatever the upstream class
(CPU, CUDA, Ascend NPU).

The overlays declare one subclass per upstream class family, since each has its own signatures,
decorators and graph wrapper; their bodies call these for the part that is the same everywhere.

A worker parses its AFD section once (:func:`afd_models.worker_config.prepare_worker_config`),
keeps the :class:`~afd_models.config.AFDConfig` as ``afd_config`` and hands it to the runner it
builds (:func:`build_runner`); everything here reads it from there, never the section again.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

from vllm.distributed import get_tensor_model_parallel_rank

from afd_models.config import AFDConfig
from afd_models.connectors.base import (
    AFDConnectionError,
    AFDConnector,
    AFDPeerLostError,
    FFNConnector,
)
from afd_models.connectors.p2p.rendezvous import PROBE_EVERY_S
from afd_models.ffn_compile import ffn_layer_model
from afd_models.ffn_server import FFNServer, ForwardContext, vllm_forward_context
from afd_models.generated_classes import generated_subclass
from afd_models.graphs import (
    GRAPH_CLASSES,
    AttentionGraphSteps,
    DeviceGraphs,
    FFNGraphs,
    GraphCounters,
)
from afd_models.log import exit_process, get_logger
from afd_models.models.ffn import token_id_layers
from afd_models.models.remote import bind_connector
from afd_models.step_failures import FailedStepOutput, failed_step_output
from afd_models.step_vote import StepVote, Verdict, engine_vote
from afd_models.wiring.connect import prepare_attention, prepare_ffn

logger = get_logger(__name__)

#: where vLLM's Model Runner V2 lives (vLLM's CUDA default since 0.29); every other runner a
#: worker builds derives from the V1 runner
MODEL_RUNNER_V2_MODULE = "vllm.v1.worker.gpu.model_runner"


def build_runner(runner_class: type, vllm_config: Any, device: Any, afd: AFDConfig) -> Any:
    """The AFD runner ``runner_class`` built as vLLM builds its runners (``vllm_config``,
    ``device``: the worker's, read by the worker so that the lock records the reads), holding
    the worker's parsed AFD config as ``afd_config``."""
    runner = runner_class(vllm_config, device)
    runner.afd_config = afd
    return runner


def attention_runner_class(upstream: type) -> type:
    """The AFD Attention runner generated for ``upstream``, the runner class vLLM's worker chose
    (Model Runner V2 or a V1 runner: the AFD worker follows vLLM's choice)."""
    overlay_class = (
        "AFDAttentionGPUModelRunnerV2"
        if upstream.__module__ == MODEL_RUNNER_V2_MODULE
        else "AFDAttentionCPUModelRunner"
    )
    return generated_subclass(overlay_class, upstream)


def afd_graph_manager(upstream: type, steps: AttentionGraphSteps, *args: Any, **kwargs: Any) -> Any:
    """Model Runner V2's CUDA-graph manager: the AFD subclass of ``upstream`` built from vLLM's
    own arguments, announcing the replays of ``steps``."""
    manager = generated_subclass("AFDModelCudaGraphManager", upstream)(*args, **kwargs)
    manager.bind_afd_steps(steps)
    return manager


def afd_ubatch_runner(built: Any, steps: AttentionGraphSteps, *args: Any, **kwargs: Any) -> Any:
    """Model Runner V2's micro-batch runner: None where vLLM built none (``built``), else the AFD
    subclass of its class from the same arguments, telling the connector of ``steps`` each split.
    vLLM's own runner is built first, so that vLLM alone decides whether there is one (a few
    small buffers and two streams, once, and only under DBO)."""
    if built is None:
        return None
    runner = generated_subclass("AFDUBatchRunner", type(built))(*args, **kwargs)
    runner.bind_afd_steps(steps)
    return runner


@dataclass
class LostStep:
    """What :func:`failing_lost_step` leaves: the failed step's output, or None when it ran."""

    output: FailedStepOutput | None = None


@contextlib.contextmanager
def failing_lost_step(scheduler_output: Any, dummy_run: bool) -> Iterator[LostStep]:
    """Around Model Runner V2's forward calls: a step :func:`forward_across_restarts` gave up on
    leaves its failed output (:func:`fail_lost_step`) instead of raising, for ``execute_model``
    to return (V2 has no override point for the forward alone, and samples later). A dummy run
    (profiling, warm-up, capture) has no request to fail: its error goes up as it came."""
    lost = LostStep()
    try:
        yield lost
    except AFDPeerLostError as error:
        if dummy_run:
            raise
        lost.output = fail_lost_step(scheduler_output, error)


def load_attention(
    runner: Any, load: Callable[[], None]
) -> tuple[AFDConnector, AttentionGraphSteps]:
    """Load the Attention model with ``load`` (upstream's ``load_model``) and connect it.

    The connector is prepared first (config checks; a loopback connector builds its FFN half),
    connects once the model is loaded (the handshake compares the loaded models; the FFN role
    computes during vLLM's profiling forward, which comes later) and is bound to the model's
    remote proxies. Returns the connector and the graph steps that announce graph replays.
    """
    afd: AFDConfig = runner.afd_config
    connect = prepare_attention(
        runner.vllm_config, afd, get_tensor_model_parallel_rank(), runner.device
    )
    load()
    connector = connect(runner.get_model())
    model = runner.get_model()
    connector.set_layers(bind_connector(model, connector), token_id_layers(model))
    # vLLM's device runners budget the weights they measured while loading; an in-process FFN
    # half was built before, so it counts here, or the KV cache would take its memory
    if hasattr(runner, "model_memory_usage"):
        runner.model_memory_usage += connector.in_process_weight_bytes()
    runner.afd_restarts = step_restarts(afd)
    return connector, AttentionGraphSteps(connector)


def refuse_preloaded_model(model: object) -> None:
    """A model handed to ``load_model`` (vLLM 0.32's weight cache passes one) is the native
    model; each AFD role builds its own half, so it is refused."""
    if model is not None:
        raise ValueError(
            f"load_model(model=<{type(model).__name__}>): an AFD runner builds its role's half "
            "of the model itself and cannot take a pre-loaded model (vLLM's weight cache); "
            "run the AFD roles without it"
        )


def load_ffn(runner: Any, load: Callable[[], None]) -> FFNConnector:
    """Load the FFN half with ``load`` (upstream's ``load_model``), compile its layers where its
    config says so (kept as ``runner.afd_ffn_layers``, what the FFN server computes with), and
    connect to the Attention role (this waits for it, bounded by the connector's
    ``connect_timeout_s``). The connector is prepared first: topology and kernel errors come
    before any weight is read. The layers compile before the connect, so that no step of a
    connected Attention peer waits for a compilation (its ``timeout_s`` may be shorter)."""
    connect = prepare_ffn(
        runner.vllm_config, runner.afd_config, get_tensor_model_parallel_rank(), runner.device
    )
    load()
    model = runner.get_model()
    runner.afd_ffn_layers = ffn_layer_model(model, runner.vllm_config, runner.device)
    return connect(model)


def start_ffn_server(
    runner: Any,
    connector: FFNConnector,
    device_graphs: bool,
    forward_context: ForwardContext = vllm_forward_context,
) -> FFNServer:
    """Serve the Attention peers from a background thread; a failure ends the process. With
    ``peer_restart_timeout_s``, Attention peers that leave are waited for instead (the server
    hosts the group again, see :class:`~afd_models.ffn_server.FFNServer`).

    With ``device_graphs`` on a device that has them (CUDA, NPU), steps every peer replays from
    a graph run from FFN graphs (afd_models.graphs); otherwise every step runs eagerly. Each
    layer computes in ``forward_context`` (the platform's: vLLM-Ascend's on an NPU).
    """
    device_type = runner.device.type
    graphs = (
        FFNGraphs(DeviceGraphs(device_type))
        if device_graphs and device_type in GRAPH_CLASSES
        else None
    )
    afd: AFDConfig = runner.afd_config
    server = FFNServer(
        runner.get_model(),
        runner.vllm_config,
        connector,
        afd=afd,
        hidden_size=runner.model_config.get_hidden_size(),
        dtype=runner.model_config.dtype,
        device=runner.device,
        graphs=graphs,
        on_failure=exit_process,
        forward_context=forward_context,
        reconnect=_ffn_reconnect(runner),
        layer_model=runner.afd_ffn_layers,
        vote=engine_vote(afd.peer_restart_timeout_s),
    )
    server.start()
    return server


def _ffn_reconnect(runner: Any) -> Callable[..., FFNConnector] | None:
    """How the FFN server connects again once its peers left: the worker's connect step, with
    the loaded model and ``peer_restart_timeout_s`` as its connect timeout (None when off)."""
    afd: AFDConfig = runner.afd_config
    if not afd.peer_restart_timeout_s:
        return None
    connect = prepare_ffn(runner.vllm_config, afd, get_tensor_model_parallel_rank(), runner.device)
    return functools.partial(
        connect, runner.get_model(), connect_timeout_s=afd.peer_restart_timeout_s
    )


@dataclass(frozen=True)
class StepRestarts:
    """How an Attention runner holds its steps across FFN restarts (``peer_restart_timeout_s``):
    the timeout, and its TP partners' vote (None for a worker with no partner)."""

    restart_s: float
    vote: StepVote | None

    def tally(self, verdict: Verdict) -> Verdict:
        return verdict if self.vote is None else self.vote.tally(verdict)


def step_restarts(afd: AFDConfig) -> StepRestarts | None:
    """The runner's :class:`StepRestarts`; None when ``peer_restart_timeout_s`` is 0."""
    restart_s = afd.peer_restart_timeout_s
    return StepRestarts(restart_s, engine_vote(restart_s)) if restart_s else None


def forward_across_restarts(runner: Any, forward: Callable[[], Any]) -> Any:
    """The Attention model's forward (``forward``, upstream's ``_model_forward``), run again
    after a restarted FFN engine connected when the FFN role went away during it.

    Running it again only rewrites the KV-cache slots the first run wrote, with the same values:
    sampling comes after the forward, and the step's inputs are prepared before it. A forward
    that lost its peer finishes on zeros (:meth:`AFDConnector.holding_lost_steps`); then the
    worker and its partners (:mod:`afd_models.step_vote`) vote, and if any lost its peer, every
    one of them reconnects and runs it again, together. The retries of one step share one
    ``peer_restart_timeout_s``. When it is 0 an :class:`AFDPeerGoneError` goes up as before.
    Past it, or when connecting to the restarted FFN engine failed for any partner,
    :class:`AFDPeerLostError` goes up on every partner (the runner fails the step,
    :func:`fail_lost_step`) and an :class:`FFNRejoin` connects the next FFN engine; the next
    step waits for it, up to ``peer_restart_timeout_s``, and is failed alike unless every partner
    connected.
    """
    restarts: StepRestarts | None = getattr(runner, "afd_restarts", None)
    if restarts is None:
        return forward()
    connector = runner.afd_connector
    deadline = None
    rejoin: FFNRejoin | None = getattr(runner, "afd_rejoin", None)
    if rejoin is not None:  # one budget for the whole step: the wait and any retry after it
        deadline = time.monotonic() + restarts.restart_s
        connected = rejoin.wait(restarts.restart_s)
        # every partner failed the last step, so every partner votes here
        if restarts.tally(Verdict.RAN if connected else Verdict.GIVE_UP) is Verdict.GIVE_UP:
            # the rejoin goes on (or is done, where a partner's is not)
            raise AFDPeerLostError(
                f"no FFN engine connected to every partner within peer_restart_timeout_s="
                f"{restarts.restart_s:g} s since a step was lost"
            )
        runner.afd_rejoin = None
    while True:
        with connector.holding_lost_steps():
            output = forward()
        gone = connector.lost_step
        if restarts.tally(Verdict.AGAIN if gone else Verdict.RAN) is Verdict.RAN:
            return output
        # a partner's loss is this worker's too: all of them talk to the same FFN engine
        gone = gone or "a partner's FFN peer went away"
        now = time.monotonic()
        deadline = now + restarts.restart_s if deadline is None else deadline
        failed = None
        if now >= deadline:
            failed = f"the FFN role went away again: {gone}"
        else:
            logger.warning(
                "AFD Attention: the FFN role went away during a step (%s); holding the step "
                "and waiting up to %.0f s (peer_restart_timeout_s) for a restarted FFN engine",
                gone,
                deadline - now,
            )
            try:
                connector.reconnect(deadline - now)
            except AFDConnectionError as exc:
                failed = f"connecting to a restarted FFN engine failed: {exc}"
        if restarts.tally(Verdict.GIVE_UP if failed else Verdict.RAN) is Verdict.GIVE_UP:
            why = failed or "a partner could not connect to a restarted FFN engine"
            raise _lost(runner, restarts, why, connected=failed is None)
        logger.info(
            "AFD Attention: a restarted FFN engine connected after %.1f s; running the step again",
            time.monotonic() - now,
        )


def dummy_step_across_restarts(dummy_step: Callable[[], None]) -> None:
    """An idle DP rank's dummy step (upstream's ``execute_dummy_batch``). Its model call is held
    and voted on like the busy ranks' forward (the Attention runner's ``_dummy_run`` calls
    ``_model_forward``); one given up on has no request to fail, so it is logged, and the next
    step waits for the rejoin as the busy ranks' does."""
    try:
        dummy_step()
    except AFDPeerLostError as lost:
        logger.error("AFD Attention: an idle DP rank's dummy step was given up on: %s", lost)


def _lost(runner: Any, restarts: StepRestarts, why: str, *, connected: bool) -> AFDPeerLostError:
    """A step given up on within ``peer_restart_timeout_s``; the next FFN engine is connected
    from the background from now on (unless this worker is ``connected`` already: a partner
    was not)."""
    restart_s = restarts.restart_s
    runner.afd_rejoin = FFNRejoin(runner.afd_connector, restart_s, connected=connected)
    return AFDPeerLostError(
        f"the FFN role went away during the step, and it did not run within "
        f"peer_restart_timeout_s={restart_s:g} s: {why}"
    )


class FFNRejoin:
    """Connects an Attention worker whose step was lost to the next FFN engine that hosts the
    group, from a background thread: without requests no step would, and a starting FFN engine
    waits only its ``connect_timeout_s`` for its peers."""

    def __init__(self, connector: Any, restart_s: float, *, connected: bool = False):
        self._connector = connector
        self._restart_s = restart_s
        self._stop = threading.Event()
        self._connected = threading.Event()
        # who closes the connector after a stop: the thread when it was still running then
        self._ownership = threading.Lock()
        self._finished = self._abandoned = False
        self._thread = threading.Thread(target=self._run, name="AFD-rejoin", daemon=True)
        if connected:  # a partner's step was lost, this worker connected: nothing to look for
            self._connected.set()
            self._finished = True
        else:
            self._thread.start()

    def _run(self) -> None:
        try:
            self._connect()
        finally:
            with self._ownership:
                self._finished = True
                abandoned = self._abandoned
            if abandoned:  # the runner shut down while this thread ran: it closes the connector
                self._connector.close()

    def _connect(self) -> None:
        while not self._stop.wait(PROBE_EVERY_S):
            try:
                if not self._connector.ffn_is_hosting():
                    continue
                self._connector.reconnect(self._restart_s)
            except Exception:  # whatever failed, the next FFN engine is still to be connected
                logger.exception(
                    "AFD Attention: connecting to the FFN engine that hosts the group failed; "
                    "trying again"
                )
                continue
            if not self._stop.is_set():
                logger.info("AFD Attention: an FFN engine connected; the next step runs on it")
                self._connected.set()
            return

    def wait(self, timeout_s: float) -> bool:
        """Whether an FFN engine connected within ``timeout_s``."""
        return self._connected.wait(timeout_s)

    def stop(self) -> bool:
        """Stop looking for an FFN engine. False when a connect is still in progress: the
        thread then closes the connector itself once it returns, connected or not."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2 * PROBE_EVERY_S)
        with self._ownership:
            self._abandoned = not self._finished
            return self._finished


def fail_lost_step(scheduler_output: Any, lost: AFDPeerLostError) -> FailedStepOutput:
    """What the Attention runner returns for a step :func:`forward_across_restarts` gave up on:
    the AFD scheduler fails its requests, and the engine stays up for the next FFN engine."""
    output = failed_step_output(scheduler_output)
    logger.error(
        "AFD Attention: %s; failing the step's %d requests (the engine stays up, and an FFN "
        "engine started later is connected as soon as it hosts the group)",
        lost,
        len(output.req_ids),
    )
    return output


def stop_role(runner: Any) -> None:
    """Before upstream's shutdown: report the graph steps, stop looking for an FFN engine, stop
    the FFN server, close the connector. The connector closes first because upstream's shutdown
    synchronizes the device, which would wait forever on a transfer still pending on a peer that
    is gone (closing aborts it). Each part is optional: a runner that failed to load has none of
    them."""
    steps = getattr(runner, "afd_graph_steps", None)
    if steps is not None:
        steps.report()
    rejoin = getattr(runner, "afd_rejoin", None)
    server = getattr(runner, "afd_server", None)
    connector = getattr(runner, "afd_connector", None)
    if rejoin is not None and not rejoin.stop():
        connector = None  # still connecting: the rejoin thread closes it
    try:
        if server is not None:
            server.stop()
    finally:
        # after a restart of its peers, the server serves through a connector of its own
        connector = server.connector if server is not None else connector
        if connector is not None:
            connector.close()


# --- the FFN worker's part, whatever its upstream worker -----------------------------------------


def serve_from_config(worker: Any, kv_cache_config: Any, device_graphs: bool) -> None:
    """``initialize_from_config`` of an FFN worker: no KV cache was configured (the worker reports
    none), and the FFN server starts serving."""
    if kv_cache_config.kv_cache_groups:
        raise RuntimeError("the AFD FFN worker reported no KV cache, but the engine configured one")
    worker.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    worker.model_runner.start_afd_server(device_graphs)


def refuse_requests(scheduler_output: Any) -> None:
    """The FFN engine schedules nothing: a scheduler step with tokens is a misrouted request."""
    if scheduler_output.total_num_scheduled_tokens:
        raise RuntimeError(
            "the AFD FFN engine serves no requests; send them to the Attention engine"
        )


def refuse_sampling() -> NoReturn:
    """The FFN engine samples nothing."""
    raise RuntimeError(
        "the AFD FFN engine samples no tokens; send requests to the Attention engine"
    )


def ffn_server_of(worker: Any) -> FFNServer | None:
    """The FFN worker's server, once its runner started one."""
    server: FFNServer | None = getattr(worker.model_runner, "afd_server", None)
    return server


def ffn_counters(worker: Any) -> dict[str, int]:
    """Graph captures and replays of the FFN graphs (zero before the server starts)."""
    server = ffn_server_of(worker)
    return GraphCounters().as_dict() if server is None else server.counters()


def ffn_recent_steps(worker: Any) -> list[dict[str, object]]:
    """What each Attention peer announced and what this FFN rank computed on, recently."""
    server = ffn_server_of(worker)
    return [] if server is None else server.recent_steps()
