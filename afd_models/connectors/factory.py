"""Create the connector an AFD worker needs, from its config, its place in the topology and its
loaded model (whose :class:`~afd_models.connectors.base.Fingerprint` the connector presents)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import threading
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn
from vllm import envs
from vllm.config import VllmConfig

from afd_models.config import AFDConfig, AFDConfigError, Role, require_afd_config
from afd_models.connectors.base import AFDConnector, FFNConnector, Fingerprint
from afd_models.connectors.cam_ops import load_cam_p2p_ops
from afd_models.log import exit_process
from afd_models.topology import (
    TopologyError,
    check_attention_engine,
    check_ports,
    group_of_attention,
    group_of_ffn,
    role_rank,
)

#: the distribution whose version the fingerprint carries
DISTRIBUTION = "vllm-afd-overlay"
#: keys of the model's config that say where or with what it was read, not what the model is
_UNIDENTIFYING_KEYS = ("_name_or_path", "transformers_version")

#: the Attention worker's connect step, called with the loaded model
AttentionConnect = Callable[[nn.Module], AFDConnector]


class FFNConnect(Protocol):
    """The FFN worker's connect step: with the loaded model, host the group and wait for the
    Attention peers; again with ``connect_timeout_s`` and ``stop`` when they left (a restart,
    which only the gloo connector takes: the config refuses it with the others)."""

    def __call__(
        self,
        model: nn.Module,
        *,
        connect_timeout_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> FFNConnector: ...


def check_restart(vllm_config: VllmConfig, afd: AFDConfig) -> None:
    """Refuse ``peer_restart_timeout_s`` where a step cannot simply run again: a worker with TP
    or DP partners (they would re-enter their collectives at different layers), a KV-transfer
    connector (its per-layer saves would repeat), or, on the Attention role, an engine that could
    not fail a step (:func:`check_failed_steps`) or a held step longer than the multiprocess
    executor waits for (``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``)."""
    restart = afd.peer_restart_timeout_s
    if not restart:
        return
    key = f"additional_config.afd.peer_restart_timeout_s={restart:g}"
    parallel = vllm_config.parallel_config
    for flag, size in (
        ("--tensor-parallel-size", parallel.tensor_parallel_size),
        ("--data-parallel-size", parallel.data_parallel_size),
    ):
        if size > 1:
            raise AFDConfigError(
                f"{key} with {flag}={size} is not allowed: a restarted peer is waited for by each "
                f"worker alone, and its partners would re-run the step from other layers; "
                f"allowed: {flag}=1, or peer_restart_timeout_s=0"
            )
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        raise AFDConfigError(
            f"{key} with --kv-transfer-config is not allowed: a step run again would save its "
            "layers' KV cache through the KV connector twice; allowed: one of them"
        )
    if afd.is_ffn:  # the FFN server waits in a thread of its own, never inside a step
        return
    check_failed_steps(vllm_config, key)
    timeout_s = afd.connector_extra_config.timeout_s
    # noticing the loss, forming the data plane again, and a retry that fails again
    held_s = restart + 3 * timeout_s
    limit = envs.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS
    if parallel.distributed_executor_backend == "mp" and held_s >= limit:
        raise AFDConfigError(
            f"{key} with connector_extra_config.timeout_s={timeout_s:g} is not allowed with "
            f"--distributed-executor-backend mp: a held step may take peer_restart_timeout_s + "
            f"3 * timeout_s = {held_s:g} s, and the executor gives a step "
            f"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS={limit} s; allowed: peer_restart_timeout_s + "
            f"3 * timeout_s < {limit} (or raise that variable)"
        )


def check_failed_steps(vllm_config: VllmConfig, key: str) -> None:
    """Refuse an Attention engine that could not fail a step's requests and stay up once no FFN
    engine came back in time: that needs the AFD scheduler, which finishes them, and a
    synchronous engine core, which hands it the failed step unsampled."""
    # generated code: imported where a restart is configured, not by every connector user
    from afd_models.scheduler import SCHEDULER_CLS, AFDScheduler

    scheduler = vllm_config.scheduler_config
    if scheduler.async_scheduling:
        raise AFDConfigError(
            f"{key} with --async-scheduling is not allowed: the engine samples every step, "
            "so the requests of a step whose FFN engine did not come back would get no error "
            "finish; allowed: --no-async-scheduling, or peer_restart_timeout_s=0"
        )
    chosen = scheduler.get_scheduler_cls()
    if not (isinstance(chosen, type) and issubclass(chosen, AFDScheduler)):
        name = f"{chosen.__module__}.{chosen.__qualname__}"
        if scheduler.scheduler_cls is None:
            name += " (vLLM's default)"
        raise AFDConfigError(
            f"{key} with --scheduler-cls {name} is not allowed: once no FFN engine came back "
            "within the timeout, the requests of the step are failed by the AFD scheduler "
            f"(and the engine stays up); allowed: --scheduler-cls {SCHEDULER_CLS}, or "
            "peer_restart_timeout_s=0"
        )


def worker_role_rank(vllm_config: VllmConfig) -> int:
    """This worker's index among the DP ranks of its role (its TP rank is its lane), after checking
    that the engine's DP ranks (``rank_offset`` ... ``rank_offset + DP - 1``) fit the configured
    count, that its lanes' ports exist and, on the Attention role, that it holds only whole FFN
    groups."""
    parallel = vllm_config.parallel_config
    afd = require_afd_config(vllm_config.additional_config)
    dp_size, tp_size = parallel.data_parallel_size, parallel.tensor_parallel_size
    dp_rank = parallel.data_parallel_rank if dp_size > 1 else 0
    first = afd.rank_offset
    configured, key = afd.num_role_ranks, afd.role_ranks_key
    if first + dp_size > configured:
        raise AFDConfigError(
            f"additional_config.afd.{key}={configured} with additional_config.afd.rank_offset={first}, "
            f"but this engine's {dp_size} DP ranks take role ranks {first}..{first + dp_size - 1}; "
            f"allowed: rank_offset + --data-parallel-size <= {key}"
        )
    try:
        check_ports(afd.port, afd.num_ffn_ranks, tp_size)
    except TopologyError as exc:
        raise AFDConfigError(
            f"additional_config.afd.port={afd.port} with additional_config.afd.num_ffn_ranks="
            f"{afd.num_ffn_ranks} and --tensor-parallel-size={tp_size}: {exc} (each FFN rank "
            "hosts one group per TP rank)"
        ) from exc
    if afd.is_attention:
        try:
            check_attention_engine(first, dp_size, afd.num_attention_ranks, afd.num_ffn_ranks)
        except TopologyError as exc:
            raise AFDConfigError(f"additional_config.afd.rank_offset={first}: {exc}") from exc
    return role_rank(dp_rank, first)


def project_version() -> str:
    """The installed version of vllm-afd-overlay (``unknown`` when run from an uninstalled tree)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def model_identity(vllm_config: VllmConfig) -> str:
    """Which model an engine serves: its architecture and a digest of its config.

    The digest covers every key of the model's config (minus where and with which transformers
    it was read) and the quantization, so two engines given the same checkpoint agree whatever
    path each reads it from, while a different checkpoint shape, routing setting or quantization
    differs. It is cheap and reads no weights: two checkpoints with identical configs but
    different weights (two fine-tunes of one base) share it.
    """
    model_config = vllm_config.model_config
    described = {
        key: value
        for key, value in model_config.hf_config.to_dict().items()
        if key not in _UNIDENTIFYING_KEYS
    }
    described["quantization"] = model_config.quantization
    digest = hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode())
    architectures = getattr(model_config.hf_config, "architectures", None) or ["?"]
    return f"{','.join(architectures)} config-sha256:{digest.hexdigest()[:16]}"


def fingerprint(
    vllm_config: VllmConfig, afd: AFDConfig, rank: int, layers: list[int]
) -> Fingerprint:
    """The fingerprint a worker of role rank ``rank`` presents at connect time."""
    model_config = vllm_config.model_config
    return Fingerprint(
        role_rank=rank,
        num_attention_ranks=afd.num_attention_ranks,
        num_ffn_ranks=afd.num_ffn_ranks,
        tensor_parallel_size=vllm_config.parallel_config.tensor_parallel_size,
        compute_gate_on_attention=afd.compute_gate_on_attention,
        layers=tuple(layers),
        hidden_size=model_config.get_hidden_size(),
        dtype=str(model_config.dtype).removeprefix("torch."),
        model=model_identity(vllm_config),
        version=project_version(),
        connector=afd.connector,
    )


def prepare_attention(
    vllm_config: VllmConfig, tp_rank: int, device: torch.device
) -> AttentionConnect:
    """The Attention worker's connect step; call before the model is built, then call the result
    with the loaded model.

    Before the model: the rank is checked against the topology (config errors come before any
    weight is read), and a loopback connector builds its in-process FFN model (which must exist
    before the Attention model). With the model: a gloo connector presents the model's remote
    layers in its fingerprint and blocks until its FFN peer accepts it (bounded by the connect
    timeout; a mismatch fails within ``timeout_s``).
    """
    afd = require_afd_config(vllm_config.additional_config, role=Role.ATTENTION)
    if afd.connector == "LoopbackAFDConnector":
        from afd_models.connectors.loopback import LoopbackConnector

        loopback = LoopbackConnector.with_ffn_model(vllm_config)
        return lambda _model: loopback
    from afd_models.models.remote import remote_layers

    rank = worker_role_rank(vllm_config)
    check_restart(vllm_config, afd)
    tp_size = vllm_config.parallel_config.tensor_parallel_size
    try:
        group = group_of_attention(
            rank,
            afd.num_attention_ranks,
            afd.num_ffn_ranks,
            afd.port,
            tp_size=tp_size,
            lane=tp_rank,
        )
    except TopologyError as exc:
        raise AFDConfigError(str(exc)) from exc
    host = afd.group_host(group.ffn_rank)

    extra = afd.connector_extra_config
    # off an NPU this fails here, before any weight is read
    cam_ops = load_cam_p2p_ops(extra.core_num) if afd.connector == "CAMP2PAFDConnector" else None

    def connect(model: nn.Module) -> AFDConnector:
        layers = [proxy.layer_idx for proxy in remote_layers(model)]
        presented = fingerprint(vllm_config, afd, rank, layers)
        if afd.connector == "CAMP2PAFDConnector":
            from afd_models.connectors.cam import CAMP2PAFDConnector

            return CAMP2PAFDConnector(
                host,
                group,
                rank,
                extra,
                presented,
                device=device,
                ops=cam_ops,
                on_peer_gone=exit_process,
            )
        if afd.connector == "NcclAFDConnector":
            from afd_models.connectors.nccl import NcclAttentionConnector

            return NcclAttentionConnector(
                host, group, rank, extra, presented, device=device, on_peer_gone=exit_process
            )
        from afd_models.connectors.gloo import GlooAttentionConnector

        return GlooAttentionConnector(host, group, rank, extra, presented)

    return connect


def prepare_ffn(vllm_config: VllmConfig, tp_rank: int, device: torch.device) -> FFNConnect:
    """The FFN worker's connect step; call before the model is built, then call the result with
    the loaded model, which hosts the group and waits for the Attention peers, refusing any whose
    fingerprint differs from its own.

    Before the model: the rank is checked against the topology and a CAM connector's kernels are
    loaded (off an NPU this fails here, before any weight is read).

    (A loopback connector never gets here: the FFN worker refuses it at start-up.)
    """
    afd = require_afd_config(vllm_config.additional_config, role=Role.FFN)
    rank = worker_role_rank(vllm_config)
    check_restart(vllm_config, afd)
    tp_size = vllm_config.parallel_config.tensor_parallel_size
    group = group_of_ffn(
        rank, afd.num_attention_ranks, afd.num_ffn_ranks, afd.port, tp_size=tp_size, lane=tp_rank
    )
    host = afd.group_host(group.ffn_rank)
    extra = afd.connector_extra_config
    cam_ops = load_cam_p2p_ops(extra.core_num) if afd.connector == "CAMP2PAFDConnector" else None

    def connect(
        model: nn.Module,
        *,
        connect_timeout_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> FFNConnector:
        presented = fingerprint(vllm_config, afd, rank, list(model.ffn_layer_indices()))
        if afd.connector == "CAMP2PAFDConnector":
            from afd_models.connectors.cam import CAMP2PFFNConnector

            return CAMP2PFFNConnector(host, group, extra, presented, device=device, ops=cam_ops)
        if afd.connector == "NcclAFDConnector":
            from afd_models.connectors.nccl import NcclFFNConnector

            return NcclFFNConnector(host, group, extra, presented, device=device)
        from afd_models.connectors.gloo import GlooFFNConnector

        waits = extra
        if connect_timeout_s is not None:
            waits = dataclasses.replace(extra, connect_timeout_s=connect_timeout_s)
        return GlooFFNConnector(host, group, waits, presented, stop=stop)

    return connect
