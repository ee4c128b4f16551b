"""What a vLLM version bump breaks: every symbol of the lock, compared between two upstream versions.

Detection yields :class:`~codegen.findings.Finding` objects; :mod:`codegen.report` renders them.
Severity follows what AFD does with the symbol:

* block: generation against the new version would fail or be wrong without a human: a removed
  base, fork or override target, a changed signature of something we override or fork, a lost or
  ambiguous anchor, an ``extend`` name upstream now defines;
* review: the code still generates, but behaviour we depend on may have changed: the body of an
  inherited method we rely on, the body an override replaces, a forked region upstream edited
  (3-way: pinned body, our edits, new body), the signature of something we call or import, MRO;
* info: everything else that changed (inherited bodies nobody relies on, forks that rebase cleanly).

A symbol that cannot be analysed is a DRF060 finding, never a silent skip.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codegen.checks.signatures import differences
from codegen.edit import EditError, anchor_lines, apply_edits, parse_method
from codegen.findings import Finding, Kind, Location, Severity
from codegen.index import Member, UpstreamIndex
from codegen.lock import describe_symbol
from codegen.markers import Edit
from codegen.model import Signature, SymbolRef
from codegen.pattern import PatternError, parse_pattern

#: roles whose symbol disappearing or changing signature breaks generation
_BREAKING_ROLES = {
    "base",
    "fork",
    "override",
    "extended",
    "override_attr",
    "overlay_import",
    "generated_import",
    "runtime_import",
    "runtime_field",
}
_SIGNATURE_KINDS = {
    "param_added": Kind.DRIFT_PARAM_ADDED,
    "param_removed": Kind.DRIFT_PARAM_REMOVED,
    "param_renamed": Kind.DRIFT_PARAM_RENAMED,
    "param_kind": Kind.DRIFT_PARAM_KIND,
    "param_order": Kind.DRIFT_PARAM_ORDER,
    "param_default": Kind.DRIFT_PARAM_DEFAULT,
    "param_annotation": Kind.DRIFT_PARAM_ANNOTATION,
    "return_annotation": Kind.DRIFT_RETURN_ANNOTATION,
    "decorators": Kind.DRIFT_DECORATORS,
}
REGISTRY_MODULE = "vllm.model_executor.models.registry"
DIFF_LINES = 60


@dataclass(frozen=True)
class Side:
    """One upstream version: its version string and index."""

    version: str
    index: UpstreamIndex


def _location(index: UpstreamIndex, ref: SymbolRef) -> Location | None:
    info = index.module(ref.module)
    if info is None:
        return None
    owner, _, member = ref.qualname.partition(".")
    if member:
        found = index.find_member(SymbolRef(ref.module, owner), member)
        return Location(str(found.module.path), found.line) if found else Location(str(info.path))
    node = info.classes.get(owner) or info.functions.get(owner)
    return Location(str(info.path), node.lineno if node else 0)


def _member(index: UpstreamIndex, ref: SymbolRef) -> Member | None:
    owner, _, member = ref.qualname.partition(".")
    return index.find_member(SymbolRef(ref.module, owner), member) if member else None


def _signature(index: UpstreamIndex, ref: SymbolRef) -> Signature | None:
    found = _member(index, ref)
    if found is not None:
        return found.signature() if found.is_method else None
    info = index.module(ref.module)
    if info is not None and ref.qualname in info.functions:
        return Signature.from_ast(info.functions[ref.qualname])
    return None


def _source(index: UpstreamIndex, ref: SymbolRef) -> str:
    found = _member(index, ref)
    if found is not None:
        return found.source()
    info = index.module(ref.module)
    node = info.functions.get(ref.qualname) if info else None
    if info is None or node is None:
        return ""
    return "".join(info.lines[node.lineno - 1 : node.end_lineno])


def body_diff(old: str, new: str, old_name: str, new_name: str) -> tuple[str, ...]:
    lines = list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), old_name, new_name, n=1, lineterm=""
        )
    )
    if len(lines) > DIFF_LINES:
        lines = [*lines[:DIFF_LINES], f"... {len(lines) - DIFF_LINES} more diff lines"]
    return tuple(lines)


def _relocated(side: Side, ref: SymbolRef, old_entry: dict[str, Any]) -> tuple[Kind, str] | None:
    """Where a vanished symbol went: a same-named definition elsewhere, or a method with the same body."""
    owner, _, member = ref.qualname.partition(".")
    if member:
        cls = side.index.resolve(ref.module, owner)
        if cls is not None and side.index.is_indexed_class(cls):
            for name, candidate in side.index.all_members(cls).items():
                if (
                    candidate.is_method
                    and old_entry.get("body")
                    and candidate.fingerprint() == old_entry["body"]
                ):
                    return Kind.DRIFT_RENAMED, f"{cls.module}:{cls.qualname}.{name}"
        return None
    package = side.index.sources[ref.module.split(".", 1)[0]]
    pattern = re.compile(rf"^(class|def) {re.escape(owner)}\b", re.MULTILINE)
    for path in sorted(package.package_dir.rglob("*.py")):
        try:
            if pattern.search(path.read_text(encoding="utf-8")):
                module = ".".join(path.relative_to(package.root).with_suffix("").parts)
                return Kind.DRIFT_MOVED, f"{module}:{owner}"
        except UnicodeDecodeError:
            continue
    return None


def _severity_for_change(roles: set[str]) -> Severity:
    if roles & _BREAKING_ROLES - {
        "overlay_import",
        "generated_import",
        "runtime_import",
        "runtime_field",
    }:
        return Severity.BLOCK
    if roles & {
        "relied_on",
        "overlay_import",
        "generated_import",
        "runtime_import",
        "runtime_field",
        "mro",
    }:
        return Severity.REVIEW
    return Severity.INFO


def extended_by_super(lock: dict[str, Any]) -> set[str]:
    """Upstream methods every override of which calls ``super()``: their bodies still run in ours."""
    calls: dict[str, bool] = {}
    for entry in lock.get("classes", {}).values():
        for member in entry.get("members", {}).values():
            if member["kind"] == "override" and "upstream" in member:
                calls[member["upstream"]] = calls.get(member["upstream"], True) and bool(
                    member.get("calls_super")
                )
    return {ref for ref, all_call in calls.items() if all_call}


def symbol_findings(lock: dict[str, Any], old: Side, new: Side) -> Iterator[Finding]:
    """Every recorded upstream symbol: removed, moved, renamed, signature and body changes."""
    extended = extended_by_super(lock)
    for key, entry in lock.get("symbols", {}).items():
        ref = SymbolRef.parse(key)
        roles = set(entry.get("roles", []))
        if key in extended:
            roles = (roles - {"override"}) | {"extended"}
        users = ", ".join(entry.get("used_by", [])[:3])
        try:
            yield from _one_symbol(ref, entry, roles, users, old, new)
        except Exception as exc:  # one unreadable symbol is a finding, not a crash of the run
            yield Finding(
                Kind.DRIFT_UNANALYSED,
                Severity.BLOCK,
                key,
                f"could not be analysed: {type(exc).__name__}: {exc}",
            )


def _one_symbol(
    ref: SymbolRef, entry: dict[str, Any], roles: set[str], users: str, old: Side, new: Side
) -> Iterator[Finding]:
    key = str(ref)
    if entry.get("kind") == "external":
        return
    current = describe_symbol(new.index, ref)
    before = _location(old.index, ref)
    after = _location(new.index, ref)
    if current["kind"] in ("missing", "external"):
        moved = _relocated(new, ref, entry)
        severity = (
            Severity.BLOCK
            if roles & (_BREAKING_ROLES | {"relied_on"})
            else _severity_for_change(roles)
        )
        if moved is not None:
            kind, where = moved
            yield Finding(
                kind,
                severity,
                key,
                f"now {where} (used by {users}); update the overlay or runtime",
                upstream=before,
                old=key,
                new=where,
            )
        else:
            yield Finding(
                Kind.DRIFT_REMOVED,
                severity,
                key,
                f"is gone in {new.version} (used by {users})",
                upstream=before,
                old=key,
            )
        return
    if current["kind"] != entry.get("kind"):
        severity = (
            Severity.BLOCK
            if roles & (_BREAKING_ROLES | {"relied_on"})
            else _severity_for_change(roles)
        )
        yield Finding(
            Kind.DRIFT_KIND,
            severity,
            key,
            f"was a {entry.get('kind')}, is a {current['kind']}",
            upstream=before,
            target=after,
            old=entry.get("kind"),
            new=current["kind"],
        )
        return
    yield from _signature_changes(ref, roles, users, old, new, before, after)
    if entry.get("kind") == "class" and entry.get("bases") != current.get("bases"):
        yield Finding(
            Kind.DRIFT_BASES,
            Severity.REVIEW if roles - {"mro"} else Severity.INFO,
            key,
            "changed its bases",
            upstream=before,
            target=after,
            old=", ".join(entry.get("bases", [])),
            new=", ".join(current.get("bases", [])),
        )
    old_body, new_body = (
        entry.get("body") or entry.get("value"),
        current.get("body") or current.get("value"),
    )
    if old_body is None or old_body == new_body:
        return
    diff = body_diff(
        _source(old.index, ref),
        _source(new.index, ref),
        f"{key} ({old.version})",
        f"{key} ({new.version})",
    )
    if "fork" in roles:
        return  # forks are re-based edit by edit in fork_findings
    if "override" in roles or "override_attr" in roles:
        yield Finding(
            Kind.DRIFT_BODY,
            Severity.REVIEW,
            key,
            f"upstream changed the body our override replaces (used by {users}); check ours still fits",
            upstream=before,
            target=after,
            details=diff,
        )
    elif "extended" in roles:
        yield Finding(
            Kind.DRIFT_BODY,
            Severity.INFO,
            key,
            f"body changed; our overrides call super(), so the change reaches us (used by {users})",
            upstream=before,
            target=after,
            details=diff,
        )
    elif roles & {"relied_on", "inherited"}:
        severity = Severity.REVIEW if "relied_on" in roles else Severity.INFO
        relied = "AFD relies on it" if "relied_on" in roles else "inherited, not marked relied_on"
        yield Finding(
            Kind.DRIFT_INHERITED_BODY,
            severity,
            key,
            f"body changed ({relied}; used by {users})",
            upstream=before,
            target=after,
            details=diff,
        )
    else:
        yield Finding(
            Kind.DRIFT_BODY,
            Severity.INFO,
            key,
            f"body changed (used by {users})",
            upstream=before,
            target=after,
            details=diff,
        )


def _signature_changes(
    ref: SymbolRef,
    roles: set[str],
    users: str,
    old: Side,
    new: Side,
    before: Location | None,
    after: Location | None,
) -> Iterator[Finding]:
    old_sig, new_sig = _signature(old.index, ref), _signature(new.index, ref)
    if old_sig is None or new_sig is None:
        return
    changed = differences(old_sig, new_sig)
    if not changed:
        return
    callee = bool(
        roles & {"generated_import", "overlay_import", "runtime_import"}
    ) and not roles & {"fork", "override"}
    for diff in changed:
        kind = Kind.DRIFT_CALLEE_SIGNATURE if callee else _SIGNATURE_KINDS[diff.kind]
        severity = Severity.REVIEW if callee else _severity_for_change(roles)
        what = f"{diff.kind.replace('_', ' ')}" + (f" {diff.param!r}" if diff.param else "")
        yield Finding(
            kind,
            severity,
            str(ref),
            f"{what}: {diff.upstream!r} -> {diff.ours!r} (used by {users})",
            upstream=before,
            target=after,
            old=diff.upstream,
            new=diff.ours,
        )


def fork_findings(
    lock: dict[str, Any],
    overlay_edits: dict[tuple[str, str], tuple[Edit, ...]],
    old: Side,
    new: Side,
) -> Iterator[Finding]:
    """Re-apply every fork's edits to the new body: lost, ambiguous, conflicting or clean (3-way)."""
    for class_key, entry in lock.get("classes", {}).items():
        base = SymbolRef.parse(entry["base"])
        for name, member in entry.get("members", {}).items():
            symbol = f"{class_key}.{name}"
            if member["kind"] in ("extend", "extend_attr"):
                found = (
                    new.index.all_members(base).get(name)
                    if new.index.is_indexed_class(base)
                    else None
                )
                if found is not None:
                    yield Finding(
                        Kind.DRIFT_EXTEND_SHADOWS,
                        Severity.BLOCK,
                        symbol,
                        f"{found.ref} now exists upstream; rename ours or override it",
                        target=Location(str(found.module.path), found.line),
                    )
                continue
            if member["kind"] != "fork":
                continue
            edits = overlay_edits.get((class_key, name))
            try:
                yield from _rebase(symbol, base, name, member, edits, old, new)
            except Exception as exc:
                yield Finding(
                    Kind.DRIFT_UNANALYSED,
                    Severity.BLOCK,
                    symbol,
                    f"could not be re-based: {type(exc).__name__}: {exc}",
                )
        if new.index.is_indexed_class(base):
            mro = [str(c) for c in new.index.mro(base)]
            if mro != entry.get("mro"):
                yield Finding(
                    Kind.DRIFT_MRO,
                    Severity.REVIEW,
                    class_key,
                    "the upstream MRO under this class changed",
                    old=" -> ".join(entry.get("mro", [])),
                    new=" -> ".join(mro),
                )


def _rebase(
    symbol: str,
    base: SymbolRef,
    name: str,
    member: dict[str, Any],
    edits: tuple[Edit, ...] | None,
    old: Side,
    new: Side,
) -> Iterator[Finding]:
    if edits is None:
        raise LookupError("the overlay no longer declares this fork; regenerate the lock first")
    target = new.index.find_member(base, name) if new.index.is_indexed_class(base) else None
    if target is None or not target.is_method:
        return  # reported as a removed fork target by symbol_findings
    first = min([target.line, *(d.lineno for d in getattr(target.node, "decorator_list", []))])
    parsed = parse_method(target.source(), first)
    where = Location(str(target.module.path), target.line)
    changed_regions = []
    for edit in edits:
        recorded = member.get("anchors", {}).get(edit.id, {})
        try:
            _, matched = anchor_lines(parsed, parse_pattern(edit.anchor))
        except PatternError as exc:
            yield Finding(
                Kind.DRIFT_UNANALYSED, Severity.BLOCK, f"{symbol}#{edit.id}", str(exc), target=where
            )
            return
        if (
            recorded
            and recorded.get("matched")
            and len(matched) == len(recorded["matched"])
            and matched != recorded["matched"]
        ):
            changed_regions.append((edit.id, recorded["matched"], matched))
    try:
        apply_edits(parsed.function, edits)
    except EditError as exc:
        kind = Kind.DRIFT_ANCHOR_LOST if exc.found == 0 else Kind.DRIFT_ANCHOR_COUNT
        yield Finding(
            kind,
            Severity.BLOCK,
            f"{symbol}#{exc.edit.id}",
            f"anchor {exc.edit.anchor!r} matches {exc.found} place(s) in {new.version}, expected {exc.edit.count}; re-anchor the edit",
            target=where,
            old=str(exc.edit.count),
            new=str(exc.found),
        )
        return
    old_target = old.index.find_member(base, name)
    diff = body_diff(
        old_target.source() if old_target else "",
        target.source(),
        f"{member['upstream']} ({old.version})",
        f"({new.version})",
    )
    if changed_regions:
        details = (
            tuple(
                f"{edit_id}: {' | '.join(a)}  ->  {' | '.join(b)}"
                for edit_id, a, b in changed_regions
            )
            + diff
        )
        yield Finding(
            Kind.DRIFT_REBASE_CONFLICT,
            Severity.REVIEW,
            symbol,
            f"edits apply, but upstream changed the code they anchor on ({', '.join(e for e, _, _ in changed_regions)}); check each",
            target=where,
            details=details,
        )
    elif diff:
        yield Finding(
            Kind.DRIFT_REBASED,
            Severity.INFO,
            symbol,
            "upstream changed the body outside our edits; they re-base cleanly",
            target=where,
            details=diff,
        )


def _registry_table(index: UpstreamIndex) -> dict[str, tuple[str, str]]:
    """Architecture -> (module, class) from vLLM's model registry, read statically."""
    info = index.module(REGISTRY_MODULE)
    table: dict[str, tuple[str, str]] = {}
    if info is None:
        return table
    for node in ast.walk(info.tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and isinstance(value, ast.Tuple)
                    and len(value.elts) == 2
                ):
                    try:
                        module, cls = ast.literal_eval(value)
                    except ValueError:
                        continue
                    if (
                        isinstance(key.value, str)
                        and isinstance(module, str)
                        and isinstance(cls, str)
                    ):
                        table.setdefault(key.value, (module, cls))
    return table


def registry_findings(architectures: list[str], old: Side, new: Side) -> Iterator[Finding]:
    """The native architectures AFD registers for still map to the same vLLM classes."""
    before, after = _registry_table(old.index), _registry_table(new.index)
    for arch in architectures:
        if arch not in after:
            yield Finding(
                Kind.DRIFT_REGISTRY,
                Severity.BLOCK,
                arch,
                f"is no longer in vLLM {new.version}'s model registry",
                old=str(before.get(arch)),
            )
        elif before.get(arch) != after[arch]:
            yield Finding(
                Kind.DRIFT_REGISTRY,
                Severity.REVIEW,
                arch,
                "now maps to another vLLM class",
                old=str(before.get(arch)),
                new=str(after[arch]),
            )


def native_architectures(repo_root: Path) -> list[str]:
    """The keys of ``AFD_ARCHITECTURES`` in afd_models/plugin.py, read statically."""
    tree = ast.parse((repo_root / "afd_models/plugin.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if ast.unparse(target) == "AFD_ARCHITECTURES" and isinstance(node.value, ast.Dict):
                return [ast.literal_eval(k) for k in node.value.keys if k is not None]
    return []
