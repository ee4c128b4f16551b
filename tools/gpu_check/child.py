"""The GPU check's engine processes (``python -m tools.gpu_check.child COMMAND PATH``), never the
parent: the probe, the tiny model, and one engine per run. Only here are torch, vLLM and
afd_models imported."""

from __future__ import annotations

import platform
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tools.gpu_check.modes import HOLD_S, LOOPBACK
from tools.harness.child import (
    InternalCommand,
    read_spec,
    run_internal_command,
    shutdown,
    worker_classes,
    write_result,
)


def weight_budget(worker: Any) -> tuple[int, int]:
    runner = worker.model_runner
    return int(runner.model_memory_usage), int(runner.afd_connector.in_process_weight_bytes())


def runner_cost(wrapper: Any) -> dict[str, float]:
    """Build vLLM's runner once more, as the AFD worker's ``init_device`` does before replacing it."""
    import torch

    worker = getattr(wrapper, "worker", wrapper)
    upstream = type(worker.model_runner).__mro__[1]  # the vLLM runner the AFD one derives from
    torch.cuda.synchronize(worker.device)
    before = torch.cuda.memory_allocated(worker.device)
    start = time.perf_counter()
    runner = upstream(worker.vllm_config, worker.device)
    torch.cuda.synchronize(worker.device)
    seconds = time.perf_counter() - start
    allocated = torch.cuda.memory_allocated(worker.device) - before
    del runner
    return {"seconds": seconds, "allocated_bytes": allocated}


def exchange_latency(before: Mapping[str, float], after: Mapping[str, float]) -> float | None:
    """Mean round trip of the exchanges between two ``afd_connector_stats`` readings."""
    count = after["exchanges"] - before["exchanges"]
    if count <= 0:
        return None
    total = after["mean_round_trip_s"] * after["exchanges"]
    total -= before["mean_round_trip_s"] * before["exchanges"]
    return total / count


def read_counters(llm: Any, result: dict[str, Any]) -> None:
    try:
        result["counters"] = llm.collective_rpc("afd_counters")[0]
    except Exception as exc:  # reported as a failed check, with the tokens still compared
        result["counters_error"] = f"{type(exc).__name__}: {exc}"


def engine_main(spec_path: Path) -> int:
    """Build the spec's LLM, generate (or serve as FFN), write the result file."""
    began = time.monotonic()
    spec, result_path = read_spec(spec_path)
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        raise RuntimeError(f"vLLM's platform is {type(current_platform).__name__}, not CUDA")
    if "worker_cls" in spec.llm_args:
        # the AFD architectures, in case this checkout is not installed (no entry point)
        from afd_models.plugin import register

        register()
    llm = LLM(model=spec.model, **spec.llm_args)
    result: dict[str, Any] = {
        "startup_s": time.monotonic() - began,
        "classes": llm.collective_rpc(worker_classes)[0],
    }
    if spec.ffn_role:
        print("AFD gpu_check: FFN engine ready", flush=True)
        sys.stdin.readline()
        result["ffn_steps"] = len(llm.collective_rpc("afd_ffn_steps")[0])
        read_counters(llm, result)
        write_result(result_path, result)
        shutdown(llm)
        return 0
    if spec.afd_attention and spec.llm_args["additional_config"]["afd"]["connector"] == LOOPBACK:
        try:
            result["budgeted_bytes"], result["in_process_bytes"] = llm.collective_rpc(
                weight_budget
            )[0]
        except Exception as exc:  # reported as a failed check
            print(f"AFD gpu_check: weight budget unreadable: {exc!r}", flush=True)
    params = SamplingParams(temperature=0.0, max_tokens=spec.max_tokens, ignore_eos=True)
    prompts = list(spec.prompts)
    first = llm.generate(prompts, params, use_tqdm=False)
    result["tokens"] = [list(output.outputs[0].token_ids) for output in first]
    # the stats before the timed runs (AFD Attention only)
    before: Mapping[str, float] = (
        llm.collective_rpc("afd_connector_stats")[0] if spec.afd_attention else {}
    )
    timed, outputs = [], first
    for _ in range(spec.repeats):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        timed.append(time.perf_counter() - start)
    result["timed_s"] = timed
    result["tokens_per_run"] = sum(len(output.outputs[0].token_ids) for output in outputs)
    if spec.afd_attention:
        after = llm.collective_rpc("afd_connector_stats")[0]
        result["connector_stats"] = after
        result["exchange_latency_s"] = exchange_latency(before, after)
        read_counters(llm, result)
        try:  # last: a measurement, never a check
            result["runner_cost"] = llm.collective_rpc(runner_cost)[0]
        except Exception as exc:
            result["runner_cost"] = {"error": f"{type(exc).__name__}: {exc}"}
    write_result(result_path, result)
    if spec.hold_path is not None:
        deadline = time.monotonic() + HOLD_S
        while not Path(spec.hold_path).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    shutdown(llm)
    return 0


def probe_main(out: Path) -> int:
    """Versions, devices, and whether vLLM and afd_models import; written as JSON to ``out``."""
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    info["cuda"] = torch.version.cuda
    available = torch.cuda.is_available()
    info["devices"] = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if available
        else []
    )
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except Exception as exc:
        info["vllm_error"] = f"{type(exc).__name__}: {exc}"
    try:
        from afd_models.freshness import check_generated_code

        check_generated_code()
    except Exception as exc:
        info["afd_models_error"] = f"{type(exc).__name__}: {exc}"
    write_result(out, info)
    return 0


def model_main(out: Path) -> int:
    """The float32 tiny DeepSeek-V2 with widened margins (as the compiled-mode e2e tests use),
    written beside ``out`` and renamed into place: ``out`` exists only whole."""
    from afd_models.cli.tiny_models import write_tiny_model

    partial = out.with_name(f"{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    write_tiny_model(partial, "v2", seed=0, dtype="float32", margin_scale=50.0)
    partial.rename(out)
    return 0


INTERNAL_COMMANDS: Mapping[str, InternalCommand] = {
    "_engine": engine_main,
    "_probe": probe_main,
    "_model": model_main,
}

if __name__ == "__main__":
    run_internal_command(INTERNAL_COMMANDS, sys.argv[1:])
