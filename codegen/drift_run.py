"""``python -m codegen drift``: compare every symbol the overlay and runtime use between two
versions of one pinned upstream package (the other pinned packages stay at their pins).

    python -m codegen drift --to 0.28.0 [--package vllm|vllm_ascend] [--from 0.26.0]
                            [--from-root DIR] [--to-root DIR] [--format md|json|sarif] [--out FILE]

Without ``--from``, vLLM's old version is the newest supported release below the target (the
overlay already handles each supported one; comparing with an older one reports again what it
absorbed), else the primary; vLLM-Ascend's is its pin. The old version's lock is the committed one
when it is up to date, else a regeneration in memory. Nothing in the overlay or the lock is
touched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from afd_models.release_order import release_key
from codegen.drift.compare import compare
from codegen.drift.contracts import ContractKey
from codegen.drift.features import feature_findings, fold
from codegen.drift.model_registry import native_architectures, registry_findings
from codegen.drift.ours import locate_ours
from codegen.drift.sides import Side
from codegen.drift.symbols import OverlayMembers
from codegen.findings import Finding, Kind, Location, Severity
from codegen.generate import PINS_PATH
from codegen.index import UpstreamIndex
from codegen.lock import Lock, read_lock
from codegen.markers import Delta
from codegen.model import GENERATED_PREFIX, MemberKind, OverlayClass, Signature, package_of
from codegen.names import global_names
from codegen.overlay import committed_edits, declared_members
from codegen.pipeline import Context, generate, open_context, up_to_date
from codegen.places import Places
from codegen.releases import applies
from codegen.report import as_markdown
from codegen.sources import Pin, load_pins, locate, paired

#: findings on the model registry, whose symbols are architectures, not modules
REGISTRY_KINDS = frozenset({Kind.DRIFT_REGISTRY, Kind.DRIFT_PLATFORM_PICK})
#: how reports name each pinned package
DISPLAY_NAMES = {"vllm": "vLLM", "vllm_ascend": "vLLM-Ascend"}


class UnknownPackage(ValueError):
    """``--package`` names no package of ``overlay/pins.toml``: a usage error (exit 3)."""


@dataclass
class DriftRun:
    """One drift comparison and what it cost."""

    old_version: str
    new_version: str
    package: str
    findings: list[Finding]
    old_index: UpstreamIndex
    new_index: UpstreamIndex
    seconds: float
    origins: dict[str, str]
    #: what ``--from`` defaults to for this package and target (:func:`default_base`)
    default_from: str
    #: why ``old_version`` is the base, for the report
    base_reason: str
    #: the old release's lock the findings come from (None: its generation was blocked)
    lock: Lock | None = None
    #: the pinned packages judged against the new release (:func:`codegen.sources.paired`)
    judged: frozenset[str] = frozenset()
    #: the pinned packages not judged there (made for other releases)
    unjudged: frozenset[str] = frozenset()

    def header(self) -> dict[str, Any]:
        return {
            "package": self.package,
            "from": self.old_version,
            "to": self.new_version,
            "from_reason": self.base_reason,
            "seconds": round(self.seconds, 2),
            "sources": self.origins,
        }


def run_drift(
    repo_root: Path,
    to_version: str,
    *,
    package: str = "vllm",
    from_version: str | None = None,
    from_root: Path | None = None,
    to_root: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> DriftRun:
    started = time.monotonic()
    pins = load_pins(repo_root / PINS_PATH)
    if package not in pins:
        raise UnknownPackage(
            f"--package {package!r} is not pinned in {PINS_PATH}; allowed: {', '.join(pins)}"
        )
    pinned = open_context(repo_root, quiet=True)
    if package == "vllm":
        default_from, reason = default_base(pins[package], to_version)
    else:  # vLLM-Ascend supports one release: its pin
        default_from, reason = pins[package].version, "the pinned release (overlay/pins.toml)"
    if from_version is not None:
        reason = "given by --from"

    def side(version: str, root: Path | None) -> Context:
        """The pinned sources with ``package`` at ``version`` (or read from ``root``)."""
        if version == pins[package].version and root is None:
            return pinned
        source = locate(pins[package], version, upstream_root=root, quiet=True)
        return replace(pinned, sources={**pinned.sources, package: source})

    old_context = side(from_version or default_from, from_root)
    new_context = side(to_version, to_root)
    old_version, new_version = old_context.versions[package], new_context.versions[package]
    progress(f"base {package} {old_version}: {reason}")
    progress(
        f"comparing {package} {old_version} ({old_context.sources[package].origin}) with {new_version} ({new_context.sources[package].origin})"
    )
    old_index, new_index = UpstreamIndex(old_context.sources), UpstreamIndex(new_context.sources)
    lock = read_lock(repo_root / old_context.lock_path) if up_to_date(old_context) else None
    findings: list[Finding] = []
    pairing = paired(pins, new_context.versions)
    judged = {p for p, ok in pairing.items() if ok}
    unjudged = set(pairing) - judged
    if (
        lock is not None
    ):  # the committed lock describes exactly this old version: no need to regenerate it
        edits = committed_edits(repo_root, old_context.versions)
    else:
        generation, old_index = generate(old_context)
        findings.extend(generation.findings)
        lock = generation.lock if not generation.blocked else None
        edits = {
            (f"{c.module}:{c.name}", m.decl.name): m.decl.edits
            for c in generation.classes
            for m in c.members
            if m.decl.edits
        }
    if lock is not None:
        old, new = Side(old_version, old_index), Side(new_version, new_index)
        places = Places(repo_root)
        findings.extend(
            compare(
                lock,
                edits,
                old,
                new,
                places,
                own=own_names(repo_root),
                members=overlay_members(repo_root, new_context.versions),
            )
        )
        findings.extend(registry_findings(native_architectures(repo_root), old, new))
        findings = [f for f in findings if judged_finding(f, lock, unjudged)] + unpaired_findings(
            repo_root,
            pins,
            new_context.versions,
            [f for f in findings if not judged_finding(f, lock, unjudged)],
        )
        losses = feature_findings(lock, old, new, package, judged)
        findings = losses + fold(findings, lock, losses)
        findings = locate_ours(findings, places, lock, old_context.lock_path, old)
    origins = {
        "from": old_context.sources[package].origin,
        "to": new_context.sources[package].origin,
    }
    return DriftRun(
        old_version,
        new_version,
        package,
        findings,
        old_index,
        new_index,
        time.monotonic() - started,
        origins,
        default_from,
        reason,
        lock,
        frozenset(judged),
        frozenset(unjudged),
    )


def judged_finding(finding: Finding, lock: Lock | None, unjudged: Collection[str]) -> bool:
    """Whether ``finding`` is judged against the new release: it is left out only when it is
    about a pinned package not judged there (``unjudged``), by its symbol's package (a generated
    class's, the upstream one it was generated from) or, for an upstream symbol that only
    generated classes use, by theirs all being unjudged. Everything else is judged, a finding on
    vLLM's model registry (an architecture AFD registers: its symbol names no module) among it,
    so that no finding is dropped without being listed."""

    symbol = finding.symbol.partition("#")[0]
    if finding.kind in REGISTRY_KINDS:
        return True
    if package_of(symbol) in unjudged:
        return False
    entry = lock.symbols.get(symbol) if lock is not None else None
    users = entry.used_by if entry is not None else ()
    generated = [u for u in users if u.startswith(GENERATED_PREFIX)]
    only_generated = bool(users) and len(generated) == len(users)
    return not (only_generated and all(package_of(u) in unjudged for u in users))


def unpaired_findings(
    repo_root: Path, pins: Mapping[str, Pin], versions: Mapping[str, str], left_out: list[Finding]
) -> list[Finding]:
    """One info per pinned package not judged against ``versions`` (its ``made_for`` names
    other releases), listing the findings ``left_out`` (those about unjudged packages)."""
    found = []
    pins_text = (repo_root / PINS_PATH).read_text()
    for package, ok in paired(pins, versions).items():
        if ok:
            continue
        made_for = ", ".join(
            f"{DISPLAY_NAMES.get(p, p)} {v}" for p, v in sorted(pins[package].made_for.items())
        )
        against = ", ".join(
            f"{DISPLAY_NAMES.get(p, p)} {versions[p]}" for p in sorted(pins[package].made_for)
        )
        found.append(
            Finding(
                Kind.DRIFT_UNPAIRED,
                Severity.INFO,
                package,
                f"{DISPLAY_NAMES.get(package, package)} {versions[package]} is made for "
                f"{made_for} ({PINS_PATH}); no release of it pairs with {against}, so the "
                f"{len(left_out)} finding(s) about its classes, and the upstream code only they "
                "use, are not judged (listed below)",
                ours=Location(PINS_PATH.as_posix(), _line_of(pins_text, "made_for")),
                details=tuple(f"{f.severity.value} {f.code} {f.symbol}" for f in left_out),
            )
        )
    return found


def _line_of(text: str, key: str) -> int:
    """The first line of ``text`` that sets ``key``."""
    return next((n for n, line in enumerate(text.splitlines(), 1) if line.startswith(key)), 0)


def default_base(pin: Pin, to_version: str) -> tuple[str, str]:
    """vLLM's ``--from`` when it is not given, and why: the newest supported release below
    ``to_version`` (one that is supported itself compares with the one before it), else the
    primary."""
    try:
        target = release_key(to_version)
    except ValueError:  # a tree whose version names no release ("dev"): nothing to order it by
        return pin.version, f"the primary release; {to_version} is not a release number"
    below = [v for v in pin.supported if release_key(v) < target]
    if not below:
        return pin.version, f"the primary release; no supported release is older than {to_version}"
    base = max(below, key=release_key)
    if to_version in pin.supported:
        return base, f"the supported release before {to_version} (overlay/pins.toml)"
    return base, f"the newest supported release below {to_version} (overlay/pins.toml)"


def overlay_members(repo_root: Path, versions: Mapping[str, str]) -> OverlayMembers:
    """What the overlay declares, for upstream at ``versions``: the signatures of the forks and
    overrides that release gets (with every release's deltas for each base), the generated
    members of every release, keyed as the lock's ``used_by``, and the contracts whose ``when=``
    excludes that release."""
    signatures: dict[str, tuple[Signature, tuple[Delta, ...]]] = {}
    every: set[str] = set()
    here: set[str] = set()
    owners: dict[str, OverlayClass] = {}
    for member in declared_members(repo_root):  # one read of the overlay, every release's
        owners[member.class_key] = member.owner
        key = f"{member.class_key}.{member.decl.name}"
        every.add(key)
        if not member.applies(versions):
            continue
        here.add(key)
        if member.decl.signature is not None:
            deltas = tuple(d for d in member.decl.deltas if d.applies_to(str(member.base)))
            signatures[key] = (member.decl.signature, deltas)
    return OverlayMembers(
        signatures,
        frozenset(every),
        frozenset(every - here),
        frozenset(
            ContractKey(class_key, name, contract.id)
            for class_key, owner in owners.items()
            for name, contracts in owner.relies_on.items()
            for contract in contracts
            if not applies(contract, versions)
        ),
    )


def own_names(repo_root: Path) -> frozenset[str]:
    """The global names the overlay's own members (overrides, extends, attributes) use: the same
    code on every release."""
    names: set[str] = set()
    for member in declared_members(repo_root):
        if member.decl.kind is not MemberKind.FORK:
            names |= global_names(member.decl.node)
    return frozenset(names)


def drift_markdown(run: DriftRun) -> str:
    name = DISPLAY_NAMES.get(run.package, run.package)
    command = "python -m codegen drift"
    if run.package != "vllm":
        command += f" --package {run.package}"
    if run.package != "vllm" or run.old_version != run.default_from:
        command += f" --from {run.old_version}"
    intro = [
        f"Upstream {name} {run.old_version} -> {run.new_version}: every symbol in the lock (bases and MRO, overridden,",
        "forked and inherited methods, anchors, names the overlay and runtime import, registry keys, config fields).",
        f"Generated by `{command} --to {run.new_version}` in {run.seconds:.1f} s.",
        f"Base {run.old_version}: {run.base_reason}.",
        f"Sources: {run.old_version} from the {run.origins['from']}; {run.new_version} from the "
        f"{run.origins['to']}.",
    ]
    return as_markdown(run.findings, f"Drift: {name} {run.old_version} -> {run.new_version}", intro)
