"""AFD's own call sites on the new release: each call or construction the lock records
(:class:`~codegen.lock.Site`) bound against the new signature. A call that bound on the old release
and no longer does (a keyword renamed, a required parameter added, fewer positional parameters) is a
block naming the site (its function, and the line it is on now: :class:`codegen.places.Places`);
one that still binds makes the signature change info (:mod:`codegen.drift.symbols`). Reads of a
member that is gone are losses, reported there."""

from __future__ import annotations

from collections.abc import Iterator

from codegen.drift.sides import Side
from codegen.findings import Finding, Kind, Severity
from codegen.index import UpstreamIndex
from codegen.lock import Lock, Site, SiteKind, SymbolEntry
from codegen.model import ParamKind, Signature, SymbolRef
from codegen.places import Places
from codegen.upstream_values import field_signature


def call_signature(index: UpstreamIndex, ref: SymbolRef, how: SiteKind) -> Signature | None:
    """The signature a call site binds against, ``self``/``cls`` left out: a function's, a
    method's, or a class's constructor (its ``__init__``, else a dataclass's fields); None when it
    cannot be known statically."""
    if how is SiteKind.CONSTRUCT:
        init = index.find_member(ref, "__init__")
        if init is not None and init.is_method:
            return _bound(init.signature())
        return field_signature(index, ref)
    owner, _, member = ref.qualname.partition(".")
    if member:
        found = index.find_member(SymbolRef(ref.module, owner), member)
        if found is None or not found.is_method:
            return None
        signature = found.signature()
        return signature if "staticmethod" in signature.decorators else _bound(signature)
    info = index.module(ref.module)
    if info is not None and ref.qualname in info.functions:
        return Signature.from_ast(info.functions[ref.qualname])
    return None


def _bound(signature: Signature) -> Signature:
    positional = (ParamKind.POSITIONAL_ONLY, ParamKind.POSITIONAL_OR_KEYWORD)
    if signature.params and signature.params[0].kind in positional:
        return Signature(signature.params[1:], signature.returns, signature.decorators)
    return signature


def binding_problem(signature: Signature, site: Site) -> str | None:
    """Why a call with ``site``'s arguments does not bind to ``signature``; None when it does."""
    if site.how not in (SiteKind.CALL, SiteKind.CONSTRUCT):
        return None
    params = signature.params
    positional = [
        p for p in params if p.kind in (ParamKind.POSITIONAL_ONLY, ParamKind.POSITIONAL_OR_KEYWORD)
    ]
    var_positional = any(p.kind is ParamKind.VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind is ParamKind.VAR_KEYWORD for p in params)
    if site.positional > len(positional) and not var_positional:
        return f"takes {len(positional)} positional argument(s), AFD passes {site.positional}"
    bound = {p.name for p in positional[: site.positional]}
    by_name = {p.name: p for p in params}
    for keyword in site.keywords:
        param = by_name.get(keyword)
        accepts = param is not None and param.kind in (
            ParamKind.POSITIONAL_OR_KEYWORD,
            ParamKind.KEYWORD_ONLY,
        )
        if not accepts and not var_keyword:
            return f"has no parameter {keyword!r}, which AFD passes by keyword"
        if keyword in bound:
            return f"gets {keyword!r} twice: by position and by keyword"
        bound.add(keyword)
    if site.unpacked:
        return None  # *args / **kwargs may supply the rest
    required = [
        p.name
        for p in params
        if p.default is None
        and p.kind not in (ParamKind.VAR_POSITIONAL, ParamKind.VAR_KEYWORD)
        and p.name not in bound
    ]
    if required:
        return f"requires {', '.join(map(repr, required))}, which AFD does not pass"
    return None


def calls(entry: SymbolEntry, elsewhere: frozenset[str] = frozenset()) -> list[Site]:
    """The recorded calls and constructions of a symbol, each place once (an overlay line serves
    every class generated from its declaration), but those of members limited by their
    ``when=`` to releases other than the target (``elsewhere``)."""
    found: dict[tuple[object, ...], Site] = {}
    for site in entry.sites:
        if site.how in (SiteKind.CALL, SiteKind.CONSTRUCT) and site.by not in elsewhere:
            place = (site.at, site.how, site.positional, site.keywords, site.unpacked)
            found.setdefault(place, site)
    return list(found.values())


def broken_sites(
    entry: SymbolEntry,
    ref: SymbolRef,
    old: Side,
    new: Side,
    elsewhere: frozenset[str] = frozenset(),
) -> list[tuple[Site, str]]:
    """The recorded calls of ``ref`` that bind on ``old`` and not on ``new``, each with why
    (``elsewhere``: as for :func:`calls`)."""
    broken: list[tuple[Site, str]] = []
    for site in calls(entry, elsewhere):
        before = call_signature(old.index, ref, site.how)
        after = call_signature(new.index, ref, site.how)
        if before is None or after is None or binding_problem(before, site) is not None:
            continue  # unknown on one side (a loss is reported as such), or never bound
        problem = binding_problem(after, site) or _shifted(before, after, site.positional)
        if problem is not None:
            broken.append((site, problem))
    return broken


def _shifted(before: Signature, after: Signature, count: int) -> str | None:
    """Whether one of the first ``count`` positional arguments binds another parameter now: the
    one it bound is still there, at another place (a parameter inserted before it, say). A
    parameter renamed in place still takes the argument."""
    new_names = _positional(after)
    for i, (was, now) in enumerate(zip(_positional(before), new_names, strict=False)):
        if i < count and was != now and was in new_names:
            return f"takes AFD's positional argument {i + 1} as {now!r}, not {was!r}"
    return None


def _positional(signature: Signature) -> list[str]:
    kinds = (ParamKind.POSITIONAL_ONLY, ParamKind.POSITIONAL_OR_KEYWORD)
    return [p.name for p in signature.params if p.kind in kinds]


def site_findings(
    lock: Lock, old: Side, new: Side, places: Places, elsewhere: frozenset[str] = frozenset()
) -> Iterator[Finding]:
    """One block per recorded call site the new release no longer accepts (``elsewhere``: the
    overlay members the new release does not get, whose calls do not count), at its line now."""
    for key, entry in lock.symbols.items():
        if not entry.sites:
            continue
        ref = SymbolRef.parse(key)
        for site, problem in broken_sites(entry, ref, old, new, elsewhere):
            what = "constructing" if site.how is SiteKind.CONSTRUCT else "calling"
            after = call_signature(new.index, ref, site.how)
            yield Finding(
                Kind.DRIFT_CALL_SITE,
                Severity.BLOCK,
                key,
                f"AFD's call in {site.at} fails on {new.version}: {ref.qualname} {problem}; "
                f"change the call to the new signature",
                ours=places.location(site, ref),
                upstream=old.location(ref),
                target=new.location(ref),
                old=_arguments(site),
                new=f"{what} {ref.qualname}{after.render() if after else ''}",
            )


def _arguments(site: Site) -> str:
    passed = [f"{site.positional} positional", *(f"{k}=" for k in site.keywords)]
    return "AFD passes " + ", ".join(passed) + (" and *args/**kwargs" if site.unpacked else "")
