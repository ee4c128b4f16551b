"""Per recorded symbol: removed, moved, renamed, another kind, a new signature, a new body; the
severity follows the symbol's uses in the lock (what AFD does with it)."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from codegen.drift.call_sites import broken_sites, calls
from codegen.drift.contracts import ContractKey, contract_ids, selection_ids
from codegen.drift.renames import Rename, relocated
from codegen.drift.sides import Side, body_diff
from codegen.drift.values import environment_findings, field_findings, type_findings
from codegen.findings import Finding, Kind, Location, Severity
from codegen.index import same_behaviour
from codegen.lock import (
    AT_SITES,
    IMPORTS,
    OVERRIDES,
    RELIED_ON,
    Lock,
    SymbolEntry,
    SymbolKind,
    SymbolUse,
)
from codegen.lock_build import describe_symbol
from codegen.markers import Delta, DifferenceKind
from codegen.model import GENERATED_PREFIX, ParamKind, Signature, SymbolRef, package_of
from codegen.places import Places
from codegen.releases import applicable
from codegen.signatures import check_signature, differences

Uses = frozenset[SymbolUse]

#: uses whose symbol changing signature breaks generation
_BREAKING_CHANGE = frozenset(
    {
        SymbolUse.BASE,
        SymbolUse.FORKED,
        SymbolUse.OVERRIDE_CALLING_SUPER,
        SymbolUse.OVERRIDE_NOT_CALLING_SUPER,
        SymbolUse.ATTRIBUTE_OVERRIDE,
    }
)
#: uses whose symbol disappearing breaks generation (or the runtime)
_BREAKING_LOSS = _BREAKING_CHANGE | IMPORTS | AT_SITES | {SymbolUse.READ_BY_RUNTIME}
#: uses of hand-written code whose calls the lock records as sites: a signature change is judged
#: by whether those calls still bind (:mod:`codegen.drift.call_sites`)
#: (inheriting a method is no call: upstream's own callers change with it)
_JUDGED_BY_SITES = AT_SITES | {
    SymbolUse.IMPORTED_BY_RUNTIME,
    SymbolUse.IMPORTED_BY_OVERLAY,
    SymbolUse.IMPORTED_BY_GENERATED,
    SymbolUse.INHERITED,
}
#: uses whose symbol changing signature needs a look
_REVIEWED_CHANGE = IMPORTS | RELIED_ON | {SymbolUse.READ_BY_RUNTIME, SymbolUse.BASE_ANCESTOR}


_SIGNATURE_KINDS = {
    DifferenceKind.PARAM_ADDED: Kind.DRIFT_PARAM_ADDED,
    DifferenceKind.PARAM_REMOVED: Kind.DRIFT_PARAM_REMOVED,
    DifferenceKind.PARAM_RENAMED: Kind.DRIFT_PARAM_RENAMED,
    DifferenceKind.PARAM_KIND: Kind.DRIFT_PARAM_KIND,
    DifferenceKind.PARAM_ORDER: Kind.DRIFT_PARAM_ORDER,
    DifferenceKind.PARAM_DEFAULT: Kind.DRIFT_PARAM_DEFAULT,
    DifferenceKind.PARAM_ANNOTATION: Kind.DRIFT_PARAM_ANNOTATION,
    DifferenceKind.RETURN_ANNOTATION: Kind.DRIFT_RETURN_ANNOTATION,
    DifferenceKind.DECORATORS: Kind.DRIFT_DECORATORS,
}


def _severity_for_loss(uses: Uses) -> Severity:
    """A symbol gone, renamed or turned into another kind: it blocks whatever uses it directly."""
    if uses & (_BREAKING_LOSS | RELIED_ON):
        return Severity.BLOCK
    return _severity_for_change(uses)


def _severity_for_change(uses: Uses) -> Severity:
    if uses & _BREAKING_CHANGE:
        return Severity.BLOCK
    if uses & _REVIEWED_CHANGE:
        return Severity.REVIEW
    return Severity.INFO


#: generated member (``module:Class.member``) -> the overlay's signature and the deltas declared
#: for its base, on every release (each with its ``when=``)
Declared = Mapping[str, tuple[Signature, tuple[Delta, ...]]]


@dataclass(frozen=True)
class OverlayMembers:
    """What the overlay declares, as drift judges a target release by it."""

    #: the forks and overrides the target release gets: their signatures and deltas
    signatures: Declared
    #: every generated member (``module:Class.member``) the overlay declares, on any release
    every: frozenset[str]
    #: of them, those the target release does not get (their ``when=`` excludes it)
    elsewhere: frozenset[str]
    #: the contracts whose ``when=`` excludes the target release
    contracts_elsewhere: frozenset[ContractKey] = frozenset()

    def inherited_only(self, user: str) -> bool:
        """A generated class's member the overlay never declares: an inherited upstream one."""
        return user.startswith(GENERATED_PREFIX) and user not in self.every


def symbol_findings(
    lock: Lock,
    old: Side,
    new: Side,
    places: Places,
    renames: dict[str, Rename] | None = None,
    sites: dict[str, list[str]] | None = None,
    members: OverlayMembers | None = None,
) -> Iterator[Finding]:
    """Every recorded upstream symbol: removed, moved, renamed, signature and body changes.

    ``renames`` (from :func:`find_renames`) turn a removal into one "renamed" finding that
    carries the forked call sites collected in ``sites`` by :func:`fork_findings`. ``members``
    (what the overlay declares) makes info a signature change the overlay already declares for
    the new release, and the removal of a symbol only members limited to other releases use.
    """
    contracts = contract_ids(lock)
    rules = selection_ids(lock)
    for key, entry in lock.symbols.items():
        ref = SymbolRef.parse(key)
        users = ", ".join(entry.used_by[:3])
        rename = (renames or {}).get(key)
        try:
            if rename is not None:
                yield _renamed(rename, entry.uses, users, old, (sites or {}).get(key, []))
            else:
                yield from _one_symbol(
                    ref,
                    entry,
                    users,
                    old,
                    new,
                    places,
                    sorted(contracts.get(key, ())),
                    members,
                    sorted(rules.get(key, ())),
                )
        except Exception as exc:  # one unreadable symbol is a finding, not a crash of the run
            yield Finding(
                Kind.DRIFT_UNANALYSED,
                Severity.BLOCK,
                key,
                f"could not be analysed: {type(exc).__name__}: {exc}",
            )


def _renamed(rename: Rename, uses: Uses, users: str, old: Side, sites: list[str]) -> Finding:
    severity = _severity_for_loss(uses)
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
        upstream=old.location(rename.old),
        target=rename.where,
        old=str(rename.old),
        new=str(rename.new),
        details=tuple(sites),
    )


def _one_symbol(
    ref: SymbolRef,
    entry: SymbolEntry,
    users: str,
    old: Side,
    new: Side,
    places: Places,
    contract_ids: list[str],
    members: OverlayMembers | None = None,
    rules: Sequence[str] = (),
) -> Iterator[Finding]:
    key = str(ref)
    uses = entry.uses
    recorded = entry.description
    if recorded.kind is SymbolKind.EXTERNAL:
        return
    current = describe_symbol(new.index, ref)
    if recorded.kind is SymbolKind.ENVIRONMENT_VARIABLE:
        yield from environment_findings(key, entry, current, old, new, places)
        return
    before = old.location(ref)
    after = new.location(ref)
    if current.kind in (SymbolKind.MISSING, SymbolKind.EXTERNAL):
        moved = relocated(new, ref, recorded, old)
        severity = _severity_for_loss(uses)
        if (
            members is not None
            and entry.used_by
            and all(user in members.elsewhere for user in entry.used_by)
        ):  # every user is an overlay member limited (when=) to releases that still have it
            severity = Severity.INFO
            users += "; each is limited by its when= to other releases"
        ours = places.location(entry.sites[0], ref) if entry.sites else None
        if entry.sites:
            users += "; AFD's code uses it in " + ", ".join(str(s.at) for s in entry.sites[:3])
        if moved is not None:
            kind, where = moved
            yield Finding(
                kind,
                severity,
                key,
                f"now {where} (used by {users}); update the overlay or runtime",
                ours=ours,
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
                ours=ours,
                upstream=before,
                old=key,
            )
        return
    if recorded.kind is current.kind is SymbolKind.INSTANCE_ATTRIBUTE:
        owner, _, name = ref.qualname.rpartition(".")
        setter = new.index.instance_attribute(SymbolRef(ref.module, owner), name)
        if setter is not None and setter.ref != ref:
            # what AFD reads is now set only by another class's method (a base's __init__ that
            # initializes it to None, say): the value it reads may be another
            yield Finding(
                Kind.DRIFT_REMOVED,
                Severity.REVIEW,
                key,
                f"no method that runs on {owner} sets it in {new.version}; only "
                f"{setter.ref.qualname.rpartition('.')[0]} does, at {setter.module.path}:"
                f"{setter.line} (used by {users}): check the value AFD reads",
                ours=places.location(entry.sites[0], ref) if entry.sites else None,
                upstream=before,
                target=Location(str(setter.module.path), setter.line),
                old=key,
                new=str(setter.ref),
            )
            return
    if current.kind is not recorded.kind:
        severity = _severity_for_loss(uses)
        yield Finding(
            Kind.DRIFT_KIND,
            severity,
            key,
            f"was a {recorded.kind.value}, is a {current.kind.value}",
            upstream=before,
            target=after,
            old=recorded.kind.value,
            new=current.kind.value,
        )
        return
    if recorded.kind in (SymbolKind.INSTANCE_ATTRIBUTE, SymbolKind.CLASS_ATTRIBUTE):
        yield from type_findings(key, entry, current, old, new, places)
    elif recorded.kind is SymbolKind.CLASS:
        yield from field_findings(key, entry, current, old, new, places)
    handled = members is not None and _declared_for(entry.used_by, new, ref, members)
    elsewhere = members.elsewhere if members is not None else frozenset()
    yield from _signature_changes(ref, entry, users, old, new, before, after, handled, elsewhere)
    if recorded.kind is SymbolKind.CLASS and recorded.bases != current.bases:
        yield Finding(
            Kind.DRIFT_BASES,
            # only what AFD derives from feels the MRO; the members AFD calls or reads on another
            # class are symbols of their own
            Severity.REVIEW if SymbolUse.BASE in uses else Severity.INFO,
            key,
            "changed its bases",
            upstream=before,
            target=after,
            old=", ".join(recorded.bases or ()),
            new=", ".join(current.bases or ()),
        )
    old_body, new_body = (recorded.body or recorded.value, current.body or current.value)
    if old_body is None or old_body == new_body or SymbolUse.FORKED in uses:
        return  # forks are re-based edit by edit in fork_findings
    diff = body_diff(
        old.source(ref),
        new.source(ref),
        f"{key} ({old.version})",
        f"{key} ({new.version})",
    )
    inherited = bool(uses & (RELIED_ON | {SymbolUse.INHERITED}))
    overridden = bool(uses & OVERRIDES)
    kind = Kind.DRIFT_INHERITED_BODY if inherited and not overridden else Kind.DRIFT_BODY
    old_node, new_node = old.node(ref), new.node(ref)
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    if (
        isinstance(old_node, functions)
        and isinstance(new_node, functions)
        and same_behaviour(old_node, new_node)
    ):
        message = "only formatting, comments, docstrings or bare annotations changed"
        yield Finding(
            kind, Severity.INFO, key, f"{message} (used by {users})", upstream=before, target=after
        )
        return
    calling = SymbolUse.OVERRIDE_CALLING_SUPER in uses
    not_calling = SymbolUse.OVERRIDE_NOT_CALLING_SUPER in uses
    if rules:
        # it decides which class AFD gets: never "the change reaches us", whatever else holds
        severity = Severity.INFO
        message = (
            f"body changed; it decides which class AFD gets, by the selection rule(s) "
            f"{', '.join(rules)}, evaluated separately (DRF072 when one no longer holds)"
        )
    elif (calling and not_calling) or SymbolUse.ATTRIBUTE_OVERRIDE in uses:
        severity = Severity.REVIEW
        message = "upstream changed the body our override replaces; check ours still fits"
    elif not_calling:
        severity = Severity.INFO
        message = "body changed; our overrides replace it and never call super(), so only its signature matters"
    elif calling:
        severity = Severity.INFO
        message = "body changed; our overrides call super(), so the change reaches us"
    elif uses & RELIED_ON and contract_ids:
        severity = Severity.INFO
        message = f"body changed (AFD relies on it; its contracts {', '.join(contract_ids)} are evaluated separately, DRF070/DRF071 when broken)"
    elif uses & RELIED_ON:
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


def is_callee(uses: Uses) -> bool:
    """Whether the lock records a symbol only as something AFD's code calls (imported by
    generated, overlay or runtime code), never forked or overridden: its signature changes are
    one callee finding (DRF022) naming the call sites."""
    overridden = {SymbolUse.OVERRIDE_CALLING_SUPER, SymbolUse.OVERRIDE_NOT_CALLING_SUPER}
    return bool(uses & IMPORTS) and not uses & (overridden | {SymbolUse.FORKED})


def _signature_changes(
    ref: SymbolRef,
    entry: SymbolEntry,
    users: str,
    old: Side,
    new: Side,
    before: Location | None,
    after: Location | None,
    handled: bool = False,
    elsewhere: frozenset[str] = frozenset(),
) -> Iterator[Finding]:
    """``elsewhere``: overlay members the new release does not get (their calls do not count)."""
    old_sig, new_sig = old.signature(ref), new.signature(ref)
    if old_sig is None or new_sig is None:
        return
    changed = differences(old_sig, new_sig)
    if not changed:
        return
    uses = entry.uses
    recorded = calls(entry, elsewhere)
    # AFD only calls it. The calls the lock holds decide (a broken one is DRF023): those of
    # hand-written code and of forks into another package. A fork's calls into its own package
    # come with the new body at regeneration, so with no call recorded the change is info too.
    by_calls = uses <= _JUDGED_BY_SITES and (
        bool(recorded)
        or (
            uses <= {SymbolUse.IMPORTED_BY_GENERATED, SymbolUse.INHERITED}
            and all(
                _generated_package(user) == ref.module.split(".", 1)[0] for user in entry.used_by
            )
        )
    )
    calls_note = ""
    if by_calls and recorded:
        broken = len(broken_sites(entry, ref, old, new, elsewhere))
        calls_note = (
            f"; {broken} of AFD's {len(recorded)} call site(s) no longer bind (DRF023)"
            if broken
            else f"; all {len(recorded)} of AFD's call sites still bind"
        )
    elif by_calls:
        calls_note = "; only forks of its own package call it: regeneration takes their new calls"
    callee = is_callee(uses)
    reordered = any(diff.kind is DifferenceKind.PARAM_ORDER for diff in changed)
    for diff in changed:
        kind = Kind.DRIFT_CALLEE_SIGNATURE if callee else _SIGNATURE_KINDS[diff.kind]
        severity = Severity.REVIEW if callee else _severity_for_change(uses)
        if (
            callee
            and diff.kind is DifferenceKind.PARAM_ADDED
            and not reordered
            and _binds_old_calls(old_sig, new_sig, diff.param)
        ):
            severity = Severity.INFO
        declared = calls_note
        if by_calls and diff.kind is not DifferenceKind.RETURN_ANNOTATION:
            severity = Severity.INFO  # what it returns is not how it binds: that stays as it was
        if diff.kind is DifferenceKind.PARAM_ANNOTATION and not uses & _BREAKING_CHANGE:
            severity = Severity.INFO
            declared += "; a parameter's annotation does not change how a call binds"
        if handled:
            severity = Severity.INFO
            declared = (
                f"; the overlay's signature, with its deltas for {new.version}, already matches"
            )
        what = f"{diff.kind.value.replace('_', ' ')}" + (f" {diff.param!r}" if diff.param else "")
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


def _declared_for(
    used_by: Sequence[str], new: Side, ref: SymbolRef, members: OverlayMembers
) -> bool:
    """Whether every generated member using ``ref`` declares, with the deltas of the new
    release (their ``when=``), exactly ``ref``'s new signature: the overlay handles the change.
    A class that only inherits ``ref`` takes upstream's new signature with it."""
    signature = new.signature(ref)
    declared = members.signatures
    used_by = [user for user in used_by if not members.inherited_only(user)]
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


def _generated_package(user: str) -> str:
    """The upstream package whose code a lock user (``afd_models._generated.<package>...``)
    was generated from; "" for a runtime file."""
    return package_of(user) if user.startswith(GENERATED_PREFIX) else ""


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
