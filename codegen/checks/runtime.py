"""Checks that import vLLM: runtime signature parity, extend shadowing on live classes, dotted paths.

Static checks compare source text; these compare what Python actually builds, so they also catch
decorator effects, re-exports that resolve to a different object, and members of non-indexed
bases (``torch.nn.Module``) that an ``@extend`` would shadow.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from codegen.findings import Finding, Kind, Location, Severity
from codegen.model import GeneratedClass, MemberKind, SymbolRef

#: documents scanned for dotted paths of our classes
DOC_GLOBS = ("README.md", "docs/**/*.md")
_DOTTED = re.compile(r"\bafd_models(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?")


def load(ref: SymbolRef) -> Any:
    """Import ``module:Qual.name``."""
    obj: Any = importlib.import_module(ref.module)
    for part in ref.qualname.split("."):
        obj = getattr(obj, part)
    return obj


def load_dotted(path: str) -> Any:
    """Import ``pkg.module.Class`` or ``pkg.module:Class`` (the longest importable module prefix)."""
    if ":" in path:
        return load(SymbolRef.parse(path))
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
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
    """Each generated class against its live upstream base."""
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
                yield Finding(
                    Kind.RUNTIME_REPLACED,
                    Severity.BLOCK,
                    f"{symbol}.{name}",
                    f"forks {name!r}, but the live one on {base.__module__}.{base.__qualname__} "
                    f"is code from {origin}, not from the source the fork was made from",
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


def foreign_code(cls: type, name: str) -> str | None:
    """The file of ``cls.name``'s code when it lies outside ``cls``'s top-level package, else None.

    A platform plugin that patches an upstream method (vLLM-Ascend does, at plugin load) leaves
    code from its own package there; a fork generated from upstream's source would silently drop
    that patch. The code object's file is used, not ``__module__``, which ``functools.wraps``
    copies from the function it replaces.
    """
    member = inspect.getattr_static(cls, name, None)
    code = getattr(getattr(member, "__func__", member), "__code__", None)
    package = sys.modules.get(cls.__module__.partition(".")[0])
    package_file = getattr(package, "__file__", None)
    if code is None or package_file is None:
        return None
    home = Path(package_file).resolve().parent
    origin = Path(code.co_filename).resolve()
    return None if origin.is_relative_to(home) else str(origin)


def _owner(cls: type, name: str) -> str:
    owner = next((c for c in cls.__mro__ if name in vars(c)), None)
    return f"{owner.__module__}.{owner.__qualname__}" if owner else "?"


def _signature(cls: type, name: str) -> inspect.Signature | str:
    try:
        return inspect.signature(getattr(cls, name))
    except (TypeError, ValueError) as exc:
        return f"<no signature: {exc}>"


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
    classes: list[GeneratedClass], registered: dict[str, str], documented: dict[str, Location]
) -> Iterator[Finding]:
    """Registered and documented class paths import, and derive from the upstream class they stand for.

    Parameters:
        classes: the generated classes (their upstream bases are the claims).
        registered: dotted path -> the upstream class it claims to derive from (plugin registrations).
        documented: dotted paths found in the docs; they must import, and a generated class (or a
            name for one, like ``afd_models.workers.*``) must derive from its upstream base.
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
