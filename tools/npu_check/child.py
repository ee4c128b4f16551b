"""The NPU check's processes (``python -m tools.npu_check.child COMMAND PATH``), never the parent:
the probe, the tiny model, and one engine per run. Only here are torch_npu, vLLM, vLLM-Ascend and
afd_models imported."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tools.harness.child import (
    InternalCommand,
    read_spec,
    run_internal_command,
    shutdown,
    worker_classes,
    write_result,
)
from tools.npu_check.settings import (
    ATTENTION_WORKER,
    ENGINE_ARGS,
    MODEL_OVERRIDES,
    MODEL_VARIANT,
    NPU_PLATFORM,
)


def probe_main(out: Path) -> int:
    """Versions, NPUs, vLLM's platform and whether afd_models imports; JSON to ``out``."""
    import torch
    import torch_npu

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_npu": torch_npu.__version__,
        "devices": [torch.npu.get_device_name(i) for i in range(torch.npu.device_count())],
        "vllm": importlib.metadata.version("vllm"),
        "vllm_ascend": importlib.metadata.version("vllm_ascend"),
    }
    try:
        # first: with AFD's platform selected, vLLM imports the generated platform while it picks
        # the platform, and stale generated code should be reported as such
        from afd_models.freshness import check_generated_code

        check_generated_code()
    except ImportError as exc:
        info["afd_models_error"] = f"{type(exc).__name__}: {exc}"
        write_result(out, info)
        return 0
    from vllm.platforms import current_platform
    from vllm_ascend.platform import NPUPlatform

    cls = type(current_platform)
    info["platform"] = f"{cls.__module__}.{cls.__qualname__}"
    info["afd_platform"] = issubclass(cls, NPUPlatform) and cls is not NPUPlatform
    try:
        import afd_models.workers

        getattr(afd_models.workers, ATTENTION_WORKER.name)
    except ImportError as exc:
        info["afd_models_error"] = f"{type(exc).__name__}: {exc}"
    except AttributeError as exc:
        info["worker_error"] = f"{type(exc).__name__}: {exc}"
    write_result(out, info)
    return 0


def model_main(out: Path) -> int:
    from afd_models.cli.tiny_models import write_tiny_model

    write_tiny_model(
        out,
        MODEL_VARIANT,
        seed=0,
        dtype=ENGINE_ARGS["dtype"],
        overrides=MODEL_OVERRIDES,
        margin_scale=50.0,
    )
    return 0


def engine_main(spec_path: Path) -> int:
    """Build the spec's LLM on the platform its run needs, generate, write the result file."""
    began = time.monotonic()
    spec, result_path = read_spec(spec_path)
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform
    from vllm_ascend.platform import NPUPlatform

    cls = type(current_platform)
    afd = spec.afd_attention
    if (cls is NPUPlatform) == afd or not issubclass(cls, NPUPlatform):
        wanted = f"AFD's subclass of {NPU_PLATFORM}" if afd else NPU_PLATFORM
        raise RuntimeError(
            f"vLLM's platform is {cls.__module__}.{cls.__qualname__}, this run needs {wanted} "
            f"(VLLM_PLUGINS={os.environ.get('VLLM_PLUGINS')!r})"
        )
    llm = LLM(model=spec.model, **spec.llm_args)
    result: dict[str, Any] = {
        "startup_s": time.monotonic() - began,
        "classes": llm.collective_rpc(worker_classes)[0],
    }
    params = SamplingParams(temperature=0.0, max_tokens=spec.max_tokens, ignore_eos=True)
    outputs = llm.generate(list(spec.prompts), params, use_tqdm=False)
    result["tokens"] = [list(output.outputs[0].token_ids) for output in outputs]
    if afd:
        try:
            result["connector_stats"] = llm.collective_rpc("afd_connector_stats")[0]
        except Exception as exc:  # reported as a failed check, with the tokens still compared
            print(f"AFD npu_check: afd_connector_stats unreadable: {exc!r}", flush=True)
    write_result(result_path, result)
    shutdown(llm)
    return 0


INTERNAL_COMMANDS: Mapping[str, InternalCommand] = {
    "_probe": probe_main,
    "_model": model_main,
    "_engine": engine_main,
}

if __name__ == "__main__":
    run_internal_command(INTERNAL_COMMANDS, sys.argv[1:])
