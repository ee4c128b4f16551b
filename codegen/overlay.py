"""Read overlay modules (``overlay/<upstream path>.py``) into :mod:`codegen.model` objects.

An overlay is parsed, never imported. Marker arguments are evaluated with nothing but the
marker functions in scope, so they must be literals (strings, numbers, tuples) and marker calls.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst

from codegen import markers
from codegen.markers import Edit
from codegen.model import MemberDecl, MemberKind, OverlayClass, OverlayModule, Signature, SymbolRef
from codegen.releases import applicable, applies, parse_range

MARKERS_MODULE = "codegen.markers"
#: a ``relies_on`` key naming a method outside the class's MRO: ``module:Class.method``
OUTSIDE_METHOD = r"[A-Za-z_][\w.]*:[A-Za-z_]\w*\.[A-Za-z_]\w*"
OVERLAY_DIR = "overlay"
_METHOD_MARKERS = {
    "override": MemberKind.OVERRIDE,
    "extend": MemberKind.EXTEND,
    "fork": MemberKind.FORK,
}
_ATTR_MARKERS = {"override_attr": MemberKind.OVERRIDE_ATTR, "extend_attr": MemberKind.EXTEND_ATTR}


@dataclass(frozen=True)
class OverlayProblem:
    """A problem in an overlay file, reported as an OVL001 finding."""

    path: Path
    line: int
    message: str


class OverlayError(ValueError):
    def __init__(self, problems: list[OverlayProblem]):
        super().__init__("; ".join(f"{p.path}:{p.line}: {p.message}" for p in problems))
        self.problems = problems


def overlay_files(repo_root: Path) -> list[Path]:
    """Overlay modules, relative to the repository root, sorted."""
    root = repo_root / OVERLAY_DIR
    return sorted(
        p.relative_to(repo_root)
        for p in root.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    )


def upstream_module_of(path: Path) -> str:
    """``overlay/vllm/model_executor/models/deepseek_v2.py`` -> ``vllm.model_executor.models.deepseek_v2``."""
    return ".".join(path.relative_to(OVERLAY_DIR).with_suffix("").parts)


class _Reader:
    def __init__(self, path: Path, text: str):
        self.path = path
        self.text = text
        self.problems: list[OverlayProblem] = []
        self.module = cst.parse_module(text)
        self.tree = ast.parse(text)
        self.marker_names: dict[str, str] = {}  # local name -> marker function name
        self.imported: dict[str, SymbolRef] = {}
        self.constants: dict[str, Any] = {}  # module-level edits shared by several methods

    def problem(self, line: int, message: str) -> None:
        self.problems.append(OverlayProblem(self.path, line, message))

    def read(self) -> OverlayModule:
        imports: list[cst.SimpleStatementLine] = []
        classes: list[OverlayClass] = []
        docstring = ast.get_docstring(self.tree)
        if len(self.module.body) != len(self.tree.body):
            self.problem(1, "write one statement per line (no ';') in overlays")
            raise OverlayError(self.problems)
        for statement, node in zip(self.module.body, self.tree.body, strict=True):
            line = node.lineno
            if (
                isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                continue  # docstring
            if isinstance(node, ast.ImportFrom | ast.Import):
                assert isinstance(statement, cst.SimpleStatementLine)
                if self._record_import(node):
                    imports.append(statement)
            elif isinstance(node, ast.ClassDef):
                assert isinstance(statement, cst.ClassDef)
                overlay_class = self._read_class(statement, node)
                if overlay_class is not None:
                    classes.append(overlay_class)
            elif isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [
                "__all__"
            ]:
                continue
            elif (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                try:
                    self.constants[node.targets[0].id] = self.evaluate(node.value)
                except (ValueError, TypeError, SyntaxError) as exc:
                    self.problem(line, f"module-level {node.targets[0].id}: {exc}")
            else:
                self.problem(
                    line,
                    "overlay modules hold only a docstring, imports, shared edits and @subclass classes",
                )
        if self.problems:
            raise OverlayError(self.problems)
        return OverlayModule(
            path=self.path,
            upstream_module=upstream_module_of(self.path),
            docstring=docstring,
            imports=tuple(imports),
            imported=dict(self.imported),
            classes=tuple(classes),
            sha256=hashlib.sha256(self.text.encode()).hexdigest(),
        )

    def _record_import(self, node: ast.Import | ast.ImportFrom) -> bool:
        """Remember what an import binds; False for the markers import (not copied)."""
        if isinstance(node, ast.ImportFrom):
            if node.level:
                self.problem(
                    node.lineno,
                    "use absolute imports in overlays (the generated module lives elsewhere)",
                )
                return False
            if node.module == MARKERS_MODULE:
                for alias in node.names:
                    if alias.name not in {
                        *_METHOD_MARKERS,
                        *_ATTR_MARKERS,
                        "subclass",
                        *markers.ACTIONS,
                        "delta",
                        "contract",
                    }:
                        self.problem(node.lineno, f"{alias.name!r} is not a codegen marker")
                    self.marker_names[alias.asname or alias.name] = alias.name
                return False
            for alias in node.names:
                if alias.name == "*":
                    self.problem(node.lineno, "star imports are not allowed in overlays")
                    continue
                self.imported[alias.asname or alias.name] = SymbolRef(node.module or "", alias.name)
            return True
        for alias in node.names:
            if alias.asname:
                self.imported[alias.asname] = SymbolRef(alias.name, "")
            else:
                top = alias.name.split(".", 1)[0]
                self.imported[top] = SymbolRef(top, "")
        return True

    # ------------------------------------------------------------------ evaluation

    def _namespace(self) -> dict[str, Any]:
        namespace = {local: getattr(markers, real) for local, real in self.marker_names.items()}
        namespace.update(self.constants)
        return namespace

    def evaluate(self, node: ast.expr) -> Any:
        """Evaluate a marker argument: literals and marker calls only."""
        for leaf in ast.walk(node):
            if (
                isinstance(leaf, ast.Name)
                and leaf.id not in self.marker_names
                and leaf.id not in self.constants
            ):
                raise ValueError(
                    f"{leaf.id!r} is not allowed here: use literals and codegen.markers calls"
                )
            if isinstance(leaf, ast.Attribute | ast.Lambda | ast.NamedExpr | ast.Subscript):
                raise ValueError(
                    f"{ast.unparse(leaf)!r} is not allowed here: use literals and codegen.markers calls"
                )
        code = compile(ast.Expression(body=node), str(self.path), "eval")
        return eval(code, {"__builtins__": {}}, self._namespace())

    def _marker_of(self, decorator: ast.expr) -> tuple[str, ast.Call | None] | None:
        """(marker name, call node) if ``decorator`` is a marker, else None."""
        call = decorator if isinstance(decorator, ast.Call) else None
        target = call.func if call else decorator
        if isinstance(target, ast.Name) and target.id in self.marker_names:
            return self.marker_names[target.id], call
        return None

    # ------------------------------------------------------------------ classes

    def _read_class(self, statement: cst.ClassDef, node: ast.ClassDef) -> OverlayClass | None:
        spec: dict[str, Any] | None = None
        kept: list[cst.Decorator] = []
        for cst_dec, ast_dec in zip(statement.decorators, node.decorator_list, strict=True):
            marker = self._marker_of(ast_dec)
            if marker is None:
                kept.append(cst_dec)
                continue
            name, call = marker
            if name != "subclass" or call is None:
                self.problem(
                    ast_dec.lineno,
                    f"class {node.name}: only @subclass(...) may decorate an overlay class",
                )
                continue
            try:
                if call.args or any(kw.arg is None for kw in call.keywords):
                    raise ValueError("subclass() takes keyword arguments only")
                spec = {str(kw.arg): self.evaluate(kw.value) for kw in call.keywords}
            except (ValueError, SyntaxError) as exc:
                self.problem(ast_dec.lineno, f"class {node.name}: {exc}")
                return None
        if spec is None:
            self.problem(node.lineno, f"class {node.name} lacks @subclass(...)")
            return None
        unknown = set(spec) - {"bases", "name", "relies_on", "when", "feature"}
        if unknown:
            self.problem(
                node.lineno,
                f"class {node.name}: subclass() got unknown arguments {sorted(unknown)}",
            )
        base_names = tuple(spec.get("bases") or (ast.unparse(b) for b in node.bases))
        if not base_names:
            self.problem(
                node.lineno, f"class {node.name}: no upstream base (write one or pass bases=)"
            )
        bases = tuple(self._base_ref(name) for name in base_names)
        template = spec.get("name") or node.name
        if len(bases) > 1 and "{base}" not in template:
            self.problem(
                node.lineno,
                f"class {node.name}: several bases need a name template with '{{base}}'",
            )
        members = [m for m in self._members(statement, node) if m is not None]
        names = [m.name for m in members]
        for member in members:
            if names.count(member.name) > 1 and member.when is None:
                self.problem(
                    member.line,
                    f"{node.name}.{member.name}: declared {names.count(member.name)} times; "
                    "members may share a name only as per-release alternatives, each with its when=",
                )
        try:
            when = self._member_when(spec.get("when"))
        except ValueError as exc:
            self.problem(node.lineno, f"class {node.name}: {exc}")
            when = None
        relies_on = self._relies_on(node, spec.get("relies_on"))
        for method, contracts in relies_on.items():
            for c in contracts:
                if c.base is not None and not any(c.applies_to(str(b)) for b in bases):
                    self.problem(
                        node.lineno,
                        f"class {node.name}: relies_on[{method!r}]: contract {c.id!r} has "
                        f"base={c.base!r}; allowed: one of its bases "
                        f"({', '.join(b.qualname for b in bases)})",
                    )
        feature = spec.get("feature")
        if feature is not None and (not isinstance(feature, str) or not feature.strip()):
            self.problem(
                node.lineno,
                f"class {node.name}: feature={feature!r}; allowed: a sentence naming the AFD "
                "feature the class carries",
            )
            feature = None
        return OverlayClass(
            name=node.name,
            bases=bases,
            name_template=template,
            relies_on=relies_on,
            members=tuple(members),
            decorators=tuple(kept),
            docstring=ast.get_docstring(node),
            line=node.lineno,
            when=when,
            feature=feature,
        )

    def _relies_on(self, node: ast.ClassDef, value: Any) -> dict[str, tuple[markers.Contract, ...]]:
        """``{"method": (contract(...), ...)}``: every relied-on method states its contracts; a
        method outside the class's MRO is named ``"module:Class.method"``."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problem(
                node.lineno,
                f"class {node.name}: relies_on must map each relied-on method to its contracts, "
                f'e.g. {{"forward": (contract(...),)}}; got {type(value).__name__}',
            )
            return {}
        result: dict[str, tuple[markers.Contract, ...]] = {}
        for method, contracts in value.items():
            where = f"class {node.name}: relies_on[{method!r}]"
            if not isinstance(contracts, tuple) or not contracts:
                self.problem(
                    node.lineno, f"{where} needs a non-empty tuple of contract(...) declarations"
                )
                continue
            if not all(isinstance(c, markers.Contract) for c in contracts):
                self.problem(node.lineno, f"{where} holds something other than contract(...)")
                continue
            ids = [c.id for c in contracts]
            if len(set(ids)) != len(ids):
                self.problem(node.lineno, f"{where}: contract ids must be unique, got {ids}")
            if ":" in str(method) and not re.fullmatch(OUTSIDE_METHOD, str(method)):
                self.problem(
                    node.lineno,
                    f"{where}: a method outside the class is named 'module:Class.method', "
                    "e.g. 'vllm.config.vllm:VllmConfig.use_v2_model_runner'",
                )
                continue
            for c in contracts:
                if c.count < 1 or not c.if_broken.strip() or not c.id.strip():
                    self.problem(
                        node.lineno,
                        f"{where}: contract {c.id!r} needs an id, count >= 1 and an if_broken sentence",
                    )
                if c.when is not None:
                    try:
                        parse_range(c.when)
                    except ValueError as exc:
                        self.problem(node.lineno, f"{where}: contract {c.id!r}: {exc}")
                if c.selects is not None and not c.selects.strip():
                    self.problem(
                        node.lineno,
                        f"{where}: contract {c.id!r}: selects='' names no choice; allowed: a "
                        "sentence such as 'the model runner the CPU worker builds'",
                    )
            result[str(method)] = contracts
        return result

    def _base_ref(self, name: str) -> SymbolRef:
        if ":" in name:
            return SymbolRef.parse(name)
        head, _, rest = name.partition(".")
        if head in self.imported:
            imported = self.imported[head]
            if imported.qualname == "":
                module = (
                    ".".join([imported.module, *rest.split(".")[:-1]]) if rest else imported.module
                )
                return SymbolRef(module, rest.rsplit(".", 1)[-1]) if rest else imported
            return SymbolRef(imported.module, imported.qualname + (f".{rest}" if rest else ""))
        return SymbolRef(upstream_module_of(self.path), name)

    def _members(self, statement: cst.ClassDef, node: ast.ClassDef) -> list[MemberDecl | None]:
        body = statement.body.body
        assert isinstance(body, list | tuple)
        result: list[MemberDecl | None] = []
        if len(body) != len(node.body):
            self.problem(node.lineno, f"class {node.name}: write one statement per line (no ';')")
            return result
        for index, (cst_item, ast_item) in enumerate(zip(body, node.body, strict=True)):
            if (
                index == 0
                and isinstance(ast_item, ast.Expr)
                and isinstance(ast_item.value, ast.Constant)
            ):
                continue  # docstring
            if isinstance(ast_item, ast.Pass):
                continue
            if isinstance(ast_item, ast.FunctionDef | ast.AsyncFunctionDef):
                assert isinstance(cst_item, cst.FunctionDef)
                result.append(self._method(node.name, cst_item, ast_item))
            elif isinstance(ast_item, ast.Assign | ast.AnnAssign):
                assert isinstance(cst_item, cst.SimpleStatementLine)
                result.append(self._attribute(node.name, cst_item, ast_item))
            else:
                self.problem(
                    ast_item.lineno,
                    f"class {node.name}: only marked methods and attributes are allowed",
                )
        return result

    def _method(
        self, owner: str, cst_item: cst.FunctionDef, item: ast.FunctionDef | ast.AsyncFunctionDef
    ) -> MemberDecl | None:
        found: list[tuple[str, ast.Call | None]] = []
        kept: list[cst.Decorator] = []
        for cst_dec, ast_dec in zip(cst_item.decorators, item.decorator_list, strict=True):
            marker = self._marker_of(ast_dec)
            if marker is None:
                kept.append(cst_dec)
            else:
                found.append(marker)
        if len(found) != 1 or found[0][0] not in _METHOD_MARKERS:
            self.problem(
                item.lineno, f"{owner}.{item.name}: needs exactly one of @override, @extend, @fork"
            )
            return None
        name, call = found[0]
        kind = _METHOD_MARKERS[name]
        edits: tuple[markers.Edit, ...] = ()
        deltas: tuple[markers.Delta, ...] = ()
        when: str | None = None
        try:
            if call is not None:
                if any(kw.arg is None for kw in call.keywords):
                    raise ValueError("** arguments are not allowed in markers")
                args = [self.evaluate(a) for a in call.args]
                kwargs = {str(kw.arg): self.evaluate(kw.value) for kw in call.keywords}
                when = self._member_when(kwargs.pop("when", None))
                if kind is MemberKind.EXTEND and (args or kwargs):
                    raise ValueError("@extend takes only when=...")
                if kind is MemberKind.FORK:
                    edits = tuple(args)
                    if not edits or not all(isinstance(e, markers.Edit) for e in edits):
                        raise ValueError(
                            "@fork(...) takes edits (replace, insert_before, ...) as arguments"
                        )
                elif args:
                    raise ValueError("@override takes only deltas=(...)")
                deltas = tuple(kwargs.pop("deltas", ()))
                if kwargs:
                    raise ValueError(f"unknown arguments {sorted(kwargs)}")
            elif kind is MemberKind.FORK:
                raise ValueError(
                    "@fork needs at least one edit; use @override for an AFD-owned body"
                )
        except (ValueError, TypeError, SyntaxError) as exc:
            self.problem(item.lineno, f"{owner}.{item.name}: {exc}")
            return None
        ids = [e.id for e in edits]
        shared = {i for i in ids if ids.count(i) > 1}
        if any(e.when is None for e in edits if e.id in shared):
            self.problem(
                item.lineno,
                f"{owner}.{item.name}: edit ids must be unique, got {ids}; edits may share an id "
                "only as per-release alternatives, each with its when=",
            )
        for edit in edits:
            if edit.when is not None:
                try:
                    parse_range(edit.when)
                except ValueError as exc:
                    self.problem(item.lineno, f"{owner}.{item.name}: edit {edit.id!r}: {exc}")
        for edit in edits:
            if edit.action not in markers.ACTIONS or edit.count < 1 or not edit.why.strip():
                self.problem(
                    item.lineno,
                    f"{owner}.{item.name}: edit {edit.id!r} needs a valid action, count >= 1 and a why",
                )
        for d in deltas:  # kind and why are checked by markers.delta
            if d.when is not None:
                try:
                    parse_range(d.when)
                except ValueError as exc:
                    self.problem(
                        item.lineno, f"{owner}.{item.name}: delta {d.kind.value} {d.param}: {exc}"
                    )
        marker_texts = frozenset(ast.unparse(d) for d in item.decorator_list if self._marker_of(d))
        signature = Signature.from_ast(item, skip_decorators=marker_texts)
        return MemberDecl(
            name=item.name,
            kind=kind,
            node=cst_item.with_changes(decorators=kept),
            signature=signature,
            edits=edits,
            deltas=deltas,
            line=item.lineno,
            when=when,
        )

    @staticmethod
    def _member_when(value: Any) -> str | None:
        """A member's ``when=``: None or a valid release range (ValueError naming it)."""
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError(f"when={value!r}: a release range such as 'vllm>=0.30' is allowed")
        parse_range(value)
        return value

    def _attribute(
        self, owner: str, cst_item: cst.SimpleStatementLine, item: ast.Assign | ast.AnnAssign
    ) -> MemberDecl | None:
        target = item.targets[0] if isinstance(item, ast.Assign) else item.target
        value = item.value
        if (
            not isinstance(target, ast.Name)
            or not isinstance(value, ast.Call)
            or len(value.args) != 1
            or any(kw.arg != "when" for kw in value.keywords)
        ):
            self.problem(
                item.lineno,
                f"{owner}: write class attributes as `name = override_attr(value)` or `extend_attr(value)`",
            )
            return None
        marker = self._marker_of(value)
        if marker is None or marker[0] not in _ATTR_MARKERS:
            self.problem(
                item.lineno,
                f"{owner}.{target.id}: wrap the value in override_attr(...) or extend_attr(...)",
            )
            return None
        try:
            when = self._member_when(
                self.evaluate(value.keywords[0].value) if value.keywords else None
            )
        except (ValueError, SyntaxError) as exc:
            self.problem(item.lineno, f"{owner}.{target.id}: {exc}")
            return None
        small = cst_item.body[0]
        assert isinstance(small, cst.Assign | cst.AnnAssign) and isinstance(small.value, cst.Call)
        unwrapped = cst_item.with_changes(
            body=[small.with_changes(value=small.value.args[0].value)]
        )
        return MemberDecl(
            target.id, _ATTR_MARKERS[marker[0]], unwrapped, None, line=item.lineno, when=when
        )


def load_overlay(repo_root: Path, path: Path) -> OverlayModule:
    """Parse one overlay file; raises OverlayError listing every problem found."""
    text = (repo_root / path).read_text(encoding="utf-8")
    try:
        return _Reader(path, text).read()
    except cst.ParserSyntaxError as exc:
        raise OverlayError(
            [OverlayProblem(path, exc.raw_line, f"does not parse: {exc.message}")]
        ) from exc
    except SyntaxError as exc:
        raise OverlayError(
            [OverlayProblem(path, exc.lineno or 0, f"does not parse: {exc.msg}")]
        ) from exc


@dataclass(frozen=True)
class DeclaredMember:
    """A member of the current overlay, as generated for one of its class's bases."""

    #: the generated class, as the lock's classes spell it (``module:Class``)
    class_key: str
    #: the upstream base the class is generated from
    base: SymbolRef
    #: the overlay's declaration
    decl: MemberDecl
    #: the overlay class declaring it (its ``when=`` limits the member too)
    owner: OverlayClass

    def applies(self, versions: Mapping[str, str]) -> bool:
        """Whether upstream at ``versions`` gets this member: its class's range and its own hold."""
        return applies(self.owner, versions) and applies(self.decl, versions)


def declared_members(
    repo_root: Path, versions: Mapping[str, str] | None = None
) -> Iterator[DeclaredMember]:
    """Every member of every overlay class, once per base (as generated); with ``versions``, only
    the members upstream at those releases gets (their ``when=``)."""
    for path in overlay_files(repo_root):
        overlay = load_overlay(repo_root, path)
        classes = overlay.classes if versions is None else applicable(overlay.classes, versions)
        for overlay_class in classes:
            members = (
                overlay_class.members
                if versions is None
                else applicable(overlay_class.members, versions)
            )
            for base in overlay_class.bases:
                key = f"{overlay.generated_module}:{overlay_class.generated_name(base)}"
                for decl in members:
                    yield DeclaredMember(key, base, decl, overlay_class)


def committed_edits(
    repo_root: Path, versions: Mapping[str, str]
) -> dict[tuple[str, str], tuple[Edit, ...]]:
    """Fork edits of the current overlay's members at ``versions`` (every edit of each, whatever
    its own when=), keyed like the lock's classes (generated class, member)."""
    return {
        (member.class_key, member.decl.name): member.decl.edits
        for member in declared_members(repo_root, versions)
        if member.decl.edits
    }
