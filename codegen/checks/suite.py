"""``python -m codegen check``: every check, in order, as one list of findings.

1. regenerate in memory: overlay validity, exact signatures, anchors, names (static); upstream
   files that differ from their pinned hashes, with the recorded symbols that changed in them;
2. the lock: the committed lock of the release (``overlay/overlay.lock`` for the primary pins,
   ``overlay/locks/`` for the other supported releases) equals the regenerated one (diff on
   mismatch);
3. generated files on disk equal the regeneration (missing ones are only noted: a fresh clone),
   when they are that release's;
4. no monkey patches anywhere in the project;
5. with vLLM importable (its general plugins loaded and, on an out-of-tree platform such as
   vLLM-Ascend, the platform's patch packages imported as its workers do) and fresh generated
   code: runtime signature parity, extend shadowing, forks and relied-on inherited methods and
   imported names that a patch replaced, registered and documented dotted paths.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from afd_models.generated_registry import GENERATED_ROOT, registry_data
from codegen.checks import monkeypatch
from codegen.checks.runtime import (
    apply_platform_patches,
    check_classes,
    check_imports,
    check_paths,
    documented_paths,
    platform_package,
    worker_paths,
)
from codegen.drift.model_registry import platform_picks, registry_table
from codegen.findings import Finding, Kind, Location, Severity
from codegen.generate import Generation
from codegen.index import UpstreamIndex
from codegen.lock import LockFormatError, lock_diff, read_lock, render_lock
from codegen.pipeline import generate, open_context, pinned_hash_findings
from codegen.sources import Pin, SourceError, installed_version

Progress = Callable[[str], None]


def compare_lock(repo_root: Path, generation: Generation) -> list[Finding]:
    relative = generation.lock_path
    path = repo_root / relative
    assert generation.lock is not None, "a blocked generation has no lock to compare"
    fresh = render_lock(generation.lock)
    if not path.exists():
        return [
            Finding(
                Kind.LOCK_MISSING,
                Severity.BLOCK,
                str(relative),
                "is missing; run `nox -s regenerate` and commit it",
            )
        ]
    committed = path.read_text()
    if committed == fresh:
        return []
    try:
        read_lock(path, str(relative))
        message = "differs from a regeneration; run `nox -s regenerate`, review the diff and commit the lock"
    except LockFormatError as exc:
        message = str(exc).removeprefix(f"{relative} ")
    return [
        Finding(
            Kind.LOCK_DIFFERS,
            Severity.BLOCK,
            str(relative),
            message,
            Location(str(relative)),
            details=tuple(lock_diff(committed, fresh)),
        )
    ]


def compare_generated(repo_root: Path, generation: Generation) -> list[Finding]:
    expected = generation.files
    on_disk = {
        p.relative_to(repo_root).as_posix()
        for p in (repo_root / GENERATED_ROOT).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    if not on_disk:
        return [
            Finding(
                Kind.GENERATED_MISSING,
                Severity.INFO,
                str(GENERATED_ROOT),
                "is not generated yet (run `nox -s regenerate`)",
            )
        ]
    findings = []
    for path in sorted(set(expected) | on_disk):
        file = repo_root / path
        if path not in expected:
            findings.append(
                Finding(
                    Kind.GENERATED_STALE,
                    Severity.BLOCK,
                    path,
                    "is not produced by the overlay any more; regenerate",
                )
            )
        elif not file.exists():
            findings.append(
                Finding(Kind.GENERATED_MISSING, Severity.BLOCK, path, "is missing; regenerate")
            )
        elif file.read_text() != expected[path]:
            findings.append(
                Finding(
                    Kind.GENERATED_STALE,
                    Severity.BLOCK,
                    path,
                    "differs from a regeneration; regenerate",
                )
            )
    return findings


def served_class_findings(
    generation: Generation, index: UpstreamIndex, vllm_version: str
) -> list[Finding]:
    """On each platform AFD serves an architecture on (``afd_models.plugin.served_platforms``),
    vLLM ``vllm_version`` builds the class AFD's class derives from, read statically from the
    registry and the model package's per-platform pick."""
    from afd_models import plugin  # imports nothing heavy

    bases = {f"{c.module}:{c.name}": c.base for c in generation.classes}
    registry = registry_table(index)
    findings = []
    for native, (_, path) in plugin.served_on(vllm_version).items():
        platforms = plugin.served_platforms(native, vllm_version)
        base = bases.get(f"{plugin.GENERATED}.{path}")
        if platforms is None or base is None or native not in registry:
            continue
        picks = platform_picks(index, registry[native])
        for platform in platforms:
            if picks[platform] != str(base):
                findings.append(
                    Finding(
                        Kind.PATH_PLATFORM,
                        Severity.BLOCK,
                        native,
                        f"AFD serves it on {platform} with a subclass of {base}, but vLLM "
                        f"{vllm_version} builds {picks[platform]} there; correct its platforms in "
                        "afd_models/plugin.py or its overlay's base",
                    )
                )
    return findings


def runtime_findings(
    repo_root: Path, generation: Generation, pins: Mapping[str, Pin]
) -> list[Finding]:
    # vLLM and the runtime are imported only here: the static checks run without them, and
    # importing vLLM costs seconds
    from vllm import ModelRegistry
    from vllm.platforms import current_platform
    from vllm.plugins import load_general_plugins

    # as the worker processes that run the model are: a plugin's patches of upstream must be in
    # place to be seen. Every engine process loads the general plugins; an out-of-tree platform's
    # workers also import its patch packages (vLLM-Ascend: in NPUWorker.__init__).
    load_general_plugins()
    package = platform_package(current_platform)
    if package is not None:
        apply_platform_patches(package)

    from vllm import __version__

    from afd_models import plugin  # imports nothing heavy; vLLM comes with the first class

    registered = {}
    paths = plugin.registrations(__version__)
    here = plugin.model_platform(current_platform.device_type, is_rocm=current_platform.is_rocm())
    for native, (afd_name, _) in plugin.served_on(__version__).items():
        platforms = plugin.served_platforms(native, __version__)
        if platforms is not None and here not in platforms:
            continue  # vLLM's registration stands for another platform's class here
        lazy: Any = ModelRegistry.models[native]  # vLLM's lazily imported registration
        registered[paths[afd_name]] = f"{lazy.module_name}:{lazy.class_name}"
    # a pinned package that is not installed (vLLM-Ascend off an Ascend host) cannot be imported:
    # what was generated against it is checked statically only, and said so once per package
    assert generation.lock is not None, "the live checks run on an unblocked generation"
    absent = frozenset(
        package for package in generation.lock.upstream if importlib.util.find_spec(package) is None
    )
    classes = [c for c in generation.classes if _package(c.base.module) not in absent]
    symbols = {
        key: entry for key, entry in generation.lock.symbols.items() if _package(key) not in absent
    }
    findings = [
        Finding(
            Kind.RUNTIME_UNAVAILABLE,
            Severity.INFO,
            package,
            f"is not importable here; the runtime checks of the "
            f"{sum(_package(c.base.module) == package for c in generation.classes)} classes "
            "generated against it, and of the documented paths that need it, run where it is "
            "installed",
        )
        for package in sorted(absent)
    ]
    findings.extend(check_classes(classes))
    accepted = frozenset(r for pin in pins.values() for r in pin.patches)
    findings.extend(check_imports(symbols, accepted))
    named = {**worker_paths(), **documented_paths(repo_root)}
    findings.extend(check_paths(classes, registered, named, absent))
    return findings


def _package(dotted: str) -> str:
    """``vllm_ascend.worker.worker:NPUWorker`` -> ``vllm_ascend``."""
    return dotted.split(":")[0].split(".")[0]


def run_checks(
    repo_root: Path,
    *,
    upstream_root: Path | None = None,
    use_installed: bool = True,
    runtime: bool = True,
    progress: Progress = lambda _: None,
    version: str | None = None,
    tag: bool = False,
) -> list[Finding]:
    """Every check against vLLM ``version`` (default: the primary pin). The generated code on
    disk and the runtime are checked only when they are that release's; ``tag`` prefixes the
    release to each finding of the generation (when several releases are checked)."""
    try:
        context = open_context(
            repo_root, upstream_root=upstream_root, use_installed=use_installed, version=version
        )
    except SourceError as exc:
        return [Finding(Kind.UPSTREAM_MISSING, Severity.BLOCK, "upstream", str(exc))]
    origins = ", ".join(
        f"{s.package} {s.version} from {s.origin}" for s in context.sources.values()
    )
    progress(f"checking against {origins}")
    generation, index = generate(context)
    findings = list(generation.findings)
    findings.extend(served_class_findings(generation, index, context.versions["vllm"]))
    if (
        generation.lock is None
    ):  # generate() stopped at a blocking finding, before the pinned hashes
        findings.extend(pinned_hash_findings(context, index))
    if tag:
        findings = [
            dataclasses.replace(f, message=f"[vllm {context.versions['vllm']}] {f.message}")
            for f in findings
        ]
    checked = context.versions["vllm"]
    on_disk_release = (registry_data(repo_root) or {}).get("UPSTREAM", {}).get("vllm")
    installed = installed_version(context.pins["vllm"])
    fresh = False
    if not generation.blocked:
        findings.extend(compare_lock(repo_root, generation))
        if on_disk_release in (None, checked):
            on_disk = compare_generated(repo_root, generation)
            findings.extend(on_disk)
            fresh = not on_disk
        elif checked == installed:  # the code on disk cannot run with the installed vLLM
            findings.append(
                Finding(
                    Kind.GENERATED_STALE,
                    Severity.BLOCK,
                    str(GENERATED_ROOT),
                    f"holds vllm {on_disk_release}'s code, but vllm {installed} is installed; "
                    "run `python -m codegen regenerate`",
                )
            )
        else:
            findings.append(
                Finding(
                    Kind.RUNTIME_UNAVAILABLE,
                    Severity.INFO,
                    str(GENERATED_ROOT),
                    f"holds vllm {on_disk_release}'s code: vllm {checked} was checked from "
                    "source (generation and lock), not on disk or at run time",
                )
            )
    # the runtime checks import the generated code into the installed vLLM: only that release's
    if runtime and installed not in (None, checked) and on_disk_release in (None, checked):
        findings.append(
            Finding(
                Kind.RUNTIME_UNAVAILABLE,
                Severity.INFO,
                "vllm",
                f"{installed} is installed: the runtime checks of vllm {checked} run in its env",
            )
        )
    runtime = runtime and installed in (None, checked)
    progress("scanning for monkey patches")
    findings.extend(monkeypatch.scan(repo_root))
    if not runtime:
        return findings
    if importlib.util.find_spec("vllm") is None:
        findings.append(
            Finding(
                Kind.RUNTIME_UNAVAILABLE,
                Severity.INFO,
                "vllm",
                "is not importable here; runtime parity and dotted paths were not checked",
            )
        )
    elif not fresh:
        findings.append(
            Finding(
                Kind.RUNTIME_UNAVAILABLE,
                Severity.INFO,
                str(GENERATED_ROOT),
                "is not fresh; runtime checks need a regeneration first",
            )
        )
    else:
        progress("importing vLLM for runtime parity and dotted paths")
        findings.extend(runtime_findings(repo_root, generation, context.pins))
    return findings
