"""NPU tier: the generated code under vLLM-Ascend 0.26.0rc1 on an Ascend NPU.

vLLM-Ascend patches upstream vLLM when its plugins load. ``python -m codegen check`` loads the
general plugins before its runtime checks, so here it proves that no method the overlay forks was
replaced by such a patch (``RT005``: the fork would drop it) and that live signatures still match.
Needs ``torch_npu`` and ``vllm_ascend`` (the ``npu`` extra); skipped elsewhere with the reason
(tests/conftest.py).
"""

from __future__ import annotations

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
        print(type(current_platform).__name__)
        """,
        dict(os.environ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "NPUPlatform"


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
