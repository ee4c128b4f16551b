"""Where AFD's hand-written code uses upstream members, and how: the calls, constructions,
attribute reads and writes of override and extend bodies, of fork edits' code and of the runtime
(``afd_models/``). The lock records each as a :class:`~codegen.lock.Site` of the symbol, so drift
can tell whether a new release still accepts the call (:mod:`codegen.drift.call_sites`).

A forked body's own upstream calls are regenerated with it from the new release, so they follow
a change of their own package by construction; its calls into *another* pinned package (a
vLLM-Ascend fork calling vLLM) stay as they are when only that package moves, and are recorded
too, at the fork's declaration.

What is resolved, statically:

* a name imported from upstream, called (a function, or a class constructed) or with a member
  called or read (``Class.method(...)``, ``Class.ATTR``);
* in a class whose base is upstream (every overlay class; a runtime class deriving from an
  imported upstream or generated class): ``self.x(...)``, ``super().x(...)``, ``self.x`` and
  ``self.x = ...``, where the class itself does not define ``x``. ``x`` may be a method, a class
  attribute or an attribute a method running on the class sets on ``self``.

Not checked: constructors other than an ``__init__`` or the fields of a ``@dataclass``, vLLM
``@config`` or ``NamedTuple`` class; fork edits whose code holds ``$`` captures.

Values of unknown type (a parameter ``runner: Any``) are not followed: the attributes the runtime
reads through them are declared in ``afd_models/upstream_fields.py``.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from codegen.index import Member, UpstreamIndex
from codegen.lock import Site, SiteKind, SymbolUse
from codegen.markers import Edit
from codegen.model import GeneratedClass, MemberKind, Param, ParamKind, Signature, SymbolRef
from codegen.names import ModuleNamespace

#: the upstream package of generated classes, as runtime modules import them
_GENERATED_PACKAGE = "afd_models._generated."


@dataclass(frozen=True)
class SiteUse:
    """One site: the upstream symbol, how the lock counts it, who uses it."""

    ref: SymbolRef
    use: SymbolUse
    #: the lock's ``used_by`` entry: a generated member, or a runtime file
    user: str
    site: Site


@dataclass(frozen=True)
class _Scope:
    """What names mean in the code being scanned."""

    #: local name -> the upstream symbol it is bound to
    imported: Mapping[str, SymbolRef]
    #: the upstream class ``self`` and ``super()`` resolve in (None: outside such a class)
    self_class: SymbolRef | None = None
    #: names the scanned class defines itself (its own members shadow upstream's)
    own: frozenset[str] = frozenset()


def call_signature(index: UpstreamIndex, ref: SymbolRef, how: SiteKind) -> Signature | None:
    """The signature a call site binds against, ``self``/``cls`` left out: a function's, a
    method's, or a class's constructor (its ``__init__``, else a dataclass's fields); None when it
    cannot be known statically."""
    if how is SiteKind.CONSTRUCT:
        init = index.find_member(ref, "__init__")
        if init is not None and init.is_method:
            return _bound(init.signature())
        return _dataclass_signature(index, ref)
    owner, _, member = ref.qualname.partition(".")
    if member:
        found = index.find_member(SymbolRef(ref.module, owner), member)
        if found is None or not found.is_method:
            return None
        signature = found.signature()
        return signature if "staticmethod" in signature.decorators else _bound(signature)
    info = index.module(ref.module)
    if info is not None and ref.qualname in info.functions:
        return Signature.from_ast(info.functions[ref.qualname])
    return None


def _bound(signature: Signature) -> Signature:
    positional = (ParamKind.POSITIONAL_ONLY, ParamKind.POSITIONAL_OR_KEYWORD)
    if signature.params and signature.params[0].kind in positional:
        return Signature(signature.params[1:], signature.returns, signature.decorators)
    return signature


#: decorators and bases that make a class's constructor take its annotated fields
_FIELD_CLASSES = ("dataclass", "config", "NamedTuple")


def _dataclass_signature(index: UpstreamIndex, ref: SymbolRef) -> Signature | None:
    """The constructor of a class built from its annotated fields (``@dataclass``, vLLM's
    ``@config``, ``NamedTuple``): the fields of every such class along the MRO, bases first, as
    keyword-or-positional parameters; a ``field(...)`` without ``default=`` or
    ``default_factory=`` is required. None for any other class."""

    def builds_fields(node: ast.ClassDef) -> bool:
        marks = [*node.decorator_list, *node.bases]
        return any(name in _FIELD_CLASSES for mark in marks for name in (_called_name(mark),))

    nodes = [n for cls in index.mro(ref) if (n := index.class_node(cls)) is not None]
    if not any(builds_fields(node) for node in nodes):
        return None
    fields: dict[str, Param] = {}
    for node in reversed(nodes):
        if not builds_fields(node):
            continue
        for statement in node.body:
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and "ClassVar" not in ast.unparse(statement.annotation)
            ):
                fields[statement.target.id] = Param(
                    statement.target.id,
                    ParamKind.POSITIONAL_OR_KEYWORD,
                    _field_default(statement.value),
                )
    return Signature(tuple(fields.values()), None)


def _called_name(node: ast.expr) -> str:
    """``dataclass`` of ``@dataclass``, ``@dataclass(frozen=True)``, ``dataclasses.dataclass``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _field_default(value: ast.expr | None) -> str | None:
    """A field's default as source text; None when the field is required."""
    if value is None:
        return None
    if isinstance(value, ast.Call) and _called_name(value) == "field":
        given = {k.arg for k in value.keywords}
        if not given & {"default", "default_factory"}:
            return None
    return ast.unparse(value)


def binding_problem(signature: Signature, site: Site) -> str | None:
    """Why a call with ``site``'s arguments does not bind to ``signature``; None when it does."""
    if site.how not in (SiteKind.CALL, SiteKind.CONSTRUCT):
        return None
    params = signature.params
    positional = [
        p for p in params if p.kind in (ParamKind.POSITIONAL_ONLY, ParamKind.POSITIONAL_OR_KEYWORD)
    ]
    var_positional = any(p.kind is ParamKind.VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind is ParamKind.VAR_KEYWORD for p in params)
    if site.positional > len(positional) and not var_positional:
        return f"takes {len(positional)} positional argument(s), AFD passes {site.positional}"
    bound = {p.name for p in positional[: site.positional]}
    by_name = {p.name: p for p in params}
    for keyword in site.keywords:
        param = by_name.get(keyword)
        accepts = param is not None and param.kind in (
            ParamKind.POSITIONAL_OR_KEYWORD,
            ParamKind.KEYWORD_ONLY,
        )
        if not accepts and not var_keyword:
            return f"has no parameter {keyword!r}, which AFD passes by keyword"
        if keyword in bound:
            return f"gets {keyword!r} twice: by position and by keyword"
        bound.add(keyword)
    if site.unpacked:
        return None  # *args / **kwargs may supply the rest
    required = [
        p.name
        for p in params
        if p.default is None
        and p.kind not in (ParamKind.VAR_POSITIONAL, ParamKind.VAR_KEYWORD)
        and p.name not in bound
    ]
    if required:
        return f"requires {', '.join(map(repr, required))}, which AFD does not pass"
    return None


def afd_sites(
    repo_root: Path,
    index: UpstreamIndex,
    classes: list[GeneratedClass],
    namespaces: Mapping[str, ModuleNamespace],
    runtime: list[Path],
) -> list[SiteUse]:
    """Every site of the overlay's applicable members, of forked bodies' calls into another
    package, and of the ``runtime`` files."""
    found: list[SiteUse] = []
    trees: dict[Path, ast.Module] = {}
    for generated in classes:
        path = generated.overlay_path
        if path not in trees:
            trees[path] = ast.parse((repo_root / path).read_text(encoding="utf-8"))
        own = list(_overlay_class_sites(trees[path], index, generated))
        found.extend(own)
        namespace = namespaces.get(generated.module)
        if namespace is not None:  # a fork's edit code is in both: keep its site at the edit
            seen = {_same_call(use) for use in own}
            found.extend(
                use
                for use in _cross_package_sites(index, generated, namespace)
                if _same_call(use) not in seen
            )
    generated_bases = {c.ref: c for c in classes}
    for path in runtime:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        relative = path.relative_to(repo_root).as_posix()
        found.extend(_runtime_sites(tree, relative, index, generated_bases))
    return found


def _overlay_class_sites(
    tree: ast.Module, index: UpstreamIndex, generated: GeneratedClass
) -> Iterator[SiteUse]:
    declared = generated.overlay
    node = next(
        (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == declared.name), None
    )
    if node is None:
        return
    imported = _imported(tree, index)
    own = frozenset(m.decl.name for m in generated.members)
    scope = _Scope(imported, generated.base, own)
    key = f"{generated.module}:{generated.name}"
    path = generated.overlay_path.as_posix()
    for member in generated.members:
        decl = member.decl
        function = _function_at(node, decl.name, decl.line)
        if function is None:
            continue
        user = f"{key}.{decl.name}"
        if decl.kind in (MemberKind.OVERRIDE, MemberKind.EXTEND):
            yield from _node_sites(_walked(function.body), scope, index, path, user)
        elif decl.kind is MemberKind.FORK:
            applied = {a.edit.id for a in member.anchors}
            for edit in decl.edits:
                if edit.id in applied:
                    line = _edit_line(function, edit)
                    yield from _node_sites(
                        _walked(_edit_code(edit)), scope, index, path, user, line
                    )


def _same_call(use: SiteUse) -> tuple[object, ...]:
    """What makes two sites of one member the same use, wherever each says it is."""
    site = use.site
    return (use.ref, use.user, site.how, site.positional, site.keywords, site.unpacked)


def _cross_package_sites(
    index: UpstreamIndex, generated: GeneratedClass, namespace: ModuleNamespace
) -> Iterator[SiteUse]:
    """The calls and reads of each generated fork body into a package other than its own."""
    own_package = generated.base.module.split(".", 1)[0]
    imported = {
        **{name: namespace.definition(ref) for name, ref in namespace.overlay.items()},
        **{name: ref for name, (_, ref) in namespace.added.items()},
    }
    scope = _Scope(imported, generated.base, frozenset(m.decl.name for m in generated.members))
    key = f"{generated.module}:{generated.name}"
    for member in generated.members:
        if member.decl.kind is not MemberKind.FORK or not isinstance(member.node, cst.FunctionDef):
            continue
        code = textwrap.dedent(cst.Module([]).code_for_node(member.node))
        at = generated.overlay_path.as_posix()
        user = f"{key}.{member.decl.name}"
        body = _walked(ast.parse(code).body)
        for found in _node_sites(body, scope, index, at, user, member.decl.line):
            if found.ref.module.split(".", 1)[0] != own_package:
                yield found


def _function_at(
    node: ast.ClassDef, name: str, line: int
) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The method ``name`` of ``node`` whose definition (decorators included) spans ``line``."""
    for statement in node.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef) and statement.name == name:
            first = min([statement.lineno, *(d.lineno for d in statement.decorator_list)])
            if first <= line <= statement.lineno:
                return statement
    return None


def _edit_line(function: ast.FunctionDef | ast.AsyncFunctionDef, edit: Edit) -> int:
    """The line of the call that declares ``edit`` (its ``id=``) in the fork's decorator."""
    for decorator in function.decorator_list:
        for call in ast.walk(decorator):
            if isinstance(call, ast.Call) and any(
                k.arg == "id" and isinstance(k.value, ast.Constant) and k.value.value == edit.id
                for k in call.keywords
            ):
                return call.lineno
    return function.lineno


def _edit_code(edit: Edit) -> list[ast.stmt]:
    """The statements an edit adds (a ``wrap`` header gets a body to parse)."""
    statements: list[ast.stmt] = []
    for code in (edit.code, edit.orelse):
        if not code:
            continue
        text = textwrap.dedent(code)
        for candidate in (text, text + "\n    pass"):
            try:
                statements += ast.parse(candidate).body
                break
            except SyntaxError:
                continue  # a wrap header needs a body; code with $captures is left out
    return statements


def _imported(tree: ast.Module, index: UpstreamIndex) -> dict[str, SymbolRef]:
    """Names any ``from <upstream> import x`` of the file binds, resolved to their definition."""
    found: dict[str, SymbolRef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if not index.owns(node.module):
                continue
            for alias in node.names:
                ref = index.resolve(node.module, alias.name)
                if ref is not None and index.owns(ref.module):
                    found[alias.asname or alias.name] = ref
    return found


def _runtime_sites(
    tree: ast.Module,
    path: str,
    index: UpstreamIndex,
    generated: Mapping[SymbolRef, GeneratedClass],
) -> Iterator[SiteUse]:
    imported = _imported(tree, index)
    bases = dict(imported)
    own_of_generated: dict[str, frozenset[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_GENERATED_PACKAGE):
            for alias in node.names:
                made = generated.get(SymbolRef(str(node.module), alias.name))
                if made is not None:
                    bases[alias.asname or alias.name] = made.base
                    own_of_generated[alias.asname or alias.name] = frozenset(
                        m.decl.name for m in made.members
                    )
    yield from _scoped_sites(tree.body, _Scope(imported), bases, own_of_generated, index, path)


def _scoped_sites(
    statements: list[ast.stmt],
    scope: _Scope,
    bases: Mapping[str, SymbolRef],
    own_of_generated: Mapping[str, frozenset[str]],
    index: UpstreamIndex,
    path: str,
) -> Iterator[SiteUse]:
    """The sites of runtime code: ``self`` resolves in the class that encloses it, if that class
    derives from an upstream (or generated) class it names directly."""
    nested: list[ast.ClassDef] = []
    nodes: list[ast.AST] = []
    for statement in statements:
        for node in _shallow(statement):
            if isinstance(node, ast.ClassDef):
                nested.append(node)
            else:
                nodes.append(node)
    yield from _node_sites(nodes, scope, index, path, path)
    for cls in nested:
        base = next(
            (
                b.id
                for b in cls.bases
                if isinstance(b, ast.Name) and b.id in bases and index.is_indexed_class(bases[b.id])
            ),
            None,
        )
        own = frozenset(_defined_names(cls)) | own_of_generated.get(base or "", frozenset())
        inner = _Scope(scope.imported, bases[base] if base else None, own)
        yield from _scoped_sites(cls.body, inner, bases, own_of_generated, index, path)


def _defined_names(cls: ast.ClassDef) -> set[str]:
    """The names a class body defines (methods, attributes) and its methods set on ``self``."""
    names: set[str] = set()
    for statement in cls.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(statement.name)
            for node in ast.walk(statement):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                ):
                    names.add(node.attr)
        elif isinstance(statement, ast.Assign | ast.AnnAssign):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _walked(statements: list[ast.stmt]) -> list[ast.AST]:
    """Every node of ``statements``, nested ones included."""
    return [node for statement in statements for node in ast.walk(statement)]


def _node_sites(
    nodes: list[ast.AST],
    scope: _Scope,
    index: UpstreamIndex,
    path: str,
    user: str,
    line: int | None = None,
) -> Iterator[SiteUse]:
    """The sites among ``nodes`` (``line``: every site's line, for code parsed from a string)."""
    callees = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    for node in nodes:
        at = f"{path}:{line or node.lineno}" if isinstance(node, ast.expr) else ""
        if isinstance(node, ast.Call):
            target = _resolve(node.func, scope, index, called=True)
            if target is None:
                continue
            ref, how, explicit_self = target
            positional = sum(not isinstance(a, ast.Starred) for a in node.args)
            site = Site(
                at,
                how,
                user,
                positional - explicit_self,
                tuple(sorted(k.arg for k in node.keywords if k.arg is not None)),
                any(isinstance(a, ast.Starred) for a in node.args)
                or any(k.arg is None for k in node.keywords),
            )
            yield SiteUse(ref, SymbolUse.CALLED_BY_AFD, user, site)
        elif isinstance(node, ast.Attribute) and id(node) not in callees:
            target = _resolve(node, scope, index, called=False)
            if target is None:
                continue
            if isinstance(node.ctx, ast.Load):
                yield SiteUse(target[0], SymbolUse.READ_BY_AFD, user, Site(at, SiteKind.READ, user))
            else:  # AFD sets what upstream sets: a rename there leaves AFD's line doing nothing
                site = Site(at, SiteKind.WRITE, user)
                yield SiteUse(target[0], SymbolUse.WRITTEN_BY_AFD, user, site)


def _shallow(statement: ast.stmt) -> Iterator[ast.AST]:
    """Every node of ``statement``; a nested class definition is yielded, not descended into."""
    stack: list[ast.AST] = [statement]
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))


def _resolve(
    node: ast.expr, scope: _Scope, index: UpstreamIndex, called: bool
) -> tuple[SymbolRef, SiteKind, bool] | None:
    """The upstream symbol ``node`` names, what calling (or reading) it does, and whether a call
    passes the instance explicitly (``Class.method(obj, ...)``)."""
    if isinstance(node, ast.Name):
        ref = scope.imported.get(node.id)
        if ref is None or not called:
            return None  # reading an imported name is its import, recorded already
        if index.is_indexed_class(ref):
            return ref, SiteKind.CONSTRUCT, False
        info = index.module(ref.module)
        if info is not None and ref.qualname in info.functions:
            return ref, SiteKind.CALL, False
        return None
    if not isinstance(node, ast.Attribute):
        return None
    if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in scope.own:
        return None  # the class's own member, not upstream's
    owner = _owner(node.value, scope, index)
    if owner is None:
        return None
    member: Member | None = index.find_member(owner, node.attr)
    if member is None:
        member = index.instance_attribute(owner, node.attr)
    if member is None:
        return None
    if called and member.is_method:
        through_class = isinstance(node.value, ast.Name) and node.value.id in scope.imported
        decorators = {ast.unparse(d) for d in getattr(member.node, "decorator_list", [])}
        plain = not decorators & {"staticmethod", "classmethod"}
        return member.ref, SiteKind.CALL, through_class and plain
    return member.ref, SiteKind.READ, False


def _owner(node: ast.expr, scope: _Scope, index: UpstreamIndex) -> SymbolRef | None:
    """The upstream class whose member ``node.<attr>`` is: ``self``'s or ``super()``'s base, or
    an imported class."""
    if isinstance(node, ast.Name) and node.id == "self":
        return scope.self_class
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super":
        return scope.self_class  # super(Class, self) too: AFD's classes name their own
    if isinstance(node, ast.Name) and node.id in scope.imported:
        ref = scope.imported[node.id]
        return ref if index.is_indexed_class(ref) else None
    return None
