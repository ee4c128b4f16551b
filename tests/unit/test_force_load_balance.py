"""Force load balance: the balanced top-k ids and their settings (afd_models.force_load_balance)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from afd_models.config import AFDConfig, AFDConfigError, Role
from afd_models.connectors.specs import CAMP2PExtraConfig
from afd_models.force_load_balance import (
    SEED,
    ForceLoadBalancer,
    ForceLoadBalanceSettings,
    balanced_quant_config,
)


def balancer(
    *, ep_rank=0, ep_size=4, num_experts=16, top_k=3, topn=0, max_tokens=8
) -> ForceLoadBalancer:
    return ForceLoadBalancer(
        ForceLoadBalanceSettings(topn_per_rank=topn, max_num_tokens=max_tokens),
        ep_rank=ep_rank,
        ep_size=ep_size,
        num_experts=num_experts,
        top_k=top_k,
    )


def routed(num_tokens: int, top_k: int = 3, dtype=torch.int32) -> torch.Tensor:
    """Upstream's ids as a router that always picks experts 0..top_k-1 would give them."""
    return torch.arange(top_k, dtype=dtype).repeat(num_tokens, 1)


@pytest.mark.parametrize("topn", [0, 1, 2])
@pytest.mark.parametrize("ep_rank", range(4))
def test_every_rank_gets_work(topn: int, ep_rank: int) -> None:
    """Over enough tokens, every EP rank's expected experts are named: all experts with topn 0,
    each rank's first topn experts otherwise, and nothing else."""
    ids = balancer(ep_rank=ep_rank, topn=topn).topk_ids(routed(16))
    expected = set(range(16)) if topn == 0 else {r * 4 + i for r in range(4) for i in range(topn)}
    assert set(ids.flatten().tolist()) == expected


@pytest.mark.parametrize("topn", [0, 1, 4])
def test_ranks_take_equal_shares(topn: int) -> None:
    """Over whole cycles, each target EP rank gets the same number of routed token slots."""
    b = balancer(topn=topn, top_k=2)
    cycle_length = b.expert_cycle().numel()
    ids = b.topk_ids(routed(cycle_length, top_k=2))  # exactly two whole cycles
    per_rank = torch.bincount(ids.flatten().long() // 4, minlength=4)
    assert per_rank.tolist() == [per_rank[0].item()] * 4


@pytest.mark.parametrize(("topn", "top_k"), [(0, 16), (0, 5), (1, 4), (2, 7), (3, 3)])
def test_no_token_repeats_an_expert(topn: int, top_k: int) -> None:
    """Each row names top_k different experts, up to a cycle as long as top_k."""
    ids = balancer(topn=topn, top_k=top_k).topk_ids(routed(50, top_k))
    assert all(len(set(row)) == top_k for row in ids.tolist())


def test_ranks_start_on_their_own_block() -> None:
    """The same token goes to different experts on different EP ranks: rank s's cycle is rank
    0's shifted by s blocks."""
    firsts = [balancer(ep_rank=r, topn=2).topk_ids(routed(1))[0].tolist() for r in range(4)]
    assert firsts == [[0, 1, 4], [4, 5, 8], [8, 9, 12], [12, 13, 0]]
    rank0 = balancer(ep_rank=0).expert_cycle()
    assert torch.equal(balancer(ep_rank=3).expert_cycle(), (rank0 + 12) % 16)


@pytest.mark.parametrize("topn", [0, 2])
def test_tokens_walk_the_cycle(topn: int) -> None:
    """Token t takes the top_k experts that follow the first t * top_k of the cycle: read row by
    row, the ids are the cycle repeated."""
    b = balancer(ep_rank=1, topn=topn)
    cycle = b.expert_cycle()
    ids = b.topk_ids(routed(13))
    assert torch.equal(ids.flatten().long(), cycle.repeat(5)[: 13 * 3])


def test_random_cycle_is_the_seeded_permutation() -> None:
    """With topn 0 the cycle is randperm(num_experts) from the fixed seed."""
    expected = torch.randperm(16, generator=torch.Generator().manual_seed(SEED))
    assert torch.equal(balancer().expert_cycle(), expected)
    assert not torch.equal(expected, torch.arange(16))


def test_deterministic_across_calls_and_instances() -> None:
    """The same step gives the same ids, on one balancer and on a fresh one."""
    b = balancer()
    first = b.topk_ids(routed(6)).clone()
    assert torch.equal(b.topk_ids(routed(6)), first)
    assert torch.equal(balancer().topk_ids(routed(6)), first)
    assert torch.equal(b.topk_ids(routed(3)), first[:3])


def test_buffer_grows_and_keeps_earlier_rows() -> None:
    """A step larger than the buffer doubles it (or fits it), and rows already handed out stay."""
    b = balancer(max_tokens=8)
    small = b.topk_ids(routed(8)).clone()
    assert b._buffer is not None and b._buffer.shape[0] == 8
    large = b.topk_ids(routed(9))
    assert b._buffer.shape[0] == 16
    assert torch.equal(large[:8], small)
    assert b.topk_ids(routed(40)).shape == (40, 3) and b._buffer.shape[0] == 40
    assert torch.equal(b.topk_ids(routed(8)), small)


def test_mix_placement_keeps_shared_columns() -> None:
    """With mix_placement the shared-expert columns after top_k come back untouched."""
    shared = torch.tensor([[16, 17]], dtype=torch.int32).repeat(5, 1)
    ids = torch.cat([routed(5), shared], dim=1)
    out = balancer().topk_ids(ids, mix_placement=True)
    assert out.shape == (5, 5)
    assert torch.equal(out[:, 3:], shared)
    assert torch.equal(out[:, :3], balancer().topk_ids(routed(5)))


def test_extra_columns_without_mix_placement_are_refused() -> None:
    """Ids wider than top_k are refused unless mix_placement says why."""
    with pytest.raises(ValueError, match=r"shape \(5, 5\); expected \[num_tokens, 3\]"):
        balancer().topk_ids(torch.zeros(5, 5, dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_dtype_and_device_preserved(dtype: torch.dtype) -> None:
    """The ids come back in upstream's dtype and device, also when they change between calls."""
    b = balancer()
    for step_dtype in (dtype, torch.int16):
        out = b.topk_ids(routed(4, dtype=step_dtype))
        assert out.dtype == step_dtype and out.device == torch.device("cpu")


def test_zero_tokens() -> None:
    """A step without tokens gets an empty [0, top_k] tensor (and [0, top_k + shared])."""
    out = balancer().topk_ids(routed(0))
    assert out.shape == (0, 3) and out.dtype == torch.int32
    mixed = balancer().topk_ids(torch.zeros(0, 4, dtype=torch.int64), mix_placement=True)
    assert mixed.shape == (0, 4) and mixed.dtype == torch.int64


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (
            {"topn": 5},
            "force_load_balance_topn_per_rank=5 is not allowed: each EP rank holds 4 experts "
            "(16 over ep_size=4); allowed: 0..4",
        ),
        (
            {"topn": 1, "top_k": 5},
            "top_k=5 and additional_config.afd.connector_extra_config."
            "force_load_balance_topn_per_rank=1 is not allowed: the cycle has 4 experts",
        ),
        ({"top_k": 17}, "allowed: top_k in 1..16"),
        ({"top_k": 0}, "allowed: top_k in 1..16"),
        ({"num_experts": 18}, "num_experts=18 over ep_size=4 is not allowed"),
        ({"ep_rank": 4}, "EP rank 4 of ep_size=4 is not allowed"),
        ({"ep_size": 0, "ep_rank": 0}, "EP rank 0 of ep_size=0 is not allowed"),
    ],
)
def test_bad_layer_facts_are_refused(kwargs: dict, fragment: str) -> None:
    """Settings that cannot give a balanced cycle for this layer name the value and the range."""
    with pytest.raises(AFDConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        balancer(**kwargs)


def ffn_config(**extra) -> AFDConfig:
    return AFDConfig(
        role=Role.FFN,
        connector="CAMP2PAFDConnector",
        connector_extra_config=CAMP2PExtraConfig(**extra),
    )


def test_settings_from_afd_config() -> None:
    """On for an FFN engine whose connector settings say so; off (None) otherwise."""
    on = ForceLoadBalanceSettings.from_afd_config(
        ffn_config(force_load_balance=True, force_load_balance_topn_per_rank=2),
        max_num_tokens=512,
    )
    assert on == ForceLoadBalanceSettings(topn_per_rank=2, max_num_tokens=512)
    default_topn = ForceLoadBalanceSettings.from_afd_config(
        ffn_config(force_load_balance=True), max_num_tokens=64
    )
    assert default_topn == ForceLoadBalanceSettings(topn_per_rank=0, max_num_tokens=64)
    attention = AFDConfig(
        role=Role.ATTENTION,
        connector="CAMP2PAFDConnector",
        connector_extra_config=CAMP2PExtraConfig(force_load_balance=True),
    )
    for off in (
        None,
        attention,
        ffn_config(),
        ffn_config(force_load_balance=False, force_load_balance_topn_per_rank=2),
    ):
        assert ForceLoadBalanceSettings.from_afd_config(off, max_num_tokens=64) is None


def vllm_config(afd: dict | None, max_num_batched_tokens: int = 2048) -> SimpleNamespace:
    return SimpleNamespace(
        additional_config={} if afd is None else {"afd": afd},
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_num_batched_tokens),
    )


def test_settings_from_vllm_config_off() -> None:
    """No AFD, an Attention engine, or an FFN engine without the switch: off."""
    for afd in (
        None,
        {"role": "attention", "connector": "GlooAFDConnector"},
        {"role": "ffn", "connector": "GlooAFDConnector"},
    ):
        assert ForceLoadBalanceSettings.from_vllm_config(vllm_config(afd)) is None


#: an FFN connector whose settings carry the force-load-balance keys
NPU_CONNECTOR = "CAMP2PAFDConnector"


def test_settings_from_vllm_config_on() -> None:
    """The switch and topn come from the FFN engine's connector settings, the first buffer size
    from the scheduler."""
    afd = {
        "role": "ffn",
        "connector": NPU_CONNECTOR,
        "connector_extra_config": {
            "force_load_balance": True,
            "force_load_balance_topn_per_rank": 3,
        },
    }
    settings = ForceLoadBalanceSettings.from_vllm_config(vllm_config(afd, 4096))
    assert settings == ForceLoadBalanceSettings(topn_per_rank=3, max_num_tokens=4096)


class ModelSlim:
    """Stands for vLLM-Ascend's ModelSlim config: built from the checkpoint's description."""

    def __init__(self, description: dict) -> None:
        self.quant_description = description

    @classmethod
    def from_config(cls, config: dict) -> ModelSlim:
        return cls(config)


class AFDModelSlim(ModelSlim):
    """Stands for the generated subclass giving W8A8-dynamic MoE layers AFD's scheme."""


def test_the_ffn_model_is_built_with_afds_modelslim_config() -> None:
    """The same description as vLLM-Ascend's config, in AFD's subclass (which picks the scheme
    while the model is constructed)."""
    description = {"model.layers.1.mlp.experts.0.w1.weight": "W8A8_DYNAMIC"}
    config = balanced_quant_config(ModelSlim(description), ModelSlim, AFDModelSlim)
    assert type(config) is AFDModelSlim and config.quant_description == description


@pytest.mark.parametrize(("quant_config", "found"), [(None, "no quantization"), (1.5, "float")])
def test_force_load_balance_without_a_modelslim_checkpoint_is_refused(
    quant_config: object, found: str
) -> None:
    with pytest.raises(AFDConfigError) as error:
        balanced_quant_config(quant_config, ModelSlim, AFDModelSlim)
    assert str(error.value) == (
        "additional_config.afd.connector_extra_config.force_load_balance=true balances "
        f"vLLM-Ascend's W8A8-dynamic MoE layers, but the model has {found}; allowed: a ModelSlim "
        "W8A8_DYNAMIC checkpoint, or leave force_load_balance out"
    )


def test_a_replaced_buffer_stays_alive_for_the_graphs_captured_over_it() -> None:
    """An FFN graph captured over a step reads the buffer's memory at replay; a larger step
    replaces the buffer, and the old one must not be freed under the graph."""
    import weakref

    b = balancer(max_tokens=8)
    b.topk_ids(routed(4))
    first = weakref.ref(b._buffer)
    b.topk_ids(routed(40))
    assert b._buffer is not first() and first() is not None
