"""Real pinned upstream source (installed vLLM, or the wheel in the download cache); never imported."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from codegen.pipeline import Context, open_context

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def pinned() -> Context:
    return open_context(REPO, quiet=True)


@pytest.fixture(scope="session")
def upstream_copy(tmp_path_factory: pytest.TempPathFactory, pinned: Context) -> Path:
    """A hard-linked copy of the pinned vllm tree that mutation tests may edit file by file."""
    root = tmp_path_factory.mktemp("upstream")
    shutil.copytree(
        pinned.sources["vllm"].package_dir,
        root / "vllm",
        copy_function=os.link,
        ignore=shutil.ignore_patterns("__pycache__", "*.so"),
    )
    return root
