"""This checkout, and copies of it as a fresh clone has it (shared by the upstream and e2e tiers)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def tracked_copy(root: Path) -> Path:
    """Copy the files git tracks (their working-tree contents) to ``root``: a fresh clone of
    this checkout, without its generated code."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True, timeout=60
    ).stdout.decode()
    for name in filter(None, files.split("\0")):
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    return root
