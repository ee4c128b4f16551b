"""Which class vLLM builds for an architecture on each platform, read statically from the
registry and a model package's per-platform pick: the drift rule on it (DRF051) and the check
that AFD serves its classes only where vLLM builds their bases (PTH003)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from afd_models.plugin import model_platform
from codegen.checks.suite import served_class_findings
from codegen.drift.model_registry import PLATFORMS, platform_picks, registry_findings
from codegen.drift.sides import Side
from codegen.findings import Severity
from codegen.index import UpstreamIndex
from codegen.model import SymbolRef
from codegen.sources import UpstreamSource

V4 = "vllm.models.deepseek_v4"
REGISTRY = '_MODELS = {{"DeepseekV4ForCausalLM": ("{module}", "DeepseekV4ForCausalLM")}}\n'
#: vLLM 0.30's shape of the pick: ROCm, XPU and CPU by name, NVIDIA otherwise
PICK = """from vllm.platforms import current_platform

if current_platform.is_rocm():
    from .amd.model import DeepseekV4ForCausalLM
elif current_platform.is_xpu():
    from .xpu.model import DeepseekV4ForCausalLM
elif current_platform.is_cpu():
    from .cpu.model import DeepseekV4ForCausalLM  # type: ignore[assignment]
else:
    from .nvidia.model import DeepseekV4ForCausalLM
"""


def index(tmp_path: Path, name: str, pick: str, registry_module: str = V4) -> UpstreamIndex:
    """An upstream tree of ``vllm`` with a registry entry for V4 and ``pick`` as its package."""
    root = tmp_path / name
    files = {
        "vllm/model_executor/models/registry.py": REGISTRY.format(module=registry_module),
        "vllm/model_executor/models/deepseek_v2.py": "class DeepseekV3ForCausalLM: ...\n",
        "vllm/models/deepseek_v4/__init__.py": pick,
        **{
            f"vllm/models/deepseek_v4/{impl}/model.py": "class DeepseekV4ForCausalLM: ...\n"
            for impl in ("amd", "xpu", "cpu", "nvidia")
        },
    }
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    for package in ("vllm", "vllm/model_executor", "vllm/model_executor/models", "vllm/models"):
        (root / package / "__init__.py").touch()
    return UpstreamIndex({"vllm": UpstreamSource("vllm", name, root, f"tree {root}")})


def test_each_platform_gets_the_branch_it_takes(tmp_path: Path) -> None:
    picks = platform_picks(index(tmp_path, "0.30", PICK), (V4, "DeepseekV4ForCausalLM"))
    assert picks == {
        "cuda": f"{V4}.nvidia.model:DeepseekV4ForCausalLM",
        "rocm": f"{V4}.amd.model:DeepseekV4ForCausalLM",
        "xpu": f"{V4}.xpu.model:DeepseekV4ForCausalLM",
        "cpu": f"{V4}.cpu.model:DeepseekV4ForCausalLM",
        "tpu": f"{V4}.nvidia.model:DeepseekV4ForCausalLM",
        "out-of-tree": f"{V4}.nvidia.model:DeepseekV4ForCausalLM",
    }


def test_aliases_raises_and_combined_tests_are_followed(tmp_path: Path) -> None:
    """V3.2's shape: an aliased import of another family's class, ``not`` / ``or`` tests, a
    module that raises on some platforms, and a test of no platform, which is named."""
    pick = """from vllm.platforms import current_platform

if current_platform.is_xpu() or current_platform.is_tpu():
    raise NotImplementedError("not here")
if not current_platform.is_cuda_alike():
    from vllm.model_executor.models.deepseek_v2 import DeepseekV3ForCausalLM as DeepseekV4ForCausalLM
elif envs.VLLM_SOMETHING:
    from .amd.model import DeepseekV4ForCausalLM
else:
    from .nvidia.model import DeepseekV4ForCausalLM
"""
    picks = platform_picks(index(tmp_path, "x", pick), (V4, "DeepseekV4ForCausalLM"))
    assert picks == {
        "cuda": "unreadable: envs.VLLM_SOMETHING",
        "rocm": "unreadable: envs.VLLM_SOMETHING",
        "xpu": "raises NotImplementedError",
        "cpu": "vllm.model_executor.models.deepseek_v2:DeepseekV3ForCausalLM",
        "tpu": "raises NotImplementedError",
        "out-of-tree": "vllm.model_executor.models.deepseek_v2:DeepseekV3ForCausalLM",
    }


def test_a_moved_platform_branch_blocks_and_names_the_platform(tmp_path: Path) -> None:
    """0.28 -> 0.30 for V4: the CPU platform stops taking the NVIDIA class and gets its own."""
    before = PICK.replace("current_platform.is_cpu()", "False and current_platform.is_cpu()")
    old = Side("0.28", index(tmp_path, "0.28", before))
    new = Side("0.30", index(tmp_path, "0.30", PICK))
    [finding] = registry_findings(["DeepseekV4ForCausalLM"], old, new)
    assert (finding.code, finding.severity) == ("DRF051", Severity.BLOCK)
    assert "builds another class for it on cpu:" in finding.message
    assert f"cpu, tpu, out-of-tree: {V4}.nvidia.model:DeepseekV4ForCausalLM" in (finding.old or "")
    assert f"cpu: {V4}.cpu.model:DeepseekV4ForCausalLM" in (finding.new or "")
    assert list(registry_findings(["DeepseekV4ForCausalLM"], new, new)) == []


def test_a_new_registry_module_is_reviewed_with_its_picks(tmp_path: Path) -> None:
    """A registry entry that maps elsewhere is DRF050 (review), the picks as details."""
    old = Side("0.28", index(tmp_path, "0.28", PICK, "deepseek_v2"))
    new = Side("0.30", index(tmp_path, "0.30", PICK))
    [finding] = registry_findings(["DeepseekV4ForCausalLM"], old, new)
    assert (finding.code, finding.severity) == ("DRF050", Severity.REVIEW)
    assert finding.details[0].startswith("per platform before: cuda, rocm, xpu, cpu, tpu, ")
    assert f"rocm: {V4}.amd.model:DeepseekV4ForCausalLM" in finding.details[1]


def generation(base: str) -> SimpleNamespace:
    """What :func:`served_class_findings` reads of a generation: AFD's V4 class and its base."""
    afd = SimpleNamespace(
        module="afd_models._generated.vllm.models.deepseek_v4.cpu.model",
        name="AFDDeepseekV4ForCausalLM",
        base=SymbolRef.parse(base),
    )
    return SimpleNamespace(classes=[afd])


def test_afd_serves_its_class_only_where_vllm_builds_its_base(tmp_path: Path) -> None:
    """AFD serves V4 on cpu (its class's platforms in afd_models.plugin) with a subclass of the CPU class: clean
    where vLLM builds that class on cpu, a block naming both classes where it builds another."""
    upstream = index(tmp_path, "0.30", PICK)
    cpu = generation(f"{V4}.cpu.model:DeepseekV4ForCausalLM")
    assert served_class_findings(cpu, upstream, "0.30.0") == []  # type: ignore[arg-type]
    nvidia = generation(f"{V4}.nvidia.model:DeepseekV4ForCausalLM")
    [finding] = served_class_findings(nvidia, upstream, "0.30.0")  # type: ignore[arg-type]
    assert (finding.code, finding.severity, finding.symbol) == (
        "PTH003",
        Severity.BLOCK,
        "DeepseekV4ForCausalLM",
    )
    assert f"on cpu with a subclass of {V4}.nvidia.model:DeepseekV4ForCausalLM" in finding.message
    assert f"builds {V4}.cpu.model:DeepseekV4ForCausalLM there" in finding.message


@pytest.mark.parametrize(
    ("device_type", "is_rocm", "platform"),
    [("cuda", False, "cuda"), ("cuda", True, "rocm"), ("cpu", False, "cpu"), ("npu", False, "npu")],
)
def test_rocm_is_its_own_platform(device_type: str, is_rocm: bool, platform: str) -> None:
    """vLLM's ROCm platform reports the ``cuda`` device type, but model packages pick their
    ``amd`` implementation there: AFD's platforms tell the two apart, as the picks do."""
    assert model_platform(device_type, is_rocm=is_rocm) == platform
    assert platform in PLATFORMS or platform == "npu"
