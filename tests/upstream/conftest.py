"""Real pinned upstream source (installed vLLM, or the wheel in the download cache); never imported."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
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


def changed_tree(
    upstream_copy: Path, tmp_path: Path, changes: Mapping[str, Callable[[str], str]]
) -> Path:
    """A tree equal to the pinned one except the files of ``changes``, each rewritten by its change.

    The copy is hard-linked: a changed file is replaced, never written through.
    """
    root = tmp_path / "tree"
    shutil.copytree(upstream_copy, root, copy_function=os.link)
    for relative, change in changes.items():
        target = root / relative
        text = change(target.read_text())
        target.unlink()
        target.write_text(text)
    return root


def once(old: str, new: str) -> Callable[[str], str]:
    """A change replacing ``old``, which must occur exactly once."""

    def change(text: str) -> str:
        assert text.count(old) == 1, old
        return text.replace(old, new)

    return change
