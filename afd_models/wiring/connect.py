"""Create the connector an AFD worker needs, from its config, its place in the topology and its
loaded model (whose :class:`~afd_models.connectors.base.Fingerprint` the connector presents).

Which connector class serves a role is its row's builder (:mod:`afd_models.connectors.specs`),
imported when the worker connects; this module holds no per-connector branch.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
import threading
from collections.abc import Callable
from typing import Protocol, cast

import torch
from torch import nn
from vllm.config import VllmConfig

from afd_models.config import AFDConfig, AFDConfigError, shared_secret
from afd_models.connectors.base import AFDConnector, FFNConnector, Fingerprint
from afd_models.connectors.build import PrepareAttention, PrepareFFN, Site
from afd_models.connectors.specs import CONNECTORS, P2PExtraConfig
from afd_models.models.ffn import token_id_layers
from afd_models.topology import (
    TopologyError,
    check_attention_engine,
    check_ports,
    group_of_attention,
    group_of_ffn,
    role_rank,
)
from afd_models.worker_config import check_restart

#: the distribution whose version the fingerprint carries
DISTRIBUTION = "vllm-afd-overlay"
#: keys of the model's config that say where or with what it was read, not what the model is
_UNIDENTIFYING_KEYS = ("_name_or_path", "transformers_version")

#: the Attention worker's connect step, called with the loaded model
AttentionConnect = Callable[[nn.Module], AFDConnector]


class FFNConnect(Protocol):
    """The FFN worker's connect step: with the loaded model, host the group and wait for the
    Attention peers; again with ``connect_timeout_s`` and ``stop`` when they left (a restart,
    which only a connector with ``peer_restart`` takes: the config refuses it with the others)."""

    def __call__(
        self,
        model: nn.Module,
        *,
        connect_timeout_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> FFNConnector: ...


class InProcessAttention(Protocol):
    """An in-process connector's builder (the wiring's, :mod:`afd_models.wiring.loopback`): the
    Attention side with its FFN half already built from the engine config and its parsed AFD
    section (before the Attention model, which needs it to exist)."""

    def __call__(self, vllm_config: VllmConfig, afd: AFDConfig) -> AFDConnector: ...


def builder(reference: str) -> object:
    """The function a connector's row names as ``"module:function"``, imported now."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def _served(reference: str | None, afd: AFDConfig) -> str:
    """A row's builder reference for this worker's role; the worker checks refuse a connector
    that has none (:func:`afd_models.worker_config.refuse_unsupported`)."""
    if reference is None:
        raise AFDConfigError(
            f"additional_config.afd.connector={afd.connector!r} has no {afd.role.value} side "
            "the AFD workers serve"
        )
    return reference


def worker_role_rank(vllm_config: VllmConfig, afd: AFDConfig) -> int:
    """This worker's index among the DP ranks of its role (its TP rank is its lane), after checking
    that the engine's DP ranks (``rank_offset`` ... ``rank_offset + DP - 1``) fit the configured
    count, that its lanes' ports exist and, on the Attention role, that it holds only whole FFN
    groups."""
    parallel = vllm_config.parallel_config
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


def _step_channel_secret(afd: AFDConfig) -> bytes | None:
    """The shared secret a point-to-point connector's step channels authenticate with, checked
    against the deployment's addresses (:func:`~afd_models.config.shared_secret`: its file is
    read here, once per connect step); None for the connectors without a step channel, whose
    peers meet through a runtime of their own."""
    if not isinstance(afd.connector_extra_config, P2PExtraConfig):
        return None
    return shared_secret(afd, os.environ)


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
    vllm_config: VllmConfig,
    afd: AFDConfig,
    rank: int,
    layers: list[int],
    id_routed_layers: list[int],
) -> Fingerprint:
    """The fingerprint a worker of role rank ``rank`` presents at connect time, its remote
    ``layers`` and those of them whose exchange carries token ids.

    Raises:
        AFDConfigError: the model has token-id layers and the connector cannot carry token ids.
    """
    spec = CONNECTORS[afd.connector]
    if id_routed_layers and not spec.token_ids:
        carriers = [
            s.name
            for s in CONNECTORS.values()
            if s.token_ids and not s.not_served and set(s.platforms) & set(spec.platforms)
        ]
        raise AFDConfigError(
            f"additional_config.afd.connector={afd.connector!r}: the model routes layers "
            f"{id_routed_layers} by token id, and this connector cannot carry token ids (its "
            f"{spec.plane.value} plane moves hidden states only); connectors that can, on its "
            f"platforms: {', '.join(carriers) or 'none'}"
        )
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
        token_id_layers=tuple(id_routed_layers),
    )


def prepare_attention(
    vllm_config: VllmConfig, afd: AFDConfig, tp_rank: int, device: torch.device
) -> AttentionConnect:
    """The Attention worker's connect step; call before the model is built, then call the result
    with the loaded model.

    Before the model: the rank is checked against the topology (config errors come before any
    weight is read), and a loopback connector builds its in-process FFN model (which must exist
    before the Attention model). With the model: a gloo connector presents the model's remote
    layers in its fingerprint and blocks until its FFN peer accepts it (bounded by the connect
    timeout; a mismatch fails within ``timeout_s``).
    """
    spec = CONNECTORS[afd.connector]
    if spec.attention_only:
        build_in_process = cast(InProcessAttention, builder(_served(spec.attention, afd)))
        in_process = build_in_process(vllm_config, afd)
        return lambda _model: in_process
    from afd_models.models.remote import remote_layers

    rank = worker_role_rank(vllm_config, afd)
    check_restart(vllm_config, afd)
    secret = _step_channel_secret(afd)
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
    site = Site(
        afd.group_host(group.ffn_rank), group, rank, afd.connector_extra_config, device, secret
    )
    prepare = cast(PrepareAttention, builder(_served(spec.attention, afd)))
    # before the model: a builder that cannot run here (CAM kernels off an NPU) fails now
    connect_side = prepare(site)

    def connect(model: nn.Module) -> AFDConnector:
        layers = [proxy.layer_idx for proxy in remote_layers(model)]
        return connect_side(fingerprint(vllm_config, afd, rank, layers, token_id_layers(model)))

    return connect


def prepare_ffn(
    vllm_config: VllmConfig, afd: AFDConfig, tp_rank: int, device: torch.device
) -> FFNConnect:
    """The FFN worker's connect step; call before the model is built, then call the result with
    the loaded model, which hosts the group and waits for the Attention peers, refusing any whose
    fingerprint differs from its own.

    Before the model: the rank is checked against the topology and a CAM connector's kernels are
    loaded (off an NPU this fails here, before any weight is read).

    (A loopback connector never gets here: the FFN worker refuses it at start-up.)
    """
    rank = worker_role_rank(vllm_config, afd)
    check_restart(vllm_config, afd)
    tp_size = vllm_config.parallel_config.tensor_parallel_size
    group = group_of_ffn(
        rank, afd.num_attention_ranks, afd.num_ffn_ranks, afd.port, tp_size=tp_size, lane=tp_rank
    )
    site = Site(
        afd.group_host(group.ffn_rank),
        group,
        rank,
        afd.connector_extra_config,
        device,
        _step_channel_secret(afd),
    )
    prepare = cast(PrepareFFN, builder(_served(CONNECTORS[afd.connector].ffn, afd)))
    connect_side = prepare(site)

    def connect(
        model: nn.Module,
        *,
        connect_timeout_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> FFNConnector:
        presented = fingerprint(
            vllm_config, afd, rank, list(model.ffn_layer_indices()), token_id_layers(model)
        )
        return connect_side(presented, connect_timeout_s=connect_timeout_s, stop=stop)

    return connect
