"""The contracts overlays state on relied-on upstream methods, evaluated on the new bodies."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from codegen.contracts import evaluate
from codegen.drift.roles import roles_of
from codegen.drift.sides import Side, body_diff
from codegen.findings import Finding, Kind, Location, Severity
from codegen.index import Member
from codegen.lock import ClassEntry, ContractEntry, Lock
from codegen.markers import Contract
from codegen.model import SymbolRef
from codegen.pattern import PatternError


class ContractKey(NamedTuple):
    """One contract as one generated class states it."""

    #: the generated class (``module:Class``)
    generated_class: str
    #: the ``relies_on`` key: a method name, or ``module:Class.method``
    relied_on: str
    contract_id: str


def contract_ids(lock: Lock) -> dict[str, set[str]]:
    """Relied-on upstream method -> the ids of the contracts overlays state on it."""
    ids: dict[str, set[str]] = {}
    for entry in lock.classes.values():
        for name, contracts in entry.relies_on.items():
            key = relied_ref(entry, name)
            if key is not None:
                ids.setdefault(key, set()).update(contracts)
    return ids


def selection_ids(lock: Lock) -> dict[str, set[str]]:
    """Relied-on upstream method -> the ids of the selection rules (``selects``) stated on it."""
    ids: dict[str, set[str]] = {}
    for entry in lock.classes.values():
        for name, contracts in entry.relies_on.items():
            key = relied_ref(entry, name)
            rules = {i for i, c in contracts.items() if c.selects is not None}
            if key is not None and rules:
                ids.setdefault(key, set()).update(rules)
    return ids


def relied_ref(entry: ClassEntry, name: str) -> str | None:
    """The upstream method a generated class relies on by ``name``: inherited, run by its
    override's ``super()`` call, or named outside its MRO (``module:Class.method``)."""
    if ":" in name:
        return name
    inherited = entry.inherited.get(name)
    if inherited is not None:
        return inherited
    member = entry.members.get(name)
    return member.upstream if member is not None else None


def contract_findings(
    lock: Lock,
    old: Side,
    new: Side,
    elsewhere: frozenset[ContractKey] = frozenset(),
) -> Iterator[Finding]:
    """Each contract of a relied-on method whose body changed, evaluated on the new body.

    ``elsewhere``: the contracts whose ``when=`` excludes the new release: the overlay states they
    stop holding there, so a break is info."""
    relied_by: dict[tuple[str, str], list[str]] = {}
    limited: dict[tuple[str, str], bool] = {}
    checks: dict[tuple[str, str], tuple[Member, Contract, ContractEntry]] = {}
    gone: dict[str, dict[str, ContractEntry]] = {}
    gone_by: dict[str, set[str]] = {}
    for class_key, entry in lock.classes.items():
        base = SymbolRef.parse(entry.base)
        for name, contracts in entry.relies_on.items():
            key = relied_ref(entry, name)
            if key is None:
                continue
            if ":" in name:
                target = new.index.outside_method(name)
            elif new.index.is_indexed_class(base):
                target = new.index.find_member(base, name)
            else:
                target = None
            if target is None or not target.is_method:
                # the removal is symbol_findings' to report; a selection rule's also here
                rules = sorted(i for i, c in contracts.items() if c.selects is not None)
                if rules:
                    gone.setdefault(key, {}).update({i: contracts[i] for i in rules})
                    gone_by.setdefault(key, set()).add(class_key)
                continue
            recorded_symbol = lock.symbols.get(key)
            if (
                recorded_symbol is not None
                and target.fingerprint() == recorded_symbol.description.body
            ):
                continue
            for contract_id, recorded in sorted(contracts.items()):
                contract = Contract(
                    recorded.pattern, contract_id, recorded.if_broken, recorded.count
                )
                checks[(key, contract_id)] = (target, contract, recorded)
                relied_by.setdefault((key, contract_id), []).append(class_key)
                limited[(key, contract_id)] = limited.get((key, contract_id), True) and (
                    ContractKey(class_key, name, contract_id) in elsewhere
                )
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
        pinned_at = ", ".join(str(line) for line in recorded.lines)
        details = (
            f"contract: {contract.pattern.strip()}",
            f"held in {old.version} at line(s) {pinned_at}: {' | '.join(recorded.matched)}",
            *body_diff(
                old.source(SymbolRef.parse(key)),
                target.source(),
                f"{key} ({old.version})",
                f"{target.ref} ({new.version})",
            ),
        )
        users = ", ".join(c.split(":")[-1] for c in relied_by[(key, contract_id)])
        if found == 0:
            absorbed = limited[(key, contract_id)]
            rule = recorded.selects
            what = (
                f"selection rule {contract_id!r} ({rule}) no longer holds in {new.version}: it "
                f"decides for {_roles(relied_by[(key, contract_id)])} (relied on by {users})"
                if rule is not None
                else f"contract {contract_id!r} no longer holds in {new.version} (relied on by {users})"
            )
            yield Finding(
                Kind.DRIFT_SELECTION if rule is not None else Kind.DRIFT_CONTRACT_BROKEN,
                Severity.INFO if absorbed else Severity.BLOCK,
                symbol,
                f"{what}: {contract.if_broken}"
                + (
                    f"; its when= limits it to other releases: the overlay states it answers "
                    f"{new.version} otherwise (drift takes its word; a regeneration for "
                    f"{new.version}, as the audit's dry run, checks the contracts that apply there)"
                    if absorbed
                    else ""
                ),
                upstream=old.location(SymbolRef.parse(key)),
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
                upstream=old.location(SymbolRef.parse(key)),
                target=where,
                old=str(contract.count),
                new=str(found),
                details=details,
            )
    for key, stated in sorted(gone.items()):
        ref = SymbolRef.parse(key)
        if (
            lock.symbols.get(key) is None
            or old.index.find_member(
                SymbolRef(ref.module, ref.qualname.rpartition(".")[0]), ref.name
            )
            is None
        ):
            continue
        users = ", ".join(sorted(c.split(":")[-1] for c in gone_by[key]))
        named = ", ".join(f"{i!r} ({c.selects})" for i, c in sorted(stated.items()))
        yield Finding(
            Kind.DRIFT_SELECTION,
            Severity.BLOCK,
            f"{key}#{min(stated)}",
            f"the method of the selection rule(s) {named} is gone in {new.version}: vLLM "
            f"decides another way for {_roles(gone_by[key])} (relied on by {users}): "
            f"{next(iter(stated.values())).if_broken}",
            upstream=old.location(ref),
            old=", ".join(sorted(stated)),
        )


def _roles(classes: Iterable[str]) -> str:
    """The AFD roles of the generated ``classes``, or the classes when they serve no role."""
    named = roles_of(classes)
    return ", ".join(named) if named else ", ".join(sorted(c.split(":")[-1] for c in classes))
