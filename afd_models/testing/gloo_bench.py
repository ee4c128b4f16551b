"""Round trips over gloo between two processes: the AFD gloo connector against raw gloo.

Both measurements move the same bytes the same way (Attention -> FFN -> Attention, one layer at a
time) between two spawned processes on 127.0.0.1, each pinned to its own core as the two roles are
in a deployment; the FFN side answers immediately (no compute), so the difference is the
connector's own cost: step headers, tags, checks, Python dispatch. Scheduling noise on a small
machine is larger than that cost, so the two alternate for several repeats and each keeps its
best. Used by ``benchmarks/serving.py`` and the demo.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta

import torch

from afd_models.config import GlooExtraConfig
from afd_models.testing.serve import free_port
from afd_models.topology import groups

TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RoundTrips:
    """Mean seconds per layer round trip (after a warm-up)."""

    raw_s: float
    connector_s: float
    nbytes: int

    @property
    def ratio(self) -> float:
        return self.connector_s / self.raw_s


WARMUP = 20


def _raw_peer(
    rank: int, out: multiprocessing.Queue, port: int, shape: tuple[int, int], iterations: int
) -> None:
    from torch.distributed import PrefixStore, TCPStore
    from vllm.distributed.utils import init_gloo_process_group

    store = TCPStore(
        "127.0.0.1", port, world_size=2, is_master=rank == 0, timeout=timedelta(seconds=TIMEOUT_S)
    )
    pg = init_gloo_process_group(PrefixStore("raw", store), rank, 2, timedelta(seconds=TIMEOUT_S))
    buffer = torch.zeros(shape, dtype=torch.bfloat16)
    times = []
    for _ in range(WARMUP + iterations):
        started = time.perf_counter()
        if rank == 1:  # Attention: send, then receive the answer
            pg.send([buffer.view(torch.uint8)], 0, 0).wait()
            pg.recv([buffer.view(torch.uint8)], 0, 0).wait()
        else:  # FFN: receive, answer at once
            pg.recv([buffer.view(torch.uint8)], 1, 0).wait()
            pg.send([buffer.view(torch.uint8)], 1, 0).wait()
        times.append(time.perf_counter() - started)
    out.put((rank, statistics.fmean(times[WARMUP:])))


def _connector_peer(
    rank: int,
    out: multiprocessing.Queue,
    port: int,
    shape: tuple[int, int],
    iterations: int,
    layers: int,
) -> None:
    import threading

    from afd_models.connectors.gloo import GlooAttentionConnector, GlooFFNConnector

    group = groups(1, 1, port)[0]
    extra = GlooExtraConfig(connect_timeout_s=TIMEOUT_S, timeout_s=TIMEOUT_S)
    hidden = torch.zeros(shape, dtype=torch.bfloat16)
    warmup_steps = max(1, WARMUP // layers)
    steps = max(1, iterations // layers) + warmup_steps
    if rank == 0:
        ffn = GlooFFNConnector("127.0.0.1", group, extra)
        stop = threading.Event()
        for _ in range(steps):
            ffn.wait_step(stop)
            for layer in range(layers):
                received, _ = ffn.recv(layer)
                ffn.send(layer, received)
        ffn.close()
        out.put((rank, 0.0))
        return
    attention = GlooAttentionConnector("127.0.0.1", group, 0, extra)
    attention.set_layers(list(range(layers)))
    for step in range(steps):
        if step == warmup_steps:  # timed per step, so the step headers count too
            started = time.perf_counter()
        for layer in range(layers):
            attention.send(layer, hidden, None)
            attention.recv(layer, hidden)
    elapsed = time.perf_counter() - started
    attention.close()
    out.put((rank, elapsed / ((steps - warmup_steps) * layers)))


def _run_pair(target: object, *args: object) -> float:
    """Run ``target(rank, queue, *args)`` as ranks 0 and 1; rank 1's measurement."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=target, args=(rank, queue, *args)) for rank in (0, 1)]  # type: ignore[arg-type]
    for process in processes:
        process.start()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:  # one core per side, as the two roles run in a deployment
        for rank, process in enumerate(processes):
            os.sched_setaffinity(process.pid, {cpus[rank % len(cpus)]})
    results = dict(queue.get(timeout=TIMEOUT_S * 2) for _ in processes)
    for process in processes:
        process.join(TIMEOUT_S)
    return float(results[1])


def measure(
    tokens: int,
    hidden_size: int,
    iterations: int = 300,
    layers: int = 3,
    repeats: int = 5,
) -> RoundTrips:
    """Per-layer round trip of ``tokens x hidden_size`` bf16 activations, raw and through the
    connector: alternating ``repeats`` times, the best mean of each."""
    shape = (tokens, hidden_size)
    raw, connector = [], []
    for _ in range(repeats):
        raw.append(_run_pair(_raw_peer, free_port(), shape, iterations))
        connector.append(_run_pair(_connector_peer, free_port(), shape, iterations, layers))
    return RoundTrips(min(raw), min(connector), tokens * hidden_size * 2)
