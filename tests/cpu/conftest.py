"""CPU tier: vLLM 0.26.0 (CPU build) imported and run. Engines run in subprocesses so that each
test gets a fresh vLLM process state; tiny models are built here, from fixed seeds."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from afd_models.testing.tiny_models import write_tiny_model

#: environment of every vLLM process the tests start
VLLM_ENV = {
    "VLLM_MLA_DISABLE": "1",
    "TORCHDYNAMO_DISABLE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}


@pytest.fixture(scope="session")
def vllm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cache = tmp_path_factory.mktemp("vllm-cache")
    return {**os.environ, **VLLM_ENV, "VLLM_CACHE_ROOT": str(cache)}


@pytest.fixture(scope="session")
def tiny_v2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "v2", "v2", seed=0)


def run_python(
    code: str, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run a Python snippet in a fresh interpreter; the result's stdout is the snippet's output."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
