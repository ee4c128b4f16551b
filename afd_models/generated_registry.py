"""The generated registry (``afd_models/_generated/__init__.py``), read without importing it.

Where the generated package lies and what its registry's literal assignments say. Standard library
only and importing nothing of the runtime: the freshness check reads it before any generated code
runs, ``codegen`` where it writes and fast-checks its output, and ``tools/cpu_env.py`` which
release the checkout's generated code is for before any environment exists.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

GENERATED_ROOT = Path("afd_models/_generated")
REGISTRY_PATH = GENERATED_ROOT / "__init__.py"


def registry_data(repo_root: Path) -> dict[str, Any] | None:
    """The literal assignments of the generated registry, or None when there is none."""
    path = repo_root / REGISTRY_PATH
    if not path.exists():
        return None
    data: dict[str, Any] = {}
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            data[node.targets[0].id] = ast.literal_eval(node.value)
    return data
