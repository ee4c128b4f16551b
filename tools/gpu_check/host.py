"""The GPU host as the check's engines see it: their environment (with a bundle's vLLM first, when
one is given), the probe of their interpreter, and the tiny model."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tools.gpu_bundle.install import install
from tools.gpu_bundle.manifest import BundleError
from tools.gpu_check.modes import ENGINE_ENV, MODEL_DIR, VLLM_VERSION
from tools.gpu_check.report import HostInfo
from tools.gpu_check.runs import CHILDREN, Setup
from tools.harness.cli import UsageError
from tools.harness.processes import REPO_ROOT, run_internal, tail, visible_device_ids


def default_target() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "vllm-afd-overlay" / f"gpu-bundle-py{sys.version_info[0]}.{sys.version_info[1]}"


def install_bundle(parts: Path, target: Path) -> None:
    """Install vLLM from the bundle's parts into ``target`` with ``gpu_bundle.install`` (standard
    library and the host's pip, offline; a rerun with the same bundle does nothing)."""
    try:
        install(parts, target=target)
    except BundleError as exc:
        raise UsageError(f"the bundle in {parts} cannot be installed: {exc}") from exc


def base_env(extra_paths: Sequence[Path] = ()) -> dict[str, str]:
    """The engines' environment: this one, :data:`ENGINE_ENV`, and the repository (and a bundle
    target) first on ``PYTHONPATH``."""
    env = {**os.environ, **ENGINE_ENV}
    # absolute: the engines run in their log directories, not where a relative --target was given
    extra_paths = [Path(p).resolve() for p in extra_paths]
    paths = [str(p) for p in (*extra_paths, REPO_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, os.environ.get("PYTHONPATH")]))
    for path in extra_paths:
        if (path / "bin").is_dir():
            env["PATH"] = os.pathsep.join([str(path / "bin"), env.get("PATH", "")])
    return env


def probe(env: Mapping[str, str], work_dir: Path) -> HostInfo:
    """What the engines' interpreter sees. Raises UsageError when it cannot run the check."""
    out = work_dir / "probe.json"
    log_path = work_dir / "probe.log"
    CHILDREN.log("probe: torch, CUDA devices, vLLM, afd_models")
    if run_internal(CHILDREN, "_probe", out, env, log_path, 300) != 0 or not out.exists():
        raise UsageError(
            f"the probe failed (`import torch`?); end of {log_path}:\n{tail(log_path)}"
        )
    info = json.loads(out.read_text())
    if not info["devices"]:
        raise UsageError(
            f"torch {info['torch']} sees no CUDA device (CUDA_VISIBLE_DEVICES="
            f"{env.get('CUDA_VISIBLE_DEVICES', 'unset')}): run this on a GPU host"
        )
    if "vllm_error" in info:
        raise UsageError(
            f"`import vllm` fails in the engines' environment: {info['vllm_error']}; without "
            "--bundle, pass --bundle DIR (parts from `python -m tools.gpu_bundle build`); with "
            "it, a module the bundle lacks is named above: one it dropped (manifest.json lists "
            "them) or one the host should have (torch's)"
        )
    from tools.cpu_env import supported_versions  # imports afd_models: not on --help's path

    supported = supported_versions()
    if info["vllm"].split("+")[0] not in supported:
        raise UsageError(
            f"vLLM {info['vllm']} found, which AFD does not support; supported "
            f"(overlay/pins.toml): {', '.join(supported)}; pass --bundle DIR (vLLM {VLLM_VERSION})"
        )
    if "afd_models_error" in info:
        raise UsageError(
            f"the generated code is not usable: {info['afd_models_error']} (afd_models/_generated is a "
            "build artifact: carry it with the working tree, or run `nox -s regenerate`)"
        )
    devices = tuple(info["devices"])
    ids = visible_device_ids(env.get("CUDA_VISIBLE_DEVICES"), len(devices))
    return HostInfo(info["python"], info["torch"], info["cuda"], info["vllm"], devices, ids)


def prepare(work_dir: Path, env: Mapping[str, str], engine_timeout_s: float = 300.0) -> Setup:
    """Probe the host and write the tiny model, unless ``work_dir`` has it from an earlier run
    (the model process writes it whole or not at all). Raises UsageError when the host cannot
    run the check."""
    work_dir = work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    host = probe(env, work_dir)
    CHILDREN.log(f"{len(host.devices)} CUDA device(s): {', '.join(host.devices)}; vLLM {host.vllm}")
    model = work_dir / MODEL_DIR
    log_path = work_dir / "model.log"
    if model.is_dir():
        CHILDREN.log(f"reusing the tiny DeepSeek-V2 model in {model}")
    elif run_internal(CHILDREN, "_model", model, env, log_path, 300) != 0:
        raise RuntimeError(f"writing the tiny model failed; end of {log_path}:\n{tail(log_path)}")
    else:
        CHILDREN.log(f"tiny DeepSeek-V2 model in {model}")
    return Setup(work_dir, model, env, host, engine_timeout_s)
