"""The sites of the overlay's hand-written code (:mod:`codegen.call_sites` says what a site is):
the bodies of override and extend members, the code of fork edits, and a generated fork body's
calls into another pinned package.

A forked body's own upstream calls are regenerated with it from the new release, so they follow
a change of their own package by construction; its calls into *another* pinned package (a
vLLM-Ascend fork calling vLLM) stay as they are when only that package moves, and are recorded
too, at the fork. So is the code of a fork's edits.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path

import libcst as cst

from codegen.call_sites import GeneratedBase, SiteUse, node_sites, registry_bases, walked
from codegen.index import UpstreamIndex
from codegen.lock import Place
from codegen.markers import Edit
from codegen.model import GeneratedClass, MemberKind
from codegen.names import ModuleNamespace
from codegen.places import Scopes
from codegen.site_scope import PlaceOf, Scope, file_scope


def _all_at(place: Place) -> PlaceOf:
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
    registry = registry_bases(
        {c.ref: GeneratedBase(c.base, frozenset(), c.overlay.name) for c in classes}
    )
    found: list[SiteUse] = []
    parsed: dict[Path, tuple[ast.Module, Scopes, Scope]] = {}
    for generated in classes:
        path = generated.overlay_path
        if path not in parsed:
            tree = ast.parse((repo_root / path).read_text(encoding="utf-8"))
            parsed[path] = (tree, Scopes.of(tree), file_scope(tree, index, registry))
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
    tree: ast.Module,
    scopes: Scopes,
    names: Scope,
    index: UpstreamIndex,
    generated: GeneratedClass,
) -> Iterator[SiteUse]:
    declared = generated.overlay
    node = next(
        (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == declared.name), None
    )
    if node is None:
        return
    own = frozenset(m.decl.name for m in generated.members)
    scope = Scope(
        names.imported,
        generated.base,
        own,
        names.os_names,
        names.registry_names,
        names.registry,
        names.local_classes,
    )
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
            # the parameters too: an annotated one makes its attributes upstream's
            nodes = [function, *ast.walk(function.args), *walked(function.body)]
            yield from node_sites(nodes, scope, index, user, place)
        elif decl.kind is MemberKind.FORK:
            applied = {a.edit.id for a in member.anchors}
            code = [s for edit in decl.edits if edit.id in applied for s in _edit_code(edit)]
            yield from node_sites(walked(code), scope, index, user, _all_at(place(function)))


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
    scope = Scope(imported, generated.base, frozenset(m.decl.name for m in generated.members))
    key = f"{generated.module}:{generated.name}"
    for member in generated.members:
        if member.decl.kind is not MemberKind.FORK or not isinstance(member.node, cst.FunctionDef):
            continue
        code = textwrap.dedent(cst.Module([]).code_for_node(member.node))
        at = Place(
            generated.overlay_path.as_posix(), f"{generated.overlay.name}.{member.decl.name}"
        )
        user = f"{key}.{member.decl.name}"
        body = walked(ast.parse(code).body)
        for found in node_sites(body, scope, index, user, _all_at(at)):
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
