"""Where AFD's hand-written code uses upstream, and how: the calls, constructions, attribute reads
and writes, environment variables and derived classes of override and extend bodies, of fork
edits' code (:mod:`codegen.overlay_sites`) and of the runtime (``afd_models/``). The lock records
each as a :class:`~codegen.lock.Site` of the symbol, at its file and enclosing function
(:class:`~codegen.lock.Place`, :mod:`codegen.places`), so drift can tell whether a new release
still accepts it (:mod:`codegen.drift.call_sites`, :mod:`codegen.drift.values`).

What is resolved, statically:

* a name imported from upstream, called (a function, or a class constructed) or with a member
  called or read (``Class.method(...)``, ``Class.ATTR``);
* in a class whose base is upstream (every overlay class; a runtime class deriving from an
  imported upstream or generated class): ``self.x(...)``, ``super().x(...)``, ``self.x`` and
  ``self.x = ...``, where the class itself does not define ``x``. ``x`` may be a method, a class
  attribute or an attribute a method running on the class sets on ``self``;
* a parameter annotated with an imported upstream class: ``vllm_config.x``, ``vllm_config.f()``;
* what is done with a member read: a method called on it (``.update()``), an index (``[]``), an
  iteration (``iter``): the site's ``operations``, judged against the attribute's type;
* an environment variable of an upstream environment table, read through its module
  (``envs.VLLM_X``) or through ``os.environ`` / ``os.getenv`` (written through ``os.environ``);
* a class of the runtime derived from an imported upstream class: a ``subclass`` site, and its
  constructions as constructions of the upstream class (its fields, less the subclass's own);
* a class of the generated registry constructed through ``generated_subclass("AFDX", Base)``, at
  once or through the name it is bound to in the same function: a construction of each upstream
  base the overlay class is generated for (``Base`` when it names one), ``via`` the registry.

Not checked: fork edits whose code holds ``$`` captures; values of unknown type (``runner: Any``),
whose attributes the runtime declares in ``afd_models/upstream_fields.py``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from codegen.index import Member, UpstreamIndex
from codegen.lock import Place, Site, SiteKind, SymbolUse
from codegen.model import GENERATED_PACKAGE, SymbolRef
from codegen.places import REGISTRY_FUNCTION, Scopes
from codegen.site_scope import PlaceOf, Scope, file_scope
from codegen.value_sites import (
    annotated_parameters,
    environment_site,
    name_of,
    operations_on,
    registry_call,
    registry_variables,
)


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
    #: the overlay class it is generated from (``generated_subclass``'s first argument)
    declared: str = ""


def registry_bases(
    generated: Mapping[SymbolRef, GeneratedBase],
) -> dict[str, tuple[SymbolRef, ...]]:
    """Overlay class -> the upstream bases it is generated for, as ``generated_subclass`` finds
    them."""
    found: dict[str, list[SymbolRef]] = {}
    for made in generated.values():
        found.setdefault(made.declared, []).append(made.base)
    return {name: tuple(sorted(bases, key=str)) for name, bases in found.items()}


def runtime_sites(
    tree: ast.Module,
    path: str,
    index: UpstreamIndex,
    generated: Mapping[SymbolRef, GeneratedBase],
) -> Iterator[SiteUse]:
    """The sites of one runtime file (``path``, repository-relative); ``generated``: the
    generated classes by reference, which runtime classes may derive from."""
    scope = file_scope(tree, index, registry_bases(generated))
    bases = dict(scope.imported)
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

    for name, local in scope.local_classes.items():
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
        # a subclass site's keywords: the fields the subclass declares itself
        site = Site(place(node), SiteKind.SUBCLASS, path, keywords=tuple(sorted(local.fields)))
        yield SiteUse(local.base, SymbolUse.SUBCLASSED_BY_AFD, path, site)
    yield from _scoped_sites(tree.body, scope, bases, own_of_generated, index, path, place)


def _scoped_sites(
    statements: list[ast.stmt],
    scope: Scope,
    bases: Mapping[str, SymbolRef],
    own_of_generated: Mapping[str, frozenset[str]],
    index: UpstreamIndex,
    path: str,
    place: PlaceOf,
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
    yield from node_sites(nodes, scope, index, path, place)
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
        inner = Scope(
            scope.imported,
            bases[base] if base else None,
            own,
            scope.os_names,
            scope.registry_names,
            scope.registry,
            scope.local_classes,
        )
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


def walked(statements: list[ast.stmt]) -> list[ast.AST]:
    """Every node of ``statements``, nested ones included."""
    return [node for statement in statements for node in ast.walk(statement)]


def _shallow(statement: ast.stmt) -> Iterator[ast.AST]:
    """Every node of ``statement``; a nested class definition is yielded, not descended into."""
    stack: list[ast.AST] = [statement]
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))


@dataclass(frozen=True)
class _Context:
    """What :func:`node_sites` learns about the nodes before it looks at each."""

    #: id(child) -> its parent
    parents: Mapping[int, ast.AST]
    #: (function, parameter) -> the upstream class it is annotated with
    parameters: Mapping[tuple[str, str], SymbolRef]
    #: (function, name) -> where a ``generated_subclass`` call bound it in that function (its
    #: line), the overlay class and the bases that call names; in source order
    registry_variables: Mapping[tuple[str, str], tuple[tuple[int, str, tuple[SymbolRef, ...]], ...]]

    def registry_variable(
        self, function: str, call: ast.Call
    ) -> tuple[str, tuple[SymbolRef, ...]] | None:
        """What calling the name ``call.func`` constructs: the last binding before the call."""
        if not isinstance(call.func, ast.Name):
            return None
        bound = self.registry_variables.get((function, call.func.id), ())
        before = [(name, bases) for line, name, bases in bound if line < call.lineno]
        return before[-1] if before else None


def node_sites(
    nodes: list[ast.AST], scope: Scope, index: UpstreamIndex, user: str, place: PlaceOf
) -> Iterator[SiteUse]:
    """The sites among ``nodes``, each at ``place(node)``."""
    callees = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    context = _Context(
        {id(child): parent for parent in nodes for child in ast.iter_child_nodes(parent)},
        annotated_parameters(nodes, scope, index, place),
        registry_variables(nodes, scope, index, place),
    )
    for node in nodes:
        environment = environment_site(node, scope, index, place)
        if environment is not None:
            ref, site = environment
            use = SymbolUse.READ_BY_AFD if site.how is SiteKind.READ else SymbolUse.WRITTEN_BY_AFD
            yield SiteUse(ref, use, user, Site(site.at, site.how, user, via=site.via))
        elif isinstance(node, ast.Call):
            for ref, how, explicit_self, via, dropped in _callees(
                node, scope, index, place, context
            ):
                yield SiteUse(
                    ref,
                    SymbolUse.CALLED_BY_AFD,
                    user,
                    _call(node, how, user, place, explicit_self, via, dropped),
                )
        elif isinstance(node, ast.Attribute) and id(node) not in callees:
            target = _resolve(
                node,
                scope,
                index,
                False,
                context.parameters.get((place(node).function, name_of(node.value))),
            )
            if target is None:
                continue
            if isinstance(node.ctx, ast.Load):
                site = Site(
                    place(node),
                    SiteKind.READ,
                    user,
                    operations=operations_on(node, context.parents),
                )
                yield SiteUse(target[0], SymbolUse.READ_BY_AFD, user, site)
            else:  # AFD sets what upstream sets: a rename there leaves AFD's line doing nothing
                site = Site(place(node), SiteKind.WRITE, user)
                yield SiteUse(target[0], SymbolUse.WRITTEN_BY_AFD, user, site)


def _call(
    node: ast.Call,
    how: SiteKind,
    user: str,
    place: PlaceOf,
    explicit_self: bool,
    via: str,
    dropped: frozenset[str],
) -> Site:
    """The site of one call: its arguments (less ``dropped`` keywords, which bind elsewhere)."""
    positional = sum(not isinstance(a, ast.Starred) for a in node.args)
    return Site(
        place(node),
        how,
        user,
        positional - explicit_self,
        tuple(sorted(k.arg for k in node.keywords if k.arg is not None and k.arg not in dropped)),
        any(isinstance(a, ast.Starred) for a in node.args)
        or any(k.arg is None for k in node.keywords),
        via,
    )


def _callees(
    node: ast.Call, scope: Scope, index: UpstreamIndex, place: PlaceOf, context: _Context
) -> Iterator[tuple[SymbolRef, SiteKind, bool, str, frozenset[str]]]:
    """What one call calls or constructs upstream: (symbol, how, passes ``self`` explicitly,
    via, keywords that bind to the subclass's own fields)."""
    function = place(node).function
    registry = registry_call(node.func, scope, index) or context.registry_variable(function, node)
    if registry is not None:
        name, bases = registry
        for base in bases:
            yield base, SiteKind.CONSTRUCT, False, f"{REGISTRY_FUNCTION}:{name}", frozenset()
        return
    if isinstance(node.func, ast.Name) and node.func.id in scope.local_classes:
        local = scope.local_classes[node.func.id]
        if not local.has_init:
            yield local.base, SiteKind.CONSTRUCT, False, f"subclass:{node.func.id}", local.fields
        return
    annotated = context.parameters.get((function, name_of(getattr(node.func, "value", None))))
    target = _resolve(node.func, scope, index, True, annotated)
    if target is not None:
        ref, how, explicit_self = target
        yield ref, how, explicit_self, "", frozenset()


def _resolve(
    node: ast.expr,
    scope: Scope,
    index: UpstreamIndex,
    called: bool,
    annotated: SymbolRef | None = None,
) -> tuple[SymbolRef, SiteKind, bool] | None:
    """The upstream symbol ``node`` names, what calling (or reading) it does, and whether a call
    passes the instance explicitly (``Class.method(obj, ...)``). ``annotated``: the upstream
    class the name ``node`` is an attribute of is annotated with, if any."""
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
    owner = annotated or _owner(node.value, scope, index)
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


def _owner(node: ast.expr, scope: Scope, index: UpstreamIndex) -> SymbolRef | None:
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
