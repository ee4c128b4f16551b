"""AFD's own call sites on the new release: each call or construction the lock records
(:class:`~codegen.lock.Site`) bound against the new signature. A call that bound on the old release
and no longer does (a keyword renamed, a required parameter added, fewer positional parameters) is a
block naming the site; one that still binds makes the signature change info
(:mod:`codegen.drift.symbols`). Reads of a member that is gone are losses, reported there."""

from __future__ import annotations

from collections.abc import Iterator

from codegen.call_sites import binding_problem, call_signature
from codegen.drift.sides import Side
from codegen.findings import Finding, Kind, Location, Severity
from codegen.lock import Lock, Site, SiteKind, SymbolEntry
from codegen.model import ParamKind, Signature, SymbolRef


def site_location(site: Site) -> Location:
    path, _, line = site.at.rpartition(":")
    return Location(path, int(line))


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
    lock: Lock, old: Side, new: Side, elsewhere: frozenset[str] = frozenset()
) -> Iterator[Finding]:
    """One block per recorded call site the new release no longer accepts (``elsewhere``: the
    overlay members the new release does not get, whose calls do not count)."""
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
                f"AFD's call at {site.at} fails on {new.version}: {ref.qualname} {problem}; "
                f"change the call to the new signature",
                ours=site_location(site),
                upstream=old.location(ref),
                target=new.location(ref),
                old=_arguments(site),
                new=f"{what} {ref.qualname}{after.render() if after else ''}",
            )


def _arguments(site: Site) -> str:
    passed = [f"{site.positional} positional", *(f"{k}=" for k in site.keywords)]
    return "AFD passes " + ", ".join(passed) + (" and *args/**kwargs" if site.unpacked else "")
