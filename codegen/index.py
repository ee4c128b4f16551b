"""A static index of upstream source: modules, classes, members, imports, MRO. Never imports upstream.

Modules are parsed with :mod:`ast` on first use and cached by content hash, so a file that is
identical in two upstream versions (drift) is parsed once. The index follows ``import`` and
``from ... import`` statements (relative ones too) through package re-exports to the module that
defines a name, and linearizes class hierarchies with C3 like Python does; classes outside the
indexed packages (``torch.nn.Module``) are opaque leaves.
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from codegen.model import Signature, SymbolRef
from codegen.sources import UpstreamSource

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


@functools.cache
def parse_module(sha256: str, source: str) -> ast.Module:
    """Parse once per content hash (the hash is the cache key; the text is needed to parse)."""
    del sha256
    return ast.parse(source)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def body_fingerprint(node: ast.AST) -> str:
    """sha256 of a function or class body with formatting and comments normalized away."""
    body = getattr(node, "body", [])
    dumped = ast.dump(ast.Module(body=body, type_ignores=[]), include_attributes=False)
    return hashlib.sha256(dumped.encode()).hexdigest()


class _StripCosmetics(ast.NodeTransformer):
    """Drops docstrings and bare annotations (``x: T``, never evaluated in a function) from every
    statement list."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for field_name in ("body", "orelse", "finalbody"):
            statements = getattr(node, field_name, None)
            if isinstance(statements, list) and statements and isinstance(statements[0], ast.stmt):
                kept = [
                    s
                    for i, s in enumerate(statements)
                    if not (isinstance(s, ast.AnnAssign) and s.value is None)
                    and not (i == 0 and _is_docstring(s))
                ]
                setattr(node, field_name, kept or [ast.Pass()])
        return node


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def same_behaviour(old: ast.AST, new: ast.AST) -> bool:
    """Whether two function nodes differ only cosmetically: formatting, comments, docstrings and
    bare annotations. Anything else, a renamed local included, counts as a change."""
    bodies = []
    for node in (old, new):
        module = ast.Module(body=copy.deepcopy(getattr(node, "body", [])), type_ignores=[])
        bodies.append(ast.dump(_StripCosmetics().visit(module), include_attributes=False))
    return bodies[0] == bodies[1]


@dataclass
class ModuleInfo:
    """One parsed upstream module."""

    name: str
    #: path relative to the source root, e.g. ``vllm/model_executor/models/deepseek_v2.py``
    path: Path
    source: str
    sha256: str
    tree: ast.Module
    is_package: bool
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    functions: dict[str, FunctionNode] = field(default_factory=dict)
    #: local name -> (module, name); name is None for ``import x.y as z``
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    #: other names bound at top level (assignments)
    assigned: set[str] = field(default_factory=set)
    #: modules imported with ``from m import *``, in order
    star_imports: list[str] = field(default_factory=list)
    #: the module's ``__all__`` when it is a literal list or tuple
    exports: set[str] | None = None

    @property
    def lines(self) -> list[str]:
        return self.source.splitlines(keepends=True)


@dataclass(frozen=True)
class Member:
    """A class member found in the MRO."""

    #: ``module:Class.name`` of the defining class member
    ref: SymbolRef
    #: the defining node (function, or the assignment for attributes)
    node: ast.AST
    #: the module that defines it
    module: ModuleInfo

    @property
    def is_method(self) -> bool:
        return isinstance(self.node, ast.FunctionDef | ast.AsyncFunctionDef)

    @property
    def line(self) -> int:
        return getattr(self.node, "lineno", 0)

    @property
    def first_line(self) -> int:
        """The first line of its source: the first decorator's, or the ``def`` line."""
        decorators: list[ast.expr] = getattr(self.node, "decorator_list", [])
        return min([self.line, *(d.lineno for d in decorators)])

    def signature(self, skip_decorators: frozenset[str] = frozenset()) -> Signature:
        assert isinstance(self.node, ast.FunctionDef | ast.AsyncFunctionDef)
        return Signature.from_ast(self.node, skip_decorators)

    def fingerprint(self) -> str:
        if self.is_method:
            return body_fingerprint(self.node)
        return hashlib.sha256(ast.dump(self.node, include_attributes=False).encode()).hexdigest()

    def source(self) -> str:
        """The member's source lines (decorators included), with their original indentation."""
        return "".join(self.module.lines[self.first_line - 1 : self.node.end_lineno])  # type: ignore[attr-defined]


class UpstreamIndex:
    """Symbols of one or more upstream packages (``vllm``, ``vllm_ascend``) at one version each."""

    def __init__(self, sources: dict[str, UpstreamSource]):
        self.sources = sources
        self._modules: dict[str, ModuleInfo | None] = {}
        self._mro: dict[SymbolRef, list[SymbolRef]] = {}
        self._self_attributes: dict[SymbolRef, dict[str, dict[str, ast.stmt]]] = {}
        #: whether a class's own method calls ``super().<method>(...)``, by (class, method)
        self._super_calls: dict[tuple[SymbolRef, str], bool] = {}

    # ------------------------------------------------------------------ modules

    @property
    def versions(self) -> dict[str, str]:
        """Each indexed package's version."""
        return {package: source.version for package, source in self.sources.items()}

    def owns(self, module: str) -> bool:
        return module.split(".", 1)[0] in self.sources

    def module_path(self, module: str) -> Path | None:
        """The file of an indexed module (``.py`` or package ``__init__.py``), if it exists."""
        if not self.owns(module):
            return None
        root = self.sources[module.split(".", 1)[0]].root
        base = root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def loaded(self) -> list[ModuleInfo]:
        """Every module read so far, sorted by name."""
        return [info for _, info in sorted(self._modules.items()) if info is not None]

    def module(self, name: str) -> ModuleInfo | None:
        if name not in self._modules:
            self._modules[name] = self._load(name)
        return self._modules[name]

    def _load(self, name: str) -> ModuleInfo | None:
        path = self.module_path(name)
        if path is None:
            return None
        source = path.read_text(encoding="utf-8")
        sha = sha256_text(source)
        root = self.sources[name.split(".", 1)[0]].root
        info = ModuleInfo(
            name=name,
            path=path.relative_to(root),
            source=source,
            sha256=sha,
            tree=parse_module(sha, source),
            is_package=path.name == "__init__.py",
        )
        self._collect(info)
        return info

    def _collect(self, info: ModuleInfo) -> None:
        package = info.name if info.is_package else info.name.rsplit(".", 1)[0]
        for node in _top_level(info.tree.body):
            if isinstance(node, ast.ClassDef):
                info.classes[node.name] = node
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                info.functions[node.name] = node
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        info.imports[alias.asname] = (alias.name, None)
                    else:
                        top = alias.name.split(".", 1)[0]
                        info.imports[top] = (top, None)
            elif isinstance(node, ast.ImportFrom):
                source_module = absolute_module(package, node.module, node.level)
                for alias in node.names:
                    if alias.name == "*":
                        info.star_imports.append(source_module)
                    else:
                        info.imports[alias.asname or alias.name] = (source_module, alias.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [
                    "__all__"
                ]:
                    try:
                        info.exports = set(ast.literal_eval(node.value))
                    except ValueError:
                        info.exports = None
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Name):
                            info.assigned.add(leaf.id)

    # ------------------------------------------------------------------ names

    def resolve(self, module: str, name: str, _depth: int = 0) -> SymbolRef | None:
        """Where ``name``, as seen from ``module``'s top level, is defined.

        Returns ``SymbolRef(module, name)`` for a definition in an indexed module,
        ``SymbolRef(submodule, "")`` for a module, a ref into a non-indexed module for
        external names (``torch.nn:Module``), or None if the name is not bound there.
        """
        if _depth > 20:
            return None
        info = self.module(module)
        if info is None:
            return SymbolRef(module, name)
        if name in info.classes or name in info.functions or name in info.assigned:
            return SymbolRef(module, name)
        if name in info.imports:
            source_module, source_name = info.imports[name]
            if source_name is None:
                return SymbolRef(source_module, "")
            submodule = f"{source_module}.{source_name}"
            if self.module_path(submodule) is not None:
                return SymbolRef(submodule, "")
            if not self.owns(source_module):
                return SymbolRef(source_module, source_name)
            return self.resolve(source_module, source_name, _depth + 1)
        if info.is_package:
            submodule = f"{module}.{name}"
            if self.module_path(submodule) is not None:
                return SymbolRef(submodule, "")
        for star in info.star_imports:
            star_info = self.module(star)
            if (
                star_info is not None
                and star_info.exports is not None
                and name not in star_info.exports
            ):
                continue
            found = self.resolve(star, name, _depth + 1)
            if found is not None:
                return found
        if "__getattr__" in info.functions:
            return SymbolRef(module, name)  # a lazily computed module attribute
        return None

    def resolve_expr(self, module: str, node: ast.expr) -> SymbolRef | None:
        """Resolve a ``Name`` or dotted ``Attribute`` expression (``nn.Module``) seen from ``module``."""
        if isinstance(node, ast.Subscript):
            return self.resolve_expr(module, node.value)
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        ref = self.resolve(module, node.id)
        for part in reversed(parts):
            if ref is None:
                return None
            if ref.qualname == "":
                inner = f"{ref.module}.{part}"
                ref = (
                    SymbolRef(inner, "")
                    if self.module_path(inner)
                    else self.resolve(ref.module, part)
                )
                if ref is None and not self.owns(inner.split(".", 1)[0]):
                    ref = SymbolRef(inner.rsplit(".", 1)[0], part)
            else:
                ref = ref.member(part)
        return ref

    # ------------------------------------------------------------------ classes

    def class_node(self, ref: SymbolRef) -> ast.ClassDef | None:
        info = self.module(ref.module)
        if info is None or "." in ref.qualname:
            return None
        return info.classes.get(ref.qualname)

    def bases(self, ref: SymbolRef) -> list[SymbolRef]:
        """Direct bases, resolved; external ones are refs into non-indexed modules."""
        node = self.class_node(ref)
        if node is None:
            return []
        result = []
        for base in node.bases:
            resolved = self.resolve_expr(ref.module, base)
            result.append(
                resolved if resolved is not None else SymbolRef("<unresolved>", ast.unparse(base))
            )
        return [b for b in result if str(b) != "builtins:object"]

    def mro(self, ref: SymbolRef) -> list[SymbolRef]:
        """C3 linearization over indexed classes; non-indexed bases are leaves (cached)."""
        if ref not in self._mro:
            self._mro[ref] = _c3(ref, self)
        return list(self._mro[ref])

    def is_indexed_class(self, ref: SymbolRef) -> bool:
        return self.class_node(ref) is not None

    def own_members(self, ref: SymbolRef) -> dict[str, ast.AST]:
        """Methods and class attributes defined directly in a class body (first definition wins)."""
        node = self.class_node(ref)
        members: dict[str, ast.AST] = {}
        if node is None:
            return members
        for stmt in node.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                members.setdefault(stmt.name, stmt)
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        members.setdefault(target.id, stmt)
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                members.setdefault(stmt.target.id, stmt)
        return members

    def find_member(self, ref: SymbolRef, name: str) -> Member | None:
        """The first definition of ``name`` along the MRO of ``ref`` (indexed classes only)."""
        for cls in self.mro(ref):
            member = self.own_members(cls).get(name)
            if member is not None:
                info = self.module(cls.module)
                assert info is not None
                return Member(cls.member(name), member, info)
        return None

    def instance_attribute(self, ref: SymbolRef, name: str) -> Member | None:
        """The first ``self.<name> = ...`` in a method that runs on ``ref``'s instances: an
        attribute each instance gets (vLLM sets most in ``__init__``), which the class body never
        names. A method runs when it is the first definition of its name along the MRO, or one
        a running definition hands on to with ``super().<name>(...)``."""
        handed_on: dict[str, bool] = {}
        for cls in self.mro(ref):
            for method, assigned in self._assigned_on_self(cls).items():
                if not handed_on.get(method, True):
                    continue  # overridden by a definition that never calls it
                handed_on[method] = self._hands_on(cls, method)
                if name in assigned:
                    info = self.module(cls.module)
                    assert info is not None
                    return Member(cls.member(name), assigned[name], info)
        return None

    def _hands_on(self, cls: SymbolRef, method: str) -> bool:
        """Whether ``cls``'s own ``method`` calls ``super().<method>(...)`` (walked once: every
        attribute lookup along an MRO asks again)."""
        key = (cls, method)
        if key not in self._super_calls:
            self._super_calls[key] = _calls_super(self.own_members(cls)[method], method)
        return self._super_calls[key]

    def _assigned_on_self(self, cls: SymbolRef) -> dict[str, dict[str, ast.stmt]]:
        """Per method of the class's own body: the attributes it sets on ``self``."""
        if cls not in self._self_attributes:
            found: dict[str, dict[str, ast.stmt]] = {}
            for method, node in self.own_members(cls).items():
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                assigned = found.setdefault(method, {})
                for statement in ast.walk(node):
                    if isinstance(statement, ast.Assign):
                        targets = [t for target in statement.targets for t in _unpacked(target)]
                    elif isinstance(statement, ast.AnnAssign):
                        targets = [statement.target]
                    else:
                        continue
                    for target in targets:
                        if (
                            isinstance(target, ast.Attribute)
                            and isinstance(target.value, ast.Name)
                            and target.value.id == "self"
                        ):
                            assigned.setdefault(target.attr, statement)
            self._self_attributes[cls] = found
        return self._self_attributes[cls]

    def outside_method(self, relied: str) -> Member | None:
        """The method ``module:Class.method`` that a ``relies_on`` key names outside a generated
        class's MRO, defined in that class's own body; None when it defines none."""
        ref = SymbolRef.parse(relied)
        owner, _, method = ref.qualname.rpartition(".")
        cls = SymbolRef(ref.module, owner)
        node = self.own_members(cls).get(method) if self.owns(ref.module) else None
        info = self.module(ref.module)
        if node is None or info is None:
            return None
        member = Member(ref, node, info)
        return member if member.is_method else None

    def all_members(self, ref: SymbolRef) -> dict[str, Member]:
        """Every member visible on ``ref`` through indexed classes, first definition wins."""
        result: dict[str, Member] = {}
        for cls in self.mro(ref):
            info = self.module(cls.module)
            if info is None:
                continue
            for name, node in self.own_members(cls).items():
                result.setdefault(name, Member(cls.member(name), node, info))
        return result


def _calls_super(function: ast.AST, name: str) -> bool:
    """Whether ``function`` calls ``super().<name>(...)``."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
        and isinstance(node.func.value, ast.Call)
        and isinstance(node.func.value.func, ast.Name)
        and node.func.value.func.id == "super"
        for node in ast.walk(function)
    )


def _unpacked(target: ast.expr) -> list[ast.expr]:
    """The single targets of an assignment target (``self.a, self.b = ...`` has two)."""
    if isinstance(target, ast.Tuple | ast.List):
        return [t for element in target.elts for t in _unpacked(element)]
    return [target]


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Module-level statements, including those inside top-level ``if`` / ``try`` blocks
    (``if TYPE_CHECKING:`` imports say where lazily exported names really live)."""
    result: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If):
            result += _top_level(node.body) + _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            result += _top_level(node.body)
            for handler in node.handlers:
                result += _top_level(handler.body)
            result += _top_level(node.orelse) + _top_level(node.finalbody)
        else:
            result.append(node)
    return result


def absolute_module(package: str, module: str | None, level: int) -> str:
    """The absolute name of a ``from`` import's module, read in ``package``."""
    if level == 0:
        return module or ""
    parts = package.split(".")
    base = parts[: len(parts) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _c3(
    ref: SymbolRef, index: UpstreamIndex, _stack: tuple[SymbolRef, ...] = ()
) -> list[SymbolRef]:
    if ref in _stack or not index.is_indexed_class(ref):
        return [ref]
    sequences = [_c3(base, index, (*_stack, ref)) for base in index.bases(ref)]
    sequences.append(index.bases(ref))
    result = [ref]
    sequences = [list(s) for s in sequences if s]
    while sequences:
        for seq in sequences:
            head = seq[0]
            if not any(head in other[1:] for other in sequences):
                break
        else:  # inconsistent hierarchy: fall back to depth-first order
            head = sequences[0][0]
        result.append(head)
        sequences = [[c for c in s if c != head] for s in sequences]
        sequences = [s for s in sequences if s]
    return result
