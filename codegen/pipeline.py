"""Wire the stages: locate upstream -> index -> build -> emit -> lock; and write the result atomically.

Every generation also compares the upstream files it read with the lock's hashes at the same
version (UPS002): a file that differs is compared symbol by symbol with the pristine pinned
release, with drift's classification. That is why generation (``regenerate`` too) imports the
drift engine (:mod:`codegen.drift.compare`), though not its use cases: a blocking difference
means nothing is written.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from afd_models.generated_registry import GENERATED_ROOT, REGISTRY_PATH, registry_data
from codegen.call_sites import GeneratedBase
from codegen.digest import inputs_digest
from codegen.drift.compare import compare
from codegen.drift.sides import Side
from codegen.emit import package_files, render_module, render_registry
from codegen.findings import Finding, Kind, Location, Severity
from codegen.generate import (
    PINS_PATH,
    Generation,
    build,
    lock_path,
    overlay_hashes,
    upstream_files,
)
from codegen.index import UpstreamIndex, sha256_text
from codegen.lock import Lock, LockFormatError, read_lock, render_lock
from codegen.lock_build import build_lock, sha256_of
from codegen.model import OverlayClass, OverlayModule, SymbolRef
from codegen.overlay import OverlayError, committed_edits
from codegen.places import Places
from codegen.releases import applies, parse_range
from codegen.runtime_uses import runtime_uses
from codegen.sources import Pin, SourceError, UpstreamSource, load_pins, locate


@dataclass(frozen=True)
class Context:
    """Where the repository is and which upstream sources to read."""

    repo_root: Path
    pins: dict[str, Pin]
    sources: dict[str, UpstreamSource]

    @property
    def versions(self) -> dict[str, str]:
        return {package: source.version for package, source in self.sources.items()}

    @property
    def lock_path(self) -> Path:
        """This release's lock, relative to the repository (:func:`codegen.generate.lock_path`)."""
        return lock_path({p: pin.version for p, pin in self.pins.items()}, self.versions)


def open_context(
    repo_root: Path,
    *,
    upstream_root: Path | None = None,
    use_installed: bool = True,
    version: str | None = None,
    quiet: bool = False,
) -> Context:
    """Read the pins and locate each pinned package's source (``upstream_root`` replaces vllm's)."""
    pins = load_pins(repo_root / PINS_PATH)
    sources = {}
    for package, pin in pins.items():
        root = upstream_root if package == "vllm" else None
        wanted = version if package == "vllm" else None
        sources[package] = locate(
            pin, wanted, upstream_root=root, use_installed=use_installed, quiet=quiet
        )
    return Context(repo_root, pins, sources)


def generate(context: Context) -> tuple[Generation, UpstreamIndex]:
    """Build, render and lock in memory. Text and lock are empty when a finding blocks."""
    index = UpstreamIndex(context.sources)
    generation = build(context.repo_root, index)
    generation.findings.extend(dead_alternatives(generation, context.pins))
    if generation.blocked:
        return generation, index
    versions = context.versions
    upstream = upstream_files(index)
    flat = {path: sha for files in upstream.values() for path, sha in files.items()}
    modules = {
        overlay.generated_path.as_posix(): render_module(overlay, generation, versions, flat)
        for overlay in generation.overlays
        if overlay.generated_module in generation.namespaces
    }
    files = {**package_files(modules), **modules}
    digest = inputs_digest(
        context.repo_root, overlay_hashes(context.repo_root), upstream, generation.runtime
    )
    generation.lock_path = context.lock_path
    supported = {package: pin.supported for package, pin in context.pins.items()}
    files[REGISTRY_PATH.as_posix()] = render_registry(
        generation, versions, supported, digest, sha256_of(files.items())
    )
    generation.files = dict(sorted(files.items()))
    generation.lock = build_lock(
        generation, index, versions, upstream, sha256_of(generation.files.items())
    )
    generation.findings.extend(pinned_hash_findings(context, index))
    return generation, index


def dead_alternatives(generation: Generation, pins: dict[str, Pin]) -> list[Finding]:
    """Members, edits, deltas and contracts whose ``when=`` holds no supported release of its
    package (all but edits: or names a package that is not pinned): declarations nothing
    generates or checks; and members of one name that one supported release would get twice."""
    findings = []
    for overlay in generation.overlays:
        for overlay_class in overlay.classes:
            if overlay_class.when is not None and (
                problem := _dead_range(overlay_class.when, "class", pins)
            ):
                findings.append(
                    Finding(
                        Kind.OVERLAY_INVALID,
                        Severity.BLOCK,
                        f"{overlay.generated_module}:{overlay_class.name}",
                        f"when={overlay_class.when!r} {problem}",
                        Location(str(overlay.path), overlay_class.line),
                    )
                )
            findings.extend(_overlapping_members(overlay, overlay_class, pins))
            contracts = [
                (f"relies_on[{relied!r}]#{c.id}", c.when)
                for relied, declared in overlay_class.relies_on.items()
                for c in declared
            ]
            for label, when in contracts:
                if when is not None and (
                    problem := _dead_range(when, "contract", pins, overlay_class)
                ):
                    findings.append(
                        Finding(
                            Kind.OVERLAY_INVALID,
                            Severity.BLOCK,
                            f"{overlay.generated_module}:{overlay_class.name}.{label}",
                            f"when={when!r} {problem}",
                            Location(str(overlay.path), overlay_class.line),
                        )
                    )
            for member in overlay_class.members:
                limited = [("", "member", member.when)]
                limited += [(f"#{e.id}", "edit", e.when) for e in member.edits]
                limited += [
                    (f"#delta:{d.kind.value}:{d.param}", "delta", d.when) for d in member.deltas
                ]
                for label, what, when in limited:
                    if when is None or not (
                        problem := _dead_range(when, what, pins, overlay_class)
                    ):
                        continue
                    findings.append(
                        Finding(
                            Kind.OVERLAY_INVALID,
                            Severity.BLOCK,
                            f"{overlay.generated_module}:{overlay_class.name}.{member.name}{label}",
                            f"when={when!r} {problem}",
                            Location(str(overlay.path), member.line),
                        )
                    )
    return findings


def _dead_range(
    when: str, what: str, pins: dict[str, Pin], owner: OverlayClass | None = None
) -> str | None:
    """What is wrong with ``when`` on a ``what`` (class, member, edit, delta, contract): it names no
    pinned package (an edit's is refused where edits are applied) or holds none of the supported
    releases its class ``owner`` is generated for; None if nothing."""
    limit = parse_range(when)
    pin = pins.get(limit.package)
    if pin is None:
        if what == "edit":
            return None  # refused where the edits are applied (generate._fork)
        return f"names no pinned package; allowed: {', '.join(sorted(pins))}"
    releases = [v for v in pin.supported if owner is None or _class_holds(owner, pin.package, v)]
    if not any(limit.contains(v) for v in releases):
        where = (
            "the supported releases"
            if len(releases) == len(pin.supported)
            else "the releases its class is generated for"
        )
        return f"holds none of {where} ({', '.join(releases)}); drop the {what} or the range"
    return None


def _class_holds(overlay_class: OverlayClass, package: str, release: str) -> bool:
    """Whether ``overlay_class`` is generated for ``package`` at ``release`` (a class limited by
    another package's range is not limited here)."""
    if overlay_class.when is None:
        return True
    limit = parse_range(overlay_class.when)
    return limit.package != package or limit.contains(release)


def _overlapping_members(
    overlay: OverlayModule, overlay_class: OverlayClass, pins: dict[str, Pin]
) -> list[Finding]:
    """Members of one name whose ``when=`` ranges share a supported release."""
    findings = []
    names = {m.name for m in overlay_class.members}
    for name in sorted(names):
        alternatives = [m for m in overlay_class.members if m.name == name]
        if len(alternatives) < 2:
            continue
        for pin in pins.values():
            for release in pin.supported:
                if not _class_holds(overlay_class, pin.package, release):
                    continue
                got = [m for m in alternatives if applies(m, {pin.package: release})]
                if len(got) > 1:
                    findings.append(
                        Finding(
                            Kind.OVERLAY_INVALID,
                            Severity.BLOCK,
                            f"{overlay.generated_module}:{overlay_class.name}.{name}",
                            f"{len(got)} declarations of {name!r} apply to {pin.package} "
                            f"{release} (lines {', '.join(str(m.line) for m in got)}); their "
                            "when= ranges must not overlap",
                            Location(str(overlay.path), got[1].line),
                        )
                    )
    return findings


def pinned_hash_findings(context: Context, index: UpstreamIndex) -> list[Finding]:
    """Upstream files that differ from the lock at the *same* version (UPS002), and what changed.

    A local patch or a post-release is compared with the pristine pinned release from the download
    cache, symbol by symbol, with drift's classification: each recorded symbol of a differing file
    that changed is a DRF finding. ``index`` indexes ``context.sources``.
    """
    try:
        lock = read_lock(context.repo_root / context.lock_path)
    except LockFormatError:  # regeneration rewrites it; `codegen check` reports it (LCK002)
        return []
    if lock is None:
        return []
    findings: list[Finding] = []
    for package, entry in lock.upstream.items():
        source = context.sources.get(package)
        if source is None or source.version != entry.version:
            continue
        changed = {
            path: (sha, now)
            for path, sha in entry.files.items()
            if (now := _file_sha(source.root / path)) is not None and now != sha
        }
        if changed:
            findings.extend(_changed_files(context, index, lock, package, changed))
    return findings


def _file_sha(path: Path) -> str | None:
    """sha256 of a source file as the index (and so the lock) computes it; None if absent."""
    return sha256_text(path.read_text(encoding="utf-8")) if path.exists() else None


def _changed_files(
    context: Context,
    index: UpstreamIndex,
    lock: Lock,
    package: str,
    changed: dict[str, tuple[str, str]],
) -> list[Finding]:
    """One UPS002 per changed file, naming how many recorded symbols changed, and their findings."""
    source = context.sources[package]
    try:
        pinned = locate(context.pins[package], source.version, use_installed=False, quiet=True)
    except SourceError as exc:
        note = f"the pinned release is not available to compare symbols with ({exc})"
        return [_hash_finding(source, path, shas, note) for path, shas in sorted(changed.items())]
    old = Side(
        f"{source.version} (pinned release)", UpstreamIndex({**context.sources, package: pinned})
    )
    new = Side(f"{source.version} (checked tree)", index)
    try:
        edits = committed_edits(context.repo_root, context.versions)
    except OverlayError:  # reported as OVL001; compare() then reports each fork as DRF060
        edits = {}
    prefix = f"the checked tree vs the pinned release {source.version}: "
    places = Places(context.repo_root)
    findings = []
    for path, shas in sorted(changed.items()):
        if _file_sha(pinned.root / path) != shas[0]:
            note = f"the pinned release found ({pinned.origin}) does not match the lock either"
            findings.append(_hash_finding(source, path, shas, note))
            continue
        drift = [
            replace(f, message=prefix + f.message)
            for f in compare(lock, edits, old, new, places, files={path})
        ]
        if drift:
            codes = ", ".join(sorted({f.code for f in drift}))
            note = f"{len({f.symbol for f in drift})} recorded symbol(s) changed: see the {codes} findings"
        else:
            note = "no recorded symbol changed (only code AFD does not use)"
        findings.append(_hash_finding(source, path, shas, note))
        findings.extend(drift)
    return findings


def _hash_finding(source: UpstreamSource, path: str, shas: tuple[str, str], note: str) -> Finding:
    pinned, now = shas
    return Finding(
        Kind.UPSTREAM_HASH,
        Severity.BLOCK,
        path,
        f"{source.package} {source.version} file differs from the pinned hash ({source.origin}); "
        f"is this really the pinned release? {note}",
        upstream=Location(path),
        old=pinned,
        new=now,
    )


# --------------------------------------------------------------------------- writing


def write_output(repo_root: Path, generation: Generation) -> None:
    """Replace ``afd_models/_generated`` and the lock; a failure leaves the previous output in place.

    Files are written into a staging directory first, then swapped in with two renames.
    """
    target = repo_root / GENERATED_ROOT
    parent = target.parent
    staging = Path(tempfile.mkdtemp(dir=parent, prefix=".generated-new-"))
    try:
        for path, text in generation.files.items():
            out = staging / Path(path).relative_to(GENERATED_ROOT)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
        retired = parent / f".generated-old-{os.getpid()}"
        if target.exists():
            target.rename(retired)
        staging.rename(target)
        shutil.rmtree(retired, ignore_errors=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    write_lock(repo_root, generation)


def write_lock(repo_root: Path, generation: Generation) -> None:
    """Write only the generation's lock (a supported release other than the one on disk)."""
    (repo_root / generation.lock_path).parent.mkdir(parents=True, exist_ok=True)
    assert generation.lock is not None, "a blocked generation has no lock to write"
    _write_atomic(repo_root / generation.lock_path, render_lock(generation.lock))


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# --------------------------------------------------------------------------- fast path


def up_to_date(context: Context) -> bool:
    """True when nothing the output depends on changed since the last regeneration.

    Hashes the generator, pins, overlays and the upstream files the lock lists, and the generated
    files themselves; then reads what the lock would record of the runtime (its upstream imports,
    call sites and reads: a second or so) and hashes that, never the runtime's bytes.
    """
    registry = registry_data(context.repo_root)
    try:
        lock = read_lock(context.repo_root / context.lock_path)
    except LockFormatError:  # a lock of another format is stale
        return False
    if registry is None or lock is None or lock.upstream.keys() != context.sources.keys():
        return False
    upstream: dict[str, dict[str, str]] = {}
    for package, entry in lock.upstream.items():
        source = context.sources[package]
        if entry.version != source.version:
            return False
        files = {}
        for path in entry.files:
            # hashed as the index read it (a CRLF file, as vllm-ascend ships, hashes as LF)
            sha = _file_sha(source.root / path)
            if sha is None:
                return False
            files[path] = sha
        upstream[package] = files
    for path, sha in lock.generated.items():
        file = context.repo_root / path
        if not file.exists() or hashlib.sha256(file.read_bytes()).hexdigest() != sha:
            return False
    generated = {
        SymbolRef.parse(key): GeneratedBase(
            SymbolRef.parse(entry.base), frozenset(entry.members), entry.declared
        )
        for key, entry in lock.classes.items()
    }
    runtime = runtime_uses(context.repo_root, UpstreamIndex(context.sources), generated)
    digest = inputs_digest(context.repo_root, overlay_hashes(context.repo_root), upstream, runtime)
    return digest == registry.get("INPUTS_DIGEST")
