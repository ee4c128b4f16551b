"""The inputs digest: sha256 of everything the generated code and the lock depend on. The registry
records it (``INPUTS_DIGEST``); ``regenerate``'s fast path recomputes it and regenerates only when
it differs (:func:`codegen.pipeline.up_to_date`).

What counts: the generator's own modules (:data:`GENERATOR_MODULES`) and the runtime modules
they import (:data:`RUNTIME_MODULES_OF_THE_GENERATOR`), the pins, the overlay
files, the upstream files the generation read (by hash), and the hand-written runtime through
what the lock records of it (:class:`codegen.runtime_uses.RuntimeUses`), not its bytes. Every
module of ``codegen/`` is either a generator module or listed in :data:`NOT_GENERATOR` with the
reason it cannot change generated code or the lock (``tests/unit/test_digest.py``).
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Mapping
from pathlib import Path

from codegen.generate import PINS_PATH
from codegen.runtime_uses import RuntimeUses

#: the ``codegen/`` modules whose code shapes generated code or the lock, relative to ``codegen/``
GENERATOR_MODULES = (
    "__init__.py",
    "call_sites.py",
    "contracts.py",
    "digest.py",
    "edit.py",
    "emit.py",
    "fork.py",
    "generate.py",
    "index.py",
    "lock.py",
    "lock_build.py",
    "markers.py",
    "model.py",
    "names.py",
    "overlay_sites.py",
    "overlay.py",
    "pattern.py",
    "pipeline.py",
    "places.py",
    "releases.py",
    "runtime_uses.py",
    "signatures.py",
    "site_scope.py",
    "sources.py",
    "upstream_values.py",
    "value_sites.py",
)

_CHECKS = "checks a generation: findings only, never generated code or the lock"
_DRIFT = (
    "compares two upstream releases: findings only (generation runs it on an upstream file that "
    "differs from its pinned hash, which the digest has already)"
)

#: the other ``codegen/`` modules, each with why it cannot change generated code or the lock
NOT_GENERATOR: Mapping[str, str] = {
    "__main__.py": "the entry point: runs the command line",
    "cli.py": "the command line: parses arguments and runs a command",
    "fetch.py": "downloads pinned sources into the cache; what they hold counts by file hash",
    "findings.py": "the findings' vocabulary and exit codes; no finding enters generated code or "
    "the lock",
    "report.py": "renders findings (text, Markdown, JSON, SARIF)",
    "show.py": "prints a generated member; writes nothing",
    "checks/__init__.py": _CHECKS,
    "checks/monkeypatch.py": _CHECKS,
    "checks/runtime.py": _CHECKS,
    "checks/suite.py": _CHECKS,
    "audit.py": _DRIFT,
    "drift_run.py": _DRIFT,
    "drift/__init__.py": _DRIFT,
    "drift/call_sites.py": _DRIFT,
    "drift/compare.py": _DRIFT,
    "drift/contracts.py": _DRIFT,
    "drift/features.py": _DRIFT,
    "drift/forks.py": _DRIFT,
    "drift/model_registry.py": _DRIFT,
    "drift/ours.py": _DRIFT,
    "drift/renames.py": _DRIFT,
    "drift/roles.py": _DRIFT,
    "drift/sides.py": _DRIFT,
    "drift/symbols.py": _DRIFT,
    "drift/values.py": _DRIFT,
}

#: the runtime's modules that generator modules import: they decide what is generated too (which
#: releases a ``when=`` range holds, where generated files and the registry go), so they count by
#: their bytes (``tests/unit/test_digest.py`` keeps this list equal to the generator's imports)
RUNTIME_MODULES_OF_THE_GENERATOR = ("afd_models.generated_registry", "afd_models.release_order")

#: ``codegen/``
PACKAGE = Path(__file__).resolve().parent


def generator_digest() -> str:
    """sha256 of the generator's own source: a new generator may produce new output."""
    digest = hashlib.sha256()
    for name in GENERATOR_MODULES:
        digest.update(name.encode())
        digest.update((PACKAGE / name).read_bytes())
    for module in RUNTIME_MODULES_OF_THE_GENERATOR:
        digest.update(module.encode())
        digest.update(Path(str(importlib.import_module(module).__file__)).read_bytes())
    return digest.hexdigest()


def inputs_digest(
    repo_root: Path,
    overlays: Mapping[str, str],
    upstream: Mapping[str, Mapping[str, str]],
    runtime: RuntimeUses,
) -> str:
    """What the output depends on: the generator, the pins, the overlays (``overlays``: path ->
    sha256), the upstream files (``upstream``: package -> {path: sha256}) and what the lock
    records of the runtime."""
    digest = hashlib.sha256()
    digest.update(generator_digest().encode())
    digest.update((repo_root / PINS_PATH).read_bytes())
    for name, sha in sorted(overlays.items()):
        digest.update(f"{name}:{sha}".encode())
    digest.update(f"runtime:{runtime.digest()}".encode())
    for package in sorted(upstream):
        for path, sha in sorted(upstream[package].items()):
            digest.update(f"{path}:{sha}".encode())
    return digest.hexdigest()
