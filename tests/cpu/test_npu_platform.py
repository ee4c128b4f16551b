"""Selecting AFD's NPU platform (afd_models.platforms) where no NPU exists: the platform plugin is
active only when ``VLLM_PLUGINS`` names it and vLLM-Ascend is installed (a stand-in package here),
and the AFD NPU workers refuse any other platform, saying how to select it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from afd_models.config import AFDConfigError
from afd_models.platforms import AFD_NPU_PLATFORM, NPU_PLUGINS, require_afd_npu_platform
from tests.engine import run_python

REPO = Path(__file__).resolve().parents[2]


def _platform(tmp_path: Path, plugins: str | None, ascend_installed: bool) -> str:
    """What the plugin returns in a fresh interpreter (vLLM reads VLLM_PLUGINS once)."""
    if ascend_installed:
        (tmp_path / "vllm_ascend").mkdir()
        (tmp_path / "vllm_ascend" / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path)])
    if plugins is not None:
        env["VLLM_PLUGINS"] = plugins
    result = run_python("from afd_models.platforms import npu_platform\nprint(npu_platform())", env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()[-1]


@pytest.mark.parametrize(
    ("plugins", "ascend_installed", "expected"),
    [
        (",".join(NPU_PLUGINS), True, AFD_NPU_PLATFORM),
        (None, True, "None"),  # every plugin loads: ours must not compete with vLLM-Ascend's
        ("ascend,afd", True, "None"),
        (",".join(NPU_PLUGINS), False, "None"),  # named, but no vLLM-Ascend to derive from
    ],
)
def test_the_platform_is_ours_only_where_named_and_vllm_ascend_is_installed(
    tmp_path: Path, plugins: str | None, ascend_installed: bool, expected: str
) -> None:
    assert _platform(tmp_path, plugins, ascend_installed) == expected


def test_an_npu_worker_on_another_platform_says_how_to_select_ours() -> None:
    with pytest.raises(AFDConfigError) as error:
        require_afd_npu_platform()
    assert str(error.value) == (
        f"the AFD NPU workers run on the platform {AFD_NPU_PLATFORM}, but vLLM selected "
        "vllm.platforms.cpu.CpuPlatform; set VLLM_PLUGINS=afd_npu,afd_models,ascend_kv_connector,"
        "ascend_model_loader,ascend_service_profiling,ascend_model (see docs/npu.md)"
    )
