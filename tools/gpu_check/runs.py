"""The GPU check's runs: native vLLM, the AFD Attention worker with the loopback connector, and
the two-process NCCL pair, each engine in a fresh interpreter (:mod:`tools.gpu_check.child`)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.gpu_check.modes import (
    ATTENTION_WORKER,
    COMMON_ENGINE_ARGS,
    FFN_WORKER,
    LOOPBACK,
    NCCL,
    NCCL_CONNECT_TIMEOUT_S,
    NCCL_TIMEOUT_S,
    Gate,
    Mode,
)
from tools.gpu_check.report import HostInfo
from tools.gpu_check.verdict import PairResult, evaluate_pair
from tools.harness.processes import Children, EngineProcess, kill, run_engine
from tools.harness.results import EngineResult, EngineSpec

#: the GPU check's engine processes
CHILDREN = Children("tools.gpu_check.child", "gpu-check")


@dataclass(frozen=True)
class Setup:
    """Everything the runs share."""

    work_dir: Path
    model: Path
    #: environment of every engine before per-run changes (PYTHONPATH with the repo and bundle)
    env: Mapping[str, str]
    host: HostInfo
    engine_timeout_s: float = 300.0


def run_env(setup: Setup, mode: Mode, device_id: str) -> dict[str, str]:
    env = {**setup.env, "CUDA_VISIBLE_DEVICES": device_id}
    env["VLLM_CACHE_ROOT"] = str(setup.work_dir / "vllm-cache")
    env["VLLM_USE_V2_MODEL_RUNNER"] = mode.runner.env_value
    if mode.compiled:
        env.pop("TORCHDYNAMO_DISABLE", None)
    else:
        env["TORCHDYNAMO_DISABLE"] = "1"
    return env


def llm_args(
    mode: Mode, worker_cls: str | None = None, afd: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    args = {**COMMON_ENGINE_ARGS, **mode.llm_args()}
    if worker_cls is not None:
        args["worker_cls"] = worker_cls
    if afd is not None:
        args["additional_config"] = {"afd": dict(afd)}
    return args


def run_native(mode: Mode, setup: Setup) -> EngineResult:
    """Native vLLM in ``mode`` on the first visible device."""
    spec = EngineSpec(f"native-{mode.name}", str(setup.model), llm_args(mode))
    env = run_env(setup, mode, setup.host.device_ids[0])
    return run_engine(spec, env, setup.work_dir / "engines", setup.engine_timeout_s, CHILDREN)


def run_pair(
    mode: Mode, gate: Gate, setup: Setup, native: EngineResult | None = None
) -> PairResult:
    """The AFD Attention worker with the loopback connector against native vLLM, in ``mode``.

    ``native`` is a native result of the same mode to reuse (it does not depend on the gate).
    """
    if mode.no_loopback is not None:
        raise ValueError(f"mode {mode.name} runs in the NCCL pair only: {mode.no_loopback}")
    if native is None:
        native = run_native(mode, setup)
    afd = {
        "role": "attention",
        "connector": LOOPBACK,
        "compute_gate_on_attention": gate is Gate.ATTENTION,
    }
    spec = EngineSpec(
        f"afd-{mode.name}-gate-on-{gate.value}",
        str(setup.model),
        llm_args(mode, ATTENTION_WORKER, afd),
        afd_attention=True,
    )
    env = run_env(setup, mode, setup.host.device_ids[0])
    result = run_engine(spec, env, setup.work_dir / "engines", setup.engine_timeout_s, CHILDREN)
    return evaluate_pair(mode, gate, LOOPBACK, result, native)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_nccl_pair(mode: Mode, gate: Gate, setup: Setup, native: EngineResult) -> PairResult:
    """An FFN engine on the second device and an Attention engine on the first, over NCCL."""
    if len(setup.host.device_ids) < 2:
        raise ValueError("the NCCL pair needs two CUDA devices")
    section = {
        "connector": NCCL,
        "port": free_port(),
        "compute_gate_on_attention": gate is Gate.ATTENTION,
        "connector_extra_config": {
            "connect_timeout_s": NCCL_CONNECT_TIMEOUT_S,
            "timeout_s": NCCL_TIMEOUT_S,
        },
    }
    tag = f"nccl-{mode.name}-gate-on-{gate.value}"
    directory = setup.work_dir / "engines"
    hold = directory / f"{tag}.exit"
    hold.unlink(missing_ok=True)
    ffn_args = llm_args(mode, FFN_WORKER, {**section, "role": "ffn"})
    ffn_args["enable_prefix_caching"] = False
    ffn_spec = EngineSpec(f"{tag}-ffn", str(setup.model), ffn_args, ffn_role=True)
    ffn = EngineProcess(ffn_spec, directory, CHILDREN)
    attention = EngineProcess(
        EngineSpec(
            f"{tag}-attention",
            str(setup.model),
            llm_args(mode, ATTENTION_WORKER, {**section, **mode.afd, "role": "attention"}),
            afd_attention=True,
            hold_path=str(hold),
        ),
        directory,
        CHILDREN,
    )
    ffn_group = ffn.start(run_env(setup, mode, setup.host.device_ids[1]), stdin=subprocess.PIPE)
    attention_group = None
    try:
        attention_group = attention.start(run_env(setup, mode, setup.host.device_ids[0]))
        ffn_process, attention_process = ffn_group.process, attention_group.process
        assert ffn_process is not None and attention_process is not None
        deadline = time.monotonic() + setup.engine_timeout_s
        # until the Attention engine has its result, or one side died, or the deadline passed
        while not attention.has_result() and time.monotonic() < deadline:
            if attention_process.poll() is not None or ffn_process.poll() is not None:
                break
            time.sleep(0.5)
        attention_timed_out = not attention.has_result() and time.monotonic() >= deadline
        ffn_timed_out = False
        if not attention.has_result():
            # it died or timed out, or its FFN peer is gone; an FFN engine still waiting for it to
            # connect would not read stdin
            kill(attention_group)
            ffn_timed_out = ffn_process.poll() is None and attention_timed_out
            kill(ffn_group)
        else:
            # the FFN engine reads its steps and exits before the Attention engine does, which it
            # would otherwise notice as a vanished peer
            try:
                if ffn_process.stdin is not None:
                    ffn_process.stdin.write(b"stop\n")
                    ffn_process.stdin.close()
            except OSError:
                pass
            try:
                ffn_process.wait(120)
            except subprocess.TimeoutExpired:
                ffn_timed_out = True
            kill(ffn_group)
        hold.touch()
        try:
            attention_process.wait(60)
        except subprocess.TimeoutExpired:
            pass
    finally:  # also when the check itself is stopped: no engine keeps a device
        kill(ffn_group)
        if attention_group is not None:
            kill(attention_group)
    ffn_result = ffn.result(ffn_timed_out and not ffn.has_result())
    attention_result = attention.result(attention_timed_out)
    return evaluate_pair(mode, gate, NCCL, attention_result, native, ffn=ffn_result)
