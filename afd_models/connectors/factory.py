"""Create the connector an AFD worker needs, from its config and its place in the topology."""

from __future__ import annotations

from vllm.config import VllmConfig

from afd_models.config import AFDConfigError, Role, require_afd_config
from afd_models.connectors.base import AFDConnector, FFNConnector
from afd_models.topology import TopologyError, group_of_attention, group_of_ffn, role_rank


def worker_role_rank(vllm_config: VllmConfig, tp_rank: int) -> int:
    """This worker's index among the workers of its role (checked against the configured count)."""
    parallel = vllm_config.parallel_config
    afd = require_afd_config(vllm_config.additional_config)
    dp_rank = parallel.data_parallel_rank if parallel.data_parallel_size > 1 else 0
    rank = role_rank(dp_rank, tp_rank, parallel.tensor_parallel_size)
    configured = afd.num_attention_ranks if afd.is_attention else afd.num_ffn_ranks
    if rank >= configured:
        key = "num_attention_ranks" if afd.is_attention else "num_ffn_ranks"
        raise AFDConfigError(
            f"additional_config.afd.{key}={configured}, but this engine has a worker of role rank {rank} "
            f"(DP rank {dp_rank} x TP size {parallel.tensor_parallel_size} + TP rank {tp_rank}); "
            f"allowed: {key} >= DP size x TP size of all {afd.role.value} engines"
        )
    return rank


def connect_attention(vllm_config: VllmConfig, tp_rank: int) -> AFDConnector:
    """The Attention worker's connector; blocks until its FFN peer joins (bounded by the connect timeout)."""
    afd = require_afd_config(vllm_config.additional_config, role=Role.ATTENTION)
    if afd.connector == "LoopbackAFDConnector":
        from afd_models.connectors.loopback import LoopbackConnector

        return LoopbackConnector.with_ffn_model(vllm_config)
    from afd_models.connectors.gloo import GlooAttentionConnector

    rank = worker_role_rank(vllm_config, tp_rank)
    try:
        group = group_of_attention(rank, afd.num_attention_ranks, afd.num_ffn_ranks, afd.port)
    except TopologyError as exc:
        raise AFDConfigError(str(exc)) from exc
    return GlooAttentionConnector(afd.host, group, rank, afd.connector_extra_config)


def connect_ffn(vllm_config: VllmConfig, tp_rank: int) -> FFNConnector:
    """The FFN worker's connector; hosts its group and waits for the Attention peers.

    (A loopback connector never gets here: the FFN worker refuses it at start-up.)
    """
    afd = require_afd_config(vllm_config.additional_config, role=Role.FFN)
    from afd_models.connectors.gloo import GlooFFNConnector

    rank = worker_role_rank(vllm_config, tp_rank)
    group = group_of_ffn(rank, afd.num_attention_ranks, afd.num_ffn_ranks, afd.port)
    return GlooFFNConnector(afd.host, group, afd.connector_extra_config)
