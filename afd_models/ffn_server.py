"""The FFN role's serving loop: receive a step's activations, compute each layer's FFN, send back.

It runs in a background thread of the FFN worker (vLLM's EngineCore has no requests to schedule
there). The main thread never runs a forward on the FFN role, so setting vLLM's process-global
forward context from this thread is safe. A failure ends the loop and is kept; the worker decides
what a failure means (in ``vllm serve`` it ends the worker process, so the engine reports it).

With ``peer_restart_timeout_s`` (and a ``reconnect`` step), Attention peers that go away are
waited for instead: the server closes its connector, hosts the group again and serves whichever
Attention engine passes the handshake within that time (a restarted one); the model stays loaded.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from vllm.config import VllmConfig
from vllm.forward_context import set_forward_context

from afd_models.config import AFDConfig
from afd_models.connectors.base import (
    AFDConnectionError,
    AFDPeerGoneError,
    FFNConnector,
    LayerInput,
    StepHeader,
    peer_counts,
)
from afd_models.dbo import receives_before_send, split_step_units
from afd_models.graphs import FFNGraphKey, FFNGraphs, GraphCounters, replays_graphs
from afd_models.log import get_logger
from afd_models.models.ffn import token_id_layers
from afd_models.step_vote import StepVote, Verdict
from afd_models.topology import Group, TopologyError, ffn_token_counts

logger = get_logger(__name__)

#: the forward context a layer's FFN computes in, from the config and the step's token count
ForwardContext = Callable[[VllmConfig, int], contextlib.AbstractContextManager[Any]]


def vllm_forward_context(vllm_config: VllmConfig, num_tokens: int) -> Any:
    """vLLM's forward context, with no attention metadata (the FFN role runs no attention)."""
    return set_forward_context(None, vllm_config, num_tokens=num_tokens)


class FFNModel(Protocol):
    def compute_ffn_output(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: torch.Tensor | None = None
    ) -> torch.Tensor: ...


def ffn_output(model: FFNModel, layer_idx: int, received: LayerInput) -> torch.Tensor:
    """``model``'s FFN output of ``layer_idx`` for what the FFN side received. Token ids come
    only for a layer whose routing needs them, and only then are they handed on, so a model
    without such layers keeps the three-argument ``compute_ffn_output``."""
    if received.token_ids is None:
        return model.compute_ffn_output(layer_idx, received.hidden_states, received.router_logits)
    compute: Callable[..., torch.Tensor] = model.compute_ffn_output
    return compute(
        layer_idx, received.hidden_states, received.router_logits, token_ids=received.token_ids
    )


def check_headers(
    headers: Sequence[StepHeader],
    group: Group,
    *,
    num_attention_ranks: int,
    num_ffn_ranks: int,
    hidden_size: int,
    dtype: torch.dtype,
    token_ids: bool = False,
) -> int:
    """Tokens this FFN rank computes on in a step: its peers' counts (``headers``, one per peer in
    group order) summed by :func:`afd_models.topology.ffn_token_counts`. ``token_ids``: whether
    this model has token-id layers, whose sends carry token ids.

    Raises:
        AFDConnectionError: a peer sends a shape or dtype this model cannot take, says token ids
            come where this model expects none or the reverse (the layers' parts would not
            pair), or the headers are not one per peer of ``group``.
    """
    for header in headers:
        if header.hidden_size != hidden_size or header.dtype != dtype:
            raise AFDConnectionError(
                f"an Attention peer sends hidden size {header.hidden_size} {header.dtype}, "
                f"this FFN model takes {hidden_size} {dtype}: are both roles serving the same checkpoint and --dtype?"
            )
        if header.token_ids != token_ids:
            raise AFDConnectionError(
                f"an Attention peer's step header says token ids "
                f"{'come' if header.token_ids else 'do not come'}, but this FFN model has "
                f"{'' if token_ids else 'no '}token-id layers"
            )
    if len(headers) != len(group.attention_ranks):
        raise AFDConnectionError(
            f"FFN rank {group.ffn_rank} got {len(headers)} step headers for its "
            f"{len(group.attention_ranks)} attention peers {list(group.attention_ranks)}"
        )
    totals = ffn_token_counts(peer_counts(group, headers), num_attention_ranks, num_ffn_ranks)
    if list(totals) != [group.ffn_rank]:
        raise TopologyError(
            f"attention ranks {list(group.attention_ranks)} are not the peers of FFN rank "
            f"{group.ffn_rank} in {num_attention_ranks}A{num_ffn_ranks}F"
        )
    return totals[group.ffn_rank]


#: one remote layer's seconds on the FFN side, in order: receiving its activations (from the
#: moment the server asked for them: the Attention side may still be computing), computing its
#: FFN, sending the output back
LayerSeconds = tuple[float, float, float]


def serve_step(
    model: FFNModel,
    vllm_config: VllmConfig,
    connector: FFNConnector,
    layers: Sequence[int],
    headers: Sequence[StepHeader],
    tokens: int,
    graphs: FFNGraphs | None = None,
    forward_context: ForwardContext = vllm_forward_context,
) -> tuple[list[int], bool, list[LayerSeconds]]:
    """Compute every remote layer of one step: the rows each layer computed on, in layer order;
    whether the step ran from ``graphs`` (only a step every peer replays from a graph may); and,
    for a step run eagerly, each layer's :data:`LayerSeconds` (none for a graph's replay). A step
    some peer split into micro-batches runs eagerly, unit by unit (:func:`serve_split_step`)."""
    if any(h.ubatch_tokens for h in headers):
        split = serve_split_step(model, vllm_config, connector, layers, headers, forward_context)
        return split, False, []
    from_graphs = graphs is not None and replays_graphs(headers)
    rows, seconds = [], []
    clock = time.perf_counter
    with torch.inference_mode(), forward_context(vllm_config, tokens):
        for layer_idx in layers:
            if graphs is not None and from_graphs:

                def layer(layer_idx: int = layer_idx) -> int:
                    received = connector.recv(layer_idx)
                    connector.send(layer_idx, ffn_output(model, layer_idx, received))
                    return int(received.hidden_states.shape[0])

                # a graph moves what its key fixes: the peers' announced tokens
                graphs.run(FFNGraphKey.of(layer_idx, headers), layer)
                rows.append(tokens)
                continue
            started = clock()
            received = connector.recv(layer_idx)
            arrived = clock()
            output = ffn_output(model, layer_idx, received)
            computed = clock()
            connector.send(layer_idx, output)
            seconds.append((arrived - started, computed - arrived, clock() - computed))
            rows.append(int(received.hidden_states.shape[0]))
    return rows, from_graphs, seconds


def serve_split_step(
    model: FFNModel,
    vllm_config: VllmConfig,
    connector: FFNConnector,
    layers: Sequence[int],
    headers: Sequence[StepHeader],
    forward_context: ForwardContext = vllm_forward_context,
) -> list[int]:
    """Compute a step some peer split into micro-batches, unit by unit, each peer's transfers in
    the order it posts the matching ones (see :mod:`afd_models.dbo`): the rows each layer
    computed on (all its micro-batches), in layer order."""
    units = split_step_units(layers, headers)
    rows = dict.fromkeys(layers, 0)
    waits = [connector.start_recv(units[0].layer, units[0].ubatch, units[0].peers)]
    with torch.inference_mode():
        for index, unit in enumerate(units):
            for wait in waits:
                wait()
            received = connector.received(unit.layer, unit.ubatch)
            tokens = int(received.hidden_states.shape[0])
            with forward_context(vllm_config, tokens):
                output = ffn_output(model, unit.layer, received)
            rows[unit.layer] += tokens
            if index + 1 == len(units):
                connector.send(unit.layer, output, unit.ubatch)
                break
            following = units[index + 1]
            before, after = receives_before_send(following, headers)
            waits = (
                [connector.start_recv(following.layer, following.ubatch, before)] if before else []
            )
            connector.send(unit.layer, output, unit.ubatch)
            if after:
                waits.append(connector.start_recv(following.layer, following.ubatch, after))
    return [rows[layer] for layer in layers]


#: steps the FFN server remembers for :meth:`FFNServer.recent_steps`
RECENT_STEPS = 4096


def device_scope(
    device: torch.device, accelerator: Any = None
) -> contextlib.AbstractContextManager[Any]:
    """What the FFN server thread enters before serving: on an accelerator, the worker's device
    (a new thread starts on device 0, which is another worker's on a multi-GPU host) and a stream
    of the thread's own, so transfers pending on a peer never hold up work that vLLM's main thread
    queues on the default stream. Nothing on the CPU.

    ``accelerator`` is the device module (``torch.cuda`` for a ``cuda`` device when not given).
    """
    if device.type == "cpu":
        return contextlib.nullcontext()
    accelerator = getattr(torch, device.type) if accelerator is None else accelerator
    accelerator.set_device(device)
    stream: contextlib.AbstractContextManager[Any] = accelerator.stream(accelerator.Stream(device))
    return stream


class FFNServer:
    """A stoppable background loop over :func:`serve_step`. ``layer_model``: what computes each
    layer, if not ``model`` itself (its layers compiled)."""

    def __init__(
        self,
        model: Any,
        vllm_config: VllmConfig,
        connector: FFNConnector,
        *,
        afd: AFDConfig,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        graphs: FFNGraphs | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        accelerator: Any = None,
        forward_context: ForwardContext = vllm_forward_context,
        reconnect: Callable[..., FFNConnector] | None = None,
        layer_model: FFNModel | None = None,
        vote: StepVote | None = None,
    ):
        self.model = model
        #: what computes each layer: the model, or its layers compiled
        #: (:class:`~afd_models.ffn_compile.CompiledLayers`, warmed up before the connect)
        self.layer_model: FFNModel = model if layer_model is None else layer_model
        self.forward_context = forward_context
        self.device = device
        self.graphs = graphs
        self.accelerator = accelerator
        self.vllm_config = vllm_config
        self.layers = list(model.ffn_layer_indices())
        #: whether the model's token-id layers' sends carry token ids
        self.token_ids = bool(token_id_layers(model))
        self.hidden_size = hidden_size
        self.dtype = dtype
        self.num_attention_ranks, self.num_ffn_ranks = afd.num_attention_ranks, afd.num_ffn_ranks
        #: hosts the group again once the peers left (None: the server fails instead); called
        #: with ``stop``, an event that ends its wait early
        self.reconnect = reconnect if afd.peer_restart_timeout_s else None
        self.restart_timeout_s = afd.peer_restart_timeout_s
        #: the TP partners' vote on each step (afd_models/step_vote.py): with it, a step whose
        #: peer went away is computed to its end, and all partners host the group again together
        self.vote = vote if self.reconnect is not None else None
        #: times the Attention peers left and new ones connected
        self.reconnects = 0
        self.group = connector.group  # its peers, in the order of their step headers
        self._adopt(connector)
        self.on_failure = on_failure
        self.steps = 0
        #: the FFN graphs' counters (its own when the server runs eagerly), splits counted here
        self._counters = graphs.counters if graphs is not None else GraphCounters()
        self._recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT_STEPS)
        self._recent_lock = threading.Lock()  # read from the worker's RPC thread
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="AFD-FFN-server", daemon=True)

    def start(self) -> None:
        logger.info("AFD FFN server: serving layers %s", self.layers)
        self._thread.start()

    def _run(self) -> None:
        try:
            with device_scope(self.device, self.accelerator):
                self._serve_across_restarts()
        except BaseException as exc:  # kept and reported; the thread must not die silently
            if not self._stop.is_set():  # an error while stopping is the interruption itself
                self.error = exc
                logger.error("AFD FFN server failed after %d steps: %s", self.steps, exc)
                if self.on_failure is not None:
                    self.on_failure(exc)
        logger.info(
            "AFD FFN server: stopped after %d steps; counters %s", self.steps, self.counters()
        )

    def _adopt(self, connector: FFNConnector) -> None:
        """Serve through ``connector`` (the first, or one hosting the group again): with the
        partners' vote, it computes a step whose peer went away to its end."""
        connector.holds_lost_steps = self.vote is not None
        self.connector = connector

    def _serve_across_restarts(self) -> None:
        while True:
            try:
                self._serve()
                return
            except AFDPeerGoneError as exc:
                if self.reconnect is None or self._stop.is_set():
                    raise
                gone = str(exc)
            # outside the except: the error's frames hold the old data plane, whose store
            # keeps the group's port until they go
            self._wait_for_new_peers(gone)

    def _wait_for_new_peers(self, gone: str) -> None:
        """The peers left (``gone`` says how): close the connector and connect a new one, which
        waits up to ``peer_restart_timeout_s`` for restarted Attention peers (or raises)."""
        logger.warning(
            "AFD FFN server: the Attention peers %s left after %d steps (%s); waiting up to "
            "%.0f s (peer_restart_timeout_s) for a restarted Attention engine",
            list(self.group.attention_ranks),
            self.steps,
            gone,
            self.restart_timeout_s,
        )
        assert self.reconnect is not None
        self.connector.close()
        started = time.monotonic()
        connector = self.reconnect(stop=self._stop)
        self._adopt(connector)
        if self._stop.is_set():  # stopped during the handshake: the stopper closed the old one
            connector.close()
            return
        self.reconnects += 1
        for metrics in connector.metrics:
            metrics.reconnected()
        logger.info(
            "AFD FFN server: Attention peers %s connected again after %.1f s; serving",
            list(self.group.attention_ranks),
            time.monotonic() - started,
        )

    def _serve(self) -> None:
        while not self._stop.is_set():
            headers = self._next_step()
            if headers is None:
                break
            tokens = check_headers(
                headers,
                self.group,
                num_attention_ranks=self.num_attention_ranks,
                num_ffn_ranks=self.num_ffn_ranks,
                hidden_size=self.hidden_size,
                dtype=self.dtype,
                token_ids=self.token_ids,
            )
            rows, from_graphs, seconds = serve_step(
                self.layer_model,
                self.vllm_config,
                self.connector,
                self.layers,
                headers,
                tokens,
                self.graphs,
                self.forward_context,
            )
            split = any(h.ubatch_tokens for h in headers)
            self._counters.ubatch_splits += split
            with self._recent_lock:
                self._recent.append(
                    {
                        "step": self.steps,
                        "peers": peer_counts(self.group, headers),
                        "tokens": tokens,
                        "rows": rows,
                        "graph": from_graphs,
                        "split": split,
                        "layer_seconds": seconds,
                    }
                )
            self.steps += 1

    def _next_step(self) -> list[StepHeader] | None:
        """The next step's headers (None once stopped). With TP partners, each lane's peer
        starts it, so every partner votes before any computes: if one lane's peers went away
        (now, or during the last step, which was held), an :class:`AFDPeerGoneError` on every
        partner makes all of them host the group again."""
        if self.vote is None:
            return self.connector.wait_step(self._stop)
        gone, headers = self.connector.lost_step, None
        if gone is None:
            try:
                headers = self.connector.wait_step(self._stop)
            except AFDPeerGoneError as exc:
                gone = str(exc)
            if headers is None and gone is None:  # stopped: the engine is shutting down, and
                return None  # a partner's pending vote ends with its process group
        if self.vote.tally(Verdict.AGAIN if gone else Verdict.RAN) is not Verdict.RAN:
            raise AFDPeerGoneError(gone or "the Attention peers of a TP partner went away")
        return headers

    def recent_steps(self) -> list[dict[str, Any]]:
        """The last :data:`RECENT_STEPS` steps, oldest first: ``step`` (its index), ``peers``
        (Attention rank -> tokens its header announced), ``tokens`` (this FFN rank's step count
        from :func:`check_headers`), ``rows`` (rows each remote layer received and computed),
        ``graph`` (whether the step ran from FFN graphs), ``split`` (whether some peer split
        it into micro-batches) and ``layer_seconds`` (each remote layer's :data:`LayerSeconds`
        when the step ran eagerly and unsplit)."""
        with self._recent_lock:
            return list(self._recent)

    def counters(self) -> dict[str, int]:
        """Graph captures and replays of the FFN graphs (zeros when the server runs eagerly), and
        the steps some peer split into micro-batches."""
        return self._counters.as_dict()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the AFD FFN server failed: {self.error}") from self.error

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self.connector.interrupt()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
