"""AFD serving on the CPU platform: throughput against a plain vLLM server, and the connector's
round trip against raw gloo and raw TCP.

    python benchmarks/serving.py [--only throughput|connector]

Throughput (section ``serving``): tokens/s of 1 and 8 concurrent requests (64 tokens each) to the
AFD pair and to a plain ``vllm serve`` of the same tiny model, measured alternately in one run,
first with vLLM's default compilation, then with ``--enforce-eager`` (all servers restarted).

Connector (section ``connector``): the mean round trip per layer of the gloo connector, of raw gloo
with every receive posted before the send it answers, and of raw TCP, all three moving the same
bytes each way in steps of the same number of round trips between two processes, the FFN side
answering at once (see :mod:`afd_models.cli.gloo_bench`). Target: the connector within 1.3x
of the better raw baseline.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _results import write_section

from afd_models.cli import serve
from afd_models.cli.gloo_bench import TARGET_RATIO, RoundTrips, Timing, measure
from afd_models.cli.tiny_models import write_tiny_model

PROMPT = "Attention-FFN disaggregation serves one model as two deployments"


def rate(server: serve.Server, concurrency: int, tokens: int = 64) -> float:
    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        outputs = list(
            pool.map(
                lambda i: serve.complete(server, f"{PROMPT} {i}", tokens, timeout_s=600),
                range(concurrency),
            )
        )
    return sum(map(len, outputs)) / (time.monotonic() - started)


def throughputs(model: Path, logs: Path, eager: bool) -> dict[int, tuple[float, float]]:
    """Concurrency -> (AFD pair, plain vLLM) tokens/s, with every server in one mode."""
    afd = {"port": serve.free_port()}
    mode = {"dtype": "bfloat16", "eager": eager}
    tag = "eager" if eager else "compiled"
    servers = [
        serve.start_ffn(
            f"ffn-{tag}", model, serve.free_port(), logs, afd, cpu=serve.cpu(1), **mode
        ),
        serve.start_attention(
            f"attention-{tag}", model, serve.free_port(), logs, afd, cpu=serve.cpu(0), **mode
        ),
        serve.start(f"baseline-{tag}", model, serve.free_port(), logs, cpu=serve.cpu(0), **mode),
    ]
    results = {}
    try:
        serve.wait_ready(servers, timeout_s=900, progress=True)
        _, attention, baseline = servers
        for server in (attention, baseline):
            if serve.ran_compiled(server) == eager:
                raise RuntimeError(f"{server.name} did not run in {tag} mode:\n{server.log_tail()}")
        for concurrency in (1, 8):
            rate(attention, concurrency, 8)
            rate(baseline, concurrency, 8)
            afd_rate = max(rate(attention, concurrency) for _ in range(2))
            base_rate = max(rate(baseline, concurrency) for _ in range(2))
            results[concurrency] = (afd_rate, base_rate)
    finally:
        for server in servers:
            serve.stop(server)
    return results


def serving() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_model(Path(tmp) / "model", "v2", seed=0)
        logs = Path(tmp) / "logs"
        compiled = throughputs(model, logs, eager=False)
        eager = throughputs(model, logs, eager=True)
    rows = []
    for concurrency in (1, 8):
        (afd_c, base_c), (afd_e, base_e) = compiled[concurrency], eager[concurrency]
        rows.append(
            f"| {concurrency} | {afd_c:.0f} | {base_c:.0f} | {afd_c / base_c:.2f} "
            f"| {afd_e:.0f} | {base_e:.0f} | {afd_e / base_e:.2f} "
            f"| {afd_c / afd_e:.2f} | {base_c / base_e:.2f} |"
        )
    write_section(
        "serving",
        "Throughput (tokens/s, 64 tokens per request, best of 2), compiled (vLLM's default) and "
        "`--enforce-eager`:\n\n"
        "| concurrent requests | AFD pair, compiled | plain, compiled | AFD / plain | "
        "AFD pair, eager | plain, eager | AFD / plain | AFD compiled / eager | plain compiled / eager |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows),
    )


#: (tokens, hidden size) of the bf16 activations the connector benchmark moves
PAYLOADS = ((1, 256), (32, 256))
LAYERS, REPEATS, ITERATIONS = 3, 5, 600


def _payload(shape: tuple[int, int], result: RoundTrips) -> str:
    return f"{shape[0]} x {shape[1]} bf16 ({result.nbytes / 1024:.1f} KiB)"


def _us(timing: Timing) -> str:
    return f"{timing.mean_s * 1e6:.0f} ({timing.median_s * 1e6:.0f})"


def connector() -> bool:
    """Measure and write the connector section; whether the connector met its target."""
    results = {
        shape: measure(*shape, iterations=ITERATIONS, layers=LAYERS, repeats=REPEATS)
        for shape in PAYLOADS
    }
    rows = [
        f"| {_payload(shape, r)} | {_us(r.raw_gloo)} | {_us(r.raw_tcp)} | {_us(r.connector)} "
        f"| {r.ratio:.2f} ({r.best_raw}) | <= {TARGET_RATIO} | {r.median_ratio:.2f} "
        f"| {' / '.join(f'{t * 1e6:.0f}' for t in r.connector.median_by_layer_s)} |"
        for shape, r in results.items()
    ]
    missed = [
        f"{_payload(shape, r)}: {r.ratio:.2f}x {r.best_raw}"
        for shape, r in results.items()
        if not r.meets_target
    ]
    verdict = (
        f"**Target missed** (connector mean <= {TARGET_RATIO}x the better raw baseline's) at "
        + "; ".join(missed)
        + "."
        if missed
        else f"Target met: the connector's mean is within {TARGET_RATIO}x of the better raw "
        "baseline's at every payload."
    )
    write_section(
        "connector",
        "Round trip per layer, µs, as mean (median): one layer's activations from the Attention "
        "process to the FFN process and the same bytes back, the FFN side answering at once; "
        f"steps of {LAYERS} round trips; about {ITERATIONS} timed round trips after a warm-up; "
        f"the three runs alternating, best of {REPEATS} for each statistic; each process pinned "
        "to its own core. The target bounds the mean.\n\n"
        "- raw gloo: gloo send/recv, each side posting its receive before it sends.\n"
        "- raw TCP: one socket pair (`TCP_NODELAY`); the Attention side sends, then reads the "
        "answer; the FFN side reads, then sends the bytes back.\n"
        "- connector: `GlooAttentionConnector` / `GlooFFNConnector`; a step's first layer goes "
        "with the step header over the TCP step channel, later layers by gloo, answers by gloo. "
        "Last column: its median round trip by position in the step (first layer / later "
        "layers).\n\n"
        "| payload | raw gloo, receives pre-posted | raw TCP | AFD gloo connector "
        "| connector / better raw, mean | target | connector / better raw, median "
        "| connector median by layer |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n\n" + verdict,
        command="python benchmarks/serving.py --only connector",
    )
    return not missed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("throughput", "connector"))
    args = parser.parse_args()
    if args.only != "connector":
        serving()
    if args.only != "throughput" and not connector():
        print(
            f"connector: target <= {TARGET_RATIO}x missed (see docs/benchmarks.md)", file=sys.stderr
        )


if __name__ == "__main__":
    main()
