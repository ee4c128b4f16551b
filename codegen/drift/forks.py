"""Forks on the new release: each fork's edits re-applied to the new upstream body (lost,
ambiguous, conflicting or clean, with the generated diff), ``extend`` names upstream now
defines, and a changed MRO."""

from __future__ import annotations

import difflib
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field

import libcst as cst

from codegen.drift.renames import (
    SITE_CODE_CHARS,
    Rename,
    only_renamed,
    re_anchored,
    renamed_code,
)
from codegen.drift.sides import Side, body_diff
from codegen.edit import EditError, ParsedMethod
from codegen.findings import Finding, Kind, Location, Severity
from codegen.fork import FailedFork, ForkStage, apply_fork
from codegen.index import Member, same_behaviour
from codegen.lock import AnchorEntry, Lock, MemberEntry
from codegen.markers import Edit
from codegen.model import MemberKind, SymbolRef
from codegen.names import global_names
from codegen.pattern import normalized_code, parse_pattern
from codegen.releases import applicable


@dataclass
class NewBodies:
    """What the forks' bodies use on the new release, per generated module, once their edits
    applied there (or, for a fork whose edits do not all apply, what its new upstream body uses:
    the edits only take code away or add AFD's own)."""

    #: generated module -> global names its rebased bodies read
    names: dict[str, set[str]] = field(default_factory=dict)
    #: generated modules with a fork that could not be rebased at all (its names are unknown)
    incomplete: set[str] = field(default_factory=set)

    def add(self, class_key: str, names: set[str]) -> None:
        self.names.setdefault(class_key.partition(":")[0], set()).update(names)

    def unknown(self, class_key: str) -> None:
        self.incomplete.add(class_key.partition(":")[0])

    def uses(self, module: str, name: str) -> bool | None:
        """Whether the rebased bodies of ``module`` use ``name``; None when not known."""
        if module in self.incomplete:
            return None
        return name in self.names.get(module, set())


def fork_findings(
    lock: Lock,
    overlay_edits: dict[tuple[str, str], tuple[Edit, ...]],
    old: Side,
    new: Side,
    renames: dict[str, Rename] | None = None,
    sites: dict[str, list[str]] | None = None,
    bodies: NewBodies | None = None,
) -> Iterator[Finding]:
    """Re-apply every fork's edits to the new body: lost, ambiguous, conflicting or clean (3-way).

    An anchor lost only because a name it mentions was renamed is not reported here: the call
    site and the re-anchored edit go into ``sites`` for the rename's finding. ``bodies`` collects
    the global names the rebased bodies use.
    """
    bodies = NewBodies() if bodies is None else bodies
    for class_key, entry in lock.classes.items():
        base = SymbolRef.parse(entry.base)
        for name, member in entry.members.items():
            symbol = f"{class_key}.{name}"
            if member.kind in (MemberKind.EXTEND, MemberKind.EXTEND_ATTR):
                found = (
                    new.index.all_members(base).get(name)
                    if new.index.is_indexed_class(base)
                    else None
                )
                if found is not None:
                    yield Finding(
                        Kind.DRIFT_EXTEND_SHADOWS,
                        Severity.BLOCK,
                        symbol,
                        f"{found.ref} now exists upstream; rename ours or override it",
                        target=Location(str(found.module.path), found.line),
                    )
                continue
            if member.kind is not MemberKind.FORK:
                continue
            edits = overlay_edits.get((class_key, name))
            try:
                yield from _rebase(
                    symbol,
                    base,
                    name,
                    member,
                    edits,
                    old,
                    new,
                    renames or {},
                    {} if sites is None else sites,
                    bodies,
                )
            except Exception as exc:
                bodies.unknown(class_key)
                yield Finding(
                    Kind.DRIFT_UNANALYSED,
                    Severity.BLOCK,
                    symbol,
                    f"could not be re-based: {type(exc).__name__}: {exc}",
                )
        if new.index.is_indexed_class(base):
            mro = [str(c) for c in new.index.mro(base)]
            if mro != list(entry.base_mro):
                yield Finding(
                    Kind.DRIFT_MRO,
                    Severity.REVIEW,
                    class_key,
                    "the upstream MRO under this class changed",
                    old=" -> ".join(entry.base_mro),
                    new=" -> ".join(mro),
                )


def _rebase(
    symbol: str,
    base: SymbolRef,
    name: str,
    member: MemberEntry,
    edits: tuple[Edit, ...] | None,
    old: Side,
    new: Side,
    renames: dict[str, Rename],
    sites: dict[str, list[str]],
    bodies: NewBodies,
) -> Iterator[Finding]:
    if edits is None:
        raise LookupError("the overlay no longer declares this fork; regenerate the lock first")
    target = new.index.find_member(base, name) if new.index.is_indexed_class(base) else None
    if target is None or not target.is_method:
        bodies.unknown(symbol)
        return  # reported as a removed fork target by symbol_findings
    # each release gets the edits its regeneration would apply (per-release alternatives)
    old_edits = applicable(edits, old.index.versions)
    fork = apply_fork(target, edits, new.index.versions)
    where = Location(str(target.module.path), target.line)
    if isinstance(fork, FailedFork):
        if fork.stage is ForkStage.ANCHOR:
            yield Finding(
                Kind.DRIFT_UNANALYSED,
                Severity.BLOCK,
                f"{symbol}#{fork.edit.id}",
                str(fork.error),
                target=where,
            )
            return
        if not isinstance(fork.error, EditError):
            raise fork.error  # an edit's code is no valid pattern: the fork is not analysed
        bodies.add(symbol, global_names(fork.parsed.function))
        if re_anchored(symbol, fork.edits, fork.parsed, target, renames, sites):
            return
        for edit, error in fork.failures:  # every lost anchor of the fork, not the first only
            if not isinstance(error, EditError):
                raise error
            yield _anchor_finding(symbol, edit, error, member, fork, old_edits, old, new, where)
        return
    bodies.add(symbol, global_names(fork.function))
    changed_regions = []
    for anchor in fork.anchors:
        # an alternative written for the new release anchors on code the old lock never saw
        edit, matched = anchor.edit, list(anchor.matched)
        recorded = (member.anchors or {}).get(edit.id) if edit in old_edits else None
        before = list(recorded.matched) if recorded is not None else []
        # a region changed only by a rename drift linked (a capture took the new name) is not
        if before and len(matched) == len(before) and matched != before:
            if [renamed_code(code, renames) for code in before] != matched:
                changed_regions.append((edit.id, before, matched))
    old_target = old.index.find_member(base, name)
    diff = body_diff(
        old_target.source() if old_target else "",
        target.source(),
        f"{member.upstream} ({old.version})",
        f"({new.version})",
    )
    if changed_regions:
        details = (
            tuple(
                f"{edit_id}: {' | '.join(a)}  ->  {' | '.join(b)}"
                for edit_id, a, b in changed_regions
            )
            + diff
        )
        yield Finding(
            Kind.DRIFT_REBASE_CONFLICT,
            Severity.REVIEW,
            symbol,
            f"edits apply, but upstream changed the code they anchor on ({', '.join(e for e, _, _ in changed_regions)}); check each",
            target=where,
            details=details,
        )
    elif not diff:
        return
    elif old_target is not None and same_behaviour(old_target.node, target.node):
        yield Finding(
            Kind.DRIFT_REBASED,
            Severity.INFO,
            symbol,
            "only formatting, comments, docstrings or bare annotations changed outside our edits",
            target=where,
            details=diff,
        )
    elif old_target is not None and (names := only_renamed(old_target, target, renames)):
        yield Finding(
            Kind.DRIFT_REBASED,
            Severity.INFO,
            symbol,
            f"only renamed names changed ({names}), and the edits for {new.version} apply",
            target=where,
            details=diff,
        )
    else:
        generated = _generated_diff(old_target, target, edits, old, new)
        yield Finding(
            Kind.DRIFT_REBASED,
            Severity.REVIEW,
            symbol,
            "upstream changed the body outside our edits; they still apply and regeneration carries "
            "the new code into ours: check it suits this role (upstream diff, then the generated diff)",
            target=where,
            details=(*diff, "", "generated method:", *generated),
        )


def _anchor_finding(
    symbol: str,
    edit: Edit,
    error: EditError,
    member: MemberEntry,
    fork: FailedFork,
    old_edits: tuple[Edit, ...],
    old: Side,
    new: Side,
    where: Location,
) -> Finding:
    """A lost or ambiguous anchor of one edit, with the nearest code of the new body."""
    kind = Kind.DRIFT_ANCHOR_LOST if error.found == 0 else Kind.DRIFT_ANCHOR_COUNT
    recorded = (member.anchors or {}).get(edit.id) if edit in old_edits else None
    fix, hint = (
        _lost(edit, recorded, fork.parsed, old.version, new.version, where)
        if kind is Kind.DRIFT_ANCHOR_LOST
        else ("re-anchor the edit", ())
    )
    return Finding(
        kind,
        Severity.BLOCK,
        f"{symbol}#{edit.id}",
        f"anchor {edit.anchor!r} matches {error.found} place(s) in {new.version}, expected "
        f"{edit.count}; {fix}",
        target=where,
        old=str(edit.count),
        new=str(error.found),
        details=hint,
    )


def _generated_diff(
    old_target: Member | None, target: Member, edits: tuple[Edit, ...], old: Side, new: Side
) -> tuple[str, ...]:
    """The fork's edited body against the old and the new upstream body (each with the edits
    of its release), as a diff."""
    bodies = []
    for side, member in ((old, old_target), (new, target)):
        if member is None:
            bodies.append("")
            continue
        fork = apply_fork(member, edits, side.index.versions)
        if isinstance(fork, FailedFork):
            raise fork.error  # the lock was generated with these edits: the fork is not analysed
        bodies.append(cst.Module(body=[fork.function]).code)
    return body_diff(
        bodies[0], bodies[1], f"generated ({old.version})", f"generated ({new.version})"
    )


def _lost(
    edit: Edit,
    recorded: AnchorEntry | None,
    parsed: ParsedMethod,
    old_version: str,
    new_version: str,
    where: Location,
) -> tuple[str, tuple[str, ...]]:
    """The fix of a lost anchor (re-anchor it on the nearest code of the new body) and the
    details showing it: what the anchor matched in the pinned body, and the new body's code most
    like it, as an anchor to paste."""
    anchored = recorded.matched[0] if recorded is not None and recorded.matched else None
    nearest = nearest_code(parsed, edit.anchor, anchored)
    if nearest is None:
        return "re-anchor the edit", ()
    at = f"{where.path}:{nearest.line}"
    code = nearest.code
    short = code if len(code) <= SITE_CODE_CHARS else code[:SITE_CODE_CHARS] + " ..."
    details = (
        *(
            [f"matched in {old_version} at line {recorded.lines[0]}: {anchored}"]
            if recorded is not None and anchored
            else []
        ),
        f"nearest in {new_version} at {at} ({nearest.ratio:.0%} alike): {code}",
        f"    proposed anchor: {nearest.anchor!r}",
    )
    return f"re-anchor the edit: the nearest code is at {at}: {short}", details


@dataclass(frozen=True)
class Nearest:
    """The code of a new body most like what a lost anchor matched."""

    #: its first line in the upstream file
    line: int
    #: normalized, as the lock records what an anchor matched (a run joined by ``" | "``)
    code: str
    #: its source, as an anchor that matches it
    anchor: str
    #: how alike it is to what the anchor matched (difflib's ratio)
    ratio: float


def nearest_code(parsed: ParsedMethod, anchor: str, anchored: str | None = None) -> Nearest | None:
    """The code of a body most like what a lost ``anchor`` matched in the pinned body
    (``anchored``, normalized as the lock records it; else the anchor's text); None when the body
    has no code of the anchor's shape: expressions of its node type, or runs of as many
    statements."""
    pattern = parse_pattern(anchor)
    wanted = anchored or textwrap.dedent(anchor).strip()
    nodes = list(_descendants(parsed.function.body))
    runs: list[list[cst.CSTNode]] = []
    if pattern.expression is not None:
        runs = [[n] for n in nodes if type(n) is type(pattern.expression)]
    else:
        size = wanted.count(" | ") + 1 if anchored else len(pattern.statements)
        for block in (n for n in nodes if isinstance(n, cst.IndentedBlock)):
            body: list[cst.CSTNode] = list(block.body)
            runs += [body[start : start + size] for start in range(len(body) - size + 1)]
    best: tuple[float, list[cst.CSTNode], str] | None = None
    for run in runs:
        code = " | ".join(normalized_code(n) for n in run)
        matcher = difflib.SequenceMatcher(None, wanted, code, autojunk=False)
        if best is not None and matcher.quick_ratio() <= best[0]:
            continue  # a cheap upper bound first: a body has many candidates
        ratio = matcher.ratio()
        if best is None or ratio > best[0]:
            best = (ratio, run, code)
    if best is None:
        return None
    ratio, run, code = best
    line = parsed.positions[run[0]].start.line + parsed.first_line - 2
    return Nearest(line, code, "\n".join(_source(n) for n in run), ratio)


def _source(node: cst.CSTNode) -> str:
    """The code of ``node`` as written, without the comment lines above a statement."""
    if isinstance(node, cst.SimpleStatementLine | cst.BaseCompoundStatement):
        node = node.with_changes(leading_lines=())
    return cst.Module(body=[]).code_for_node(node).strip()


def _descendants(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``node`` and every node under it, in source order."""
    yield node
    for child in node.children:
        yield from _descendants(child)
