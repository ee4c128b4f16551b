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
from codegen.places import Places

#: findings of a lost upstream symbol
_LOSS = (Kind.DRIFT_REMOVED, Kind.DRIFT_MOVED, Kind.DRIFT_RENAMED, Kind.DRIFT_KIND)


def _unused_on_new(
    finding: Finding, lock: Lock, bodies: NewBodies, own: frozenset[str] | None
) -> Finding:
    """A lost name that generated code imported only for forked bodies, and that none uses once
    the overlay's edits for the new release applied (per-release alternatives replaced it), is
    info. ``own``: the names AFD's own members (overrides, extends) use, the same on every
    release; None when unknown (nothing is lowered)."""
    entry = lock.symbols.get(finding.symbol)
    if entry is None:
        return finding
    # the names the generated modules bind it to (``module:NAME``)
    local = {user.rsplit(":", 1)[-1].split(".")[0] for user in entry.used_by}
    if (
        finding.kind not in _LOSS
        or finding.severity is Severity.INFO
        or entry.uses != {SymbolUse.IMPORTED_BY_GENERATED}
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
    bodies.complete &= files is None  # a restricted lock rebases only some forks
    findings = [
        _unused_on_new(f, lock, bodies, own)
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
