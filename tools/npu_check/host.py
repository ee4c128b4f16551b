"""The Ascend host as the NPU check sees it: the ``VLLM_PLUGINS`` rule, the probe of the operator's
interpreter (versions, NPUs, vLLM's platform) and the tiny model."""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.harness.cli import UsageError
from tools.harness.processes import Children, run_internal, tail, visible_device_ids
from tools.npu_check.settings import (
    AFD_PLUGINS,
    ASCEND_GENERAL_PLUGINS,
    ASCEND_PLATFORM_PLUGIN,
    ATTENTION_WORKER,
    GENERAL_PLUGIN,
    MODEL_TIMEOUT_S,
    NPU_PLATFORM,
    PLATFORM_PLUGIN,
    PROBE_TIMEOUT_S,
    VLLM_ASCEND_VERSION,
    VLLM_VERSION,
)

#: the NPU check's processes
CHILDREN = Children("tools.npu_check.child", "npu-check")


def plugins_problem(value: str | None) -> str | None:
    """What is wrong with ``VLLM_PLUGINS`` for AFD's platform (None: nothing)."""
    if value is None:
        return "VLLM_PLUGINS is not set, so vLLM-Ascend's own platform plugin is selected"
    names = value.split(",")  # as vLLM splits it: no spaces
    missing = [
        name
        for name in (PLATFORM_PLUGIN, GENERAL_PLUGIN, *ASCEND_GENERAL_PLUGINS)
        if name not in names
    ]
    if ASCEND_PLATFORM_PLUGIN in names:
        return (
            f"VLLM_PLUGINS={value!r} names {ASCEND_PLATFORM_PLUGIN!r}, vLLM-Ascend's platform "
            "plugin; vLLM activates one platform plugin only"
        )
    if missing:
        return f"VLLM_PLUGINS={value!r} lacks {', '.join(missing)}"
    return None


def installed_platform_plugins() -> set[str]:
    """Names of the installed ``vllm.platform_plugins`` entry points (without loading them)."""
    return {entry.name for entry in importlib.metadata.entry_points(group="vllm.platform_plugins")}


@dataclass(frozen=True)
class HostInfo:
    """What the probe process found (the operator's interpreter and ``VLLM_PLUGINS``)."""

    python: str
    torch: str
    torch_npu: str
    vllm: str
    vllm_ascend: str
    #: vLLM's platform class under ``VLLM_PLUGINS`` (AFD's)
    platform: str
    #: ``torch.npu.get_device_name(i)`` of each visible device
    devices: tuple[str, ...]
    #: the ``ASCEND_RT_VISIBLE_DEVICES`` entry of each visible device
    device_ids: tuple[str, ...]


def host_info(info: Mapping[str, Any], visible_devices: str | None) -> HostInfo:
    """The probe's findings, or UsageError saying why this host cannot run the check."""
    if not info["devices"]:
        raise UsageError(
            f"torch_npu {info['torch_npu']} sees no NPU (ASCEND_RT_VISIBLE_DEVICES="
            f"{visible_devices or 'unset'}): run this on an Ascend host with its driver loaded"
        )
    for name, found, wanted in (
        ("vLLM", info["vllm"], VLLM_VERSION),
        ("vLLM-Ascend", info["vllm_ascend"], VLLM_ASCEND_VERSION),
    ):
        if found.split("+")[0] != wanted:
            raise UsageError(f"{name} {found} found, this checks {name} {wanted}")
    if "afd_models_error" in info:
        raise UsageError(
            f"the generated code is not usable: {info['afd_models_error']} (afd_models/_generated is a "
            "build artifact: run `python -m codegen regenerate` in this environment)"
        )
    if "worker_error" in info:
        raise UsageError(f"{ATTENTION_WORKER.path} does not import: {info['worker_error']}")
    if not info["afd_platform"]:
        raise UsageError(
            f"vLLM selected the platform {info['platform']}, not AFD's subclass of {NPU_PLATFORM} "
            f"(is the {PLATFORM_PLUGIN!r} entry point of this checkout's install?); set exactly: "
            f"export VLLM_PLUGINS={AFD_PLUGINS}"
        )
    devices = tuple(info["devices"])
    ids = visible_device_ids(visible_devices, len(devices))
    return HostInfo(
        info["python"],
        info["torch"],
        info["torch_npu"],
        info["vllm"],
        info["vllm_ascend"],
        info["platform"],
        devices,
        ids,
    )


@dataclass(frozen=True)
class Setup:
    """Everything the checks share."""

    work_dir: Path
    model: Path
    #: the operator's environment with :data:`ENGINE_ENV` and the repository on PYTHONPATH
    env: Mapping[str, str]
    host: HostInfo
    engine_timeout_s: float = 600.0


def probe(env: Mapping[str, str], work_dir: Path) -> HostInfo:
    """What the engines' interpreter sees. Raises UsageError when it cannot run the check."""
    out, log_path = work_dir / "probe.json", work_dir / "probe.log"
    CHILDREN.log("probe: torch_npu, NPUs, vLLM, vLLM-Ascend, vLLM's platform, afd_models")
    code = run_internal(CHILDREN, "_probe", out, env, log_path, PROBE_TIMEOUT_S)
    if code != 0 or not out.exists():
        raise UsageError(
            f"the probe failed (`import torch_npu`? CANN's set_env.sh sourced?) or took over "
            f"{PROBE_TIMEOUT_S} s; end of {log_path}:\n{tail(log_path)}"
        )
    return host_info(json.loads(out.read_text()), env.get("ASCEND_RT_VISIBLE_DEVICES"))


def prepare(work_dir: Path, env: Mapping[str, str], engine_timeout_s: float) -> Setup:
    """Probe the host and write the tiny model. Raises UsageError when the host cannot run it."""
    work_dir = work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    host = probe(env, work_dir)
    CHILDREN.log(f"{len(host.devices)} NPU(s): {', '.join(host.devices)}; platform {host.platform}")
    model, log_path = work_dir / "tiny-one-moe-layer", work_dir / "model.log"
    if run_internal(CHILDREN, "_model", model, env, log_path, MODEL_TIMEOUT_S) != 0:
        raise RuntimeError(
            f"writing the tiny model failed or took over {MODEL_TIMEOUT_S} s; end of "
            f"{log_path}:\n{tail(log_path)}"
        )
    CHILDREN.log(f"tiny DeepSeek model (one MoE layer) in {model}")
    return Setup(work_dir, model, env, host, engine_timeout_s)
