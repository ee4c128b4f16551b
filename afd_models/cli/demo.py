"""``nox -s demo``: AFD serving a tiny DeepSeek model on this CPU, next to a plain vLLM baseline.

    python -m afd_models.cli.demo [--work DIR] [--tokens N] [--keep-logs]

1. builds a tiny DeepSeek-V2 checkpoint (random weights from a fixed seed, local tokenizer);
2. starts the FFN role, the Attention role and a plain ``vllm serve`` baseline on 127.0.0.1, in
   vLLM's default compiled mode (the docs' launch commands, plus test-friendly limits);
3. checks greedy completions are equal token for token, measures tokens/s of AFD and baseline
   with 8 concurrent requests, and the per-layer connector round trip against raw gloo (receives
   pre-posted) and raw TCP moving the same bytes (:mod:`afd_models.cli.gloo_bench`);
4. prints a table and stops every process it started.
"""

from __future__ import annotations

import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from afd_models.cli import serve
from afd_models.cli.gloo_bench import measure
from afd_models.cli.tiny_models import tiny_config, write_tiny_model
from codegen.findings import CommandParser, ExitCode

PROMPTS = [
    "Hello world, the license",
    "The quick brown fox",
    "Numbers like 0 1 2",
    "Attention and experts",
    "A tiny model keeps the tests fast",
    "Every wait has a timeout",
    "The FFN ranks own the experts",
    "Greedy decoding is a stable signal",
]


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def throughput(server: serve.Server, max_tokens: int) -> float:
    """Generated tokens per second for all PROMPTS sent at once."""
    started = time.monotonic()
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        outputs = list(
            pool.map(lambda p: serve.complete(server, p, max_tokens, timeout_s=300), PROMPTS)
        )
    return sum(len(o) for o in outputs) / (time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="python -m afd_models.cli.demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--work", type=Path, default=Path(".afd-work/demo"), help="model and logs go here"
    )
    parser.add_argument("--tokens", type=int, default=48, help="tokens per request")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    if args.work.exists():
        shutil.rmtree(args.work)
    say(
        "building the tiny DeepSeek-V2 model (3 layers: 1 dense + 2 MoE, 8 experts top-2, 1 shared)"
    )
    model = write_tiny_model(args.work / "model", "v2", seed=0, dtype="float32", margin_scale=50.0)
    logs = args.work / "logs"
    afd = {"port": serve.free_port(), "connector_extra_config": {"timeout_s": 30}}
    config = tiny_config("v2")
    say(
        f"starting the FFN role, the Attention role and the baseline (logs in {logs}); vLLM compiles "
        "the Attention model and the baseline first: 2-4 minutes on 2 cores"
    )
    ffn = serve.start_ffn("ffn", model, serve.free_port(), logs, afd, cpu=serve.cpu(1))
    attention = serve.start_attention(
        "attention",
        model,
        serve.free_port(),
        logs,
        afd,
        cpu=serve.cpu(0),
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    baseline = serve.start("baseline", model, serve.free_port(), logs, cpu=serve.cpu(0))
    servers = [attention, ffn, baseline]
    try:
        serve.wait_ready(servers, timeout_s=900, progress=True)
        compiled = serve.ran_compiled(attention) and serve.ran_compiled(baseline)
        say("comparing greedy completions, one request at a time")
        equal = all(
            serve.complete(attention, p, 32) == serve.complete(baseline, p, 32) for p in PROMPTS[:4]
        )
        say(f"measuring throughput with {len(PROMPTS)} concurrent requests x {args.tokens} tokens")
        throughput(attention, 8)  # warm both paths
        throughput(baseline, 8)
        before = serve.connector_stats(attention)
        afd_rate = throughput(attention, args.tokens)
        after = serve.connector_stats(attention)
        base_rate = throughput(baseline, args.tokens)
        exchanges = after["exchanges"] - before["exchanges"]
        round_trip = (
            after["mean_round_trip_s"] * after["exchanges"]
            - before["mean_round_trip_s"] * before["exchanges"]
        ) / exchanges
        mean_bytes = (after["bytes_sent"] - before["bytes_sent"]) / exchanges
    finally:
        codes = [serve.stop(s) for s in servers]
    tokens = max(1, round(mean_bytes / (config["hidden_size"] * 2)))
    say(
        f"measuring the connector against raw gloo and raw TCP on the same bytes ({tokens} tokens x {config['hidden_size']} bf16) between two processes"
    )
    raw = measure(tokens, config["hidden_size"], iterations=200, repeats=3)
    rows = [
        ("Attention model and baseline compiled (vLLM default)", "yes" if compiled else "NO"),
        ("greedy tokens equal (4 prompts x 32 tokens)", "yes" if equal else "NO"),
        ("throughput, AFD pair", f"{afd_rate:.0f} tok/s"),
        ("throughput, plain vLLM", f"{base_rate:.0f} tok/s"),
        ("AFD / plain", f"{afd_rate / base_rate:.2f}"),
        ("connector round trip per layer (incl. FFN compute)", f"{round_trip * 1e3:.3f} ms"),
        (
            f"{mean_bytes / 1024:.1f} KiB there and back, raw gloo (receives pre-posted)",
            f"{raw.raw_gloo_s * 1e3:.3f} ms",
        ),
        ("the same, raw TCP", f"{raw.raw_tcp_s * 1e3:.3f} ms"),
        ("the same through the connector, no FFN compute", f"{raw.connector_s * 1e3:.3f} ms"),
        (
            "processes stopped cleanly",
            "yes"
            if all(c is not None for c in codes) and not any(map(serve.group_alive, servers))
            else "NO",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    print()
    print(
        f"AFD demo: tiny DeepSeek-V2 (float32) on vLLM 0.26.0, CPU platform, {len(PROMPTS)} concurrent requests"
    )
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")
    print()
    if not args.keep_logs:
        shutil.rmtree(logs, ignore_errors=True)
    return ExitCode.CLEAN if equal and compiled else ExitCode.BLOCK


if __name__ == "__main__":
    sys.exit(main())
