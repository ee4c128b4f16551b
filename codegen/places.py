"""Places in this repository's hand-written code: the function around each node, as the lock
records a use (:class:`~codegen.lock.Place`), and the line a recorded use is on now.

The lock names where AFD's code uses upstream by file and qualified function, never by line, so
moving code rewrites no lock. A finding about a recorded use (drift's, ``check``'s, SARIF's)
shows the line looked up here, in the file as it is when the finding is reported.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from codegen.findings import Location
from codegen.lock import Site, SiteKind
from codegen.model import SymbolRef

#: the enclosing "function" of code outside any function or class
MODULE_LEVEL = "<module>"
#: the function that looks up a class of the generated registry: a construction through it has
#: the ``via`` ``generated_subclass:AFDX``
REGISTRY_FUNCTION = "generated_subclass"

_Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


@dataclass(frozen=True)
class Scopes:
    """The qualified names of one parsed file. A definition's decorators, defaults and
    annotations count as its own (a fork's edits sit in its decorators), unlike Python's scoping."""

    #: id(node) -> the qualified name of the innermost definition holding it (absent: module level)
    names: Mapping[int, str]
    #: qualified name -> its first definition
    definitions: Mapping[str, _Definition]

    @classmethod
    def of(cls, tree: ast.Module) -> Scopes:
        names: dict[int, str] = {}
        definitions: dict[str, _Definition] = {}

        def visit(node: ast.AST, current: str | None, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, _Definition):
                    qualname = prefix + child.name
                    definitions.setdefault(qualname, child)
                    names[id(child)] = qualname
                    inner = ".<locals>." if not isinstance(child, ast.ClassDef) else "."
                    visit(child, qualname, qualname + inner)
                    continue
                if current is not None:
                    names[id(child)] = current
                visit(child, current, prefix)

        visit(tree, None, "")
        return cls(names, definitions)

    def name(self, node: ast.AST) -> str:
        """The qualified name of the function or class around ``node``."""
        return self.names.get(id(node), MODULE_LEVEL)


class Places:
    """This repository's files as a finding reports them, each parsed once."""

    def __init__(self, repo_root: Path):
        self.root = repo_root
        self._parsed: dict[str, tuple[ast.Module, Scopes] | None] = {}

    def location(self, site: Site, ref: SymbolRef) -> Location:
        """The line where ``site`` uses ``ref`` now: the first call in its function passing the
        keywords the site records, else a string in the function's decorators naming ``ref`` (a
        fork edit's code), else the first node using ``ref`` as the site does, else the
        function's definition; the file alone when the function is gone."""
        at = site.at
        parsed = self._parse(at.file)
        if parsed is None:
            return Location(at.file)
        tree, scopes = parsed
        definition = scopes.definitions.get(at.function)
        if definition is None and at.function != MODULE_LEVEL:
            return Location(at.file)
        names = _names(tree, ref, site)
        uses = sorted(
            (
                n
                for n in ast.walk(tree)
                if isinstance(n, ast.expr)
                and scopes.name(n) == at.function
                and _uses(n, names, site)
            ),
            key=lambda n: (n.lineno, n.col_offset),
        )
        exact = [n for n in uses if isinstance(n, ast.Call) and _passes(n, site)]
        mention = re.compile(rf"\b(?:{'|'.join(map(re.escape, sorted(names)))})\b")
        decorators = definition.decorator_list if definition is not None else []
        strings = [
            n
            for decorator in decorators
            for n in ast.walk(decorator)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and mention.search(n.value)
        ]
        for found in (exact, strings, uses):
            if found:
                return Location(at.file, found[0].lineno)
        return Location(at.file, definition.lineno if definition is not None else 0)

    def _parse(self, path: str) -> tuple[ast.Module, Scopes] | None:
        if path not in self._parsed:
            file = self.root / path
            try:
                tree = ast.parse(file.read_text(encoding="utf-8"))
            except (OSError, SyntaxError, UnicodeDecodeError):
                self._parsed[path] = None
            else:
                self._parsed[path] = (tree, Scopes.of(tree))
        return self._parsed[path]


def _names(tree: ast.Module, ref: SymbolRef, site: Site) -> set[str]:
    """How code names ``ref``: its own name, what ``from ... import name as alias`` binds, and
    the name a site's indirection spells (the subclass constructed, the name a
    ``generated_subclass`` call is bound to)."""
    name = ref.qualname.rsplit(".", 1)[-1]
    names = {name} | {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name == name and alias.asname
    }
    kind, _, spelled = site.via.partition(":")
    if kind == "subclass":
        names.add(spelled)
    elif kind == REGISTRY_FUNCTION:
        names |= {
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and _registry_lookup(node.value, spelled)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
    return names


def _registry_lookup(node: ast.expr, declared: str) -> bool:
    """Whether ``node`` is ``generated_subclass("<declared>", ...)``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == REGISTRY_FUNCTION
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == declared
    )


def _named(node: ast.expr, names: set[str]) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in names
    return isinstance(node, ast.Name) and node.id in names


def _uses(node: ast.expr, names: set[str], site: Site) -> bool:
    """Whether ``node`` uses one of ``names`` the way ``site`` says."""
    how = site.how
    if site.via == "os.environ":  # the variable's name, spelled as a string
        return isinstance(node, ast.Constant) and node.value in names
    if how is SiteKind.SUBCLASS:
        return False  # the class statement itself: its definition's line
    if how in (SiteKind.CALL, SiteKind.CONSTRUCT):
        if not isinstance(node, ast.Call):
            return False
        kind, _, declared = site.via.partition(":")
        return _named(node.func, names) or (
            kind == REGISTRY_FUNCTION and _registry_lookup(node.func, declared)
        )
    wanted = ast.Load if how is SiteKind.READ else ast.Store
    return isinstance(node, ast.Attribute) and isinstance(node.ctx, wanted) and _named(node, names)


def _passes(call: ast.Call, site: Site) -> bool:
    """Whether ``call`` passes the keywords ``site`` records, and unpacks as it does."""
    keywords = tuple(sorted(k.arg for k in call.keywords if k.arg is not None))
    unpacked = any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    )
    return keywords == site.keywords and unpacked == site.unpacked
