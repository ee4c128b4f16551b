"""Renames and moves: a removed symbol's successor in its module, where a vanished symbol went,
bodies that differ only by renamed names, and fork edits re-anchored on a renamed name (the call
sites a rename finding lists)."""

from __future__ import annotations

import ast
import copy
import difflib
import re
from dataclasses import dataclass, replace

from codegen.drift.sides import Side
from codegen.edit import EditError, ParsedMethod, anchor_lines, apply_edits
from codegen.findings import Kind, Location
from codegen.index import Member, ModuleInfo, same_behaviour
from codegen.lock import Lock, SymbolDescription, SymbolKind
from codegen.lock_build import describe_symbol
from codegen.markers import DifferenceKind, Edit
from codegen.model import Signature, SymbolRef
from codegen.pattern import PatternError, parse_pattern
from codegen.signatures import differences

#: how much of a call site's code a rename finding shows
SITE_CODE_CHARS = 120


@dataclass(frozen=True)
class Rename:
    """A removed module-level symbol and its successor in the same module."""

    old: SymbolRef
    new: SymbolRef
    #: what changed besides the name, e.g. "3 new optional parameters: a, b, c"
    change: str
    where: Location


#: how alike two definitions must be (difflib ratio of their lines, names aside) to call one the
#: other's successor
RENAME_SIMILARITY = 0.9


def find_renames(lock: Lock, old: Side, new: Side) -> dict[str, Rename]:
    """Removed module-level functions and classes of the lock whose successor is in the same module."""
    renames = {}
    for key, entry in lock.symbols.items():
        ref = SymbolRef.parse(key)
        if entry.kind not in (SymbolKind.FUNCTION, SymbolKind.CLASS) or "." in ref.qualname:
            continue
        if describe_symbol(new.index, ref).kind is not SymbolKind.MISSING:
            continue
        rename = _successor(ref, old, new)
        if rename is not None:
            renames[key] = rename
    return renames


def _definitions(info: ModuleInfo) -> dict[str, ast.AST]:
    return {**info.classes, **info.functions}


def _successor(ref: SymbolRef, old: Side, new: Side) -> Rename | None:
    """The most alike new definition of the same kind: a compatible signature and a body at least
    half alike, or a near-identical body."""
    before, after = old.index.module(ref.module), new.index.module(ref.module)
    if before is None or after is None or ref.qualname not in _definitions(before):
        return None
    existing = _definitions(before)
    old_node = existing[ref.qualname]
    old_lines = ast.unparse(old_node).replace(ref.qualname, "_").splitlines()
    best: tuple[float, Rename] | None = None
    for name, node in sorted(_definitions(after).items()):
        if name in existing or type(node) is not type(old_node):
            continue
        change = None
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert isinstance(old_node, ast.FunctionDef | ast.AsyncFunctionDef)
            change = _compatible_change(Signature.from_ast(old_node), Signature.from_ast(node))
        matcher = difflib.SequenceMatcher(
            None, old_lines, ast.unparse(node).replace(name, "_").splitlines(), autojunk=False
        )
        threshold = 0.5 if change is not None else RENAME_SIMILARITY
        if matcher.real_quick_ratio() < threshold or matcher.quick_ratio() < threshold:
            continue  # cheap upper bounds first: a module has many unrelated definitions
        ratio = matcher.ratio()
        if ratio < threshold:
            continue
        change = change or f"body {ratio:.0%} alike"
        if best is None or ratio > best[0]:
            where = Location(str(after.path), getattr(node, "lineno", 0))
            best = (ratio, Rename(ref, SymbolRef(ref.module, name), change, where))
    return best[1] if best else None


def _compatible_change(old: Signature, new: Signature) -> str | None:
    """How ``new`` differs from ``old`` if every old call still works with it, else None."""
    changed = differences(old, new)
    added = [
        d.param
        for d in changed
        if d.kind is DifferenceKind.PARAM_ADDED and d.ours and "=" in d.ours
    ]
    if len(added) != len(changed):
        return None
    if not added:
        return "same signature"
    return f"{len(added)} new optional parameter(s): {', '.join(str(a) for a in added)}"


def relocated(
    side: Side, ref: SymbolRef, old_entry: SymbolDescription, base: Side | None = None
) -> tuple[Kind, str] | None:
    """Where a vanished symbol went: a same-named definition elsewhere, or a method with the same
    body; never to something ``base`` (the release compared with) already had there: that is
    another symbol of the same name, not where this one went."""
    owner, _, member = ref.qualname.partition(".")
    if member:
        cls = side.index.resolve(ref.module, owner)
        if cls is not None and side.index.is_indexed_class(cls):
            existing = (
                base.index.all_members(cls) if base and base.index.is_indexed_class(cls) else {}
            )
            for name, candidate in side.index.all_members(cls).items():
                if (
                    candidate.is_method
                    and name not in existing
                    and old_entry.body
                    and candidate.fingerprint() == old_entry.body
                ):
                    return Kind.DRIFT_RENAMED, f"{cls.module}:{cls.qualname}.{name}"
        return None
    package = side.index.sources[ref.module.split(".", 1)[0]]
    pattern = re.compile(rf"^(class|def) {re.escape(owner)}\b", re.MULTILINE)
    for path in sorted(package.package_dir.rglob("*.py")):
        try:
            if pattern.search(path.read_text(encoding="utf-8")):
                module = ".".join(path.relative_to(package.root).with_suffix("").parts)
                if base is not None and _defines(base, module, owner):
                    continue  # the same name was there already: not where this one went
                return Kind.DRIFT_MOVED, f"{module}:{owner}"
        except UnicodeDecodeError:
            continue
    return None


def _defines(side: Side, module: str, name: str) -> bool:
    """Whether ``module`` defines ``name`` (a class or function) on ``side``."""
    info = side.index.module(module)
    return info is not None and (name in info.classes or name in info.functions)


def renamed_code(code: str, renames: dict[str, Rename]) -> str:
    """``code`` (an anchor's matched source) with the bare names ``renames`` found renamed: a
    region that differs from the new release's only by those names did not change."""
    for rename in renames.values():
        if "." not in rename.old.qualname:
            code = re.sub(rf"\b{re.escape(rename.old.qualname)}\b", rename.new.qualname, code)
    return code


def only_renamed(old: Member, new: Member, renames: dict[str, Rename]) -> str:
    """The renames (``a -> b``) that make ``old``'s body ``new``'s, up to cosmetics; "" if none do.
    Only bare names are renamed (not attributes, keywords or strings)."""
    names = {r.old.qualname: r for r in renames.values() if "." not in r.old.qualname}
    used = {
        node.id: names[node.id]
        for node in ast.walk(old.node)
        if isinstance(node, ast.Name) and node.id in names
    }
    if not used:
        return ""

    class Renamer(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.Name:
            if node.id in used:
                return ast.copy_location(ast.Name(used[node.id].new.qualname, node.ctx), node)
            return node

    renamed = Renamer().visit(copy.deepcopy(old.node))
    if not same_behaviour(renamed, new.node):
        return ""
    return ", ".join(f"{r.old.qualname} -> {r.new.qualname}" for r in used.values())


def re_anchored(
    symbol: str,
    edits: tuple[Edit, ...],
    parsed: ParsedMethod,
    target: Member,
    renames: dict[str, Rename],
    sites: dict[str, list[str]],
) -> bool:
    """Whether the edits apply once renamed names are substituted; records the call sites."""
    mentioned = [r for r in renames.values() if any(_mentions(e, r.old.qualname) for e in edits)]
    if not mentioned:
        return False
    renamed = []
    for edit in edits:
        for rename in mentioned:
            edit = _rename_in(edit, rename.old.qualname, rename.new.qualname)
        renamed.append(edit)
    try:
        apply_edits(parsed.function, renamed)
    except (EditError, PatternError):
        return False
    for before, after in zip(edits, renamed, strict=True):
        if before == after:
            continue
        lines, matched = anchor_lines(parsed, parse_pattern(after.anchor))
        for rename in mentioned:
            if _mentions(before, rename.old.qualname):
                at = ", ".join(f"{target.module.path}:{line}" for line in lines)
                code = " | ".join(matched)
                code = code if len(code) <= SITE_CODE_CHARS else code[:SITE_CODE_CHARS] + " ..."
                sites.setdefault(str(rename.old), []).append(
                    f"{symbol}#{before.id} at {at}: {code}"
                )
                sites[str(rename.old)].append(f"    proposed: {_edit_call(after)}")
    return True


def _mentions(edit: Edit, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", edit.anchor) is not None


def _rename_in(edit: Edit, old: str, new: str) -> Edit:
    pattern = re.compile(rf"\b{re.escape(old)}\b")
    code = pattern.sub(new, edit.code) if edit.code is not None else None
    return replace(edit, anchor=pattern.sub(new, edit.anchor), code=code)


def _edit_call(edit: Edit) -> str:
    """The edit as the overlay would declare it (``why`` left out: it is unchanged)."""
    arguments = [repr(edit.anchor)] + ([repr(edit.code)] if edit.code is not None else [])
    return f"{edit.action}({', '.join(arguments)}, id={edit.id!r}, ...)"
