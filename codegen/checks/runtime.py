"""Checks that import vLLM: runtime signature parity, extend shadowing on live classes, dotted paths,
and upstream code a platform plugin replaced.

Static checks compare source text; these compare what Python actually builds, so they also catch
decorator effects, re-exports that resolve to a different object, members of non-indexed
bases (``torch.nn.Module``) that an ``@extend`` would shadow, and upstream methods and names that
a platform plugin (vLLM-Ascend) replaced at run time (``RT005``).
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import sysconfig
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from codegen.contracts import evaluate_source
from codegen.findings import Finding, Kind, Location, Severity
from codegen.lock import IMPORTS, SymbolEntry
from codegen.markers import Contract
from codegen.model import GeneratedClass, MemberKind, SymbolRef
from codegen.pattern import PatternError

#: documents scanned for dotted paths of our classes
#: the documentation users follow; docs/reports/ holds generated reports of past states
DOC_GLOBS = ("README.md", "docs/*.md")
#: the worker-class table, whose paths are checked like documented ones
WORKER_TABLE_PATH = "afd_models/launch.py"
_DOTTED = re.compile(r"\bafd_models(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?")
#: the patch packages of a platform plugin, in the order vLLM-Ascend imports them at run time
PATCH_MODULES = ("patch.platform", "patch.worker")


class Platform(Protocol):
    """What :func:`platform_package` needs of vLLM's ``current_platform``."""

    def is_out_of_tree(self) -> bool: ...


def platform_package(platform: Platform) -> str | None:
    """The top-level package of an out-of-tree platform (``vllm_ascend`` on an NPU host), else None.

    AFD's own subclass of a platform (``AFDNPUPlatform``) stands for the plugin it derives from:
    the package is that of the first class along its MRO that is not AFD's.
    """
    if not platform.is_out_of_tree():
        return None
    for cls in type(platform).__mro__:
        package = cls.__module__.partition(".")[0]
        if package != "afd_models":
            return package
    return None


def apply_platform_patches(package: str) -> tuple[str, ...]:
    """Import a platform plugin's patch packages, as the plugin itself does at run time.

    vLLM-Ascend 0.26.0rc1 keeps its patches of vLLM in two packages whose ``__init__`` imports
    one module per patch; each module assigns its replacement to vLLM's attribute when imported
    (``vllm_ascend/patch/worker/patch_deepseek_v2.py:357``: ``DeepseekV2Model.forward =
    _patched_forward``). ``vllm_ascend.utils.adapt_patch`` (``vllm_ascend/utils.py:533``) imports
    ``vllm_ascend.patch.platform`` when ``is_global_patch`` is true, ``vllm_ascend.patch.worker``
    otherwise, and is called:

    * with ``is_global_patch=True`` by ``NPUPlatform.pre_register_and_update``
      (``vllm_ascend/platform.py:183-187``), which vLLM calls while building the engine config and
      its CLI parser (``vllm/engine/arg_utils.py:1857``, ``:2745``), and by the general plugins
      ``register_connector``, ``register_model_loader`` and ``register_service_profiling``
      through ``_ensure_global_patch`` (``vllm_ascend/__init__.py:21-34``), so
      ``load_general_plugins()`` already applies the platform patches;
    * with ``is_global_patch=False`` by ``NPUWorker.__init__`` (``vllm_ascend/worker/worker.py:116-119``),
      that is only in worker processes, which is where the model classes run. Loading the general
      plugins does not apply these.

    This imports the same modules, in the same order; the patches are the plugin's own code. A
    package without a patch package is skipped; a patch module that fails to import raises.

    Parameters:
        package: the plugin's top-level package, e.g. ``vllm_ascend`` (see :func:`platform_package`).

    Returns:
        The patch packages imported.
    """
    applied: list[str] = []
    for name in PATCH_MODULES:
        module = f"{package}.{name}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or not f"{module}.".startswith(f"{exc.name}."):
                raise  # something the patch module imports is missing: not ours to hide
            continue  # this plugin has no such patch package
        applied.append(module)
    return tuple(applied)


def load(ref: SymbolRef) -> Any:
    """Import ``module:Qual.name`` (``module:``: the module)."""
    obj: Any = importlib.import_module(ref.module)
    for part in ref.qualname.split(".") if ref.qualname else ():
        obj = getattr(obj, part)
    return obj


def load_dotted(path: str) -> Any:
    """Import ``pkg.module.Class`` or ``pkg.module:Class`` (the longest importable module prefix)."""
    if ":" in path:
        return load(SymbolRef.parse(path))
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        module = ".".join(parts[:split])
        try:
            obj: Any = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise  # the module exists but needs one that is missing
            continue
        for part in parts[split:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(f"no importable module in {path!r}")


def _failure(kind: Kind, symbol: str, exc: BaseException, where: Location | None) -> Finding:
    return Finding(
        kind,
        Severity.BLOCK,
        symbol,
        f"does not import: {type(exc).__name__}: {exc}",
        where,
        details=tuple(traceback.format_exception_only(type(exc), exc)),
    )


def check_classes(classes: list[GeneratedClass]) -> Iterator[Finding]:
    """Each generated class against its live upstream base: the class derives from it, overrides and
    forks keep its live signatures, extends shadow none of its members, and neither a forked method
    nor an inherited one the overlay relies on is code from another package (``RT005``)."""
    for generated in classes:
        symbol = str(generated.ref)
        where = Location(str(generated.overlay_path), generated.overlay.line)
        try:
            cls = load(generated.ref)
            base = load(generated.base)
        except Exception as exc:
            yield _failure(Kind.RUNTIME_IMPORT, symbol, exc, where)
            continue
        if not (isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base)):
            yield Finding(
                Kind.PATH_BASE,
                Severity.BLOCK,
                symbol,
                f"does not derive from {generated.base}",
                where,
            )
            continue
        for member in generated.members:
            name = member.decl.name
            member_at = Location(str(generated.overlay_path), member.decl.line)
            if member.decl.kind is MemberKind.EXTEND or member.decl.kind is MemberKind.EXTEND_ATTR:
                if hasattr(base, name):
                    yield Finding(
                        Kind.RUNTIME_SHADOWS,
                        Severity.BLOCK,
                        f"{symbol}.{name}",
                        f"extends {name!r}, but the live {base.__module__}.{base.__qualname__} has it (through {_owner(base, name)})",
                        member_at,
                    )
                continue
            if member.decl.kind is MemberKind.FORK and (origin := foreign_code(base, name)):
                forked = (
                    member.upstream.qualname if member.upstream else f"{base.__qualname__}.{name}"
                )
                yield _patched(
                    f"{symbol}.{name}",
                    f"forked {forked}",
                    origin,
                    "AFD's fork was made from vLLM's body and drops this patch",
                    member_at,
                )
            if not member.decl.kind.is_method or any(
                d.applies_to(str(generated.base)) for d in member.decl.deltas
            ):
                continue
            ours, theirs = _signature(cls, name), _signature(base, name)
            if ours != theirs:
                yield Finding(
                    Kind.RUNTIME_SIGNATURE,
                    Severity.BLOCK,
                    f"{symbol}.{name}",
                    "inspect.signature differs from the live upstream method",
                    member_at,
                    old=str(theirs),
                    new=str(ours),
                )
        for name in sorted(set(generated.overlay.relies_on) & set(generated.inherited)):
            if origin := foreign_code(base, name):
                yield _relied_on_patched(
                    f"{symbol}.{name}",
                    generated.inherited[name].qualname,
                    getattr(base, name),
                    generated.overlay.relies_on[name],
                    origin,
                    where,
                )


def _relied_on_patched(
    symbol: str,
    qualname: str,
    live: Any,
    contracts: tuple[Contract, ...],
    origin: str,
    where: Location,
) -> Finding:
    """A relied-on method a platform plugin patched: its contracts are evaluated on the patch's
    own source. All holding is info (AFD relies on the same facts there); a broken one, or a
    patch without source, blocks."""
    try:
        matches = evaluate_source(inspect.getsource(inspect.unwrap(live)), contracts)
    except (OSError, TypeError, PatternError) as exc:
        return _patched(
            symbol,
            f"relied-on {qualname}",
            origin,
            f"AFD's contracts could not be evaluated on the patch ({exc})",
            where,
        )
    broken = [m.contract for m in matches if len(m.lines) != m.contract.count]
    if broken:
        return _patched(
            symbol,
            f"relied-on {qualname}",
            origin,
            "contracts broken in the patch: "
            + "; ".join(f"{c.id} ({c.if_broken})" for c in broken),
            where,
        )
    return Finding(
        Kind.RUNTIME_PATCHED,
        Severity.INFO,
        symbol,
        f"relied-on {qualname} is patched by {_module_of(origin)}; every contract holds in the "
        f"patch ({', '.join(m.contract.id for m in matches)})",
        where,
        details=(f"live code: {origin}",),
    )


def check_imports(
    symbols: Mapping[str, SymbolEntry], accepted: frozenset[str] = frozenset()
) -> Iterator[Finding]:
    """Upstream names our code imports whose live object is code from another package.

    Parameters:
        symbols: the lock's ``symbols`` (``module:name`` -> entry); those with a use in
            :data:`codegen.lock.IMPORTS` (imported by the overlay, generated code or runtime)
            are checked.
        accepted: ``module:qualname`` of patches a platform plugin makes on purpose and AFD
            takes as they are (a pin's ``patches`` in overlay/pins.toml): reported as info.
    """
    for key, entry in sorted(symbols.items()):
        if not entry.uses & IMPORTS:
            continue
        ref = SymbolRef.parse(key)
        try:
            obj = load(ref)
        except Exception as exc:
            yield _failure(Kind.RUNTIME_IMPORT, key, exc, None)
            continue
        if origin := foreign_object(obj, ref.module):
            users = ", ".join(entry.used_by) or "?"
            patch = f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', '?')}"
            if patch in accepted:
                yield Finding(
                    Kind.RUNTIME_PATCHED,
                    Severity.INFO,
                    key,
                    f"imported {ref.qualname} is {patch}, a patch overlay/pins.toml "
                    f"accepts: AFD ({users}) uses it as upstream code would",
                    None,
                )
                continue
            yield _patched(
                key,
                f"imported {ref.qualname}",
                origin,
                f"AFD ({users}) was checked against vLLM's definition, not this one",
                None,
            )


def _patched(symbol: str, what: str, origin: str, missed: str, where: Location | None) -> Finding:
    return Finding(
        Kind.RUNTIME_PATCHED,
        Severity.BLOCK,
        symbol,
        f"{what} is patched by {_module_of(origin)}: {missed}",
        where,
        details=(f"live code: {origin}",),
    )


def _module_of(file: str) -> str:
    """The loaded module whose file is ``file``, else ``file`` (a code object names only its file)."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and str(Path(path).resolve()) == file:
            return name
    return file


def foreign_object(obj: object, module: str) -> str | None:
    """The file of a function's code, or of a class's module, when it lies outside ``module``'s
    top-level package, else None; other objects (instances, modules, aliases) are not checked."""
    if isinstance(obj, type):
        file = getattr(sys.modules.get(obj.__module__), "__file__", None)
    else:
        file = _code_file(obj)
    return None if file is None else _outside(file, module)


def foreign_code(cls: type, name: str) -> str | None:
    """The file of ``cls.name``'s code when it lies outside ``cls``'s top-level package, else None.

    A platform plugin that patches an upstream method (vLLM-Ascend does, see
    :func:`apply_platform_patches`) leaves code from its own package there: a fork generated from
    upstream's source would silently drop that patch, and an inherited method AFD relies on runs a
    body the lock never saw. The code object's file is used, not ``__module__``, which
    ``functools.wraps`` copies from the function it replaces.
    """
    member = inspect.getattr_static(cls, name, None)
    file = _code_file(getattr(member, "__func__", member))
    return None if file is None else _outside(file, cls.__module__)


def _code_file(obj: Any) -> str | None:
    """The file of the code ``obj`` runs, None if it has none.

    A plugin's patch is never standard-library code, so a standard-library wrapper (vLLM's own
    ``@contextlib.contextmanager`` or ``@functools.lru_cache``) is judged by the function it wraps
    (``__wrapped__``), and so is a wrapper without code of its own and torch's context-manager
    decorator (vLLM's ``@torch.inference_mode()``, :data:`DECORATOR_WRAPPERS`).
    """
    inner = inspect.unwrap(obj, stop=_runs_own_code)
    return str(inner.__code__.co_filename) if _runs_own_code(inner) else None


#: files of decorator wrappers outside the standard library that only run the function they
#: wrap (``__wrapped__``) inside a context: judged by that function
DECORATOR_WRAPPERS = ("torch/utils/_contextlib.py",)


def _runs_own_code(obj: object) -> bool:
    code = getattr(obj, "__code__", None)
    if code is None or _in_stdlib(code.co_filename):
        return False
    file = Path(code.co_filename).as_posix()
    return not (hasattr(obj, "__wrapped__") and file.endswith(DECORATOR_WRAPPERS))


def _in_stdlib(file: str) -> bool:
    """Whether ``file`` is standard-library code (packages installed below it excluded)."""
    path = Path(file).resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    return path.is_relative_to(stdlib) and not {"site-packages", "dist-packages"} & set(
        path.relative_to(stdlib).parts
    )


def _outside(file: str, module: str) -> str | None:
    """``file``, resolved, when it lies outside ``module``'s top-level package, else None."""
    package_file = getattr(sys.modules.get(module.partition(".")[0]), "__file__", None)
    if package_file is None:
        return None
    origin = Path(file).resolve()
    return None if origin.is_relative_to(Path(package_file).resolve().parent) else str(origin)


def _owner(cls: type, name: str) -> str:
    owner = next((c for c in cls.__mro__ if name in vars(c)), None)
    return f"{owner.__module__}.{owner.__qualname__}" if owner else "?"


def _signature(cls: type, name: str) -> inspect.Signature | str:
    try:
        return inspect.signature(getattr(cls, name))
    except (TypeError, ValueError) as exc:
        return f"<no signature: {exc}>"


def worker_paths() -> dict[str, Location]:
    """The ``--worker-cls`` path of every row of the worker-class table
    (:data:`afd_models.launch.WORKER_CLASSES`): each must import and derive from its generated
    class's upstream base, as a documented path must, whether the docs name it or not."""
    from afd_models.launch import WORKER_CLASSES

    return {row.path: Location(WORKER_TABLE_PATH) for row in WORKER_CLASSES}


def documented_paths(repo_root: Path) -> dict[str, Location]:
    """Dotted paths of our classes named in the README and docs, with where they appear."""
    found: dict[str, Location] = {}
    for pattern in DOC_GLOBS:
        for path in sorted(repo_root.glob(pattern)):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                for match in _DOTTED.finditer(line):
                    text = match.group(0)
                    if text.rsplit(".", 1)[-1].rsplit(":", 1)[-1][:1].isupper():
                        found.setdefault(
                            text, Location(path.relative_to(repo_root).as_posix(), number)
                        )
    return found


def check_paths(
    classes: list[GeneratedClass],
    registered: dict[str, str],
    documented: dict[str, Location],
    absent: frozenset[str] = frozenset(),
) -> Iterator[Finding]:
    """Registered and documented class paths import, and derive from the upstream class they stand for.

    Parameters:
        classes: the generated classes (their upstream bases are the claims).
        registered: dotted path -> the upstream class it claims to derive from (plugin registrations).
        documented: dotted paths found in the docs; they must import, and a generated class (or a
            name for one, like ``afd_models.workers.*``) must derive from its upstream base.
        absent: pinned upstream packages not installed here; a documented path that needs one
            is not checked (the caller reports the package once).
    """
    by_object: dict[int, GeneratedClass] = {}
    for generated in classes:
        try:
            by_object[id(load(generated.ref))] = generated
        except Exception:
            continue  # reported by check_classes
    for path, claimed in sorted(registered.items()):
        try:
            cls, base = load_dotted(path), load_dotted(claimed)
        except Exception as exc:
            yield _failure(Kind.PATH_IMPORT, path, exc, None)
            continue
        if not (isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base)):
            yield Finding(
                Kind.PATH_BASE,
                Severity.BLOCK,
                path,
                f"is registered for {claimed} but does not derive from it",
            )
    for path, where in sorted(documented.items()):
        try:
            obj = load_dotted(path)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in absent:
                yield _failure(Kind.PATH_IMPORT, path, exc, where)
            continue
        except Exception as exc:
            yield _failure(Kind.PATH_IMPORT, path, exc, where)
            continue
        claimed_class = by_object.get(id(obj))
        if claimed_class is not None and not issubclass(obj, load(claimed_class.base)):
            yield Finding(
                Kind.PATH_BASE,
                Severity.BLOCK,
                path,
                f"is documented as {claimed_class.base}'s subclass but is not",
                where,
            )
