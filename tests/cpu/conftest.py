"""CPU tier: vLLM (CPU build; the primary release, or another supported one) imported and run. Engines run in subprocesses so that each
test gets a fresh vLLM process state; tiny models are built here, from fixed seeds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from afd_models.cli.tiny_models import write_tiny_model
from tests.engine import VLLM_ENV


@pytest.fixture(scope="session")
def vllm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cache = tmp_path_factory.mktemp("vllm-cache")
    return {**os.environ, **VLLM_ENV, "VLLM_CACHE_ROOT": str(cache)}


@pytest.fixture(scope="session")
def tiny_v2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "v2", "v2", seed=0)
