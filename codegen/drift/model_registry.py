"""vLLM's model registry: the native architectures AFD registers for still map to the same
vLLM classes, and to the same class on each platform where the registry names a package that
picks its implementation by ``current_platform`` (DeepSeek-V3.2 and V4 from 0.30). Both are read
statically, like every upstream file."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from codegen.drift.sides import Side
from codegen.findings import Finding, Kind, Severity
from codegen.index import UpstreamIndex, absolute_module

REGISTRY_MODULE = "vllm.model_executor.models.registry"
#: where the registry's relative module names live (vLLM's ``_resolve_module_name``)
MODELS_PACKAGE = "vllm.model_executor.models"
#: vLLM's platform tests (``current_platform.is_<name>()``) -> the platforms each is true on
PLATFORM_TESTS: dict[str, tuple[str, ...]] = {
    "is_cuda": ("cuda",),
    "is_rocm": ("rocm",),
    "is_cuda_alike": ("cuda", "rocm"),
    "is_xpu": ("xpu",),
    "is_cpu": ("cpu",),
    "is_tpu": ("tpu",),
    "is_out_of_tree": ("out-of-tree",),
}
#: the platforms a pick is read for (an out-of-tree platform, Ascend's, answers only
#: ``is_out_of_tree``)
PLATFORMS = ("cuda", "rocm", "xpu", "cpu", "tpu", "out-of-tree")
#: how many re-exporting modules a pick is followed through
PICK_DEPTH = 6


def registry_table(index: UpstreamIndex) -> dict[str, tuple[str, str]]:
    """Architecture -> (module, class) from vLLM's model registry, read statically."""
    info = index.module(REGISTRY_MODULE)
    table: dict[str, tuple[str, str]] = {}
    if info is None:
        return table
    for node in ast.walk(info.tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and isinstance(value, ast.Tuple)
                    and len(value.elts) == 2
                ):
                    try:
                        module, cls = ast.literal_eval(value)
                    except ValueError:
                        continue
                    if (
                        isinstance(key.value, str)
                        and isinstance(module, str)
                        and isinstance(cls, str)
                    ):
                        table.setdefault(key.value, (module, cls))
    return table


class _NotAPlatformTest(Exception):
    """A module-level ``if`` test that is not made of vLLM's platform tests."""


def _holds(test: ast.expr, platform: str) -> bool:
    """Whether a module-level ``if`` test made of platform tests, constants, ``not``, ``and`` and
    ``or`` is true on ``platform``; ``TYPE_CHECKING`` is false, as at run time."""
    if isinstance(test, ast.BoolOp):
        values = [_holds(value, platform) for value in test.values]
        return all(values) if isinstance(test.op, ast.And) else any(values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return not _holds(test.operand, platform)
    if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
        return False
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if (
        isinstance(test, ast.Call)
        and not test.args
        and not test.keywords
        and isinstance(test.func, ast.Attribute)
        and ast.unparse(test.func.value) == "current_platform"
        and test.func.attr in PLATFORM_TESTS
    ):
        return platform in PLATFORM_TESTS[test.func.attr]
    raise _NotAPlatformTest(ast.unparse(test))


def _decides(body: list[ast.stmt], name: str) -> bool:
    """Whether running ``body`` at import binds ``name`` (a ``from`` import or a class) or raises
    (function bodies do not run at import)."""
    for node in body:
        if isinstance(node, ast.Raise) or (isinstance(node, ast.ClassDef) and node.name == name):
            return True
        if isinstance(node, ast.ImportFrom) and any(
            (alias.asname or alias.name) == name for alias in node.names
        ):
            return True
        if isinstance(node, ast.If) and _decides(node.body + node.orelse, name):
            return True
        if isinstance(node, ast.Try) and _decides(node.body, name):
            return True
    return False


def _raised(node: ast.Raise) -> str:
    """The exception a ``raise`` names, without its message (a reworded message is no drift)."""
    if node.exc is None:
        return "the active exception"
    return ast.unparse(node.exc.func if isinstance(node.exc, ast.Call) else node.exc)


def _picked(index: UpstreamIndex, module: str, name: str, platform: str, depth: int = 0) -> str:
    """What importing ``module`` on ``platform`` binds ``name`` to, as ``module:Class`` (followed
    through re-exports into the class's own module), ``raises Error``, or ``unreadable: TEST``
    when a module-level test that decides it is not a platform test."""
    info = index.module(module)
    if info is None or depth > PICK_DEPTH:
        return f"{module}:{name}"
    package = module if info.is_package else module.rsplit(".", 1)[0]
    bound = ""

    def run(body: list[ast.stmt]) -> bool:
        """Run ``body`` as the import would; False where it stops (a raise or an unreadable test)."""
        nonlocal bound
        for node in body:
            if isinstance(node, ast.If) and _decides([node], name):
                try:
                    branch = node.body if _holds(node.test, platform) else node.orelse
                except _NotAPlatformTest as error:
                    bound = f"unreadable: {error}"
                    return False
                if not run(branch):
                    return False
            elif isinstance(node, ast.Try):
                if not run(node.body):
                    return False
            elif isinstance(node, ast.Raise):
                bound = f"raises {_raised(node)}"
                return False
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = absolute_module(package, node.module, node.level)
                        bound = _picked(index, source, alias.name, platform, depth + 1)
            elif isinstance(node, ast.ClassDef) and node.name == name:
                bound = f"{module}:{name}"
        return True

    run(info.tree.body)
    return bound or f"{module}:{name}"


def platform_picks(index: UpstreamIndex, entry: tuple[str, str]) -> dict[str, str]:
    """Platform -> the class vLLM builds there for a registry ``entry`` (module, class) of
    :func:`registry_table` (see :func:`_picked`)."""
    module, name = entry
    module = module if module.startswith("vllm.") else f"{MODELS_PACKAGE}.{module}"
    return {platform: _picked(index, module, name, platform) for platform in PLATFORMS}


def _picks_text(picks: dict[str, str]) -> str:
    """``cuda: a:A; rocm, xpu, cpu: b:B``: the platforms grouped by what they get."""
    grouped: dict[str, list[str]] = {}
    for platform, picked in picks.items():
        grouped.setdefault(picked, []).append(platform)
    return "; ".join(f"{', '.join(platforms)}: {picked}" for picked, platforms in grouped.items())


def registry_findings(architectures: list[str], old: Side, new: Side) -> Iterator[Finding]:
    """The native architectures AFD registers for still map to the same vLLM classes, and to the
    same one on each platform."""
    before, after = registry_table(old.index), registry_table(new.index)
    for arch in architectures:
        if arch not in after:
            yield Finding(
                Kind.DRIFT_REGISTRY,
                Severity.BLOCK,
                arch,
                f"is no longer in vLLM {new.version}'s model registry",
                old=str(before.get(arch)),
            )
        elif before.get(arch) != after[arch]:
            yield Finding(
                Kind.DRIFT_REGISTRY,
                Severity.REVIEW,
                arch,
                "now maps to another vLLM class",
                old=str(before.get(arch)),
                new=str(after[arch]),
                details=_pick_details(
                    platform_picks(old.index, before[arch]) if arch in before else {},
                    platform_picks(new.index, after[arch]),
                ),
            )
        elif (old_picks := platform_picks(old.index, before[arch])) != (
            new_picks := platform_picks(new.index, after[arch])
        ):
            changed = [p for p in PLATFORMS if old_picks[p] != new_picks[p]]
            yield Finding(
                Kind.DRIFT_PLATFORM_PICK,
                Severity.BLOCK,
                arch,
                f"vLLM {new.version} builds another class for it on {', '.join(changed)}: check "
                "the platforms AFD serves it on (afd_models/plugin.py) and the class its overlay "
                "subclasses",
                old=_picks_text(old_picks),
                new=_picks_text(new_picks),
            )


def _pick_details(old: dict[str, str], new: dict[str, str]) -> tuple[str, ...]:
    """The per-platform classes on both sides, when either side picks by platform."""
    if len(set(old.values())) < 2 and len(set(new.values())) < 2:
        return ()
    return (f"per platform before: {_picks_text(old)}", f"per platform now: {_picks_text(new)}")


def native_architectures(repo_root: Path) -> list[str]:
    """The ``native`` of each ``Architecture`` row in afd_models/plugin.py, read statically."""
    tree = ast.parse((repo_root / "afd_models/plugin.py").read_text())
    return [
        ast.literal_eval(keyword.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Architecture"
        for keyword in node.keywords
        if keyword.arg == "native"
    ]
