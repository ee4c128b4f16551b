"""NPU tier: the generated code under vLLM-Ascend 0.26.0rc1 on an Ascend NPU.

vLLM-Ascend patches upstream vLLM at run time: its platform patches when its general plugins load
or the platform is set up, its worker patches in ``NPUWorker.__init__`` (see
``codegen.checks.runtime.apply_platform_patches``). ``python -m codegen check`` applies both, as
vLLM-Ascend's workers have them, before its runtime checks; here it proves that the worker patches
are seen, and that no method the overlay forks or relies on and no upstream name it imports was
replaced by such a patch (``RT005``) and that live signatures still match.
Needs ``torch_npu`` and ``vllm_ascend`` (the ``npu`` extra); skipped elsewhere with the reason
(tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.engine import run_python

REPO = Path(__file__).resolve().parents[2]


def test_the_platform_is_ascend() -> None:
    result = run_python(
        """
        from vllm.platforms import current_platform
        from vllm_ascend.platform import NPUPlatform
        print(isinstance(current_platform, NPUPlatform))
        """,
        dict(os.environ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "True"  # vLLM-Ascend's, or AFD's subclass of it


def test_the_check_applies_the_worker_patches() -> None:
    """The general plugins leave ``DeepseekV2Model.forward`` alone; the check's import of
    vLLM-Ascend's patch packages, as ``NPUWorker.__init__`` does, puts its replacement
    (vllm_ascend/patch/worker/patch_deepseek_v2.py) in place, where ``foreign_code`` sees it."""
    result = run_python(
        """
        import json
        from vllm.platforms import current_platform
        from vllm.plugins import load_general_plugins
        from codegen.checks.runtime import apply_platform_patches, foreign_code, platform_package

        load_general_plugins()
        from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model

        before = foreign_code(DeepseekV2Model, "forward")
        applied = apply_platform_patches(platform_package(current_platform))
        print(json.dumps([before, applied, foreign_code(DeepseekV2Model, "forward")]))
        """,
        {**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    before, applied, after = json.loads(result.stdout.splitlines()[-1])
    assert before is None
    assert applied == ["vllm_ascend.patch.platform", "vllm_ascend.patch.worker"]
    assert after is not None and "/vllm_ascend/patch/worker/" in after


def test_codegen_check_is_clean_with_vllm_ascend_loaded() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "codegen", "check", "--format", "text"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "0 block, 0 review" in result.stdout
