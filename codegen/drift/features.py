"""What a release takes away, in one finding: an upstream module or class that is gone (deleted,
or made unreachable: its module raises as it is imported) and that the overlay mirrors, a
generated class derives from, or the runtime imports. Modules and classes gone together that
build on one another (one imports or derives from the other) are one loss: one DRF080 block
naming every AFD role, class and feature standing on it, the overlay files mirroring it and the
runtime files importing it. The symbol findings it explains (a method of a removed base, a name
only the lost classes' modules import, a lost anchor of their forks) fold under it: still listed
and counted, marked with ``folded_under``, and shown beneath it in the audit's work list.

Sketch (vLLM 0.34.0)::

    block DRF080 vllm.v1.worker.gpu_model_runner: Model Runner V1 is gone: ...
        takes down the FFN role on cpu, ...; the Attention role on cuda on Model Runner V1
        (Model Runner V2 stands: AFDAttentionGPUModelRunnerV2); features: DBO on the V1 runners
    block DRF001 vllm.v1.worker.gpu_model_runner:GPUModelRunner.load_model ... (under it)
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from codegen.drift.renames import relocated
from codegen.drift.roles import role_losses, runner_name, runners_gone
from codegen.drift.sides import Side
from codegen.findings import Finding, Kind, Location, Severity
from codegen.lock import IMPORTS, Lock, SymbolKind, SymbolUse
from codegen.lock_build import describe_symbol
from codegen.model import GENERATED_PREFIX, SymbolRef, package_of
from codegen.overlay import upstream_module_of


@dataclass(frozen=True)
class Loss:
    """Upstream modules and classes gone together, and what of AFD stood on them."""

    #: the modules gone (deleted or unreachable), sorted
    modules: tuple[str, ...]
    #: classes gone from modules that remain, sorted
    classes: tuple[str, ...]
    #: the one the others build on (its module, or the class): the finding's symbol
    root: str
    #: generated classes deriving from what is gone (lock keys), sorted
    generated: tuple[str, ...]

    def holds(self, ref: SymbolRef) -> bool:
        """Whether upstream ``ref`` is part of what is gone."""
        return ref.module in self.modules or any(
            str(ref) == c or str(ref).startswith(c + ".") for c in self.classes
        )


def feature_findings(
    lock: Lock, old: Side, new: Side, package: str, judged: Iterable[str]
) -> list[Finding]:
    """One DRF080 per loss of ``package``'s code that AFD stands on (``judged``: the packages
    whose generated classes are judged against the new release)."""
    judged = set(judged)
    findings = []
    for loss in _losses(lock, old, new, package):
        generated = [c for c in loss.generated if package_of(c) in judged]
        findings.append(_finding(lock, old, new, loss, generated, judged))
    return findings


def fold(
    findings: Sequence[Finding], lock: Lock | None, losses: Sequence[Finding]
) -> list[Finding]:
    """``findings`` with those a feature finding of ``losses`` explains marked as folded under
    it: a symbol of what is gone, a member of a generated class deriving from it, or a name only
    such classes' modules use."""
    units = [(f, _loss_of(f)) for f in losses]
    folded = []
    for finding in findings:
        under = next(
            (
                feature.symbol
                for feature, loss in units
                if finding is not feature and _explains(loss, finding, lock)
            ),
            None,
        )
        folded.append(replace(finding, folded_under=under) if under else finding)
    return folded


# ------------------------------------------------------------------ what is gone


def _losses(lock: Lock, old: Side, new: Side, package: str) -> list[Loss]:
    mirrored = {
        upstream_module_of(Path(c.overlay.rpartition(":")[0])) for c in lock.classes.values()
    }
    bases = {cls for entry in lock.classes.values() for cls in entry.base_mro}
    imported = {
        key for key, entry in lock.symbols.items() if SymbolUse.IMPORTED_BY_RUNTIME in entry.uses
    }
    stood_on = {SymbolRef.parse(k).module for k in bases | imported} | mirrored
    modules = sorted(
        m
        for m in stood_on
        if m.split(".", 1)[0] == package and old.index.module(m) is not None and _gone(new, m)
    )
    classes = sorted(
        key
        for key in bases | imported
        if (ref := SymbolRef.parse(key)).module.split(".", 1)[0] == package
        and ref.module not in modules
        and ref.qualname
        and "." not in ref.qualname
        and lock.symbols[key].kind is SymbolKind.CLASS
        and describe_symbol(new.index, ref).kind is SymbolKind.MISSING
        and relocated(new, ref, lock.symbols[key].description, old) is None
    )
    units = [*modules, *classes]
    groups = _connected(units, old)
    losses = []
    for group in groups:
        gone_modules = tuple(sorted(u for u in group if ":" not in u))
        gone_classes = tuple(sorted(u for u in group if ":" in u))
        probe = Loss(gone_modules, gone_classes, "", ())
        generated = tuple(
            sorted(
                key
                for key, entry in lock.classes.items()
                if any(probe.holds(SymbolRef.parse(c)) for c in entry.base_mro)
            )
        )
        if not generated and not any(probe.holds(SymbolRef.parse(k)) for k in imported):
            continue
        root = max(group, key=lambda u: (_standing(lock, u), -len(u), u))
        losses.append(Loss(gone_modules, gone_classes, root, generated))
    return sorted(losses, key=lambda loss: loss.root)


def _gone(new: Side, module: str) -> bool:
    """Whether ``module`` is deleted in the new release, or raises at its top level as it is
    imported (unreachable)."""
    info = new.index.module(module)
    return info is None or any(isinstance(node, ast.Raise) for node in info.tree.body)


def _connected(units: list[str], old: Side) -> list[list[str]]:
    """Groups of ``units`` (modules, ``module:Class``) that build on one another in the old
    release: one imports the other's module, or derives from its class."""
    parent = {u: u for u in units}

    def find(u: str) -> str:
        while parent[u] != u:
            u = parent[u]
        return u

    def module_of(u: str) -> str:
        return u.partition(":")[0]

    for a in units:
        info = old.index.module(module_of(a))
        if info is None:
            continue
        uses = {m for m, _ in info.imports.values()} | {
            str(base) for cls in info.classes for base in old.index.mro(SymbolRef(info.name, cls))
        }
        for b in units:
            if a != b and (module_of(b) in uses or b in uses):
                parent[find(a)] = find(b)
    groups: dict[str, list[str]] = {}
    for u in units:
        groups.setdefault(find(u), []).append(u)
    return [sorted(g) for g in groups.values()]


def _standing(lock: Lock, unit: str) -> tuple[int, int]:
    """How much of AFD stands on ``unit``: the generated classes with it in their MRO, then
    those deriving from it directly."""
    probe = Loss((unit,), (), "", ()) if ":" not in unit else Loss((), (unit,), "", ())
    mro = sum(
        any(probe.holds(SymbolRef.parse(c)) for c in e.base_mro) for e in lock.classes.values()
    )
    direct = sum(probe.holds(SymbolRef.parse(e.base)) for e in lock.classes.values())
    return mro, direct


# ------------------------------------------------------------------ the finding


def _finding(
    lock: Lock, old: Side, new: Side, loss: Loss, generated: list[str], judged: set[str]
) -> Finding:
    gone = set(generated)
    losses = role_losses(gone, judged)
    runners = runners_gone(losses)
    headline = (
        f"{' and '.join(runner_name(r) for r in runners)} is gone in {new.version}: "
        if runners
        else f"gone in {new.version}: "
    )
    what = [*loss.modules, *loss.classes]
    others_gone = [u.rpartition(".")[2] if ":" not in u else u for u in what if u != loss.root]
    headline += (
        f"{loss.root}"
        + (f" and what is built with it ({', '.join(others_gone)})" if others_gone else "")
        + " are removed"
    )
    down = [loss.describe() for loss in losses if loss.down]
    partly = [loss.describe() for loss in losses if not loss.down]
    features = sorted(
        {
            f"{lock.classes[c].feature} ({c.rpartition(':')[2]})"
            for c in gone
            if lock.classes[c].feature
        }
    )
    roles = {c for loss in losses for c in (loss.row.generated, *loss.row.runners.values())}
    others = sorted(
        c.rpartition(":")[2] for c in gone if c not in roles and not lock.classes[c].feature
    )
    parts = []
    if down:
        parts.append("takes down " + ", ".join(down))
    parts.extend(partly)
    if features:
        parts.append("features: " + "; ".join(features))
    if others:
        parts.append("other classes: " + ", ".join(others))
    mirrors = sorted(
        {
            c.overlay.rpartition(":")[0]
            for c in lock.classes.values()
            if upstream_module_of(Path(c.overlay.rpartition(":")[0])) in loss.modules
        }
    )
    runtime = sorted(
        {
            user
            for key, entry in lock.symbols.items()
            if SymbolUse.IMPORTED_BY_RUNTIME in entry.uses and loss.holds(SymbolRef.parse(key))
            for user in entry.used_by
            if not user.startswith(GENERATED_PREFIX)
        }
    )
    details = [
        *(f"gone: {unit}" for unit in what),
        *(f"AFD class standing on it: {c}" for c in generated),
        *(f"overlay file mirroring it: {m}" for m in mirrors),
        *(f"runtime file importing it: {r}" for r in runtime),
    ]
    fix = (
        "; rebase the roles on what remains (or limit these classes with when=) before "
        "anything else in this report"
    )
    first = lock.classes[generated[0]].overlay if generated else None
    ours = None
    if first is not None:
        path, _, line = first.rpartition(":")
        ours = Location(path, int(line))
    root = SymbolRef.parse(loss.root if ":" in loss.root else loss.root + ":")
    return Finding(
        Kind.DRIFT_FEATURE_REMOVED,
        Severity.BLOCK,
        loss.root,
        headline + (": " + "; ".join(parts) if parts else "") + fix,
        ours=ours,
        upstream=old.location(root),
        old=", ".join(what),
        details=tuple(details),
    )


def _loss_of(finding: Finding) -> Loss:
    """The loss a DRF080 finding reports, back from its details."""
    gone = [d.removeprefix("gone: ") for d in finding.details if d.startswith("gone: ")]
    generated = tuple(
        d.removeprefix("AFD class standing on it: ")
        for d in finding.details
        if d.startswith("AFD class standing on it: ")
    )
    return Loss(
        tuple(u for u in gone if ":" not in u),
        tuple(u for u in gone if ":" in u),
        finding.symbol,
        generated,
    )


def _explains(loss: Loss, finding: Finding, lock: Lock | None) -> bool:
    """Whether ``finding`` follows from ``loss`` (``lock``: the old release's, None when unknown)."""
    symbol = finding.symbol.partition("#")[0]
    if symbol in loss.modules or any(
        symbol == c or symbol.startswith(c + ".") for c in loss.generated
    ):
        return True
    if lock is None or symbol not in lock.symbols:
        return False
    if loss.holds(SymbolRef.parse(symbol)):
        return True
    users = lock.symbols[symbol].used_by
    lost_modules = {
        module
        for module in {c.partition(":")[0] for c in lock.classes}
        if all(c in loss.generated for c in lock.classes if c.partition(":")[0] == module)
    }
    entry = lock.symbols[symbol]
    return (
        bool(users)
        and not entry.uses - IMPORTS - {SymbolUse.INHERITED}
        and all(
            any(u == c or u.startswith(c + ".") for c in loss.generated)
            or u.partition(":")[0] in lost_modules
            for u in users
        )
    )
