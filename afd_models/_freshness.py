"""The import-time check that ``afd_models/_generated`` exists and matches its inputs.

Cheap by design (no vLLM import, a few file hashes): it compares the generated files with the
digests their registry recorded and, in a source checkout, the overlay files and lock with what
the code was generated from. Any mismatch is one :class:`GeneratedCodeError` naming the command
that fixes it.
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
GENERATED_DIR = PACKAGE_DIR / "_generated"
#: the source checkout, or site-packages for an installed wheel
CHECKOUT_ROOT = PACKAGE_DIR.parent
FIX = "run `nox -s regenerate` (or `python -m codegen regenerate`) in the source checkout"


class GeneratedCodeError(ImportError):
    """afd_models/_generated is missing or stale."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _registry() -> dict[str, object]:
    path = GENERATED_DIR / "__init__.py"
    if not path.exists():
        raise GeneratedCodeError(
            f"afd_models/_generated is missing (generated code is a build artifact): {FIX}"
        )
    values: dict[str, object] = {}
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            values[node.targets[0].id] = ast.literal_eval(node.value)
    return values


def check_generated_code() -> None:
    """Raise GeneratedCodeError if the generated code is missing, edited, or older than its inputs."""
    registry = _registry()
    files = registry.get("FILES")
    overlays = registry.get("OVERLAYS")
    if not isinstance(files, dict) or not isinstance(overlays, dict):
        raise GeneratedCodeError(
            f"afd_models/_generated/__init__.py is not a registry written by codegen: {FIX}"
        )
    for relative, digest in files.items():
        path = CHECKOUT_ROOT / relative
        if not path.exists() or _sha256(path) != digest:
            raise GeneratedCodeError(f"{relative} is missing or was edited after generation: {FIX}")
    overlay_dir = CHECKOUT_ROOT / "overlay"
    if not overlay_dir.is_dir():
        return  # an installed wheel: no overlay to compare with
    for relative, digest in overlays.items():
        path = CHECKOUT_ROOT / relative
        if not path.exists() or _sha256(path) != digest:
            raise GeneratedCodeError(f"{relative} changed since the code was generated: {FIX}")
    current = {
        p.relative_to(CHECKOUT_ROOT).as_posix()
        for p in overlay_dir.rglob("*.py")
        if p.name != "__init__.py"
    }
    if current != set(overlays):
        raise GeneratedCodeError(
            f"overlay files were added or removed since the code was generated: {FIX}"
        )
    lock = overlay_dir / "overlay.lock"
    if lock.exists():
        generated = json.loads(lock.read_text()).get("generated", {})
        registry_file = (GENERATED_DIR / "__init__.py").relative_to(CHECKOUT_ROOT).as_posix()
        if generated.get(registry_file) != _sha256(GENERATED_DIR / "__init__.py"):
            raise GeneratedCodeError(f"overlay/overlay.lock describes other generated code: {FIX}")
