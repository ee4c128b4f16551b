"""CPU tier: vLLM (CPU build; the primary release, or another supported one) imported and run. Engines run in subprocesses so that each
test gets a fresh vLLM process state; tiny models are built here, from fixed seeds."""

from __future__ import annotations

import os
from collections.abc import Hashable
from pathlib import Path

import pytest

from afd_models.cli.tiny_models import write_tiny_model
from tests.engine import VLLM_ENV
from tests.verify_runs import VerifyRun, session_runs


@pytest.fixture(scope="session")
def vllm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cache = tmp_path_factory.mktemp("vllm-cache")
    return {**os.environ, **VLLM_ENV, "VLLM_CACHE_ROOT": str(cache)}


@pytest.fixture(scope="session")
def tiny_v2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "v2", "v2", seed=0)


@pytest.fixture(scope="session")
def verify_runs(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    vllm_env: dict[str, str],
) -> dict[Hashable, VerifyRun]:
    """Every selected ``verify`` case of the session, two at a time (tests/verify_runs.py)."""
    env = {k: v for k, v in vllm_env.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    return session_runs(request.session, tmp_path_factory.mktemp("verify"), env)
