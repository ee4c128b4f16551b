"""Force load balance: deterministic, evenly spread MoE routing for the FFN role (Ascend W8A8).

A profiling switch, not a correctness feature: it changes the model's outputs. Set on the FFN
engine, under ``additional_config.afd.connector_extra_config``::

    {"force_load_balance": true, "force_load_balance_topn_per_rank": 0}

The FFN role's W8A8 fused-MoE method calls :meth:`ForceLoadBalancer.topk_ids` right after
upstream's ``select_experts``, and the routed ``topk_ids`` are replaced by a fixed cycle of
experts, so each EP rank receives the same share of routed tokens whatever the router says.

The cycle, for ``E`` logical experts over ``ep_size`` ranks of ``L = E / ep_size`` experts each:

- ``topn_per_rank = N > 0``: the first ``N`` local experts of rank 0, then of rank 1, ... (rank
  ``r`` owns experts ``r*L .. r*L + L - 1``), ``N * ep_size`` experts in all;
- ``topn_per_rank = 0``: all ``E`` experts in a fixed random order (``randperm`` seeded with
  :data:`SEED`, the same on every rank and device).

EP rank ``s`` adds ``s * L`` (mod ``E``) to every expert of the cycle, so on a given token the EP
ranks send to different ranks. Token ``t`` takes the ``top_k`` experts of the cycle that follow
the ``t * top_k`` first ones, wrapping around: no token names an expert twice while
``top_k <= len(cycle)``, and every expert of the cycle gets work once a step has
``len(cycle) / top_k`` tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from afd_models.config import AFD_KEY, AFDConfig, AFDConfigError, afd_config_from
from afd_models.log import get_logger

logger = get_logger(__name__)

#: the ``connector_extra_config`` keys read here
ENABLE_KEY = "force_load_balance"
TOPN_KEY = "force_load_balance_topn_per_rank"
#: seed of the expert order when ``topn_per_rank`` is 0 (the public AFD plugin's, so profiles of
#: the two compare)
SEED = 1024


def _where(key: str) -> str:
    return f"additional_config.{AFD_KEY}.connector_extra_config.{key}"


@dataclass(frozen=True)
class ForceLoadBalanceSettings:
    """Force-load-balance settings of one FFN engine; only built when the switch is on."""

    #: each EP rank's first ``topn_per_rank`` local experts make the cycle; 0: all experts
    topn_per_rank: int = 0
    #: rows of the first top-k buffer (the scheduler's ``max_num_batched_tokens``); a larger
    #: step doubles it
    max_num_tokens: int = 128

    @classmethod
    def from_afd_config(
        cls, afd_config: AFDConfig | None, *, max_num_tokens: int
    ) -> ForceLoadBalanceSettings | None:
        """The settings of an AFD FFN engine whose connector settings switch it on, else None."""
        if afd_config is None or not afd_config.is_ffn:
            return None
        # the connector's schema checked the keys (afd_models/config.py); connectors without
        # them (gloo, NCCL) have no switch
        extra = afd_config.connector_extra_config
        if not getattr(extra, ENABLE_KEY, False):
            return None
        return cls(topn_per_rank=getattr(extra, TOPN_KEY), max_num_tokens=max_num_tokens)

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> ForceLoadBalanceSettings | None:
        """:meth:`from_afd_config` for the engine of ``vllm_config`` (a ``VllmConfig``)."""
        return cls.from_afd_config(
            afd_config_from(vllm_config.additional_config),
            max_num_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
        )


class ForceLoadBalancer:
    """The balanced ``topk_ids`` of one MoE layer, from a buffer built once and reused.

    Only the ids change: upstream's ``topk_weights`` (the router's weights of its own choice)
    go on unchanged with the replaced ids.

    Args:
        settings: from :meth:`ForceLoadBalanceSettings.from_vllm_config`.
        ep_rank: this rank in the layer's expert-parallel group.
        ep_size: ranks in that group.
        num_experts: routed logical experts of the layer, all ranks together (no shared or
            redundant experts); ``num_experts / ep_size`` per rank, the block layout of
            logical ids.
        top_k: routed experts per token.

    Raises:
        AFDConfigError: when the settings and these facts cannot give a balanced cycle, naming
            the key, the value and what is allowed.
    """

    def __init__(
        self,
        settings: ForceLoadBalanceSettings,
        *,
        ep_rank: int,
        ep_size: int,
        num_experts: int,
        top_k: int,
    ) -> None:
        if ep_size < 1 or not 0 <= ep_rank < ep_size:
            raise AFDConfigError(
                f"force load balance on EP rank {ep_rank} of ep_size={ep_size} is not allowed; "
                "allowed: ep_size >= 1 and 0 <= ep_rank < ep_size"
            )
        if num_experts < 1 or num_experts % ep_size:
            raise AFDConfigError(
                f"force load balance with num_experts={num_experts} over ep_size={ep_size} is not "
                "allowed; allowed: a positive multiple of ep_size (the same experts on every rank)"
            )
        local_experts = num_experts // ep_size
        if settings.topn_per_rank > local_experts:
            raise AFDConfigError(
                f"{_where(TOPN_KEY)}={settings.topn_per_rank} is not allowed: each EP rank holds "
                f"{local_experts} experts ({num_experts} over ep_size={ep_size}); "
                f"allowed: 0..{local_experts}"
            )
        cycle_length = settings.topn_per_rank * ep_size or num_experts
        if not 1 <= top_k <= cycle_length:
            raise AFDConfigError(
                f"force load balance with the model's top_k={top_k} and {_where(TOPN_KEY)}="
                f"{settings.topn_per_rank} is not allowed: the cycle has {cycle_length} experts and "
                f"a token may not name one twice; allowed: top_k in 1..{cycle_length} (raise "
                f"{TOPN_KEY} to at least {-(-top_k // ep_size)}, or set it to 0)"
            )
        self.settings = settings
        self.ep_rank = ep_rank
        self.ep_size = ep_size
        self.num_experts = num_experts
        self.top_k = top_k
        self._buffer: torch.Tensor | None = None
        #: buffers a larger one replaced: graphs captured over them still read their memory
        self._replaced: list[torch.Tensor] = []

    def expert_cycle(self) -> torch.Tensor:
        """This rank's cycle of expert ids (int64, on the CPU)."""
        local_experts = self.num_experts // self.ep_size
        topn = self.settings.topn_per_rank
        if topn:
            first_of_rank = torch.arange(self.ep_size).unsqueeze(1) * local_experts
            cycle = (first_of_rank + torch.arange(topn)).flatten()
        else:
            # a CPU generator: the same order on every device
            generator = torch.Generator().manual_seed(SEED)
            cycle = torch.randperm(self.num_experts, generator=generator)
        # start each EP rank on its own block of experts, so one token's ids differ across ranks
        return (cycle + self.ep_rank * local_experts) % self.num_experts

    def _build(self, rows: int, like: torch.Tensor) -> torch.Tensor:
        cycle = self.expert_cycle()
        flat = cycle[torch.arange(rows * self.top_k) % cycle.numel()]
        logger.info(
            "force load balance: top-k buffer of %d tokens (EP rank %d of %d, %d experts, "
            "top_k %d, topn_per_rank %d)",
            rows,
            self.ep_rank,
            self.ep_size,
            self.num_experts,
            self.top_k,
            self.settings.topn_per_rank,
        )
        return flat.view(rows, self.top_k).to(device=like.device, dtype=like.dtype)

    def topk_ids(self, topk_ids: torch.Tensor, *, mix_placement: bool = False) -> torch.Tensor:
        """Balanced ids for upstream's ``topk_ids`` (``[num_tokens, top_k]``), same dtype and device.

        With ``mix_placement`` upstream's ids carry the shared experts in the columns after
        ``top_k``; those are kept as they are. Without it the result is a view of the buffer:
        read it, do not write it.

        The buffer is built on the first call, on the ids' device, and doubles when a step has
        more tokens than it holds (earlier rows stay the same); both happen in eager steps (the
        FFN graphs run each step shape eagerly before capturing it). A replaced buffer is kept:
        a graph captured over it still reads its memory.
        """
        columns = topk_ids.shape[1] if topk_ids.dim() == 2 else -1
        if columns < self.top_k or (columns != self.top_k and not mix_placement):
            raise ValueError(
                f"force load balance got topk_ids of shape {tuple(topk_ids.shape)}; expected "
                f"[num_tokens, {self.top_k}]"
                + (" plus the shared-expert columns" if mix_placement else "")
            )
        num_tokens = topk_ids.shape[0]
        buffer = self._buffer
        rows = self.settings.max_num_tokens if buffer is None else buffer.shape[0]
        if num_tokens > rows:
            rows = max(num_tokens, 2 * rows)
        if (
            buffer is None
            or buffer.shape[0] != rows
            or buffer.device != topk_ids.device
            or buffer.dtype != topk_ids.dtype
        ):
            if buffer is not None:
                self._replaced.append(buffer)
            buffer = self._buffer = self._build(rows, topk_ids)
        routed = buffer[:num_tokens]
        if columns == self.top_k:
            return routed
        return torch.cat([routed, topk_ids[:, self.top_k :]], dim=1)


def balanced_quant_config(quant_config: Any, modelslim: type[Any], afd_modelslim: type[Any]) -> Any:
    """AFD's ModelSlim config (``afd_modelslim``, a subclass of vLLM-Ascend's ``modelslim``) built
    from ``quant_config``'s description, as vLLM builds ``modelslim`` from the checkpoint's.

    Raises:
        AFDConfigError: the model is not quantized with vLLM-Ascend's ModelSlim config, so it has
            no W8A8-dynamic MoE layers to balance.
    """
    if not isinstance(quant_config, modelslim):
        found = "no quantization" if quant_config is None else type(quant_config).__name__
        raise AFDConfigError(
            f"{_where(ENABLE_KEY)}=true balances vLLM-Ascend's W8A8-dynamic MoE layers, but the "
            f"model has {found}; allowed: a ModelSlim W8A8_DYNAMIC checkpoint, or leave "
            f"{ENABLE_KEY} out"
        )
    return afd_modelslim.from_config(quant_config.quant_description)


def with_balanced_moe(vllm_config: Any, afd: AFDConfig) -> Any:
    """The FFN NPU engine's ``vllm_config`` with AFD's ModelSlim config when force load balance is
    on in its parsed AFD section ``afd`` (its W8A8-dynamic MoE layers then get AFD's scheme);
    unchanged when it is off."""
    max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
    if ForceLoadBalanceSettings.from_afd_config(afd, max_num_tokens=max_num_tokens) is None:
        return vllm_config
    from vllm_ascend.quantization.modelslim_config import AscendModelSlimConfig

    from afd_models.generated_classes import generated_subclass

    afd_modelslim = generated_subclass("AFDAscendModelSlimConfig", AscendModelSlimConfig)
    quant_config = balanced_quant_config(
        vllm_config.quant_config, AscendModelSlimConfig, afd_modelslim
    )
    return dataclasses.replace(vllm_config, quant_config=quant_config)
