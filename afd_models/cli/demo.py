"""``nox -s demo``: AFD serving a tiny DeepSeek model on this CPU, beside plain vLLM on the same cores.

    python -m afd_models.cli.demo [--work DIR] [--concurrency N] [--keep-logs]

1. builds a tiny DeepSeek-V2 checkpoint (random weights from a fixed seed, local tokenizer);
2. starts, on 127.0.0.1 in vLLM's default compiled mode, the AFD pair (Attention engine on the
   first core, FFN engine on the second) and plain vLLM on the same two cores, both ways a plain
   deployment could use them: one engine on both cores, one engine on the first core;
3. checks greedy completions of the pair and of plain vLLM are equal token for token;
4. measures each deployment with vLLM's own client (``vllm bench serve``) at one concurrency and
   sets the pair beside the faster plain configuration (:mod:`afd_models.cli.bench_serve`);
5. measures the per-layer connector round trip against raw gloo (receives pre-posted) and raw TCP
   moving the same bytes (:mod:`afd_models.cli.gloo_bench`);
6. prints a table saying which cores each side had, and stops every process it started.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from afd_models.cli import bench_serve, serve
from afd_models.cli.gloo_bench import measure
from afd_models.cli.tiny_models import tiny_config, write_tiny_model
from afd_models.commandline import CommandParser, ExitCode

PROMPTS = [
    "Hello world, the license",
    "The quick brown fox",
    "Numbers like 0 1 2",
    "Attention and experts",
]


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="python -m afd_models.cli.demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--work", type=Path, default=Path(".afd-work/demo"), help="model and logs go here"
    )
    parser.add_argument(
        "--concurrency", type=int, default=8, help="requests in flight while measuring"
    )
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    if args.concurrency < 1:
        parser.error(f"--concurrency={args.concurrency}: must be at least 1")
    try:
        return run(args.work, args.concurrency, args.keep_logs)
    except (bench_serve.BenchError, serve.ServerError) as exc:
        say(f"failed, nothing measured: {exc}")
        return ExitCode.ERROR


def run(work: Path, concurrency: int, keep_logs: bool) -> int:
    """The demo's steps (the module's docstring); raises when a server or a client run fails."""
    if work.exists():
        shutil.rmtree(work)
    say(
        "building the tiny DeepSeek-V2 model (3 layers: 1 dense + 2 MoE, 8 experts top-2, 1 shared)"
    )
    model = write_tiny_model(work / "model", "v2", seed=0, dtype="float32", margin_scale=50.0)
    logs = work / "logs"
    afd = {"port": serve.free_port(), "connector_extra_config": {"timeout_s": 30}}
    config = tiny_config("v2")
    group = bench_serve.start_equal_hardware(
        model,
        logs,
        afd,
        afd_env={"VLLM_SERVER_DEV_MODE": "1"},
        extra=("--max-num-seqs", str(max(16, concurrency))),
    )
    say(
        f"started the AFD pair and plain vLLM on the same cores ({group.cores()}); logs in "
        f"{logs}. vLLM compiles each model first: 3-6 minutes on 2 cores"
    )
    attention, plain = group.afd.server, group.plain[-1].server
    try:
        serve.wait_ready(group.servers, timeout_s=1200, progress=True)
        compiled = all(serve.ran_compiled(d.server) for d in (group.afd, *group.plain))
        say("comparing greedy completions with plain vLLM, one request at a time")
        equal = all(
            serve.complete(attention, p, 32) == serve.complete(plain, p, 32) for p in PROMPTS
        )
        say(f"measuring with `vllm bench serve`, {concurrency} requests in flight")
        before = serve.connector_stats(attention)
        [result] = bench_serve.measure_all(group, model, (concurrency,), say)
        exchanges = serve.exchanges_between(before, serve.connector_stats(attention))
        round_trip, mean_bytes = exchanges.mean_round_trip_s, exchanges.mean_bytes_sent
    finally:
        codes = [serve.stop(s) for s in group.servers]
    tokens = max(1, round(mean_bytes / (config["hidden_size"] * 2)))
    say(
        "measuring the connector against raw shared memory, raw gloo and raw TCP on the same bytes "
        f"({tokens} tokens x {config['hidden_size']} bf16) between two processes"
    )
    raw = measure(tokens, config["hidden_size"], iterations=200, repeats=2)
    rows = [
        ("every model compiled (vLLM default)", "yes" if compiled else "NO"),
        (f"greedy tokens equal ({len(PROMPTS)} prompts x 32 tokens)", "yes" if equal else "NO"),
        *(
            (
                run.deployment if run.plain else f"{run.deployment}, {run.cores} cores",
                f"{run.output_tokens_per_s:.0f} tok/s ({run.per_core:.0f} per core), TPOT "
                f"median {run.tpot_median_ms:.1f} ms",
            )
            for run in (result.afd, *result.plain)
        ),
        (
            f"AFD pair / {result.baseline.deployment} (the faster plain on these cores)",
            f"{result.throughput_ratio:.2f}x tok/s, {result.tpot_ratio:.2f}x TPOT",
        ),
        ("connector round trip per remote layer (incl. FFN compute)", f"{round_trip * 1e3:.3f} ms"),
        (
            f"{mean_bytes / 1024:.1f} KiB there and back, raw shared memory",
            f"{raw.raw_shm.mean_s * 1e3:.3f} ms",
        ),
        ("the same, raw gloo (receives pre-posted)", f"{raw.raw_gloo.mean_s * 1e3:.3f} ms"),
        ("the same, raw TCP", f"{raw.raw_tcp.mean_s * 1e3:.3f} ms"),
        (
            "the same through the connector (shared memory), no FFN compute",
            f"{raw.connector_s * 1e3:.3f} ms ({raw.ratio:.1f}x {raw.best_raw})",
        ),
        ("the same through the connector over gloo", f"{raw.connector_gloo.mean_s * 1e3:.3f} ms"),
        (
            "processes stopped cleanly",
            "yes"
            if all(c is not None for c in codes) and not any(map(serve.group_alive, group.servers))
            else "NO",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    print()
    print(
        "AFD demo: tiny DeepSeek-V2 (float32) on vLLM 0.26.0, CPU platform, `vllm bench serve` "
        f"with {concurrency} requests in flight ({bench_serve.INPUT_TOKENS} tokens in, "
        f"{bench_serve.OUTPUT_TOKENS} out)"
    )
    print(f"  cores: {group.cores()}; the client shares them")
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")
    print()
    if not keep_logs:
        shutil.rmtree(logs, ignore_errors=True)
    return ExitCode.CLEAN if equal and compiled else ExitCode.BLOCK


if __name__ == "__main__":
    sys.exit(main())
