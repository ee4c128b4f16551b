"""Which global names a piece of generated code needs, and where each one comes from.

A forked body was written against its upstream module's namespace; override and extend bodies
against the overlay's imports. The generated module must bind every name those bodies use, and
bind it to the same object each side meant. A name that two sides would bind differently is a
NAME_CLASH finding, a name nobody binds is an UNBOUND finding: both block generation.
"""

from __future__ import annotations

import builtins
import symtable
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

import libcst as cst

from codegen.findings import Finding, Kind, Location, Severity
from codegen.index import UpstreamIndex
from codegen.model import SymbolRef

BUILTINS = frozenset(dir(builtins))
#: names the compiler provides (``super()`` reads ``__class__``)
IMPLICIT = frozenset({"__class__"})


def global_names(node: cst.CSTNode) -> set[str]:
    """Global names a function or class-level statement reads (decorators, defaults, annotations, body)."""
    code = (
        cst.Module(body=[cast(cst.SimpleStatementLine | cst.BaseCompoundStatement, node)]).code
        if isinstance(node, cst.BaseStatement)
        else cst.Module(body=[]).code_for_node(node)
    )
    table = symtable.symtable(code, "<generated>", "exec")
    names: set[str] = set()
    for symbol in table.get_symbols():
        if symbol.is_referenced() and not symbol.is_assigned() and not symbol.is_imported():
            names.add(symbol.get_name())
    for child in table.get_children():
        names |= _globals_of(child)
    return names - IMPLICIT


def _globals_of(table: symtable.SymbolTable) -> set[str]:
    names = {s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()}
    for child in table.get_children():
        names |= _globals_of(child)
    return names


@dataclass
class ModuleNamespace:
    """Bindings of one generated module, built up while its classes are generated."""

    module: str
    index: UpstreamIndex
    #: names bound by the overlay's imports -> what they resolve to
    overlay: dict[str, SymbolRef]
    #: generated class names defined in the module
    generated: set[str] = field(default_factory=set)
    #: extra imports the generator adds: name -> (module to import from, resolved definition)
    added: dict[str, tuple[str, SymbolRef]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def definition(self, ref: SymbolRef) -> SymbolRef:
        """Follow re-exports of an indexed module to the defining module."""
        if ref.qualname and self.index.owns(ref.module) and "." not in ref.qualname:
            resolved = self.index.resolve(ref.module, ref.qualname)
            if resolved is not None:
                return resolved
        return ref

    def require_upstream(self, name: str, namespace_module: str, symbol: str, at: Location) -> None:
        """``name`` as seen from ``namespace_module`` (a forked body's home) must be bound here."""
        if name in self.generated:
            self._clash(
                name, symbol, at, f"the generated class {name}", f"{namespace_module}:{name}"
            )
            return
        upstream = self.index.resolve(namespace_module, name)
        if upstream is None:
            if name in BUILTINS:
                return
            self.findings.append(
                Finding(
                    Kind.UNBOUND_NAME,
                    Severity.BLOCK,
                    symbol,
                    f"uses {name!r}, which neither {namespace_module} nor the overlay's imports define; "
                    f"import it in the overlay",
                    at,
                )
            )
            return
        upstream = self.definition(upstream)
        if name in self.overlay:
            ours = self.definition(self.overlay[name])
            if ours != upstream:
                self._clash(name, symbol, at, f"the overlay's import of {ours}", str(upstream))
            return
        if name in self.added:
            if self.added[name][1] != upstream:
                self._clash(name, symbol, at, str(self.added[name][1]), str(upstream))
            return
        self.added[name] = (namespace_module, upstream)

    def require_ours(self, name: str, symbol: str, at: Location) -> None:
        """``name`` used by overlay code must come from the overlay's imports or generated classes."""
        if name in self.overlay or name in self.generated or name in BUILTINS or name in self.added:
            return
        self.findings.append(
            Finding(
                Kind.UNBOUND_NAME,
                Severity.BLOCK,
                symbol,
                f"uses {name!r}, which the overlay does not import; add the import to the overlay",
                at,
            )
        )

    def require_class(self, ref: SymbolRef, symbol: str, at: Location) -> None:
        """A class the generated code names directly (a base, or the class in ``super(C, self)``)."""
        name = ref.qualname
        if name in self.overlay and self.definition(self.overlay[name]) == self.definition(ref):
            return
        if name in self.overlay or name in self.generated:
            self._clash(name, symbol, at, "another binding in the overlay", str(ref))
            return
        if name in self.added and self.added[name][1] != self.definition(ref):
            self._clash(name, symbol, at, str(self.added[name][1]), str(ref))
            return
        self.added.setdefault(name, (ref.module, self.definition(ref)))

    def _clash(self, name: str, symbol: str, at: Location, first: str, second: str) -> None:
        self.findings.append(
            Finding(
                Kind.NAME_CLASH,
                Severity.BLOCK,
                symbol,
                f"{name!r} would mean {first} and {second} in {self.module}; rename one side",
                at,
            )
        )

    def import_lines(self) -> Iterator[str]:
        """``from m import a, b`` lines for the added names, sorted by module then name."""
        by_module: dict[str, list[str]] = {}
        for name, (module, _) in self.added.items():
            by_module.setdefault(module, []).append(name)
        for module in sorted(by_module):
            yield f"from {module} import {', '.join(sorted(by_module[module]))}"
