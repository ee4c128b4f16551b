"""Where in this repository each drift finding lands (``Finding.ours``), beside the upstream places
it names (``upstream``, ``target``): code-scanning UIs and reviewers open our files, not vLLM's.

A finding's symbol is an upstream symbol of the lock (``module:Qual``; ``#id`` for a contract), a
generated class or member (``module:Class[.member][#edit]``) or an architecture AFD registers.
Each lands on the overlay declaration that uses it (a member, its edit, a contract, a
``relies_on`` key, an import, the fork whose upstream body uses a name the generated code
imports), the runtime's import of it, its line in ``afd_models/upstream_fields.py`` or
``afd_models/plugin.py``, or the runtime's use of it (the line the recorded function holds it on
now, :mod:`codegen.places`); failing those, on its entry in the lock.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from codegen.drift.contracts import relied_ref
from codegen.drift.sides import Side
from codegen.findings import Finding, Kind, Location
from codegen.generate import LOCK_PATH
from codegen.lock import OVERRIDES, RELIED_ON, Lock, SymbolUse
from codegen.model import GENERATED_PREFIX, MemberKind, SymbolRef
from codegen.overlay import declared_members
from codegen.places import Places
from codegen.runtime_uses import UPSTREAM_FIELDS_PATH, runtime_upstream_imports

#: the uses the overlay declares, beyond imports: what ``declared`` points at
_DECLARED = RELIED_ON | OVERRIDES | {SymbolUse.FORKED, SymbolUse.BASE}
#: where AFD registers its architectures (the ``Architecture`` rows of ``ARCHITECTURES``)
PLUGIN_PATH = "afd_models/plugin.py"


def locate_ours(
    findings: Sequence[Finding], places: Places, lock: Lock, lock_path: Path, old: Side
) -> list[Finding]:
    """``findings`` with ``ours`` set where it is None (the hand-written line that fails, else
    the overlay declaration) and ``declared`` to the overlay declaration beside it. ``places``:
    this repository's files; ``lock`` describes the ``old`` side; ``lock_path`` is its file (the
    primary lock when that file does not exist)."""
    repository = _Repository(places, lock, lock_path, old)
    located = []
    for finding in findings:
        declared = repository.location(finding)
        failing = finding.ours or repository.failing(finding) or declared
        beside = (
            declared
            if declared != failing
            and declared.path.startswith("overlay/")
            and repository.declares(finding)
            else None
        )
        located.append(replace(finding, ours=failing, declared=finding.declared or beside))
    return located


class _Repository:
    """The overlay, runtime and lock files, read once each as findings ask for them."""

    def __init__(self, places: Places, lock: Lock, lock_path: Path, old: Side):
        self.places = places
        self.root = places.root
        self.lock = lock
        self.lock_path = (lock_path if (self.root / lock_path).is_file() else LOCK_PATH).as_posix()
        self.old = old
        self._texts: dict[str, str] = {}
        self._trees: dict[str, ast.Module] = {}

    def location(self, finding: Finding) -> Location:
        key, _, mark = finding.symbol.partition("#")
        if finding.kind in (Kind.DRIFT_REGISTRY, Kind.DRIFT_PLATFORM_PICK):
            return Location(PLUGIN_PATH, self._line(PLUGIN_PATH, f'"{key}"'))
        if key in self.lock.symbols:
            found = self._contract(key, mark) if mark else self._used(key)
        else:
            found = self._generated(key, mark)
        return found or Location(self.lock_path, self._line(self.lock_path, f'"{key}": {{'))

    def failing(self, finding: Finding) -> Location | None:
        """The hand-written line that fails with the change: where AFD's code (the runtime's
        first) calls, constructs, reads or sets the symbol; None when no recorded site uses it,
        and for a contract (its declaration is what to change)."""
        key, _, mark = finding.symbol.partition("#")
        entry = self.lock.symbols.get(key)
        if mark or entry is None or not entry.sites:
            return None  # a contract's finding: what to change is its declaration
        site = min(entry.sites, key=lambda s: (not s.at.file.startswith("afd_models/"), s.order()))
        return self.places.location(site, SymbolRef.parse(key))

    def declares(self, finding: Finding) -> bool:
        """Whether the overlay states a dependence on the finding's symbol (a contract, a
        member overriding or forking it, a base), beyond importing it."""
        key, _, mark = finding.symbol.partition("#")
        entry = self.lock.symbols.get(key)
        return bool(mark) or (entry is not None and bool(entry.uses & _DECLARED))

    # ------------------------------------------------------------------ upstream symbols

    def _used(self, key: str) -> Location | None:
        """Where the first overlay member declared using ``key`` is, else the first user found."""
        users = self.lock.symbols[key].used_by
        declared = [u for u in users if tuple(u.rsplit(".", 1)) in self._members]
        for user in [*declared, *users]:
            where = self._user(key, user)
            if where is not None:
                return where
        return None

    def _user(self, key: str, user: str) -> Location | None:
        """Where ``user`` (a lock ``used_by`` entry) uses ``key``."""
        if not user.startswith(GENERATED_PREFIX):  # a runtime file
            for place in self._runtime_imports.get(key, ()):
                if place.path == user:
                    return place
            if user == UPSTREAM_FIELDS_PATH.as_posix():
                return Location(user, self._line(user, f'"{key}"'))
            for site in self.lock.symbols[key].sites:
                if site.by == user:
                    return self.places.location(site, SymbolRef.parse(key))
            return Location(user)
        module, _, name = user.partition(":")
        owner, _, member = name.partition(".")
        if f"{module}:{owner}" not in self.lock.classes:
            return self._module_name(module, name)
        # a member, or the class itself (a base, a method relied on outside its MRO)
        return self._generated(user) if member else self._generated(user, key)

    def _module_name(self, module: str, name: str) -> Location | None:
        """A name a generated module imports: the overlay's import of it, else the first fork
        of that module whose upstream body mentions it."""
        classes = {k: c for k, c in self.lock.classes.items() if k.startswith(module + ":")}
        if not classes:
            return None
        path = self._overlay_of(next(iter(classes)))[0]
        for node in self._tree(path).body:
            if isinstance(node, ast.Import | ast.ImportFrom) and any(
                (alias.asname or alias.name.split(".")[0]) == name for alias in node.names
            ):
                return Location(path, node.lineno)
        mentions = re.compile(rf"\b{re.escape(name)}\b")
        for class_key, entry in classes.items():
            for member, recorded in entry.members.items():
                if (
                    recorded.kind is MemberKind.FORK
                    and recorded.upstream
                    and mentions.search(self.old.source(SymbolRef.parse(recorded.upstream)))
                ):
                    return self._generated(f"{class_key}.{member}")
        return None

    def _contract(self, key: str, contract_id: str) -> Location | None:
        """The declaration of contract ``contract_id`` on ``key`` by the first class stating it."""
        for class_key, entry in self.lock.classes.items():
            for name, contracts in entry.relies_on.items():
                if contract_id in contracts and relied_ref(entry, name) == key:
                    path, line = self._overlay_of(class_key)
                    return Location(path, self._mention(path, line, contract_id))
        return None

    # ------------------------------------------------------------------ generated classes

    def _generated(self, key: str, mention: str = "") -> Location | None:
        """``module:Class[.member]``: the member's declaration, at the string ``mention`` (an
        edit's id) when its decorators hold it; a member the class inherits, or the class
        itself: the class's declaration, at ``mention`` or the member's name (a ``relies_on``
        key) when its decorators hold it."""
        class_key = next(
            (c for c in self.lock.classes if key == c or key.startswith(c + ".")), None
        )
        if class_key is None:
            return None
        path, line = self._overlay_of(class_key)
        member = key[len(class_key) + 1 :]
        declared = self._members.get((class_key, member))
        if declared is None:
            return Location(path, self._mention(path, line, mention or member))
        return Location(path, self._mention(path, declared, mention))

    def _overlay_of(self, class_key: str) -> tuple[str, int]:
        path, _, line = self.lock.classes[class_key].overlay.rpartition(":")
        return path, int(line)

    # ------------------------------------------------------------------ files

    @functools.cached_property
    def _members(self) -> dict[tuple[str, str], int]:
        """(generated class, member) -> the line of its overlay declaration, for the lock's release."""
        versions = {package: entry.version for package, entry in self.lock.upstream.items()}
        return {
            (m.class_key, m.decl.name): m.decl.line for m in declared_members(self.root, versions)
        }

    @functools.cached_property
    def _runtime_imports(self) -> dict[str, tuple[Location, ...]]:
        """Upstream symbol -> the runtime's imports of it, where they are now."""
        found = runtime_upstream_imports(self.root, self.old.index)
        return {str(ref): places for ref, places in found.items()}

    def _text(self, path: str) -> str:
        if path not in self._texts:
            self._texts[path] = (self.root / path).read_text(encoding="utf-8")
        return self._texts[path]

    def _tree(self, path: str) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(self._text(path))
        return self._trees[path]

    def _line(self, path: str, text: str) -> int:
        """The first line of ``path`` holding ``text``; 0 if none does."""
        lines = self._text(path).splitlines()
        return next((n for n, line in enumerate(lines, 1) if text in line), 0)

    def _mention(self, path: str, line: int, value: str) -> int:
        """The line of the string ``value`` in the decorators of the declaration at ``line`` of
        the overlay ``path``, or in a module constant they name; ``line`` when neither holds it."""
        tree = self._tree(path)
        declaration = next(
            (
                node
                for node in ast.walk(tree)
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and node.lineno == line
            ),
            None,
        )
        if declaration is None or not value:
            return line
        constants = {
            target.id: node
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        decorators = declaration.decorator_list
        named = [
            constants[n.id]
            for d in decorators
            for n in ast.walk(d)
            if isinstance(n, ast.Name) and n.id in constants
        ]
        for nodes in (decorators, named):
            lines = [n.lineno for n in _strings(nodes) if n.value == value]
            if lines:
                return min(lines)
        return line


def _strings(nodes: Sequence[ast.AST]) -> Iterator[ast.Constant]:
    for node in nodes:
        for child in ast.walk(node):
            if isinstance(child, ast.Constant) and isinstance(child.value, str):
                yield child
