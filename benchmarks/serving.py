"""AFD serving on the CPU platform: throughput against a plain vLLM server, connector against raw gloo.

    python benchmarks/serving.py

Throughput: tokens/s of 1 and 8 concurrent requests (64 tokens each) to the AFD pair and to a
plain ``vllm serve`` of the same tiny model, measured alternately in one run, first with vLLM's
default compilation, then with ``--enforce-eager`` (all servers restarted). Connector: the mean
per-layer round trip of the gloo connector against a raw gloo send/recv of the same bytes between
two processes, FFN side answering at once (target: within 1.3x of raw).
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _results import write_section

from afd_models.testing import serve
from afd_models.testing.gloo_bench import measure
from afd_models.testing.tiny_models import write_tiny_model

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


def main() -> None:
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
    gloo = []
    for tokens in (1, 32):
        result = measure(tokens, 256, iterations=600)
        gloo.append(
            f"| {tokens} x 256 bf16 ({result.nbytes / 1024:.1f} KiB) | {result.raw_s * 1e6:.0f} | {result.connector_s * 1e6:.0f} | {result.ratio:.2f} | <= 1.3 |"
        )
    write_section(
        "serving",
        "Throughput (tokens/s, 64 tokens per request, best of 2), compiled (vLLM's default) and "
        "`--enforce-eager`:\n\n"
        "| concurrent requests | AFD pair, compiled | plain, compiled | AFD / plain | "
        "AFD pair, eager | plain, eager | AFD / plain | AFD compiled / eager | plain compiled / eager |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n\n"
        "Connector round trip per layer vs raw gloo (µs; mean after warm-up, best of 5 alternating "
        "repeats; steps of 3 layers, headers included; each side pinned to a core; the FFN side "
        "answers at once):\n\n"
        "| payload | raw gloo send+recv | AFD gloo connector | ratio | target |\n| --- | --- | --- | --- | --- |\n"
        + "\n".join(gloo),
    )


if __name__ == "__main__":
    main()
