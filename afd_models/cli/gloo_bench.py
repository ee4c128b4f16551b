"""Round trips between two processes: the AFD gloo connector, over shared memory and over gloo,
against raw shared memory, raw gloo and raw TCP.

All five move the same traffic between two spawned processes on 127.0.0.1, each pinned to its
own core as the two roles are in a deployment: steps of ``layers`` round trips, each carrying one
``tokens x hidden_size`` bf16 tensor from the Attention side to the FFN side and the same bytes
straight back (no compute). Only the way the bytes travel differs:

- **connector**: :class:`~afd_models.connectors.gloo.GlooAttentionConnector` and
  :class:`~afd_models.connectors.gloo.GlooFFNConnector` as served on one host: a step's first
  layer goes over the TCP step channel together with the step header, every later layer and
  every answer through the shared-memory rings (:mod:`afd_models.connectors.p2p.shm`).
- **connector over gloo**: the same with ``shared_memory`` false, as across hosts: the Attention
  side posts the gloo receive of a layer's answer, then sends the layer by gloo; the FFN side
  posts a gloo receive for each later layer once it has answered the previous one, and answers
  every layer by gloo send.
- **raw shm**: the connector's rings alone (:class:`~afd_models.connectors.p2p.shm.Ring`): the
  Attention side writes the bytes and reads the answer, the echo side reads and writes back.
- **raw gloo**: the Attention side posts the gloo receive of the answer, then sends (gloo); the
  echo side has its next receive posted before it sends each answer, so neither side's send
  should find the other's receive not yet posted.
- **raw TCP**: one connected socket pair (``TCP_NODELAY``); the Attention side sends the bytes and
  reads the answer, the echo side reads the bytes and sends them back.

The Attention side times every round trip after a warm-up (a step's first one carries the
connector's step header) and reports their mean and 99th percentile, which the target bounds, their
median, and the median by position in the step; it checks the last answer against what it sent.
The connector's cost (headers, tags, checks, statistics, Python dispatch) is its mean and p99
against the best of the three raw baselines. Scheduling noise on a small machine can exceed that
cost, so the five alternate for several repeats and each keeps its best. Both sides freeze the
garbage collector's survivors once set up, as vLLM's engine does after start-up. A side that fails,
exits early or answers wrong bytes raises :class:`BenchmarkError`: a failed run never yields a
time. Used by ``benchmarks/serving.py`` and the demo.
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import multiprocessing.process
import multiprocessing.queues
import os
import queue
import socket
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch

from afd_models.cli.serve import free_port
from afd_models.connectors.p2p.rendezvous import connected_to_itself
from afd_models.connectors.p2p.wire import byte_view
from afd_models.connectors.specs import GlooExtraConfig
from afd_models.topology import groups

#: every wait in a benchmark process, and the connector's timeouts
TIMEOUT_S = 60.0
#: round trips before the clock starts (rounded up to whole steps)
WARMUP = 20
#: the connector's mean and p99 round trip may be at most this many times the best raw baseline's
TARGET_RATIO = 1.3
#: rank of the side that answers (the FFN role, group rank 0) and of the side that times
ECHO, TIMER = 0, 1


class BenchmarkError(RuntimeError):
    """A benchmark process failed, exited early, timed out or received the wrong bytes."""


@dataclass(frozen=True)
class Timing:
    """Seconds per round trip (one layer's bytes there and back) of one run, or the best of several."""

    mean_s: float
    median_s: float
    #: median by position in the step: the first layer (which carries the connector's step header
    #: over its step channel), then each later one
    median_by_layer_s: tuple[float, ...]
    #: the 99th percentile
    p99_s: float

    @staticmethod
    def best(runs: list[Timing]) -> Timing:
        """The lowest of every statistic over ``runs``."""
        return Timing(
            min(r.mean_s for r in runs),
            min(r.median_s for r in runs),
            tuple(map(min, zip(*(r.median_by_layer_s for r in runs), strict=True))),
            min(r.p99_s for r in runs),
        )


@dataclass(frozen=True)
class RoundTrips:
    """Round trips through the connector (both planes) and the three raw baselines, the best over
    the repeats."""

    #: through the AFD gloo connector on one host (shared memory), step headers included
    connector: Timing
    #: through the AFD gloo connector with ``shared_memory`` false (gloo), step headers included
    connector_gloo: Timing
    #: the shared-memory rings alone
    raw_shm: Timing
    #: gloo send/recv, receives posted before the sends on both sides
    raw_gloo: Timing
    #: one TCP socket pair with ``TCP_NODELAY``
    raw_tcp: Timing
    #: payload bytes each way per round trip
    nbytes: int
    #: round trips per step
    layers: int

    @property
    def connector_s(self) -> float:
        return self.connector.mean_s

    @property
    def raws(self) -> dict[str, Timing]:
        return {"raw shm": self.raw_shm, "raw gloo": self.raw_gloo, "raw TCP": self.raw_tcp}

    @property
    def best_raw(self) -> str:
        """The raw baseline with the lowest mean."""
        return min(self.raws, key=lambda kind: self.raws[kind].mean_s)

    @property
    def best_raw_s(self) -> float:
        return self.raws[self.best_raw].mean_s

    @property
    def ratio(self) -> float:
        """Connector mean against the best raw baseline's: what the target bounds."""
        return self.connector_s / self.best_raw_s

    @property
    def p99_ratio(self) -> float:
        """Connector p99 against the same baseline's p99: the target bounds it too."""
        return self.connector.p99_s / self.raws[self.best_raw].p99_s

    @property
    def median_ratio(self) -> float:
        """Connector median against the same baseline's median (the typical round trip)."""
        return self.connector.median_s / self.raws[self.best_raw].median_s

    @property
    def meets_target(self) -> bool:
        return self.ratio <= TARGET_RATIO and self.p99_ratio <= TARGET_RATIO


@dataclass(frozen=True)
class _Plan:
    """What both sides of one run do: ``warmup_steps`` untimed steps, then ``steps`` timed ones."""

    shape: tuple[int, int]
    layers: int
    warmup_steps: int
    steps: int

    @property
    def round_trips(self) -> int:
        return (self.warmup_steps + self.steps) * self.layers


def _payload(plan: _Plan) -> torch.Tensor:
    """Random bf16 values (never all zeros, so an answer that never arrived shows)."""
    return torch.rand(plan.shape, generator=torch.Generator().manual_seed(0)).add_(1).bfloat16()


def _check_answer(answer: torch.Tensor, payload: torch.Tensor, kind: str) -> None:
    if not torch.equal(answer, payload):
        raise BenchmarkError(f"{kind}: the last answer differs from the bytes sent")


def _timed(plan: _Plan, round_trip: Callable[[int], None]) -> Timing:
    """Run ``round_trip(layer)`` for the warm-up steps, then time it over the measured steps."""
    for _ in range(plan.warmup_steps):
        for layer in range(plan.layers):
            round_trip(layer)
    by_layer: list[list[float]] = [[] for _ in range(plan.layers)]
    clock = time.perf_counter
    for _ in range(plan.steps):
        for layer, spent in enumerate(by_layer):
            started = clock()
            round_trip(layer)
            spent.append(clock() - started)
    every = sorted(t for spent in by_layer for t in spent)
    return Timing(
        statistics.fmean(every),
        statistics.median(every),
        tuple(statistics.median(spent) for spent in by_layer),
        every[min(len(every) - 1, math.ceil(0.99 * len(every)) - 1)],
    )


def _connector(rank: int, port: int, plan: _Plan, shared_memory: bool = True) -> Timing | None:
    import threading

    from afd_models.connectors.gloo import GlooAttentionConnector, GlooFFNConnector

    group = groups(1, 1, port)[0]
    extra = GlooExtraConfig(
        connect_timeout_s=TIMEOUT_S, timeout_s=TIMEOUT_S, shared_memory=shared_memory
    )
    if rank == ECHO:
        ffn = GlooFFNConnector("127.0.0.1", group, extra)
        try:
            gc.freeze()
            stop = threading.Event()
            for _ in range(plan.warmup_steps + plan.steps):
                if ffn.wait_step(stop) is None:
                    raise BenchmarkError("connector: the FFN side stopped before the last step")
                for layer in range(plan.layers):
                    ffn.send(layer, ffn.recv(layer).hidden_states)
        finally:
            ffn.close()
        return None
    attention = GlooAttentionConnector("127.0.0.1", group, 0, extra)
    try:
        attention.set_layers(list(range(plan.layers)))
        payload = _payload(plan)
        answers = [torch.zeros_like(payload)]
        gc.freeze()

        def round_trip(layer: int) -> None:  # layer 0 opens a step: its header goes with it
            attention.send(layer, payload, None)
            answers[0] = attention.recv(layer, payload)

        timing = _timed(plan, round_trip)
        _check_answer(answers[0], payload, "connector")
    finally:
        attention.close()
    return timing


def _connector_over_gloo(rank: int, port: int, plan: _Plan) -> Timing | None:
    return _connector(rank, port, plan, shared_memory=False)


def _raw_shm(rank: int, port: int, plan: _Plan) -> Timing | None:
    from torch.distributed import TCPStore

    from afd_models.connectors.p2p.shm import negotiate

    timeout = timedelta(seconds=TIMEOUT_S)
    store = TCPStore("127.0.0.1", port, world_size=2, is_master=rank == ECHO, timeout=timeout)
    plane = negotiate(store, rank, 2, TIMEOUT_S, allowed=True)
    if isinstance(plane, str):
        raise BenchmarkError(f"raw shm: no shared memory between the two processes: {plane}")
    outgoing, incoming = plane.rings(ECHO if rank == TIMER else TIMER)
    payload = _payload(plan)
    answer = torch.zeros_like(payload)
    sent = byte_view(payload)
    received = byte_view(answer)
    gc.freeze()
    try:
        if rank == ECHO:
            for i in range(plan.round_trips):
                deadline = time.monotonic() + TIMEOUT_S
                incoming.read(i % plan.layers, received, deadline, "raw shm")
                outgoing.write(i % plan.layers, received, deadline)
            return None

        def round_trip(layer: int) -> None:
            deadline = time.monotonic() + TIMEOUT_S
            outgoing.write(layer, sent, deadline)
            incoming.read(layer, received, deadline, "raw shm")

        timing = _timed(plan, round_trip)
    finally:
        plane.close()
    _check_answer(answer, payload, "raw shm")
    return timing


def _raw_gloo(rank: int, port: int, plan: _Plan) -> Timing | None:
    from torch.distributed import PrefixStore, TCPStore
    from vllm.distributed.utils import init_gloo_process_group

    timeout = timedelta(seconds=TIMEOUT_S)
    store = TCPStore("127.0.0.1", port, world_size=2, is_master=rank == ECHO, timeout=timeout)
    pg = init_gloo_process_group(PrefixStore("raw", store), rank, 2, timeout)
    payload = _payload(plan)
    gc.freeze()
    if rank == ECHO:  # answer each round trip with its bytes; the next receive is already posted
        buffers = [torch.empty_like(payload).view(torch.uint8) for _ in range(2)]
        pending = pg.recv([buffers[0]], TIMER, 0)
        for i in range(plan.round_trips):
            pending.wait(timeout)
            if i + 1 < plan.round_trips:
                pending = pg.recv([buffers[(i + 1) % 2]], TIMER, (i + 1) % plan.layers)
            pg.send([buffers[i % 2]], TIMER, i % plan.layers).wait(timeout)
        return None
    answer = torch.zeros_like(payload)
    sent, received = payload.view(torch.uint8), answer.view(torch.uint8)

    def round_trip(layer: int) -> None:
        work = pg.recv([received], ECHO, layer)  # posted before the send, as the connector does
        pg.send([sent], ECHO, layer).wait(timeout)
        work.wait(timeout)

    timing = _timed(plan, round_trip)
    _check_answer(answer, payload, "raw gloo")
    return timing


def _read_into(channel: socket.socket, buffer: memoryview) -> None:
    from afd_models.connectors.p2p.wire import read_into

    try:
        read_into(channel, buffer)
    except ConnectionError as exc:
        raise BenchmarkError(f"raw TCP: {exc}") from exc


def _tcp_channel(rank: int, port: int) -> socket.socket:
    if rank == ECHO:
        with socket.create_server(("127.0.0.1", port)) as listener:
            listener.settimeout(TIMEOUT_S)
            channel, _ = listener.accept()
    else:  # the echo side may not listen yet
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                channel = socket.create_connection(("127.0.0.1", port), TIMEOUT_S)
            except ConnectionRefusedError:
                pass
            else:
                if not connected_to_itself(channel):
                    break
                channel.close()  # TCP joined it to itself: nothing listens yet
            if time.monotonic() > deadline:
                raise TimeoutError(f"the echo side did not listen on port {port} in {TIMEOUT_S} s")
            time.sleep(0.05)
    channel.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    channel.settimeout(TIMEOUT_S)
    return channel


def _raw_tcp(rank: int, port: int, plan: _Plan) -> Timing | None:
    payload = _payload(plan)
    gc.freeze()
    with _tcp_channel(rank, port) as channel:
        if rank == ECHO:
            buffer = byte_view(torch.empty_like(payload))
            for _ in range(plan.round_trips):
                _read_into(channel, buffer)
                channel.sendall(buffer)
            return None
        answer = torch.zeros_like(payload)
        sent = byte_view(payload)
        received = byte_view(answer)

        def round_trip(layer: int) -> None:
            channel.sendall(sent)
            _read_into(channel, received)

        timing = _timed(plan, round_trip)
    _check_answer(answer, payload, "raw TCP")
    return timing


_Side = Callable[[int, int, _Plan], Timing | None]
#: what a side reports: its rank, and its timing or the traceback of its failure
_Result = tuple[int, Timing | None, str | None]
KINDS: dict[str, _Side] = {
    "connector": _connector,
    "connector over gloo": _connector_over_gloo,
    "raw shm": _raw_shm,
    "raw gloo": _raw_gloo,
    "raw TCP": _raw_tcp,
}


def _side(
    side: _Side, rank: int, results: multiprocessing.queues.Queue[_Result], port: int, plan: _Plan
) -> None:
    """One process of a run: report ``(rank, timing, None)``, or ``(rank, None, traceback)`` and
    exit with status 1."""
    try:
        timing = side(rank, port, plan)
    except BaseException:
        results.put((rank, None, traceback.format_exc()))
        raise SystemExit(1) from None
    results.put((rank, timing, None))


def _next_result(
    results: multiprocessing.queues.Queue[_Result],
    processes: Sequence[multiprocessing.process.BaseProcess],
    kind: str,
    deadline: float,
) -> _Result:
    """The next ``(rank, timing, traceback)`` a side reports; raises if a side died silently or
    time ran out."""
    while True:
        try:
            return results.get(timeout=0.2)
        except queue.Empty:
            pass
        for process in processes:
            if process.exitcode not in (None, 0):
                try:  # its traceback may still be on the way
                    return results.get(timeout=2)
                except queue.Empty:
                    raise BenchmarkError(
                        f"{kind}: {process.name} exited with status {process.exitcode} "
                        "without a result"
                    ) from None
        if time.monotonic() > deadline:
            raise BenchmarkError(f"{kind}: no result within {2 * TIMEOUT_S:.0f} s")


def _run_pair(kind: str, port: int, plan: _Plan) -> Timing:
    """Run ``kind`` as ranks 0 (echo) and 1 (timer); the timer's round trips.

    Raises :class:`BenchmarkError` as soon as either side fails or exits without a result, or
    when the run takes longer than twice ``TIMEOUT_S``; the other side is then killed.
    """
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [
        context.Process(
            target=_side, args=(KINDS[kind], rank, results, port, plan), name=f"{kind} rank {rank}"
        )
        for rank in (ECHO, TIMER)
    ]
    timings: dict[int, Timing | None] = {}
    try:
        for process in processes:
            process.start()
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > 1:  # one core per side, as the two roles run in a deployment
            for rank, process in enumerate(processes):
                assert process.pid is not None, "started above"
                try:
                    os.sched_setaffinity(process.pid, {cpus[rank % len(cpus)]})
                except ProcessLookupError:
                    pass  # already gone: reported below
        deadline = time.monotonic() + 2 * TIMEOUT_S
        while len(timings) < len(processes):
            rank, timing, error = _next_result(results, processes, kind, deadline)
            if error is not None:
                raise BenchmarkError(f"{kind}: rank {rank} failed:\n{error}")
            timings[rank] = timing
        for process in processes:
            process.join(TIMEOUT_S)
            if process.exitcode != 0:
                raise BenchmarkError(f"{kind}: {process.name} ended with status {process.exitcode}")
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(5)
        results.close()
    timing = timings[TIMER]
    if timing is None or not all(
        math.isfinite(v) and v > 0
        for v in (timing.mean_s, timing.median_s, *timing.median_by_layer_s, timing.p99_s)
    ):
        raise BenchmarkError(f"{kind}: measured {timing!r} per round trip")
    return timing


def measure(
    tokens: int,
    hidden_size: int,
    iterations: int = 300,
    layers: int = 3,
    repeats: int = 5,
) -> RoundTrips:
    """Round trips of ``tokens x hidden_size`` bf16 activations through the connector (over
    shared memory and over gloo), raw shared memory, raw gloo and raw TCP: about ``iterations``
    timed round trips in steps of ``layers``, after a warm-up; the five alternate ``repeats``
    times and each keeps its best of every statistic."""
    warmup_steps = max(1, math.ceil(WARMUP / layers))
    plan = _Plan(
        (tokens, hidden_size), layers, warmup_steps, max(1, math.ceil(iterations / layers))
    )
    kinds = list(KINDS)
    runs: dict[str, list[Timing]] = {kind: [] for kind in kinds}
    for repeat in range(repeats):
        shift = repeat % len(kinds)  # a different kind goes first each repeat
        for kind in kinds[shift:] + kinds[:shift]:
            runs[kind].append(_run_pair(kind, free_port(), plan))
    best = {kind: Timing.best(timings) for kind, timings in runs.items()}
    return RoundTrips(
        best["connector"],
        best["connector over gloo"],
        best["raw shm"],
        best["raw gloo"],
        best["raw TCP"],
        tokens * hidden_size * 2,
        layers,
    )
