"""The generator: overlay declarations + pinned upstream source -> generated subclasses, lock, findings.

``build`` works in memory and never writes; :mod:`codegen.pipeline` writes the result atomically.
One failing class does not stop the others: every problem becomes a finding, and any blocking
finding means the caller writes nothing.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import libcst as cst

from codegen.call_sites import GeneratedBase, SiteUse
from codegen.contracts import evaluate
from codegen.edit import EditError, RelativeImportRewriter, SuperRewriter
from codegen.findings import Finding, Kind, Location, Severity
from codegen.fork import FailedFork, ForkStage, apply_fork
from codegen.index import Member, UpstreamIndex
from codegen.lock import Lock
from codegen.markers import Contract, Edit
from codegen.model import (
    ContractMatch,
    GeneratedClass,
    GeneratedMember,
    MemberDecl,
    MemberKind,
    OverlayClass,
    OverlayModule,
    SymbolRef,
)
from codegen.names import ModuleNamespace, global_names
from codegen.overlay import OverlayError, load_overlay, overlay_files
from codegen.overlay_sites import overlay_sites
from codegen.pattern import PatternError
from codegen.releases import applicable, parse_range
from codegen.runtime_uses import RuntimeUses, runtime_findings, runtime_uses
from codegen.signatures import check_signature

LOCK_PATH = Path("overlay/overlay.lock")
#: the locks of supported releases other than the primary pins
RELEASE_LOCKS = Path("overlay/locks")
PINS_PATH = Path("overlay/pins.toml")


def lock_path(primary: Mapping[str, str], versions: Mapping[str, str]) -> Path:
    """The lock of upstream at ``versions``: ``overlay/overlay.lock`` for the primary pins
    (``primary``: package -> pinned version), else one per release under ``overlay/locks/``."""
    others = [f"{p}-{v}" for p, v in sorted(versions.items()) if primary.get(p, v) != v]
    return RELEASE_LOCKS / ("_".join(others) + ".lock") if others else LOCK_PATH


@dataclass
class Generation:
    """Everything one generation produced, in memory."""

    overlays: list[OverlayModule] = field(default_factory=list)
    classes: list[GeneratedClass] = field(default_factory=list)
    #: one namespace per generated module
    namespaces: dict[str, ModuleNamespace] = field(default_factory=dict)
    #: repo-relative path -> file content (filled by codegen.emit)
    files: dict[str, str] = field(default_factory=dict)
    #: the lock (filled by :func:`codegen.lock_build.build_lock`; None when generation blocked)
    lock: Lock | None = None
    findings: list[Finding] = field(default_factory=list)
    #: where the overlay's hand-written code (members, fork edits) calls or reads upstream
    sites: list[SiteUse] = field(default_factory=list)
    #: the hand-written runtime's uses of upstream
    runtime: RuntimeUses = field(default_factory=lambda: RuntimeUses({}, (), ()))
    #: where this generation's lock lives (:func:`lock_path`)
    lock_path: Path = LOCK_PATH

    @property
    def blocked(self) -> bool:
        return any(f.severity is Severity.BLOCK for f in self.findings)


def build(repo_root: Path, index: UpstreamIndex) -> Generation:
    """Load overlays and build every generated class (no text yet)."""
    result = Generation()
    for path in overlay_files(repo_root):
        try:
            overlay = load_overlay(repo_root, path)
        except OverlayError as exc:
            for problem in exc.problems:
                result.findings.append(
                    Finding(
                        Kind.OVERLAY_INVALID,
                        Severity.BLOCK,
                        str(problem.path),
                        problem.message,
                        Location(str(problem.path), problem.line),
                    )
                )
            continue
        result.overlays.append(overlay)
        classes = applicable(overlay.classes, index.versions)
        if not classes:
            continue  # every class is limited to other releases: no module for this one
        if index.module(overlay.upstream_module) is None:
            result.findings.append(
                Finding(
                    Kind.OVERLAY_INVALID,
                    Severity.BLOCK,
                    overlay.upstream_module,
                    f"{path} mirrors {overlay.upstream_module}, which the pinned upstream does not have",
                    Location(str(path), 1),
                )
            )
            continue
        namespace = ModuleNamespace(overlay.generated_module, index, dict(overlay.imported))
        namespace.generated = {c.generated_name(b) for c in classes for b in c.bases}
        result.namespaces[overlay.generated_module] = namespace
        for overlay_class in classes:
            for base in overlay_class.bases:
                built = _build_class(
                    index, overlay, overlay_class, base, namespace, result.findings
                )
                if built is not None:
                    result.classes.append(built)
        result.findings.extend(namespace.findings)
    result.findings = list(
        dict.fromkeys(result.findings)
    )  # one finding per problem, even with several bases
    result.sites = overlay_sites(repo_root, index, result.classes, result.namespaces)
    generated = {
        c.ref: GeneratedBase(c.base, frozenset(m.decl.name for m in c.members), c.overlay.name)
        for c in result.classes
    }
    result.runtime = runtime_uses(repo_root, index, generated)
    result.findings.extend(runtime_findings(result.runtime, index))
    return result


def _build_class(
    index: UpstreamIndex,
    overlay: OverlayModule,
    overlay_class: OverlayClass,
    base: SymbolRef,
    namespace: ModuleNamespace,
    findings: list[Finding],
) -> GeneratedClass | None:
    name = overlay_class.generated_name(base)
    where = Location(str(overlay.path), overlay_class.line)
    resolved = index.resolve(base.module, base.qualname) if index.owns(base.module) else None
    if resolved is None or not index.is_indexed_class(resolved):
        findings.append(
            Finding(
                Kind.BASE_UNKNOWN,
                Severity.BLOCK,
                str(base),
                f"{overlay_class.name} names base {base}, which is not an upstream class",
                where,
            )
        )
        return None
    base = resolved
    namespace.require_class(base, f"{overlay.generated_module}:{name}", where)
    for decorator in overlay_class.decorators:
        for used in global_names(decorator.decorator):
            namespace.require_ours(used, f"{overlay.generated_module}:{name}", where)
    names = (
        {b.qualname for b in overlay_class.bases}
        | {str(b) for b in overlay_class.bases}
        | {base.qualname, str(base)}
    )
    # the members this release gets (a member's when=, as an edit's)
    current = applicable(overlay_class.members, index.versions)
    for decl in current:
        for delta in decl.deltas:
            if delta.base is not None and delta.base not in names:
                findings.append(
                    Finding(
                        Kind.OVERLAY_INVALID,
                        Severity.BLOCK,
                        f"{overlay.generated_module}:{name}.{decl.name}",
                        f"delta for base {delta.base!r}, which is not a base of {overlay_class.name}",
                        Location(str(overlay.path), decl.line),
                    )
                )
    members: list[GeneratedMember] = []
    visible = index.all_members(base)
    for decl in current:
        member = _build_member(index, overlay, name, base, decl, visible, namespace, findings)
        if member is not None:
            members.append(member)
    declared = {d.name for d in current}
    inherited = {n: m.ref for n, m in sorted(visible.items()) if m.is_method and n not in declared}
    # an override that calls super() still runs upstream's body: AFD may rely on it too
    extended = {
        m.decl.name
        for m in members
        if m.decl.kind is MemberKind.OVERRIDE and calls_super(m.decl.node, m.decl.name)
    }
    contracts = {}
    for relied, all_contracts in overlay_class.relies_on.items():
        declared_contracts = tuple(
            c for c in applicable(all_contracts, index.versions) if c.applies_to(str(base))
        )
        if not declared_contracts:
            continue  # every contract is for other releases, or other bases
        symbol = f"{overlay.generated_module}:{name}.{relied}"
        if ":" in relied:  # a method outside the class's MRO
            target = index.outside_method(relied)
            missing = "is not a method upstream defines in that class's own body (name the class that defines it)"
        else:
            target = visible[relied] if relied in inherited or relied in extended else None
            missing = f"is neither an inherited upstream method of {base} nor one our override runs through super()"
        if target is None:
            findings.append(
                Finding(
                    Kind.OVERLAY_INVALID,
                    Severity.BLOCK,
                    symbol,
                    f"relies_on names {relied!r}, which {missing}",
                    where,
                )
            )
            continue
        matches = _contracts(target, declared_contracts, symbol, where, findings)
        if matches is not None:
            contracts[relied] = matches
    return GeneratedClass(
        name=name,
        module=overlay.generated_module,
        base=base,
        overlay=overlay_class,
        overlay_path=overlay.path,
        members=tuple(members),
        inherited=inherited,
        contracts=contracts,
    )


def calls_super(node: Any, name: str) -> bool:
    """Whether an override calls ``super().<name>``, or hands it on as a bound method: upstream's
    body then still runs inside ours."""

    class _Finder(cst.CSTVisitor):
        found = False

        def visit_Attribute(self, attribute: cst.Attribute) -> None:
            value = attribute.value
            if (
                attribute.attr.value == name
                and isinstance(value, cst.Call)
                and isinstance(value.func, cst.Name)
                and value.func.value == "super"
            ):
                self.found = True

    finder = _Finder()
    node.visit(finder)
    return finder.found


def _contracts(
    upstream: Member,
    declared: tuple[Contract, ...],
    symbol: str,
    where: Location,
    findings: list[Finding],
) -> tuple[ContractMatch, ...] | None:
    """Each contract must match the pinned body exactly ``count`` times."""
    upstream_at = Location(str(upstream.module.path), upstream.line)
    try:
        matches = evaluate(upstream, declared)
    except PatternError as exc:
        findings.append(
            Finding(Kind.CONTRACT_INVALID, Severity.BLOCK, symbol, str(exc), where, upstream_at)
        )
        return None
    for match in matches:
        found, wanted = len(match.lines), match.contract.count
        if found != wanted:
            findings.append(
                Finding(
                    Kind.CONTRACT_BROKEN if found == 0 else Kind.CONTRACT_COUNT,
                    Severity.BLOCK,
                    f"{symbol}#{match.contract.id}",
                    f"contract {' '.join(match.contract.pattern.split())!r} matches {found} place(s) in {upstream.ref}, "
                    f"declared {wanted}; fix the pattern or the count (a contract that never holds checks nothing)",
                    where,
                    upstream_at,
                    old=str(wanted),
                    new=str(found),
                )
            )
    return matches


def _build_member(
    index: UpstreamIndex,
    overlay: OverlayModule,
    class_name: str,
    base: SymbolRef,
    decl: MemberDecl,
    visible: dict[str, Member],
    namespace: ModuleNamespace,
    findings: list[Finding],
) -> GeneratedMember | None:
    symbol = f"{overlay.generated_module}:{class_name}.{decl.name}"
    ours_at = Location(str(overlay.path), decl.line)
    upstream = visible.get(decl.name)
    # this release's deltas only: the signature check, the lock and the runtime check see these
    decl = replace(decl, deltas=applicable(decl.deltas, index.versions))
    if decl.kind in (MemberKind.EXTEND, MemberKind.EXTEND_ATTR):
        if upstream is not None:
            findings.append(
                Finding(
                    Kind.EXTEND_SHADOWS,
                    Severity.BLOCK,
                    symbol,
                    f"extends {decl.name!r}, but {upstream.ref} already defines it; rename ours or declare an override",
                    ours_at,
                    Location(str(upstream.module.path), upstream.line),
                )
            )
            return None
        _require_ours(decl.node, symbol, ours_at, namespace)
        return GeneratedMember(decl, None, None, decl.node)
    if upstream is None:
        findings.append(
            Finding(
                Kind.TARGET_MISSING,
                Severity.BLOCK,
                symbol,
                f"{decl.kind.value} of {decl.name!r}, which {base} and its upstream bases do not define",
                ours_at,
            )
        )
        return None
    upstream_at = Location(str(upstream.module.path), upstream.line)
    if decl.kind is MemberKind.OVERRIDE_ATTR:
        if upstream.is_method:
            findings.append(
                Finding(
                    Kind.OVERLAY_INVALID,
                    Severity.BLOCK,
                    symbol,
                    f"{upstream.ref} is a method, not an attribute",
                    ours_at,
                    upstream_at,
                )
            )
            return None
        _require_ours(decl.node, symbol, ours_at, namespace)
        return GeneratedMember(decl, upstream.ref, None, decl.node)
    if not upstream.is_method:
        findings.append(
            Finding(
                Kind.OVERLAY_INVALID,
                Severity.BLOCK,
                symbol,
                f"{upstream.ref} is an attribute; use override_attr",
                ours_at,
                upstream_at,
            )
        )
        return None
    upstream_signature = upstream.signature()
    assert decl.signature is not None
    deltas = [d for d in decl.deltas if d.applies_to(str(base))]
    findings.extend(
        check_signature(
            symbol,
            upstream_signature,
            decl.signature,
            deltas,
            ours_at=ours_at,
            upstream_at=upstream_at,
        )
    )
    if decl.kind is MemberKind.OVERRIDE:
        _require_ours(decl.node, symbol, ours_at, namespace)
        return GeneratedMember(decl, upstream.ref, upstream_signature, decl.node)
    return _fork(upstream, decl, symbol, ours_at, upstream_at, namespace, findings)


def _require_ours(node: cst.CSTNode, symbol: str, at: Location, namespace: ModuleNamespace) -> None:
    for used in sorted(global_names(node)):
        namespace.require_ours(used, symbol, at)


def _fork(
    upstream: Member,
    decl: MemberDecl,
    symbol: str,
    ours_at: Location,
    upstream_at: Location,
    namespace: ModuleNamespace,
    findings: list[Finding],
) -> GeneratedMember | None:
    versions = namespace.index.versions
    unknown = [e for e in decl.edits if e.when and parse_range(e.when).package not in versions]
    if unknown:
        findings.append(
            Finding(
                Kind.OVERLAY_INVALID,
                Severity.BLOCK,
                f"{symbol}#{unknown[0].id}",
                f"when={unknown[0].when!r} names no pinned package; allowed: "
                f"{', '.join(sorted(versions))}",
                ours_at,
            )
        )
        return None
    ids = [e.id for e in applicable(decl.edits, versions)]
    if not ids or len(set(ids)) != len(ids):
        on = ", ".join(f"{p} {v}" for p, v in sorted(versions.items()))
        findings.append(
            Finding(
                Kind.OVERLAY_INVALID,
                Severity.BLOCK,
                symbol,
                f"the edits that apply on {on} are {ids}: a fork needs at least one, and "
                "alternatives sharing an id must not both apply to one release (see their when=)",
                ours_at,
                upstream_at,
            )
        )
        return None
    fork = apply_fork(upstream, decl.edits, versions)
    if isinstance(fork, FailedFork):
        findings.extend(_fork_failures(fork, symbol, ours_at, upstream_at))
        return None
    function = fork.function
    assert isinstance(upstream.node, ast.FunctionDef | ast.AsyncFunctionDef)
    defining = SymbolRef(upstream.ref.module, upstream.ref.qualname.rsplit(".", 1)[0])
    params = upstream.node.args.posonlyargs + upstream.node.args.args
    is_static = any(ast.unparse(d) == "staticmethod" for d in upstream.node.decorator_list)
    if params and not is_static:
        rewriter = SuperRewriter(defining.qualname, params[0].arg)
        rewritten = function.visit(rewriter)
        assert isinstance(rewritten, cst.FunctionDef)
        function = rewritten
        if rewriter.count:
            namespace.require_class(defining, symbol, ours_at)
    module = upstream.module
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    absolute = function.visit(RelativeImportRewriter(package))
    assert isinstance(absolute, cst.FunctionDef) and isinstance(decl.node, cst.FunctionDef)
    function = absolute.with_changes(
        params=decl.node.params,
        returns=decl.node.returns,
        decorators=decl.node.decorators,
        leading_lines=(),
        asynchronous=decl.node.asynchronous,
    )
    pinned_names = global_names(fork.parsed.function)
    arguments = upstream.node.args
    upstream_params = {
        a.arg
        for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
        + [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
    }
    for used in sorted(global_names(function)):
        if used in upstream_params:  # the body upstream wrote takes a parameter ours lacks
            findings.append(
                Finding(
                    Kind.UNBOUND_NAME,
                    Severity.BLOCK,
                    symbol,
                    f"uses {used!r}, a parameter of {upstream.ref} that the fork's signature "
                    f"lacks; add the parameter to the overlay's signature (with a delta for the "
                    "releases that lack it), not an import",
                    ours_at,
                    upstream_at,
                )
            )
        elif used in pinned_names:
            namespace.require_upstream(used, upstream.module.name, symbol, ours_at)
        else:
            namespace.require_ours(used, symbol, ours_at)
    return GeneratedMember(decl, upstream.ref, upstream.signature(), function, fork.anchors)


def _fork_failures(
    fork: FailedFork, symbol: str, ours_at: Location, upstream_at: Location
) -> list[Finding]:
    """One finding per edit that could not be anchored or applied: every lost anchor at once."""
    if fork.stage is ForkStage.ANCHOR or not fork.failures:
        return [_fork_failure(fork, fork.edit, fork.error, symbol, ours_at, upstream_at)]
    return [
        _fork_failure(fork, edit, error, symbol, ours_at, upstream_at)
        for edit, error in fork.failures
    ]


def _fork_failure(
    fork: FailedFork,
    edit: Edit,
    error: EditError | PatternError,
    symbol: str,
    ours_at: Location,
    upstream_at: Location,
) -> Finding:
    """The finding of an edit that could not be anchored or applied."""
    if isinstance(error, EditError):
        return Finding(
            Kind.ANCHOR_LOST if error.found == 0 else Kind.ANCHOR_COUNT,
            Severity.BLOCK,
            f"{symbol}#{error.edit.id}",
            str(error),
            ours_at,
            upstream_at,
            old=str(error.edit.count),
            new=str(error.found),
        )
    # an invalid anchor names its edit; a pattern in an edit's code, the member
    where = f"{symbol}#{edit.id}" if fork.stage is ForkStage.ANCHOR else symbol
    return Finding(Kind.ANCHOR_INVALID, Severity.BLOCK, where, str(error), ours_at, upstream_at)


def upstream_files(index: UpstreamIndex) -> dict[str, dict[str, str]]:
    """package -> {file: sha256} for every upstream module the generation read."""
    files: dict[str, dict[str, str]] = {}
    for info in index.loaded():
        files.setdefault(info.name.split(".", 1)[0], {})[info.path.as_posix()] = info.sha256
    return files


def overlay_hashes(repo_root: Path) -> dict[str, str]:
    """sha256 of each overlay file, by repo-relative path."""
    return {
        p.as_posix(): hashlib.sha256((repo_root / p).read_bytes()).hexdigest()
        for p in overlay_files(repo_root)
    }
