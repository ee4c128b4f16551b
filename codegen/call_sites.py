"""Where AFD's hand-written code uses upstream members, and how: the calls, constructions,
attribute reads and writes of override and extend bodies, of fork edits' code and of the runtime
(``afd_models/``). The lock records each as a :class:`~codegen.lock.Site` of the symbol, at its
file and enclosing function (:class:`~codegen.lock.Place`, :mod:`codegen.places`), so drift can
tell whether a new release still accepts the call (:mod:`codegen.drift.call_sites`).

A forked body's own upstream calls are regenerated with it from the new release, so they follow
a change of their own package by construction; its calls into *another* pinned package (a
vLLM-Ascend fork calling vLLM) stay as they are when only that package moves, and are recorded
too, at the fork. So is the code of a fork's edits.

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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from codegen.index import Member, UpstreamIndex
from codegen.lock import Place, Site, SiteKind, SymbolUse
from codegen.markers import Edit
from codegen.model import GeneratedClass, MemberKind, SymbolRef
from codegen.names import ModuleNamespace
from codegen.places import Scopes

#: the upstream package of generated classes, as runtime modules import them
GENERATED_PACKAGE = "afd_models._generated"


@dataclass(frozen=True)
class SiteUse:
    """One site: the upstream symbol, how the lock counts it, who uses it."""

    ref: SymbolRef
    use: SymbolUse
    #: the lock's ``used_by`` entry: a generated member, or a runtime file
    user: str
    site: Site


@dataclass(frozen=True)
class GeneratedBase:
    """What runtime code deriving from a generated class sees of it (from the generation, or
    from a lock's ``classes``)."""

    #: the upstream class ``self`` and ``super()`` resolve in
    base: SymbolRef
    #: the members the generated class defines itself (they shadow upstream's)
    own: frozenset[str]


@dataclass(frozen=True)
class _Scope:
    """What names mean in the code being scanned."""

    #: local name -> the upstream symbol it is bound to
    imported: Mapping[str, SymbolRef]
    #: the upstream class ``self`` and ``super()`` resolve in (None: outside such a class)
    self_class: SymbolRef | None = None
    #: names the scanned class defines itself (its own members shadow upstream's)
    own: frozenset[str] = frozenset()


#: the place of a scanned node
_PlaceOf = Callable[[ast.AST], Place]


def _all_at(place: Place) -> _PlaceOf:
    """Every node at ``place``: code parsed from a string (a fork edit's, a generated body) is at
    the fork."""
    return lambda _: place


def overlay_sites(
    repo_root: Path,
    index: UpstreamIndex,
    classes: list[GeneratedClass],
    namespaces: Mapping[str, ModuleNamespace],
) -> list[SiteUse]:
    """Every site of the overlay's applicable members, and of forked bodies' calls into another
    package."""
    found: list[SiteUse] = []
    parsed: dict[Path, tuple[ast.Module, Scopes]] = {}
    for generated in classes:
        path = generated.overlay_path
        if path not in parsed:
            tree = ast.parse((repo_root / path).read_text(encoding="utf-8"))
            parsed[path] = (tree, Scopes.of(tree))
        own = list(_overlay_class_sites(*parsed[path], index, generated))
        found.extend(own)
        namespace = namespaces.get(generated.module)
        if namespace is not None:  # a fork's edit code is in both: record its sites once
            seen = {_same_call(use) for use in own}
            found.extend(
                use
                for use in _cross_package_sites(index, generated, namespace)
                if _same_call(use) not in seen
            )
    return found


def _overlay_class_sites(
    tree: ast.Module, scopes: Scopes, index: UpstreamIndex, generated: GeneratedClass
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

    def place(node: ast.AST) -> Place:
        return Place(path, scopes.name(node))

    for member in generated.members:
        decl = member.decl
        function = _function_at(node, decl.name, decl.line)
        if function is None:
            continue
        user = f"{key}.{decl.name}"
        if decl.kind in (MemberKind.OVERRIDE, MemberKind.EXTEND):
            yield from _node_sites(_walked(function.body), scope, index, user, place)
        elif decl.kind is MemberKind.FORK:
            applied = {a.edit.id for a in member.anchors}
            code = [s for edit in decl.edits if edit.id in applied for s in _edit_code(edit)]
            yield from _node_sites(_walked(code), scope, index, user, _all_at(place(function)))


def _same_call(use: SiteUse) -> tuple[object, ...]:
    """What makes two sites of one member the same use, wherever each says it is."""
    site = use.site
    return (use.ref, use.user, site.how, site.positional, site.keywords, site.unpacked)


def _cross_package_sites(
    index: UpstreamIndex, generated: GeneratedClass, namespace: ModuleNamespace
) -> Iterator[SiteUse]:
    """The calls and reads of each generated fork body into a package other than its own, at
    the fork (overlay classes are top-level: ``Class.member`` is its qualified name)."""
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
        at = Place(
            generated.overlay_path.as_posix(), f"{generated.overlay.name}.{member.decl.name}"
        )
        user = f"{key}.{member.decl.name}"
        body = _walked(ast.parse(code).body)
        for found in _node_sites(body, scope, index, user, _all_at(at)):
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


def runtime_sites(
    tree: ast.Module,
    path: str,
    index: UpstreamIndex,
    generated: Mapping[SymbolRef, GeneratedBase],
) -> Iterator[SiteUse]:
    """The sites of one runtime file (``path``, repository-relative); ``generated``: the
    generated classes by reference, which runtime classes may derive from."""
    imported = _imported(tree, index)
    bases = dict(imported)
    own_of_generated: dict[str, frozenset[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            GENERATED_PACKAGE + "."
        ):
            for alias in node.names:
                made = generated.get(SymbolRef(str(node.module), alias.name))
                if made is not None:
                    bases[alias.asname or alias.name] = made.base
                    own_of_generated[alias.asname or alias.name] = made.own
    scopes: list[Scopes] = []  # computed for the first site: most files have none

    def place(node: ast.AST) -> Place:
        if not scopes:
            scopes.append(Scopes.of(tree))
        return Place(path, scopes[0].name(node))

    yield from _scoped_sites(
        tree.body, _Scope(imported), bases, own_of_generated, index, path, place
    )


def _scoped_sites(
    statements: list[ast.stmt],
    scope: _Scope,
    bases: Mapping[str, SymbolRef],
    own_of_generated: Mapping[str, frozenset[str]],
    index: UpstreamIndex,
    path: str,
    place: _PlaceOf,
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
    yield from _node_sites(nodes, scope, index, path, place)
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
        yield from _scoped_sites(cls.body, inner, bases, own_of_generated, index, path, place)


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
    nodes: list[ast.AST], scope: _Scope, index: UpstreamIndex, user: str, place: _PlaceOf
) -> Iterator[SiteUse]:
    """The sites among ``nodes``, each at ``place(node)``."""
    callees = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    for node in nodes:
        if isinstance(node, ast.Call):
            target = _resolve(node.func, scope, index, called=True)
            if target is None:
                continue
            ref, how, explicit_self = target
            positional = sum(not isinstance(a, ast.Starred) for a in node.args)
            site = Site(
                place(node),
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
                site = Site(place(node), SiteKind.READ, user)
                yield SiteUse(target[0], SymbolUse.READ_BY_AFD, user, site)
            else:  # AFD sets what upstream sets: a rename there leaves AFD's line doing nothing
                site = Site(place(node), SiteKind.WRITE, user)
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
