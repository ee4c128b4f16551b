"""The model registrations per vLLM release: which native architectures AFD serves where."""

from __future__ import annotations

from pathlib import Path

import pytest

from afd_models.plugin import (
    ARCHITECTURES,
    BY_NATIVE,
    GENERATED,
    afd_architecture,
    registrations,
    served_on,
)
from afd_models.release_order import release_key
from codegen.drift.model_registry import native_architectures


@pytest.mark.parametrize("version", ["0.26.0", "0.28.0+cpu"])
def test_v32_is_served_with_the_v3_class_before_it_has_its_own(version: str) -> None:
    assert afd_architecture("DeepseekV32ForCausalLM", version, "cpu") == "AFDDeepseekV32ForCausalLM"
    # the V3 class reduces its MoE output itself: several lanes are served
    assert (
        afd_architecture("DeepseekV32ForCausalLM", version, "cuda", tensor_parallel_size=2)
        == "AFDDeepseekV32ForCausalLM"
    )
    assert registrations(version)["AFDDeepseekV32ForCausalLM"] == (
        f"{GENERATED}.model_executor.models.deepseek_v2:AFDDeepseekV3ForCausalLM"
    )
    assert set(served_on(version)) == set(BY_NATIVE) - {"DeepseekV4ForCausalLM"}


@pytest.mark.parametrize("version", ["0.30.0+cpu", "0.32.0"])
def test_v32_is_served_from_its_own_cuda_class_where_vllm_gives_it_one(version: str) -> None:
    """From 0.30 vLLM picks V3.2's own class on CUDA and the V3 class elsewhere: AFD serves its
    overlay of the CUDA class, on CUDA only, with one tensor-parallel lane per role."""
    assert registrations(version)["AFDDeepseekV32ForCausalLM"] == (
        f"{GENERATED}.models.deepseek_v32.nvidia.model:AFDDeepseekV32ForCausalLM"
    )
    assert (
        afd_architecture("DeepseekV32ForCausalLM", version, "cuda") == "AFDDeepseekV32ForCausalLM"
    )
    with pytest.raises(ValueError) as refused:
        afd_architecture("DeepseekV32ForCausalLM", version, "cpu")
    assert str(refused.value) == (
        "architecture 'DeepseekV32ForCausalLM' has an AFD model for vLLM's cuda implementation "
        "only, not for this platform ('cpu')"
    )
    # ROCm (device type "cuda") builds another class: V3's on 0.30, deepseek_v32/amd's on 0.32
    with pytest.raises(
        ValueError, match=r"cuda implementation only, not for this platform \('rocm'\)"
    ):
        afd_architecture("DeepseekV32ForCausalLM", version, "rocm")
    with pytest.raises(ValueError) as refused:
        afd_architecture("DeepseekV32ForCausalLM", version, "cuda", tensor_parallel_size=2)
    assert str(refused.value).startswith(
        f"--tensor-parallel-size=2 is not supported with AFD for architecture "
        f"'DeepseekV32ForCausalLM' on vLLM {version}: vLLM's DeepSeek-V3.2 decoder layers leave "
        "their MoE and dense MLP outputs unreduced"
    )
    assert str(refused.value).endswith("; allowed: 1")
    # the other architectures are served as before, with several lanes too
    assert (
        afd_architecture("DeepseekV3ForCausalLM", version, "cuda", tensor_parallel_size=2)
        == "AFDDeepseekV3ForCausalLM"
    )
    assert set(served_on(version)) == set(BY_NATIVE)


def test_an_architecture_without_an_afd_model_is_refused() -> None:
    with pytest.raises(ValueError, match="'LlamaForCausalLM' has no AFD model; supported: "):
        afd_architecture("LlamaForCausalLM", "0.26.0", "cpu")


@pytest.mark.parametrize("version", ["0.26.0", "0.28.0", "0.30.0rc1"])
def test_v4_is_refused_by_name_before_its_cpu_implementation(version: str) -> None:
    """vLLM has V4 on CUDA, ROCm and XPU before 0.30; the CPU implementation AFD's class is
    generated from comes with 0.30 (drift's DRF051 on 0.28 -> 0.30), not with its candidates."""
    with pytest.raises(ValueError) as refused:
        afd_architecture("DeepseekV4ForCausalLM", version, "cpu")
    assert str(refused.value) == (
        "architecture 'DeepseekV4ForCausalLM' has an AFD model from vLLM 0.30, the first release "
        "with vLLM's cpu implementation of it, which AFD's class is generated from; not on vLLM "
        f"{version}"
    )
    assert "AFDDeepseekV4ForCausalLM" not in registrations(version)


@pytest.mark.parametrize("version", ["0.30.0+cpu", "0.32.0"])
def test_v4_is_registered_from_030_for_the_cpu_implementation(version: str) -> None:
    """Registered (the class is generated and checked there), refused by name on CUDA, which it
    has no overlay for, and on the CPU releases whose own V4 cannot run a step."""
    assert registrations(version)["AFDDeepseekV4ForCausalLM"] == (
        f"{GENERATED}.models.deepseek_v4.cpu.model:AFDDeepseekV4ForCausalLM"
    )
    with pytest.raises(
        ValueError, match=r"for vLLM's cpu implementation only, not for this platform \('cuda'\)"
    ):
        afd_architecture("DeepseekV4ForCausalLM", version, "cuda")
    with pytest.raises(ValueError) as refused:
        afd_architecture("DeepseekV4ForCausalLM", version, "cpu")
    assert str(refused.value).startswith(
        f"architecture 'DeepseekV4ForCausalLM' cannot be served on vLLM {version} (cpu): vLLM's "
        "own DeepSeek-V4 fails its first step on the CPU platform"
    )


def test_v4_is_served_on_a_cpu_release_not_known_to_fail() -> None:
    assert afd_architecture("DeepseekV4ForCausalLM", "0.34.0", "cpu") == "AFDDeepseekV4ForCausalLM"


def test_a_vllm_that_does_not_know_its_release_is_refused_naming_it() -> None:
    """A vLLM build that lost its version says ``__version__ == "dev"``: the workers refuse it by
    name, since which classes serve it depends on the release (the plugin registers nothing)."""
    with pytest.raises(ValueError, match=r"'dev' is not a release such as 0\.28\.0"):
        afd_architecture("DeepseekV2ForCausalLM", "dev", "cpu")
    with pytest.raises(ValueError, match="'dev' is not a release"):
        registrations("dev")


def test_each_row_lists_its_classes_oldest_first() -> None:
    """A row's classes serve from their ``since`` on, in order: the first one may serve every
    release, the later ones start at later releases."""
    for row in ARCHITECTURES:
        since = [c.since for c in row.classes]
        assert all(s is not None for s in since[1:]), row.native
        keys = [release_key(s) for s in since if s is not None]
        assert keys == sorted(keys) and len(set(keys)) == len(keys), row.native


def test_drift_reads_the_rows_the_runtime_serves() -> None:
    """``codegen drift`` reads the native architectures from plugin.py without importing it."""
    repo = Path(__file__).resolve().parents[2]
    assert native_architectures(repo) == [row.native for row in ARCHITECTURES]
