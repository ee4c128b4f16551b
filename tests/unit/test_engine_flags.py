"""Engine flags the AFD runtime refuses before anything is built (afd_models.worker_config.refuse_unsupported).

The configs are stand-ins with the attributes the check reads: the CUDA-graph, DBO and pipeline
settings cannot be set on this machine's CPU platform (it forces them off), and the check itself
reads plain attributes only.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from afd_models.config import AFDConfigError, parse_afd_config
from afd_models.worker_config import RunnerChoice, check_model_runner, refuse_unsupported


def engine(
    *,
    cudagraph_mode: str = "NONE",
    speculative_config: Any = None,
    lora_config: Any = None,
    enable_prefix_caching: bool = False,
    **parallel: Any,
) -> SimpleNamespace:
    """An engine config as vLLM's CPU platform leaves it, with ``parallel`` settings changed."""
    settings = {
        "pipeline_parallel_size": 1,
        "tensor_parallel_size": 1,
        "data_parallel_size": 1,
        "enable_dbo": False,
        "ubatch_size": 1,
        "enable_eplb": False,
        **parallel,
    }
    return SimpleNamespace(
        parallel_config=SimpleNamespace(**settings),
        compilation_config=SimpleNamespace(cudagraph_mode=SimpleNamespace(name=cudagraph_mode)),
        speculative_config=speculative_config,
        lora_config=lora_config,
        cache_config=SimpleNamespace(enable_prefix_caching=enable_prefix_caching),
    )


def afd(role: str, **keys: Any) -> Any:
    return parse_afd_config({"role": role, **keys})


@pytest.mark.parametrize("role", ["attention", "ffn"])
@pytest.mark.parametrize("mode", ["NONE", "PIECEWISE"])
def test_defaults_and_graphs_without_the_exchange_are_accepted(role: str, mode: str) -> None:
    refuse_unsupported(engine(cudagraph_mode=mode), afd(role))


@pytest.mark.parametrize("mode", ["FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_full_cuda_graphs_are_refused_on_attention_with_gloo(mode: str) -> None:
    with pytest.raises(AFDConfigError) as error:
        refuse_unsupported(
            engine(cudagraph_mode=mode), afd("attention", connector="GlooAFDConnector")
        )
    message = str(error.value)
    assert f"--compilation-config cudagraph_mode={mode}" in message
    assert "GlooAFDConnector" in message
    assert "allowed: NONE or PIECEWISE" in message and "--enforce-eager" in message


@pytest.mark.parametrize("mode", ["FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
@pytest.mark.parametrize("connector", ["NcclAFDConnector", "LoopbackAFDConnector"])
def test_full_cuda_graphs_capture_the_nccl_and_loopback_exchange(mode: str, connector: str) -> None:
    refuse_unsupported(engine(cudagraph_mode=mode), afd("attention", connector=connector))


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL_DECODE_ONLY"])
def test_breakable_cuda_graphs_are_refused_on_attention(mode: str) -> None:
    with pytest.raises(AFDConfigError) as error:
        refuse_unsupported(
            engine(cudagraph_mode=mode),
            afd("attention", connector="NcclAFDConnector"),
            breakable_cudagraphs=True,
        )
    assert str(error.value).startswith(f"VLLM_USE_BREAKABLE_CUDAGRAPH=1 with cudagraph_mode={mode}")
    refuse_unsupported(engine(), afd("attention"), breakable_cudagraphs=True)  # eager: no graph


@pytest.mark.parametrize("mode", ["FULL", "FULL_AND_PIECEWISE"])
def test_the_ffn_role_captures_nothing_so_any_graph_mode_is_accepted(mode: str) -> None:
    refuse_unsupported(engine(cudagraph_mode=mode), afd("ffn"))


REFUSED = {
    "pipeline parallel": (
        {"pipeline_parallel_size": 2},
        ["--pipeline-parallel-size=2", "allowed: 1"],
    ),
    "dbo": (
        {"enable_dbo": True},
        [
            "--enable-dbo=True",
            "allowed: no --enable-dbo and --ubatch-size 1",
            "additional_config.afd.dbo=true on the Attention engine",
        ],
    ),
    "micro-batches": ({"ubatch_size": 2}, ["--ubatch-size=2", "allowed:"]),
    "eplb": ({"enable_eplb": True}, ["--enable-eplb", "allowed: leave --enable-eplb off"]),
    "lora": (
        {"lora_config": SimpleNamespace(max_loras=1)},
        ["--enable-lora", "allowed: no --enable-lora"],
    ),
    "speculative decoding": (
        {"speculative_config": SimpleNamespace(method="mtp")},
        ["--speculative-config (method 'mtp')", "allowed: no --speculative-config"],
    ),
}


@pytest.mark.parametrize("role", ["attention", "ffn"])
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_flags_name_the_flag_its_value_and_the_alternative(role: str, case: str) -> None:
    settings, expected = REFUSED[case]
    with pytest.raises(AFDConfigError) as error:
        refuse_unsupported(engine(**settings), afd(role))
    message = str(error.value)
    for text in [*expected, f"({role} role)"]:
        assert text in message


@pytest.mark.parametrize("role", ["attention", "ffn"])
@pytest.mark.parametrize("size", [2, 4])
def test_tensor_parallel_is_accepted_on_both_roles(role: str, size: int) -> None:
    """TP ranks are lanes: TP rank t of one role exchanges with TP rank t of the other
    (afd_models.topology), so FFN TP partners receive identical tokens."""
    refuse_unsupported(engine(tensor_parallel_size=size), afd(role))


@pytest.mark.parametrize("size", [2, 3])
def test_data_parallel_is_refused_on_the_ffn_engine_only(size: int) -> None:
    """Attention DP ranks step in lockstep and each serves its own requests; FFN DP ranks would
    share a MoE collective while serving different peers, so each FFN rank is its own engine."""
    refuse_unsupported(engine(data_parallel_size=size), afd("attention", num_attention_ranks=size))
    refuse_unsupported(engine(), afd("ffn", num_attention_ranks=size, num_ffn_ranks=size))
    with pytest.raises(AFDConfigError) as error:
        refuse_unsupported(
            engine(data_parallel_size=size),
            afd("ffn", num_attention_ranks=size, num_ffn_ranks=size),
        )
    message = str(error.value)
    assert f"--data-parallel-size={size} is not supported on the AFD FFN role" in message
    assert "allowed: 1. Start one FFN engine per FFN rank" in message
    assert "additional_config.afd.rank_offset" in message


def test_the_loopback_connector_on_an_ffn_engine_never_reaches_the_flag_check() -> None:
    """Parse time refuses it (tests/unit/test_config.py), so refuse_unsupported holds no second copy."""
    refuse_unsupported(engine(), afd("attention", connector="LoopbackAFDConnector"))
    with pytest.raises(
        AFDConfigError, match=r"with additional_config\.afd\.role='ffn' is not allowed"
    ):
        afd("ffn", connector="LoopbackAFDConnector")


def test_prefix_caching_is_refused_on_the_ffn_engine_only() -> None:
    refuse_unsupported(engine(enable_prefix_caching=True), afd("attention"))
    with pytest.raises(AFDConfigError) as error:
        refuse_unsupported(engine(enable_prefix_caching=True), afd("ffn"))
    assert "add --no-enable-prefix-caching to the FFN engine" in str(error.value)


def test_dbo_runs_on_cuda_only() -> None:
    """The AFD section's DBO needs vLLM's CUDA micro-batch threads: refused elsewhere by name."""
    section = afd("attention", connector="NcclAFDConnector", dbo=True)
    with pytest.raises(AFDConfigError, match=r"additional_config.afd.dbo=true is not supported on"):
        refuse_unsupported(engine(), section)
    refuse_unsupported(engine(), section, is_cuda=True)


@pytest.mark.parametrize("role", ["attention", "ffn"])
def test_cam_async_is_refused_before_any_weight_loads(role: str) -> None:
    """Its connectors exist, but no worker drives them yet: both roles refuse it in the worker's
    __init__ (the FFN role would otherwise load its experts first)."""
    section = afd(role, connector="CAMAsyncAFDConnector", compute_gate_on_attention=True)
    with pytest.raises(AFDConfigError) as error:
        refuse_unsupported(engine(), section)
    assert str(error.value) == (
        "additional_config.afd.connector='CAMAsyncAFDConnector' is not served by the AFD workers "
        "yet (no routing hook on Attention, no expert-grouped FFN step); allowed on npu: "
        "CAMP2PAFDConnector, LoopbackAFDConnector"
    )
    refuse_unsupported(engine(), afd(role, connector="CAMP2PAFDConnector"))


def choice(**changes: object) -> RunnerChoice:
    """An Attention engine on CUDA with vLLM 0.30.0 that vLLM put on Model Runner V2 by default."""
    fields: dict[str, Any] = dict(
        engine_v2=True,
        worker_v2=True,
        requested=None,
        vllm_version="0.30.0",
        is_cuda=True,
        dbo=False,
        data_parallel_size=1,
    )
    fields.update(changes)
    return RunnerChoice(**fields)


@pytest.mark.parametrize(
    "accepted",
    [
        choice(),  # vLLM 0.29+'s CUDA default
        choice(vllm_version="0.32.0", requested=True),
        choice(dbo=True, requested=True, data_parallel_size=2),
        choice(engine_v2=False, worker_v2=False, is_cuda=False, vllm_version="0.26.0"),
        choice(engine_v2=False, worker_v2=False, dbo=True),  # V1 splits one DP rank alone
    ],
)
def test_the_attention_worker_follows_vllms_runner_choice(accepted: RunnerChoice) -> None:
    """Model Runner V2 on CUDA from vLLM 0.30 and the V1 runners anywhere are served."""
    check_model_runner(accepted)


@pytest.mark.parametrize(
    ("refused", "reason", "way_out"),
    [
        (
            choice(is_cuda=False, requested=True),
            "VLLM_USE_V2_MODEL_RUNNER=1 asks for Model Runner V2",
            "set VLLM_USE_V2_MODEL_RUNNER=0",
        ),
        (
            choice(vllm_version="0.28.0", requested=True),
            "VLLM_USE_V2_MODEL_RUNNER=1 asks for Model Runner V2",
            "set VLLM_USE_V2_MODEL_RUNNER=0",
        ),
        (
            choice(vllm_version="0.29.1"),
            "vLLM 0.29.1 chose Model Runner V2 by default (on CUDA since vLLM 0.29)",
            "set VLLM_USE_V2_MODEL_RUNNER=0",
        ),
        (  # vLLM overrides the setting for a feature that needs V2 (HiSparse, watermarking)
            choice(is_cuda=False, requested=False),
            "vLLM 0.30.0 chose Model Runner V2 although VLLM_USE_V2_MODEL_RUNNER=0",
            "switch off the engine feature that requires Model Runner V2",
        ),
        (  # the worker's copy alone on V2 is as unservable off CUDA
            choice(is_cuda=False, requested=True, engine_v2=False),
            "VLLM_USE_V2_MODEL_RUNNER=1 asks for Model Runner V2",
            "set VLLM_USE_V2_MODEL_RUNNER=0",
        ),
    ],
)
def test_model_runner_v2_without_an_afd_runner_is_refused_naming_the_way_out(
    refused: RunnerChoice, reason: str, way_out: str
) -> None:
    """Off CUDA, and before vLLM 0.30, no AFD runner derives from Model Runner V2."""
    where = "CUDA" if refused.is_cuda else "this platform"
    with pytest.raises(AFDConfigError) as error:
        check_model_runner(refused)
    assert str(error.value) == (
        f"{reason}, but the AFD Attention role runs on Model Runner V2 only on CUDA from vLLM "
        f"0.30 (not on {where} with vLLM {refused.vllm_version}); its runners here derive from "
        f"vLLM's V1 runner: {way_out}"
    )


def test_dbo_on_model_runner_v2_needs_two_dp_ranks() -> None:
    """V2 builds a micro-batch runner only with more than one DP rank; the AFD V1 runner splits
    one DP rank alone, so the refusal names both ways out."""
    with pytest.raises(AFDConfigError) as error:
        check_model_runner(choice(dbo=True, requested=True))
    assert str(error.value) == (
        "additional_config.afd.dbo=true with --data-parallel-size=1 on Model Runner V2: V2 "
        "micro-batches only across more than one DP rank (vLLM's maybe_build_ubatch_runner); "
        "allowed: --data-parallel-size >= 2, or VLLM_USE_V2_MODEL_RUNNER=0 (the V1 runner, on "
        "which the AFD Attention runner splits one DP rank alone)"
    )


@pytest.mark.parametrize(
    ("refused", "message"),
    [
        (
            choice(dbo=True, worker_v2=False, data_parallel_size=2),
            "vLLM 0.30.0 schedules this engine for Model Runner V2 but would build the V1 runner "
            "for its AFD Attention worker (additional_config.afd.dbo=true: vLLM 0.30.0 runs DBO "
            "on Model Runner V2 only when VLLM_USE_V2_MODEL_RUNNER is set); allowed: "
            "VLLM_USE_V2_MODEL_RUNNER=1 or VLLM_USE_V2_MODEL_RUNNER=0, which both follow (DBO on "
            "V2 needs --data-parallel-size >= 2)",
        ),
        (  # the other way round, from whatever else tells the worker's copy apart
            choice(engine_v2=False),
            "vLLM 0.30.0 schedules this engine for the V1 runner but would build Model Runner V2 "
            "for its AFD Attention worker; allowed: VLLM_USE_V2_MODEL_RUNNER=1 or "
            "VLLM_USE_V2_MODEL_RUNNER=0, which both follow",
        ),
    ],
)
def test_a_worker_on_another_runner_than_its_scheduler_is_refused(
    refused: RunnerChoice, message: str
) -> None:
    """vLLM 0.30 keeps DBO off Model Runner V2 unless VLLM_USE_V2_MODEL_RUNNER is set: with the
    AFD DBO switched on in the worker's copy only, the worker would build the V1 runner while
    the engine's scheduler schedules for V2. Setting the variable makes both choose alike."""
    with pytest.raises(AFDConfigError) as error:
        check_model_runner(refused)
    assert str(error.value) == message
