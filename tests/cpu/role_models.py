"""Both roles' AFD models of a tiny checkpoint, built and loaded by vLLM's own loader in one
process (a child of a test: ``tests.engine.run_python``), for the model families whose pair
cannot run on the CPU platform (DeepSeek-V3.2's and V4's own classes), and what their workers
say of such an engine before it starts."""

from __future__ import annotations

from pathlib import Path

from torch import nn
from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.model_loader import get_model_loader
from vllm.plugins import load_general_plugins

from afd_models.config import AFDConfigError, Role
from afd_models.worker_config import prepare_worker_config


def engine_config(model: Path, role: str, gate_on_attention: bool = False) -> VllmConfig:
    """An engine's config for ``model`` as an AFD ``role`` (eager, bfloat16, the checkpoint's
    weights)."""
    return VllmConfig(
        model_config=ModelConfig(model=str(model), dtype="bfloat16", enforce_eager=True),
        additional_config={"afd": {"role": role, "compute_gate_on_attention": gate_on_attention}},
    )


def start_single_rank(model: Path, port: str) -> None:
    """One rank of everything (world, TP, PP) over gloo, and the general plugins loaded, as
    vLLM's workers have them before they build a model."""
    with set_current_vllm_config(engine_config(model, "ffn")):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, "gloo")
        initialize_model_parallel(1, 1)
    load_general_plugins()


def load_role_model(
    model: Path, architecture: str, role: str, gate_on_attention: bool
) -> tuple[VllmConfig, nn.Module]:
    """The AFD class ``architecture`` of the workers, built for ``role`` by vLLM's loader, which
    loads the checkpoint into it (and AFD's loader checks it filled every parameter)."""
    config = engine_config(model, role, gate_on_attention)
    config = config.with_hf_config(config.model_config.hf_config, architectures=[architecture])
    with set_current_vllm_config(config):
        loaded = get_model_loader(config.load_config).load_model(
            vllm_config=config, model_config=config.model_config
        )
    return config, loaded


def worker_refusal(model: Path) -> str | None:
    """Why an AFD worker refuses an engine of ``model`` (the FFN role's config) before it starts;
    None if it accepts it."""
    try:
        prepare_worker_config(engine_config(model, "ffn"), Role.FFN)
    except AFDConfigError as error:
        return str(error)
    return None
