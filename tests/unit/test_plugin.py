"""The model registrations per vLLM release: which native architectures AFD serves where."""

from __future__ import annotations

import pytest

from afd_models.plugin import (
    AFD_ARCHITECTURES,
    GENERATED_MODELS,
    afd_architecture,
    registrations,
    release_numbers,
    served_on,
)


@pytest.mark.parametrize(
    ("version", "numbers"),
    [
        ("0.26.0", (0, 26, 0)),
        ("0.30.0+cpu", (0, 30, 0)),
        ("0.26.0rc1", (0, 26, 0)),
        ("0.3", (0, 3)),
    ],
)
def test_release_numbers(version: str, numbers: tuple[int, ...]) -> None:
    assert release_numbers(version) == numbers


@pytest.mark.parametrize("version", ["0.26.0", "0.28.0+cpu"])
def test_v32_is_served_with_the_v3_class_before_it_has_its_own(version: str) -> None:
    assert afd_architecture("DeepseekV32ForCausalLM", version) == "AFDDeepseekV32ForCausalLM"
    assert registrations(version)["AFDDeepseekV32ForCausalLM"] == (
        f"{GENERATED_MODELS}.deepseek_v2:AFDDeepseekV3ForCausalLM"
    )
    assert set(served_on(version)) == set(AFD_ARCHITECTURES)


@pytest.mark.parametrize("version", ["0.30.0+cpu", "0.32.0"])
def test_v32_is_refused_by_name_where_vllm_gives_it_its_own_class(version: str) -> None:
    with pytest.raises(ValueError) as refused:
        afd_architecture("DeepseekV32ForCausalLM", version)
    assert str(refused.value) == (
        f"architecture 'DeepseekV32ForCausalLM' has a model class of its own in vLLM {version} "
        "(vllm.models.deepseek_v32, since 0.30), which AFD has no overlay of yet; AFD serves it "
        "on vLLM releases before 0.30 only"
    )
    assert "AFDDeepseekV32ForCausalLM" not in registrations(version)
    # the other architectures are served as before
    assert afd_architecture("DeepseekV3ForCausalLM", version) == "AFDDeepseekV3ForCausalLM"
    assert set(served_on(version)) == set(AFD_ARCHITECTURES) - {"DeepseekV32ForCausalLM"}


def test_an_architecture_without_an_afd_model_is_refused() -> None:
    with pytest.raises(ValueError, match="'LlamaForCausalLM' has no AFD model; supported: "):
        afd_architecture("LlamaForCausalLM", "0.26.0")
