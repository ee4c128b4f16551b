"""The import-time release check: the generated code must be for the installed vLLM."""

from __future__ import annotations

import pytest

from afd_models.freshness import GeneratedCodeError, check_release

REGISTRY = {"UPSTREAM": {"vllm": "0.26.0"}, "SUPPORTED": {"vllm": ("0.26.0", "0.28.0")}}


@pytest.mark.parametrize("installed", ["0.26.0", None])
def test_the_generated_release_or_no_vllm_passes(installed: str | None) -> None:
    check_release(REGISTRY, installed)


def test_another_supported_release_asks_for_regeneration() -> None:
    with pytest.raises(GeneratedCodeError) as error:
        check_release(REGISTRY, "0.28.0")
    message = str(error.value)
    assert "generated for vLLM 0.26.0, but vLLM 0.28.0 is installed" in message
    assert "supported: 0.26.0, 0.28.0" in message and "python -m codegen regenerate" in message


def test_an_unsupported_release_names_installed_and_supported() -> None:
    with pytest.raises(GeneratedCodeError) as error:
        check_release(REGISTRY, "0.30.0")
    message = str(error.value)
    assert "vLLM 0.30.0 is installed, which vllm-afd-overlay does not support" in message
    assert "supported releases: 0.26.0, 0.28.0" in message
