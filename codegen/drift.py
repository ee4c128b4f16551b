"""What a vLLM version bump breaks: every symbol of the lock, compared between two upstream versions.

Detection yields :class:`~codegen.findings.Finding` objects; :mod:`codegen.report` renders them.
Severity follows what AFD does with the symbol:

* block: generation against the new version would fail or be wrong without a human: a removed
  base, fork or override target, a changed signature of something we override or fork, a lost or
  ambiguous anchor, an ``extend`` name upstream now defines;
  ambiguous anchor, an ``extend`` name upstream now defines, a broken contract of a relied-on
  method (what AFD would do wrong is in the message);
* review: the code still generates, but behaviour we depend on may have changed: a forked body
  upstream edited (outside our anchors: the generated code changes with it; inside: 3-way), the
  signature of something we call or import, a contract now matching elsewhere, MRO;
* info: everything else that changed: inherited bodies nobody relies on, relied-on bodies whose
  contracts all hold, bodies our overrides replace without calling ``super()`` (only their
  signature matters), purely cosmetic changes (formatting, comments, docstrings, bare annotations).

A removed symbol with a successor in the same module (a compatible signature or a near-identical
body) is one "renamed" finding that lists every forked call site and the re-anchored edits.

A symbol that cannot be analysed is a DRF060 finding, never a silent skip.
"""

from __future__ import annotations

import ast
import copy
import difflib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import libcst as cst

from codegen.checks.signatures import check_signature, differences
from codegen.contracts import evaluate
from codegen.edit import EditError, anchor_lines, apply_edits, parse_member
from codegen.findings import Finding, Kind, Location, Severity
from codegen.index import Member, UpstreamIndex, same_behaviour
from codegen.lock import describe_symbol
from codegen.markers import Contract, Delta, Edit
from codegen.model import ParamKind, Signature, SymbolRef
from codegen.names import global_names
from codegen.pattern import PatternError, parse_pattern
from codegen.releases import applicable

#: roles whose symbol disappearing or changing signature breaks generation
_BREAKING_ROLES = {
    "base",
    "fork",
    "override",
    "extended",
    "replaced",
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
#: how much of a call site's code a rename finding shows
SITE_CODE_CHARS = 120
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


def _node(index: UpstreamIndex, ref: SymbolRef) -> ast.AST | None:
    found = _member(index, ref)
    if found is not None:
        return found.node
    info = index.module(ref.module)
    return info.functions.get(ref.qualname) if info else None


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


def find_renames(lock: dict[str, Any], old: Side, new: Side) -> dict[str, Rename]:
    """Removed module-level functions and classes of the lock whose successor is in the same module."""
    renames = {}
    for key, entry in lock.get("symbols", {}).items():
        ref = SymbolRef.parse(key)
        if entry.get("kind") not in ("function", "class") or "." in ref.qualname:
            continue
        if describe_symbol(new.index, ref)["kind"] != "missing":
            continue
        rename = _successor(ref, old, new)
        if rename is not None:
            renames[key] = rename
    return renames


def _definitions(info: Any) -> dict[str, ast.AST]:
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
    added = [d.param for d in changed if d.kind == "param_added" and d.ours and "=" in d.ours]
    if len(added) != len(changed):
        return None
    if not added:
        return "same signature"
    return f"{len(added)} new optional parameter(s): {', '.join(str(a) for a in added)}"


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


def _severity_for_loss(roles: set[str]) -> Severity:
    """A symbol gone, renamed or turned into another kind: it blocks whatever uses it directly."""
    if roles & (_BREAKING_ROLES | {"relied_on"}):
        return Severity.BLOCK
    return _severity_for_change(roles)


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


def override_roles(lock: dict[str, Any]) -> dict[str, str]:
    """How our overrides use each upstream method they override.

    ``extended``: every override calls ``super()``, so upstream's body still runs inside ours;
    ``replaced``: none does, so only the signature matters; ``override``: some do.
    """
    calls: dict[str, set[bool]] = {}
    for entry in lock.get("classes", {}).values():
        for member in entry.get("members", {}).values():
            if member["kind"] == "override" and "upstream" in member:
                calls.setdefault(member["upstream"], set()).add(bool(member.get("calls_super")))
    named = {frozenset({True}): "extended", frozenset({False}): "replaced"}
    return {ref: named.get(frozenset(seen), "override") for ref, seen in calls.items()}


def _contract_ids(lock: dict[str, Any]) -> dict[str, set[str]]:
    """Relied-on upstream method -> the ids of the contracts overlays state on it."""
    ids: dict[str, set[str]] = {}
    for entry in lock.get("classes", {}).values():
        for name, contracts in (entry.get("relies_on") or {}).items():
            key = relied_ref(entry, name)
            if key is not None and isinstance(contracts, dict):
                ids.setdefault(key, set()).update(contracts)
    return ids


def relied_ref(entry: dict[str, Any], name: str) -> str | None:
    """The upstream method a generated class relies on by ``name``: inherited, or run by its
    override's ``super()`` call."""
    inherited: str | None = entry["inherited"].get(name)
    if inherited is not None:
        return inherited
    upstream: str | None = entry["members"].get(name, {}).get("upstream")
    return upstream


#: generated member (``module:Class.member``) -> the overlay's signature and the deltas declared
#: for its base, on every release (each with its ``when=``)
Declared = Mapping[str, tuple[Signature, tuple[Delta, ...]]]


def symbol_findings(
    lock: dict[str, Any],
    old: Side,
    new: Side,
    renames: dict[str, Rename] | None = None,
    sites: dict[str, list[str]] | None = None,
    declared: Declared | None = None,
) -> Iterator[Finding]:
    """Every recorded upstream symbol: removed, moved, renamed, signature and body changes.

    ``renames`` (from :func:`find_renames`) turn a removal into one "renamed" finding that
    carries the forked call sites collected in ``sites`` by :func:`fork_findings`. ``declared``
    (the overlay's signatures) makes a signature change the overlay already declares for the new
    release info.
    """
    overrides = override_roles(lock)
    contracts = _contract_ids(lock)
    for key, entry in lock.get("symbols", {}).items():
        ref = SymbolRef.parse(key)
        roles = set(entry.get("roles", []))
        if key in overrides:
            roles = (roles - {"override"}) | {overrides[key]}
        users = ", ".join(entry.get("used_by", [])[:3])
        rename = (renames or {}).get(key)
        try:
            if rename is not None:
                yield _renamed(rename, roles, users, old, (sites or {}).get(key, []))
            else:
                yield from _one_symbol(
                    ref, entry, roles, users, old, new, sorted(contracts.get(key, ())), declared
                )
        except Exception as exc:  # one unreadable symbol is a finding, not a crash of the run
            yield Finding(
                Kind.DRIFT_UNANALYSED,
                Severity.BLOCK,
                key,
                f"could not be analysed: {type(exc).__name__}: {exc}",
            )


def _renamed(rename: Rename, roles: set[str], users: str, old: Side, sites: list[str]) -> Finding:
    severity = _severity_for_loss(roles)
    count = sum(not line.startswith(" ") for line in sites)
    fix = (
        f"; {count} forked call site(s) re-anchor as proposed in the details"
        if sites
        else f"; import {rename.new.qualname} where {rename.old.qualname} was used"
    )
    return Finding(
        Kind.DRIFT_RENAMED,
        severity,
        str(rename.old),
        f"renamed: {rename.old.qualname} -> {rename.new.qualname} ({rename.change}; used by {users}){fix}",
        upstream=_location(old.index, rename.old),
        target=rename.where,
        old=str(rename.old),
        new=str(rename.new),
        details=tuple(sites),
    )


def _one_symbol(
    ref: SymbolRef,
    entry: dict[str, Any],
    roles: set[str],
    users: str,
    old: Side,
    new: Side,
    contract_ids: list[str],
    declared: Declared | None = None,
) -> Iterator[Finding]:
    key = str(ref)
    if entry.get("kind") == "external":
        return
    current = describe_symbol(new.index, ref)
    before = _location(old.index, ref)
    after = _location(new.index, ref)
    if current["kind"] in ("missing", "external"):
        moved = _relocated(new, ref, entry)
        severity = _severity_for_loss(roles)
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
        severity = _severity_for_loss(roles)
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
    handled = _declared_for(entry.get("used_by", []), new, ref, declared or {})
    yield from _signature_changes(ref, roles, users, old, new, before, after, handled)
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
    if old_body is None or old_body == new_body or "fork" in roles:
        return  # forks are re-based edit by edit in fork_findings
    diff = body_diff(
        _source(old.index, ref),
        _source(new.index, ref),
        f"{key} ({old.version})",
        f"{key} ({new.version})",
    )
    inherited = bool(roles & {"relied_on", "inherited"})
    overridden = bool(roles & {"override", "override_attr", "replaced", "extended"})
    kind = Kind.DRIFT_INHERITED_BODY if inherited and not overridden else Kind.DRIFT_BODY
    old_node, new_node = _node(old.index, ref), _node(new.index, ref)
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    if (
        isinstance(old_node, functions)
        and isinstance(new_node, functions)
        and same_behaviour(old_node, new_node)
    ):
        message = "only formatting, comments, docstrings or bare annotations changed"
        yield Finding(kind, Severity.INFO, key, f"{message} (used by {users})", before, after)
        return
    if "override" in roles or "override_attr" in roles:
        severity = Severity.REVIEW
        message = "upstream changed the body our override replaces; check ours still fits"
    elif "replaced" in roles:
        severity = Severity.INFO
        message = "body changed; our overrides replace it and never call super(), so only its signature matters"
    elif "extended" in roles:
        severity = Severity.INFO
        message = "body changed; our overrides call super(), so the change reaches us"
    elif "relied_on" in roles and contract_ids:
        severity = Severity.INFO
        message = f"body changed (AFD relies on it; its contracts {', '.join(contract_ids)} are evaluated separately, DRF070/DRF071 when broken)"
    elif "relied_on" in roles:
        severity = Severity.REVIEW
        message = "body changed (AFD relies on it; no contract states how)"
    elif inherited:
        severity = Severity.INFO
        message = "body changed (inherited, not relied on)"
    else:
        severity = Severity.INFO
        message = "body changed"
    yield Finding(
        kind,
        severity,
        key,
        f"{message} (used by {users})",
        upstream=before,
        target=after,
        details=diff,
    )


def is_callee(roles: set[str]) -> bool:
    """Whether the lock records a symbol only as something AFD's code calls (imported by
    generated, overlay or runtime code), never forked, overridden or extended: its signature
    changes are one callee finding (DRF022) naming the call sites."""
    return bool(roles & {"generated_import", "overlay_import", "runtime_import"}) and not (
        roles & {"fork", "override", "extended", "replaced"}
    )


def _signature_changes(
    ref: SymbolRef,
    roles: set[str],
    users: str,
    old: Side,
    new: Side,
    before: Location | None,
    after: Location | None,
    handled: bool = False,
) -> Iterator[Finding]:
    old_sig, new_sig = _signature(old.index, ref), _signature(new.index, ref)
    if old_sig is None or new_sig is None:
        return
    changed = differences(old_sig, new_sig)
    if not changed:
        return
    callee = is_callee(roles)
    reordered = any(diff.kind == "param_order" for diff in changed)
    for diff in changed:
        kind = Kind.DRIFT_CALLEE_SIGNATURE if callee else _SIGNATURE_KINDS[diff.kind]
        severity = Severity.REVIEW if callee else _severity_for_change(roles)
        if (
            callee
            and diff.kind == "param_added"
            and not reordered
            and _binds_old_calls(old_sig, new_sig, diff.param)
        ):
            severity = Severity.INFO
        declared = ""
        if handled:
            severity = Severity.INFO
            declared = (
                f"; the overlay's signature, with its deltas for {new.version}, already matches"
            )
        what = f"{diff.kind.replace('_', ' ')}" + (f" {diff.param!r}" if diff.param else "")
        yield Finding(
            kind,
            severity,
            str(ref),
            f"{what}: {diff.upstream!r} -> {diff.ours!r} (used by {users}){declared}",
            upstream=before,
            target=after,
            old=diff.upstream,
            new=diff.ours,
        )


def _declared_for(used_by: Sequence[str], new: Side, ref: SymbolRef, declared: Declared) -> bool:
    """Whether every generated member using ``ref`` declares, with the deltas of the new
    release (their ``when=``), exactly ``ref``'s new signature: the overlay handles the change."""
    signature = _signature(new.index, ref)
    if signature is None or not used_by or any(user not in declared for user in used_by):
        return False
    return not any(
        check_signature(
            user,
            signature,
            declared[user][0],
            applicable(declared[user][1], new.index.versions),
            ours_at=Location(user),
            upstream_at=Location(str(ref)),
        )
        for user in used_by
    )


def _binds_old_calls(old: Signature, new: Signature, added: str | None) -> bool:
    """Whether every call of ``old`` still binds the same way with parameter ``added`` of ``new``:
    it has a default and is keyword-only, or comes after every positional parameter ``old`` had."""
    params = {p.name: (i, p) for i, p in enumerate(new.params)}
    if added not in params or params[added][1].default is None:
        return False
    index, param = params[added]
    if param.kind is ParamKind.KEYWORD_ONLY:
        return True
    positional = (ParamKind.POSITIONAL_ONLY, ParamKind.POSITIONAL_OR_KEYWORD)
    return all(
        params[p.name][0] < index for p in old.params if p.kind in positional and p.name in params
    )


@dataclass
class NewBodies:
    """What the forks' bodies use on the new release, once their edits applied there."""

    #: global names the rebased bodies read
    names: set[str] = field(default_factory=set)
    #: False when a fork could not be rebased with its own edits (its names are unknown)
    complete: bool = True


#: findings of a lost upstream symbol
_LOSS = (Kind.DRIFT_REMOVED, Kind.DRIFT_MOVED, Kind.DRIFT_RENAMED, Kind.DRIFT_KIND)


def _unused_on_new(
    finding: Finding, lock: dict[str, Any], bodies: NewBodies, own: frozenset[str] | None
) -> Finding:
    """A lost name that generated code imported only for forked bodies, and that none uses once
    the overlay's edits for the new release applied (per-release alternatives replaced it), is
    info. ``own``: the names AFD's own members (overrides, extends) use, the same on every
    release; None when unknown (nothing is lowered)."""
    entry = lock.get("symbols", {}).get(finding.symbol, {})
    # the names the generated modules bind it to (``module:NAME``)
    local = {user.rsplit(":", 1)[-1].split(".")[0] for user in entry.get("used_by", [])}
    if (
        finding.kind not in _LOSS
        or finding.severity is Severity.INFO
        or entry.get("roles") != ["generated_import"]
        or own is None
        or not bodies.complete
        or not local
        or local & (bodies.names | own)
    ):
        return finding
    return replace(
        finding,
        severity=Severity.INFO,
        message=finding.message
        + "; no forked body uses it on the new release once its edits there applied",
    )


def fork_findings(
    lock: dict[str, Any],
    overlay_edits: dict[tuple[str, str], tuple[Edit, ...]],
    old: Side,
    new: Side,
    renames: dict[str, Rename] | None = None,
    sites: dict[str, list[str]] | None = None,
    bodies: NewBodies | None = None,
) -> Iterator[Finding]:
    """Re-apply every fork's edits to the new body: lost, ambiguous, conflicting or clean (3-way).

    An anchor lost only because a name it mentions was renamed is not reported here: the call
    site and the re-anchored edit go into ``sites`` for the rename's finding. ``bodies`` collects
    the global names the rebased bodies use.
    """
    bodies = NewBodies() if bodies is None else bodies
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
                yield from _rebase(
                    symbol,
                    base,
                    name,
                    member,
                    edits,
                    old,
                    new,
                    renames or {},
                    {} if sites is None else sites,
                    bodies,
                )
            except Exception as exc:
                bodies.complete = False
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
    renames: dict[str, Rename],
    sites: dict[str, list[str]],
    bodies: NewBodies,
) -> Iterator[Finding]:
    if edits is None:
        raise LookupError("the overlay no longer declares this fork; regenerate the lock first")
    # each release gets the edits its regeneration would apply (per-release alternatives)
    old_edits, edits = applicable(edits, old.index.versions), applicable(edits, new.index.versions)
    target = new.index.find_member(base, name) if new.index.is_indexed_class(base) else None
    if target is None or not target.is_method:
        bodies.complete = False
        return  # reported as a removed fork target by symbol_findings
    parsed = parse_member(target)
    where = Location(str(target.module.path), target.line)
    changed_regions = []
    for edit in edits:
        # an alternative written for the new release anchors on code the old lock never saw
        recorded = member.get("anchors", {}).get(edit.id, {}) if edit in old_edits else {}
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
        bodies.names |= global_names(apply_edits(parsed.function, edits))
    except EditError as exc:
        bodies.complete = False
        if _re_anchored(symbol, edits, parsed, target, renames, sites):
            return
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
    elif not diff:
        return
    elif old_target is not None and same_behaviour(old_target.node, target.node):
        yield Finding(
            Kind.DRIFT_REBASED,
            Severity.INFO,
            symbol,
            "only formatting, comments, docstrings or bare annotations changed outside our edits",
            target=where,
            details=diff,
        )
    elif old_target is not None and (names := _only_renamed(old_target, target, renames)):
        yield Finding(
            Kind.DRIFT_REBASED,
            Severity.INFO,
            symbol,
            f"only renamed names changed ({names}), and the edits for {new.version} apply",
            target=where,
            details=diff,
        )
    else:
        generated = _generated_diff(
            old_target, target, (old_edits, edits), old.version, new.version
        )
        yield Finding(
            Kind.DRIFT_REBASED,
            Severity.REVIEW,
            symbol,
            "upstream changed the body outside our edits; they still apply and regeneration carries "
            "the new code into ours: check it suits this role (upstream diff, then the generated diff)",
            target=where,
            details=(*diff, "", "generated method:", *generated),
        )


def _only_renamed(old: Member, new: Member, renames: dict[str, Rename]) -> str:
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


def _generated_diff(
    old_target: Member | None,
    target: Member,
    edits: tuple[tuple[Edit, ...], tuple[Edit, ...]],
    old_version: str,
    new_version: str,
) -> tuple[str, ...]:
    """The fork's edited body against the old and the new upstream body (each with the edits
    of its release), as a diff."""
    bodies = []
    for member, applied in zip((old_target, target), edits, strict=True):
        if member is None:
            bodies.append("")
            continue
        function = apply_edits(parse_member(member).function, applied)
        bodies.append(cst.Module(body=[function]).code)
    return body_diff(
        bodies[0], bodies[1], f"generated ({old_version})", f"generated ({new_version})"
    )


def _re_anchored(
    symbol: str,
    edits: tuple[Edit, ...],
    parsed: Any,
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


def contract_findings(lock: dict[str, Any], old: Side, new: Side) -> Iterator[Finding]:
    """Each contract of a relied-on method whose body changed, evaluated on the new body."""
    relied_by: dict[tuple[str, str], list[str]] = {}
    checks: dict[tuple[str, str], tuple[Member, Contract, dict[str, Any]]] = {}
    for class_key, entry in lock.get("classes", {}).items():
        base = SymbolRef.parse(entry["base"])
        for name, contracts in (entry.get("relies_on") or {}).items():
            key = relied_ref(entry, name)
            if key is None or not isinstance(contracts, dict):
                continue  # a lock older than contracts states none
            target = new.index.find_member(base, name) if new.index.is_indexed_class(base) else None
            if target is None or not target.is_method:
                continue  # the removal is symbol_findings' to report
            if target.fingerprint() == lock["symbols"].get(key, {}).get("body"):
                continue
            for contract_id, recorded in sorted(contracts.items()):
                contract = Contract(
                    recorded["pattern"], contract_id, recorded["if_broken"], recorded["count"]
                )
                checks[(key, contract_id)] = (target, contract, recorded)
                relied_by.setdefault((key, contract_id), []).append(class_key.split(":")[-1])
    for (key, contract_id), (target, contract, recorded) in sorted(checks.items()):
        symbol = f"{key}#{contract_id}"
        try:
            (match,) = evaluate(target, [contract])
        except PatternError as exc:
            yield Finding(Kind.DRIFT_UNANALYSED, Severity.BLOCK, symbol, str(exc))
            continue
        found = len(match.lines)
        if found == contract.count:
            continue
        where = Location(str(target.module.path), match.lines[0] if match.lines else target.line)
        pinned_at = ", ".join(str(line) for line in recorded.get("lines", []))
        details = (
            f"contract: {contract.pattern.strip()}",
            f"held in {old.version} at line(s) {pinned_at}: {' | '.join(recorded.get('matched', []))}",
            *body_diff(
                _source(old.index, SymbolRef.parse(key)),
                target.source(),
                f"{key} ({old.version})",
                f"{target.ref} ({new.version})",
            ),
        )
        users = ", ".join(relied_by[(key, contract_id)])
        if found == 0:
            yield Finding(
                Kind.DRIFT_CONTRACT_BROKEN,
                Severity.BLOCK,
                symbol,
                f"contract {contract_id!r} no longer holds in {new.version} (relied on by {users}): {contract.if_broken}",
                upstream=_location(old.index, SymbolRef.parse(key)),
                target=where,
                old=str(contract.count),
                new="0",
                details=details,
            )
        else:
            yield Finding(
                Kind.DRIFT_CONTRACT_COUNT,
                Severity.REVIEW,
                symbol,
                f"contract {contract_id!r} now holds in {found} place(s), declared {contract.count} "
                f"(relied on by {users}); check each still means what AFD relies on",
                upstream=_location(old.index, SymbolRef.parse(key)),
                target=where,
                old=str(contract.count),
                new=str(found),
                details=details,
            )


def compare(
    lock: dict[str, Any],
    overlay_edits: dict[tuple[str, str], tuple[Edit, ...]],
    old: Side,
    new: Side,
    *,
    files: set[str] | None = None,
    own: frozenset[str] | None = None,
    declared: Declared | None = None,
) -> list[Finding]:
    """Every lock-based drift finding between two upstream trees (symbols, forks, contracts).

    ``files``: only symbols defined in these upstream files (paths as the lock records them).
    ``own``: the global names AFD's own members use (:func:`_unused_on_new`).
    ``declared``: the overlay's signatures (:func:`symbol_findings`).
    """
    if files is not None:
        lock = _restricted(lock, files)
    renames = find_renames(lock, old, new)
    sites: dict[str, list[str]] = {}
    bodies = NewBodies()
    forks = list(fork_findings(lock, overlay_edits, old, new, renames, sites, bodies))
    bodies.complete &= files is None  # a restricted lock rebases only some forks
    findings = [
        _unused_on_new(f, lock, bodies, own)
        for f in symbol_findings(lock, old, new, renames, sites, declared)
    ]
    return findings + forks + list(contract_findings(lock, old, new))


def _restricted(lock: dict[str, Any], files: set[str]) -> dict[str, Any]:
    """The lock cut down to the symbols (and classes whose base) defined in ``files``."""
    symbols = {k: v for k, v in lock.get("symbols", {}).items() if v.get("file") in files}
    classes = {
        k: v
        for k, v in lock.get("classes", {}).items()
        if lock.get("symbols", {}).get(v["base"], {}).get("file") in files
    }
    return {**lock, "symbols": symbols, "classes": classes}


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
