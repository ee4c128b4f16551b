"""``codegen check`` with vLLM importable: runtime parity, live shadowing, registered and documented paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from afd_models.freshness import installed_vllm
from afd_models.release_order import release_key
from codegen.checks.suite import run_checks
from tests.engine import run_python

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.every_release
def test_check_is_clean_with_runtime() -> None:
    """Every generated class derives from its base, every override/fork has upstream's live signature,
    no extend shadows a live member, and every registered and documented class path imports (on
    the installed release, which the generated code is for). The
    classes generated against vLLM-Ascend, which does not import here, are said to be left to an
    NPU host, once."""
    findings = run_checks(REPO, runtime=True, version=installed_vllm())
    assert [(f.code, f.severity.value, f.symbol) for f in findings] == [
        ("RT001", "info", "vllm_ascend")
    ], [f.one_line() for f in findings]


@pytest.mark.every_release
def test_plugin_registers_afd_names_only(vllm_env: dict[str, str]) -> None:
    """The entry point adds AFD architectures and leaves vLLM's own names on vLLM's classes."""
    result = run_python(
        """
        import json
        from vllm import ModelRegistry
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        models = ModelRegistry.models
        print(json.dumps({name: f"{m.module_name}:{m.class_name}" for name, m in models.items()
                          if ("Deepseek" in name or name.endswith("Qwen3MoeForCausalLM")) and "VL" not in name and "OCR" not in name and "MTP" not in name
                          and "Eagle" not in name}))
        """,
        vllm_env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    table = json.loads(result.stdout.splitlines()[-1])
    assert (
        table["DeepseekV2ForCausalLM"]
        == "vllm.model_executor.models.deepseek_v2:DeepseekV2ForCausalLM"
    )
    generated = "afd_models._generated.vllm.model_executor.models.deepseek_v2"
    assert table["AFDDeepseekV2ForCausalLM"] == f"{generated}:AFDDeepseekV2ForCausalLM"
    if release_key(installed_vllm()) < release_key("0.30"):  # V3.2 runs on vLLM's V3 class
        assert table["AFDDeepseekV32ForCausalLM"] == f"{generated}:AFDDeepseekV3ForCausalLM"
    else:  # V3.2 has a class of its own on CUDA, which AFD serves its overlay of
        assert table["DeepseekV32ForCausalLM"] == "vllm.models.deepseek_v32:DeepseekV32ForCausalLM"
        assert table["AFDDeepseekV32ForCausalLM"] == (
            "afd_models._generated.vllm.models.deepseek_v32.nvidia.model:AFDDeepseekV32ForCausalLM"
        )
    assert (
        table["Qwen3MoeForCausalLM"] == "vllm.model_executor.models.qwen3_moe:Qwen3MoeForCausalLM"
    )
    assert (
        table["AFDQwen3MoeForCausalLM"]
        == "afd_models._generated.vllm.model_executor.models.qwen3_moe:AFDQwen3MoeForCausalLM"
    )


def test_conflicting_registration_is_refused(vllm_env: dict[str, str]) -> None:
    """If another plugin took one of our names, register() fails loudly instead of losing silently."""
    result = run_python(
        """
        from vllm import ModelRegistry
        ModelRegistry.register_model("AFDDeepseekV2ForCausalLM", "somewhere.else:Model")
        from afd_models.plugin import register
        register()
        """,
        vllm_env,
    )
    assert result.returncode != 0
    assert "already registered as somewhere.else:Model" in result.stderr
