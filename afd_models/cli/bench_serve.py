"""Serving figures from vLLM's own client, and the equal-hardware comparison built on them.

:func:`bench_serve` runs ``vllm bench serve`` (random prompts, fixed lengths, ``--ignore-eos``)
against a running server and reads the JSON it saves. :func:`comparison` sets an AFD deployment
beside the best plain vLLM on the same cores: a comparison is only honest when both sides had the
same hardware, and plain vLLM's best use of that hardware may be one engine on fewer cores (on a
tiny model a second OpenMP thread can slow a step down), so every plain configuration tried on
those cores is measured and the faster one at each concurrency is the baseline. The demo and
``benchmarks/serving.py`` use this.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from afd_models.cli import serve

#: prompt and answer lengths of every run, in tokens
INPUT_TOKENS, OUTPUT_TOKENS = 64, 32


class BenchError(RuntimeError):
    """``vllm bench serve`` failed, timed out, or some of its requests failed: never a time."""


class UnstreamedRun(BenchError):
    """A run whose requests reached the client in one chunk each (TPOT median 0): its
    latencies measure nothing."""


#: runs :func:`measure_all` tries for one figure before an unstreamed run is an error
ATTEMPTS = 3


@dataclass(frozen=True)
class Deployment:
    """One side of a comparison: where requests go and the CPUs its engines were bound to."""

    #: how tables name it ("AFD pair", "plain vLLM, 1 engine on 2 cores")
    name: str
    server: serve.Server
    #: every CPU id any of its engines ran on (the client's process is not bound)
    cpus: tuple[str, ...]
    plain: bool

    @property
    def where(self) -> str:
        return "cores " + ",".join(self.cpus) if len(self.cpus) > 1 else f"core {self.cpus[0]}"


@dataclass(frozen=True)
class EqualHardware:
    """An AFD pair (Attention on the first core, FFN on the second) and the plain vLLM
    configurations on the same two cores: one engine on both, one engine on the first."""

    afd: Deployment
    plain: tuple[Deployment, ...]
    ffn: serve.Server
    #: the cores of the Attention engine and of the FFN engine
    attention_cpu: str
    ffn_cpu: str

    @property
    def servers(self) -> list[serve.Server]:
        return [self.afd.server, self.ffn, *(p.server for p in self.plain)]

    def cores(self) -> str:
        """Which cores each deployment had, in words."""
        return "; ".join(
            [
                f"{self.afd.name}: Attention engine on core {self.attention_cpu}, FFN engine on "
                f"core {self.ffn_cpu}",
                *(f"{p.name}: {p.where}" for p in self.plain),
            ]
        )


def start_equal_hardware(
    model: Path,
    logs: Path,
    afd: Mapping[str, Any],
    *,
    afd_env: Mapping[str, str] | None = None,
    **engine: Any,
) -> EqualHardware:
    """Start the AFD pair and the plain configurations on this process's first two allowed
    CPUs (on a one-CPU machine, the pair shares it and plain vLLM runs once); ``engine`` goes to
    every :func:`serve.start` alike (``dtype``, ``eager``, ``extra``), ``afd_env`` to both roles
    of the pair."""
    first, second = serve.cpu(0), serve.cpu(1)
    cores = tuple(dict.fromkeys((first, second)))
    configurations = (
        [(f"plain vLLM, 1 engine on {len(cores)} cores", cores)] if len(cores) > 1 else []
    )
    configurations.append(("plain vLLM, 1 engine on 1 core", (first,)))
    started: list[serve.Server] = []
    try:  # a start that fails stops those before it: the caller never gets them back
        ffn = serve.start_ffn(
            "ffn", model, serve.free_port(), logs, afd, cpu=second, env=afd_env, **engine
        )
        started.append(ffn)
        attention = serve.start_attention(
            "attention", model, serve.free_port(), logs, afd, cpu=first, env=afd_env, **engine
        )
        started.append(attention)
        plain = []
        for name, cpus in configurations:
            server = serve.start(
                f"plain-{len(cpus)}-core",
                model,
                serve.free_port(),
                logs,
                cpu=",".join(cpus),
                **engine,
            )
            started.append(server)
            plain.append(Deployment(name, server, cpus, plain=True))
    except BaseException:
        for server in started:
            serve.stop(server)
        raise
    return EqualHardware(
        Deployment("AFD pair", attention, cores, plain=False), tuple(plain), ffn, first, second
    )


@dataclass(frozen=True)
class Serving:
    """One ``vllm bench serve`` run against one deployment."""

    deployment: str
    plain: bool
    cores: int
    concurrency: int
    prompts: int
    output_tokens_per_s: float
    ttft_median_ms: float
    ttft_p99_ms: float
    tpot_median_ms: float
    tpot_p99_ms: float

    @property
    def per_core(self) -> float:
        """Output tokens/s per CPU core the deployment's engines had."""
        return self.output_tokens_per_s / self.cores


def bench_serve(
    deployment: Deployment,
    model: Path,
    concurrency: int,
    prompts: int,
    *,
    timeout_s: float = 900.0,
    client: Sequence[str] | None = None,
) -> Serving:
    """``prompts`` random requests of INPUT_TOKENS in and OUTPUT_TOKENS out, at most
    ``concurrency`` in flight, sent by ``vllm bench serve`` (tokenizer from ``model``); ``client``
    is the command that runs vLLM's CLI (default: this environment's ``vllm``).

    Raises:
        BenchError: the client exited non-zero, ran past ``timeout_s``, or not every request
            completed.
    """
    with tempfile.TemporaryDirectory(prefix="afd-bench-") as tmp:
        args = [
            *(client or serve.vllm_command()),
            "bench",
            "serve",
            "--backend",
            "vllm",
            "--base-url",
            deployment.server.url,
            "--model",
            serve.SERVED_MODEL_NAME,
            "--tokenizer",
            str(model),
            "--dataset-name",
            "random",
            "--random-input-len",
            str(INPUT_TOKENS),
            "--random-output-len",
            str(OUTPUT_TOKENS),
            "--ignore-eos",
            "--num-prompts",
            str(prompts),
            "--max-concurrency",
            str(concurrency),
            "--seed",
            "0",
            "--percentile-metrics",
            "ttft,tpot",
            "--metric-percentiles",
            "50,99",
            "--disable-tqdm",
            "--save-result",
            "--result-dir",
            tmp,
            "--result-filename",
            "result.json",
        ]
        what = f"`vllm bench serve` against {deployment.name} at concurrency {concurrency}"
        try:
            done = subprocess.run(
                args,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env={**os.environ, **serve.SERVER_ENV},
            )
        except subprocess.TimeoutExpired:
            raise BenchError(f"{what} did not finish within {timeout_s:.0f} s") from None
        if done.returncode != 0:
            raise BenchError(
                f"{what} exited with {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
            )
        result = json.loads((Path(tmp) / "result.json").read_text())
    if result["completed"] != prompts or result.get("failed", 0):
        raise BenchError(
            f"{what}: {result['completed']} of {prompts} requests completed, "
            f"{result.get('failed', 0)} failed"
        )
    if float(result["median_tpot_ms"]) <= 0:
        raise UnstreamedRun(
            f"{what}: TPOT median {float(result['median_tpot_ms']):.2f} ms: most requests' "
            "tokens reached the client in one chunk (a server or client starved of CPU?), so "
            "the run's latencies measure nothing"
        )
    return Serving(
        deployment.name,
        deployment.plain,
        len(deployment.cpus),
        concurrency,
        prompts,
        float(result["output_throughput"]),
        float(result["median_ttft_ms"]),
        float(result["p99_ttft_ms"]),
        float(result["median_tpot_ms"]),
        float(result["p99_tpot_ms"]),
    )


@dataclass(frozen=True)
class Comparison:
    """At one concurrency: the AFD deployment, and the best plain vLLM on the same cores."""

    afd: Serving
    baseline: Serving
    #: every plain configuration measured, the baseline among them
    plain: tuple[Serving, ...]

    @property
    def throughput_ratio(self) -> float:
        return self.afd.output_tokens_per_s / self.baseline.output_tokens_per_s

    @property
    def tpot_ratio(self) -> float:
        return self.afd.tpot_median_ms / self.baseline.tpot_median_ms


def check_equal_hardware(afd: Deployment, plain: Sequence[Deployment]) -> None:
    """Refuse a comparison where a plain configuration had a core the AFD deployment did not."""
    for deployment in plain:
        extra = sorted(set(deployment.cpus) - set(afd.cpus))
        if extra:
            raise ValueError(
                f"{deployment.name} ran on cores {','.join(deployment.cpus)}, {afd.name} on "
                f"{','.join(afd.cpus)}: a baseline may use only the AFD deployment's cores "
                f"(extra: {','.join(extra)})"
            )


def comparison(afd: Serving, plain: Sequence[Serving]) -> Comparison:
    """``afd`` against the plain configuration with the highest output tokens/s at its
    concurrency."""
    same = tuple(p for p in plain if p.concurrency == afd.concurrency)
    if not same:
        raise ValueError(f"no plain vLLM run at concurrency {afd.concurrency} to compare with")
    return Comparison(afd, max(same, key=lambda p: p.output_tokens_per_s), same)


class AFDProbe(Protocol):
    """Looks inside the AFD deployment around each of its measured runs."""

    def start(self) -> None: ...

    def finish(self, run: Serving) -> None: ...


def _streamed_run(
    deployment: Deployment,
    model: Path,
    concurrency: int,
    prompts: int,
    say: Callable[[str], None],
) -> Serving:
    """:func:`bench_serve`, run again (saying so) when a run was unstreamed, up to ATTEMPTS."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return bench_serve(deployment, model, concurrency, prompts)
        except UnstreamedRun as exc:
            if attempt == ATTEMPTS:
                raise
            say(f"discarded, run again: {exc}")
    raise AssertionError("unreachable")


def measure_all(
    group: EqualHardware,
    model: Path,
    concurrencies: Sequence[int],
    say: Callable[[str], None],
    *,
    repeats: int = 1,
    prompts_per_slot: int = 4,
    probe: AFDProbe | None = None,
) -> list[Comparison]:
    """Every deployment of ``group`` at every concurrency: a short warm-up run of each, then
    ``repeats`` rounds taking the deployments in turn, each run with ``prompts_per_slot *
    concurrency`` requests (at least 16); each deployment keeps its best round (highest output
    tokens/s). One :class:`Comparison` per concurrency."""
    check_equal_hardware(group.afd, group.plain)
    deployments = [group.afd, *group.plain]
    results = []
    for concurrency in concurrencies:
        prompts = max(16, prompts_per_slot * concurrency)
        for deployment in deployments:
            bench_serve(deployment, model, concurrency, min(prompts, 2 * concurrency))
        best: dict[str, Serving] = {}
        for _ in range(repeats):
            for deployment in deployments:
                if probe is not None and deployment is group.afd:
                    probe.start()
                run = _streamed_run(deployment, model, concurrency, prompts, say)
                if probe is not None and deployment is group.afd:
                    probe.finish(run)
                say(
                    f"{deployment.name} ({deployment.where}), concurrency {concurrency}: "
                    f"{run.output_tokens_per_s:.0f} output tok/s, TPOT median "
                    f"{run.tpot_median_ms:.1f} ms"
                )
                kept = best.get(deployment.name)
                if kept is None or run.output_tokens_per_s > kept.output_tokens_per_s:
                    best[deployment.name] = run
        runs = [best[d.name] for d in deployments]
        results.append(comparison(runs[0], runs[1:]))
    return results
