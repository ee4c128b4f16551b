"""AFD serving on the CPU platform against the best plain vLLM on the same cores, and the
connector's round trip against raw shared memory, raw gloo and raw TCP.

    python benchmarks/serving.py [--only throughput|connector] [--enforce-eager]

Throughput (section ``serving``): vLLM's own client (``vllm bench serve``: random prompts of 64
tokens, 32 tokens out, ``--ignore-eos``) at concurrency 1, 8 and 32 against the AFD pair
(Attention on the first core, FFN on the second) and against plain vLLM on the same two cores,
configured both ways a plain deployment could use them (one engine on both cores, one engine on
one core); the faster plain configuration at each concurrency is the baseline. Every server runs
in vLLM's default compiled mode (or all with ``--enforce-eager``), with the same engine flags. The
figures also go to ``docs/plots/serving.json``, which ``nox -s plots`` draws as
``docs/plots/serving.png``.

Connector (section ``connector``): the round trip per layer (mean, median, p99) of the gloo
connector over shared memory and over gloo, of its shared-memory rings alone, of raw gloo with
every receive posted before the send it answers, and of raw TCP, all five moving the same bytes
each way in steps of the same number of round trips between two processes, the FFN side
answering at once (see :mod:`afd_models.cli.gloo_bench`). Target: the connector's mean and p99
within 1.3x of the best raw baseline's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _results import DOC, write_section

from afd_models.cli import serve
from afd_models.cli.bench_serve import (
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    Comparison,
    Serving,
    measure_all,
    start_equal_hardware,
)
from afd_models.cli.gloo_bench import TARGET_RATIO, RoundTrips, Timing, measure
from afd_models.cli.tiny_models import write_tiny_model

CONCURRENCIES = (1, 8, 32)
#: every engine may batch the highest concurrency (the launcher's default is 16 sequences)
ENGINE_FLAGS = ("--max-num-seqs", str(max(CONCURRENCIES)))
#: the figures ``nox -s plots`` draws
FIGURES = DOC.parent / "plots" / "serving.json"


def say(message: str) -> None:
    print(f"[serving {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass(frozen=True)
class Breakdown:
    """Where the AFD pair's time went in one measured run, in ms."""

    concurrency: int
    #: the run's TPOT median: about one decode step
    tpot_ms: float
    #: Attention side, mean per remote layer: from sending the layer to holding its output
    round_trip_ms: float
    #: of it, the time the Attention side waited for the answer; the rest is its connector code
    wait_ms: float
    #: FFN side, by remote layer: mean receive (waiting included), compute and send of its
    #: eagerly served steps
    ffn_ms: tuple[tuple[float, float, float], ...]
    ffn_steps: int


class WhereTimeGoes:
    """Reads both roles of the AFD pair around each measured run (AFDProbe)."""

    def __init__(self, attention: serve.Server, ffn: serve.Server):
        self.attention, self.ffn = attention, ffn
        self.found: list[tuple[Serving, Breakdown]] = []

    def _last_step(self) -> int:
        steps = serve.collective_rpc(self.ffn, "afd_ffn_steps")[0]
        return int(steps[-1]["step"]) if steps else -1

    def start(self) -> None:
        self._stats, self._step = serve.connector_stats(self.attention), self._last_step()

    def finish(self, run: Serving) -> None:
        exchanges = serve.exchanges_between(self._stats, serve.connector_stats(self.attention))
        steps = [
            step
            for step in serve.collective_rpc(self.ffn, "afd_ffn_steps")[0]
            if step["step"] > self._step and step["layer_seconds"]
        ]
        if not steps:
            raise RuntimeError(
                f"the AFD pair exchanged {exchanges.count} layers but served no timed step "
                f"during the run at concurrency {run.concurrency}: nothing to break down"
            )
        by_layer = zip(*(step["layer_seconds"] for step in steps), strict=True)
        ffn_ms = tuple(
            tuple(1e3 * statistics.fmean(phase) for phase in zip(*layer, strict=True))
            for layer in by_layer
        )
        self.found.append(
            (
                run,
                Breakdown(
                    run.concurrency,
                    run.tpot_median_ms,
                    1e3 * exchanges.mean_round_trip_s,
                    1e3 * exchanges.mean_wait_s,
                    ffn_ms,
                    len(steps),
                ),
            )
        )

    def of(self, run: Serving) -> Breakdown:
        return next(breakdown for kept, breakdown in self.found if kept is run)


def throughputs(eager: bool, repeats: int) -> tuple[list[Comparison], list[Breakdown], str]:
    """One comparison per concurrency, where the AFD pair's time went in its kept runs, and
    which cores each deployment had."""
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_model(Path(tmp) / "model", "v2", seed=0)
        logs = Path(tmp) / "logs"
        group = start_equal_hardware(
            model,
            logs,
            {"port": serve.free_port()},
            afd_env={"VLLM_SERVER_DEV_MODE": "1"},
            dtype="bfloat16",
            eager=eager,
            extra=ENGINE_FLAGS,
        )
        try:
            say("starting the AFD pair and plain vLLM (compiling takes minutes on 2 cores)")
            serve.wait_ready(group.servers, timeout_s=1200, progress=True)
            for server in (group.afd.server, *(p.server for p in group.plain)):
                if serve.ran_compiled(server) == eager:
                    mode = "eager" if eager else "compiled"
                    raise RuntimeError(f"{server.name} did not run {mode}:\n{server.log_tail()}")
            probe = WhereTimeGoes(group.afd.server, group.ffn)
            comparisons = measure_all(
                group, model, CONCURRENCIES, say, repeats=repeats, probe=probe
            )
        finally:
            for server in group.servers:
                serve.stop(server)
    return comparisons, [probe.of(c.afd) for c in comparisons], group.cores()


def _breakdown_table(breakdowns: list[Breakdown]) -> str:
    def by_layer(phase: int, b: Breakdown) -> str:
        return " / ".join(f"{layer[phase]:.3f}" for layer in b.ffn_ms)

    rows = [
        f"| {b.concurrency} | {b.round_trip_ms:.3f} | {b.round_trip_ms - b.wait_ms:.3f} "
        f"| {b.wait_ms:.3f} | {by_layer(0, b)} | {by_layer(1, b)} | {by_layer(2, b)} "
        f"| {b.wait_ms - statistics.fmean(layer[1] for layer in b.ffn_ms):.3f} "
        f"| {b.tpot_ms - len(b.ffn_ms) * b.round_trip_ms:.3f} |"
        for b in breakdowns
    ]
    return (
        "| concurrency | Attention: round trip | Attention: its connector code (round trip "
        "less the wait) | Attention: waiting for the answer | FFN: receive, waiting included, "
        "by layer | FFN: compute, by layer | FFN: send, by layer | the wait less the FFN's "
        "compute (transport, the FFN side's step set-up and connector code) | TPOT median less "
        "the round trips (Attention compute, scheduling, sampling) |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows)
    )


def serving(eager: bool, repeats: int) -> None:
    comparisons, breakdowns, cores = throughputs(eager, repeats)
    FIGURES.parent.mkdir(exist_ok=True)
    FIGURES.write_text(
        json.dumps(
            [dataclasses.asdict(run) for c in comparisons for run in (c.afd, *c.plain)], indent=1
        )
        + "\n"
    )
    rows = []
    for c in comparisons:
        for run in (c.afd, *c.plain):
            mark = " (baseline)" if run is c.baseline else ""
            rows.append(
                f"| {run.concurrency} | {run.deployment}{mark} | {run.cores} "
                f"| {run.output_tokens_per_s:.0f} | {run.per_core:.0f} "
                f"| {run.ttft_median_ms:.1f} / {run.ttft_p99_ms:.1f} "
                f"| {run.tpot_median_ms:.2f} / {run.tpot_p99_ms:.2f} |"
            )
    ratios = "\n".join(
        f"| {c.afd.concurrency} | {c.baseline.deployment} | {c.throughput_ratio:.2f} "
        f"| {c.afd.per_core / c.baseline.per_core:.2f} | {c.tpot_ratio:.2f} |"
        for c in comparisons
    )
    mode = "`--enforce-eager`" if eager else "compiled (vLLM's default)"
    write_section(
        "serving",
        f"All engines {mode}, bf16, the same engine flags. Cores: {cores}. The client "
        f"(`vllm bench serve`, random {INPUT_TOKENS} tokens in, {OUTPUT_TOKENS} out, "
        "`--ignore-eos`, 4 requests per concurrency slot, at least 16, after a warm-up) is not "
        f"bound and shares the two cores. Best of {repeats} rounds per deployment (the "
        "deployments take turns).\n\n"
        "| concurrency | deployment | cores | output tok/s | per core | TTFT ms, median / p99 "
        "| TPOT ms, median / p99 |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n\n"
        "The AFD pair against the faster plain configuration on the same cores:\n\n"
        "| concurrency | baseline | AFD / baseline, output tok/s | per core | AFD / baseline, "
        "TPOT median |\n| --- | --- | --- | --- | --- |\n" + ratios + "\n\n"
        "Where the AFD pair's time went in those runs, ms per remote layer (with the gate on "
        "the FFN role, the FFN engine computes every layer's MLP: layer 1 is the dense MLP, "
        "the others are MoE layers). The Attention columns are means over the layers, from "
        "the Attention worker's connector statistics; the FFN columns are by layer, from the "
        "FFN server's timings of the run's steps. The FFN's receive of layer 1 comes with the "
        "step header it waited for, its later receives include the Attention engine's compute "
        "of the layer's attention:\n\n"
        + _breakdown_table(breakdowns)
        + "\n\n![output tokens/s and TPOT median against concurrency](plots/serving.png)",
        command="python benchmarks/serving.py --only throughput"
        + (" --enforce-eager" if eager else ""),
    )


#: (tokens, hidden size) of the bf16 activations the connector benchmark moves
PAYLOADS = ((1, 256), (32, 256))
LAYERS, REPEATS, ITERATIONS = 3, 5, 600


def _payload(shape: tuple[int, int], result: RoundTrips) -> str:
    return f"{shape[0]} x {shape[1]} bf16 ({result.nbytes / 1024:.1f} KiB)"


def _us(timing: Timing) -> str:
    return f"{timing.mean_s * 1e6:.0f} ({timing.median_s * 1e6:.0f}) [{timing.p99_s * 1e6:.0f}]"


def connector() -> bool:
    """Measure and write the connector section; whether the connector met its target."""
    results = {
        shape: measure(*shape, iterations=ITERATIONS, layers=LAYERS, repeats=REPEATS)
        for shape in PAYLOADS
    }
    rows = [
        f"| {_payload(shape, r)} | {_us(r.raw_shm)} | {_us(r.raw_gloo)} | {_us(r.raw_tcp)} "
        f"| {_us(r.connector)} | {_us(r.connector_gloo)} "
        f"| {r.ratio:.2f} / {r.p99_ratio:.2f} ({r.best_raw}) | <= {TARGET_RATIO} "
        f"| {r.median_ratio:.2f} "
        f"| {' / '.join(f'{t * 1e6:.0f}' for t in r.connector.median_by_layer_s)} |"
        for shape, r in results.items()
    ]
    missed = [
        f"{_payload(shape, r)}: {r.ratio:.2f}x mean, {r.p99_ratio:.2f}x p99 ({r.best_raw})"
        for shape, r in results.items()
        if not r.meets_target
    ]
    verdict = (
        f"**Target missed** (connector mean and p99 <= {TARGET_RATIO}x the best raw "
        "baseline's) at " + "; ".join(missed) + "."
        if missed
        else f"Target met: the connector's mean and p99 are within {TARGET_RATIO}x of the best "
        "raw baseline's at every payload."
    )
    write_section(
        "connector",
        "Round trip per layer, µs, as mean (median) [p99]: one layer's activations from the "
        "Attention process to the FFN process and the same bytes back, the FFN side answering "
        f"at once; steps of {LAYERS} round trips; about {ITERATIONS} timed round trips after a "
        f"warm-up; the five runs alternating, best of {REPEATS} for each statistic; each "
        "process pinned to its own core, its garbage collector's survivors frozen once set up "
        "(as vLLM's engine does). The target bounds the mean and the p99.\n\n"
        "- raw shm: the connector's shared-memory rings alone (a ring per direction, the reader "
        "polling, then sleeping on a FIFO doorbell).\n"
        "- raw gloo: gloo send/recv, each side posting its receive before it sends.\n"
        "- raw TCP: one socket pair (`TCP_NODELAY`); the Attention side sends, then reads the "
        "answer; the FFN side reads, then sends the bytes back.\n"
        "- connector: `GlooAttentionConnector` / `GlooFFNConnector` on one host, as served: a "
        "step's first layer goes with the step header over the TCP step channel, later layers "
        "and every answer through the shared-memory rings. Last column: its median round trip "
        "by position in the step (first layer / later layers).\n"
        "- connector over gloo: the same with `shared_memory` false, as across hosts: later "
        "layers and answers by gloo.\n\n"
        "| payload | raw shm | raw gloo, receives pre-posted | raw TCP | AFD connector "
        "(shared memory) | AFD connector over gloo | connector / best raw, mean / p99 | target "
        "| connector / best raw, median | connector median by layer |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
        + "\n".join(rows)
        + "\n\n"
        + verdict,
        command="python benchmarks/serving.py --only connector",
    )
    return not missed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("throughput", "connector"))
    parser.add_argument("--enforce-eager", action="store_true", help="every engine eager")
    parser.add_argument("--repeats", type=int, default=2, help="rounds per deployment (best kept)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: must be at least 1")
    if args.only != "connector":
        serving(args.enforce_eager, args.repeats)
    if args.only != "throughput" and not connector():
        print(
            f"connector: target <= {TARGET_RATIO}x missed (see docs/benchmarks.md)", file=sys.stderr
        )


if __name__ == "__main__":
    main()
