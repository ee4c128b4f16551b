"""One upstream version as drift reads it: where a recorded symbol is, its signature, source and
node, and the diff of two bodies."""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass

from codegen.findings import Location
from codegen.index import Member, UpstreamIndex
from codegen.lock_build import describe_symbol
from codegen.model import Signature, SymbolRef

#: the most lines a body diff shows
DIFF_LINES = 60


@dataclass(frozen=True)
class Side:
    """One upstream version: its version string and index."""

    version: str
    index: UpstreamIndex

    def location(self, ref: SymbolRef) -> Location | None:
        """Where ``ref`` is defined (its module's file when a member is gone); None: no module."""
        info = self.index.module(ref.module)
        if info is None:
            return None
        owner, _, member = ref.qualname.partition(".")
        if member:
            cls = SymbolRef(ref.module, owner)
            found = self.index.find_member(cls, member) or self.index.instance_attribute(
                cls, member
            )
            return (
                Location(str(found.module.path), found.line) if found else Location(str(info.path))
            )
        node = info.classes.get(owner) or info.functions.get(owner)
        if node is None:  # an environment table's variable, or another module-level name
            return Location(str(info.path), describe_symbol(self.index, ref).line or 0)
        return Location(str(info.path), node.lineno)

    def _member(self, ref: SymbolRef) -> Member | None:
        owner, _, member = ref.qualname.partition(".")
        return self.index.find_member(SymbolRef(ref.module, owner), member) if member else None

    def signature(self, ref: SymbolRef) -> Signature | None:
        """The signature of a method or module function; None for anything else."""
        found = self._member(ref)
        if found is not None:
            return found.signature() if found.is_method else None
        info = self.index.module(ref.module)
        if info is not None and ref.qualname in info.functions:
            return Signature.from_ast(info.functions[ref.qualname])
        return None

    def source(self, ref: SymbolRef) -> str:
        """The source of a member or module function; "" when there is none."""
        found = self._member(ref)
        if found is not None:
            return found.source()
        info = self.index.module(ref.module)
        node = info.functions.get(ref.qualname) if info else None
        if info is None or node is None:
            return ""
        return "".join(info.lines[node.lineno - 1 : node.end_lineno])

    def node(self, ref: SymbolRef) -> ast.AST | None:
        """The defining node of a member or module function."""
        found = self._member(ref)
        if found is not None:
            return found.node
        info = self.index.module(ref.module)
        return info.functions.get(ref.qualname) if info else None


def body_diff(old: str, new: str, old_name: str, new_name: str) -> tuple[str, ...]:
    lines = list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), old_name, new_name, n=1, lineterm=""
        )
    )
    if len(lines) > DIFF_LINES:
        lines = [*lines[:DIFF_LINES], f"... {len(lines) - DIFF_LINES} more diff lines"]
    return tuple(lines)
