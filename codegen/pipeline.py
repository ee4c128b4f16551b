"""Wire the stages: locate upstream -> index -> build -> emit -> lock; and write the result atomically."""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codegen.emit import package_files, render_module, render_registry
from codegen.findings import Finding, Kind, Location, Severity
from codegen.generate import (
    GENERATED_ROOT,
    LOCK_PATH,
    PINS_PATH,
    Generation,
    build,
    inputs_digest,
    overlay_hashes,
    upstream_files,
)
from codegen.index import UpstreamIndex
from codegen.lock import build_lock, read_lock, render_lock, sha256_of
from codegen.sources import Pin, UpstreamSource, load_pins, locate

REGISTRY_PATH = GENERATED_ROOT / "__init__.py"


@dataclass(frozen=True)
class Context:
    """Where the repository is and which upstream sources to read."""

    repo_root: Path
    pins: dict[str, Pin]
    sources: dict[str, UpstreamSource]

    @property
    def versions(self) -> dict[str, str]:
        return {package: source.version for package, source in self.sources.items()}


def open_context(
    repo_root: Path,
    *,
    upstream_root: Path | None = None,
    use_installed: bool = True,
    version: str | None = None,
    quiet: bool = False,
) -> Context:
    """Read the pins and locate each pinned package's source (``upstream_root`` replaces vllm's)."""
    pins = load_pins(repo_root / PINS_PATH)
    sources = {}
    for package, pin in pins.items():
        root = upstream_root if package == "vllm" else None
        wanted = version if package == "vllm" else None
        sources[package] = locate(
            pin, wanted, upstream_root=root, use_installed=use_installed, quiet=quiet
        )
    return Context(repo_root, pins, sources)


def generate(context: Context) -> tuple[Generation, UpstreamIndex]:
    """Build, render and lock in memory. Text and lock are empty when a finding blocks."""
    index = UpstreamIndex(context.sources)
    generation = build(context.repo_root, index)
    if generation.blocked:
        return generation, index
    versions = context.versions
    upstream = upstream_files(index)
    flat = {path: sha for files in upstream.values() for path, sha in files.items()}
    modules = {
        overlay.generated_path.as_posix(): render_module(overlay, generation, versions, flat)
        for overlay in generation.overlays
        if overlay.generated_module in generation.namespaces
    }
    files = {**package_files(modules), **modules}
    digest = inputs_digest(context.repo_root, overlay_hashes(context.repo_root), upstream)
    files[REGISTRY_PATH.as_posix()] = render_registry(
        generation, versions, digest, sha256_of(files.items())
    )
    generation.files = dict(sorted(files.items()))
    generation.lock = build_lock(
        generation, index, versions, upstream, sha256_of(generation.files.items())
    )
    _check_pinned_hashes(context, generation)
    return generation, index


def _check_pinned_hashes(context: Context, generation: Generation) -> None:
    """An upstream file whose content differs from the lock at the *same* version is suspicious."""
    lock = read_lock(context.repo_root / LOCK_PATH)
    if lock is None:
        return
    for package, entry in lock.get("upstream", {}).items():
        current = generation.lock["upstream"].get(package)
        if current is None or current["version"] != entry.get("version"):
            continue
        for path, sha in entry.get("files", {}).items():
            now = current["files"].get(path)
            if now is not None and now != sha:
                generation.findings.append(
                    Finding(
                        Kind.UPSTREAM_HASH,
                        Severity.BLOCK,
                        path,
                        f"{package} {entry['version']} file differs from the pinned hash "
                        f"({context.sources[package].origin}); is this really the pinned release?",
                        upstream=Location(path),
                        old=sha,
                        new=now,
                    )
                )


# --------------------------------------------------------------------------- writing


def write_output(repo_root: Path, generation: Generation) -> None:
    """Replace ``afd_models/_generated`` and the lock; a failure leaves the previous output in place.

    Files are written into a staging directory first, then swapped in with two renames.
    """
    target = repo_root / GENERATED_ROOT
    parent = target.parent
    staging = Path(tempfile.mkdtemp(dir=parent, prefix=".generated-new-"))
    try:
        for path, text in generation.files.items():
            out = staging / Path(path).relative_to(GENERATED_ROOT)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
        retired = parent / f".generated-old-{os.getpid()}"
        if target.exists():
            target.rename(retired)
        staging.rename(target)
        shutil.rmtree(retired, ignore_errors=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    _write_atomic(repo_root / LOCK_PATH, render_lock(generation.lock))


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# --------------------------------------------------------------------------- fast path


def registry_data(repo_root: Path) -> dict[str, Any] | None:
    """The literal assignments of the generated registry, read without importing it."""
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


def up_to_date(context: Context) -> bool:
    """True when nothing the output depends on changed since the last regeneration.

    Hashes the generator, pins, overlays and the upstream files the lock lists, and the generated
    files themselves; parses nothing.
    """
    registry = registry_data(context.repo_root)
    lock = read_lock(context.repo_root / LOCK_PATH)
    if (
        registry is None
        or lock is None
        or lock.get("upstream", {}).keys() != context.sources.keys()
    ):
        return False
    upstream: dict[str, dict[str, str]] = {}
    for package, entry in lock["upstream"].items():
        source = context.sources[package]
        if entry.get("version") != source.version:
            return False
        files = {}
        for path in entry.get("files", {}):
            file = source.root / path
            if not file.exists():
                return False
            files[path] = hashlib.sha256(file.read_bytes()).hexdigest()
        upstream[package] = files
    if inputs_digest(
        context.repo_root, overlay_hashes(context.repo_root), upstream
    ) != registry.get("INPUTS_DIGEST"):
        return False
    expected = dict(lock.get("generated", {}))
    for path, sha in expected.items():
        file = context.repo_root / path
        if not file.exists() or hashlib.sha256(file.read_bytes()).hexdigest() != sha:
            return False
    return True
