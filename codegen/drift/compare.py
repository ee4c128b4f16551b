"""The comparison: every lock-based drift finding between two upstream versions (symbols, forks,
contracts), and the rule that lowers a lost import no rebased body uses any more."""

from __future__ import annotations

from dataclasses import replace

from codegen.drift.call_sites import site_findings
from codegen.drift.contracts import contract_findings
from codegen.drift.forks import NewBodies, fork_findings
from codegen.drift.renames import find_renames
from codegen.drift.sides import Side
from codegen.drift.symbols import OverlayMembers, symbol_findings
from codegen.findings import Finding, Kind, Severity
from codegen.lock import Lock, SymbolUse
from codegen.markers import Edit
from codegen.model import MemberKind, SymbolRef
from codegen.places import Places

#: findings of a lost upstream symbol
_LOSS = (Kind.DRIFT_REMOVED, Kind.DRIFT_MOVED, Kind.DRIFT_RENAMED, Kind.DRIFT_KIND)


def _unused_on_new(
    finding: Finding, lock: Lock, bodies: NewBodies, own: frozenset[str] | None
) -> Finding:
    """A lost name that generated code imported only for forked bodies, and that none of those
    modules' bodies uses once the overlay's edits for the new release applied (per-release
    alternatives replaced it), is info. ``own``: the names AFD's own members (overrides,
    extends) use, the same on every release; None when unknown (nothing is lowered)."""
    entry = lock.symbols.get(finding.symbol)
    if (
        entry is None
        or finding.kind not in _LOSS
        or finding.severity is Severity.INFO
        or entry.uses != {SymbolUse.IMPORTED_BY_GENERATED}
        or own is None
        or not entry.used_by
    ):
        return finding
    # the modules and the names they bind it to (``module:NAME``)
    bound = [user.rsplit(":", 1) for user in entry.used_by]
    if any(
        name.split(".")[0] in own or bodies.uses(module, name.split(".")[0]) is not False
        for module, name in bound
    ):
        return finding
    return replace(
        finding,
        severity=Severity.INFO,
        message=finding.message
        + "; no forked body uses it on the new release once its edits there applied",
    )


def _followed(finding: Finding, lock: Lock, new: Side) -> Finding:
    """A name generated code imports only because forked bodies use it, that moved to another
    module which the modules those bodies come from now import it from: regeneration copies
    upstream's own import, so it is info."""
    entry = lock.symbols.get(finding.symbol)
    if (
        entry is None
        or finding.kind is not Kind.DRIFT_MOVED
        or finding.severity is Severity.INFO
        or entry.uses != {SymbolUse.IMPORTED_BY_GENERATED}
        or finding.new is None
    ):
        return finding
    target = SymbolRef.parse(finding.new)
    for user in entry.used_by:
        module, _, name = user.rpartition(":")
        # the upstream modules the forked bodies of that generated module come from: a forked
        # body's names are bound as its own module binds them
        homes = {
            SymbolRef.parse(member.upstream).module
            for key, cls in lock.classes.items()
            if key.partition(":")[0] == module
            for member in cls.members.values()
            if member.kind is MemberKind.FORK and member.upstream
        }
        if not homes or any(new.index.resolve(home, name) != target for home in homes):
            return finding
    return replace(
        finding,
        severity=Severity.INFO,
        message=finding.message.replace("; update the overlay or runtime", "")
        + "; the forked bodies' upstream module imports it from there now, and regeneration "
        "follows that import",
    )


def compare(
    lock: Lock,
    overlay_edits: dict[tuple[str, str], tuple[Edit, ...]],
    old: Side,
    new: Side,
    places: Places,
    *,
    files: set[str] | None = None,
    own: frozenset[str] | None = None,
    members: OverlayMembers | None = None,
) -> list[Finding]:
    """Every lock-based drift finding between two upstream trees (symbols, forks, contracts).

    ``files``: only symbols defined in these upstream files (paths as the lock records them).
    ``own``: the global names AFD's own members use (:func:`_unused_on_new`).
    ``members``: what the overlay declares (:func:`symbol_findings`).
    ``places``: this repository's files, where findings about AFD's own uses find their lines.
    """
    if files is not None:
        lock = _restricted(lock, files)
    renames = find_renames(lock, old, new)
    sites: dict[str, list[str]] = {}
    bodies = NewBodies()
    forks = list(fork_findings(lock, overlay_edits, old, new, renames, sites, bodies))
    if files is not None:  # a restricted lock rebases only some forks: nothing is lowered
        own = None
    findings = [
        _followed(_unused_on_new(f, lock, bodies, own), lock, new)
        for f in symbol_findings(lock, old, new, places, renames, sites, members)
    ]
    limited = members.elsewhere if members is not None else frozenset()
    calls = list(site_findings(lock, old, new, places, limited))
    elsewhere = members.contracts_elsewhere if members is not None else frozenset()
    return findings + forks + list(contract_findings(lock, old, new, elsewhere)) + calls


def _restricted(lock: Lock, files: set[str]) -> Lock:
    """The lock cut down to the symbols (and classes whose base) defined in ``files``."""
    symbols = {k: v for k, v in lock.symbols.items() if v.description.file in files}
    classes = {
        k: v
        for k, v in lock.classes.items()
        if (base := lock.symbols.get(v.base)) is not None and base.description.file in files
    }
    return replace(lock, symbols=symbols, classes=classes)
