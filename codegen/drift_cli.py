"""``python -m codegen drift`` and ``python -m codegen audit``: the upgrade workflow.

    python -m codegen drift --to 0.28.0 [--package vllm|vllm_ascend] [--from 0.26.0]
                            [--from-root DIR] [--to-root DIR] [--format md|json|sarif] [--out FILE]
    python -m codegen audit --to 0.28.0 [--to-root DIR] [--out DIR] [--apply]

``drift`` compares every symbol the overlay and runtime use between two versions of one pinned
upstream package (``--package``, default vllm); the other pinned packages stay at their pins.
``audit`` adds a dry-run regeneration against the new version (in memory), the diff of the
generated code and a work list, as Markdown with a JSON twin. Neither touches the overlay or the
lock; ``audit --apply`` adds the release to the supported ones and writes its lock only when nothing
blocks, for review in a normal diff.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codegen.drift import Declared, Side, compare, native_architectures, registry_findings
from codegen.findings import EXIT_BLOCK, Finding, Kind, Severity, exit_code, summary
from codegen.generate import PINS_PATH
from codegen.index import UpstreamIndex
from codegen.lock import read_lock
from codegen.markers import Edit
from codegen.model import MemberDecl, MemberKind
from codegen.names import global_names
from codegen.overlay import load_overlay, overlay_files
from codegen.releases import release_key
from codegen.report import as_json, as_markdown, as_sarif, counts, ordered
from codegen.sources import SourceError, choose_version, load_pins, locate

if TYPE_CHECKING:
    from codegen.pipeline import Context

GENERATED_DIFF_LINES = 400
#: how reports name each pinned package
DISPLAY_NAMES = {"vllm": "vLLM", "vllm_ascend": "vLLM-Ascend"}


class UnknownPackage(ValueError):
    """``--package`` names no package of ``overlay/pins.toml``: a usage error (exit 2)."""


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

    def header(self) -> dict[str, Any]:
        return {
            "package": self.package,
            "from": self.old_version,
            "to": self.new_version,
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
    from codegen.pipeline import generate, open_context, up_to_date

    started = time.monotonic()
    pins = load_pins(repo_root / PINS_PATH)
    if package not in pins:
        raise UnknownPackage(
            f"--package {package!r} is not pinned in {PINS_PATH}; allowed: {', '.join(pins)}"
        )
    pinned = open_context(repo_root, quiet=True)

    def side(version: str | None, root: Path | None) -> Context:
        """The pinned sources with ``package`` at ``version`` (or read from ``root``)."""
        if version is None and root is None:
            return pinned
        source = locate(pins[package], version, upstream_root=root, quiet=True)
        return replace(pinned, sources={**pinned.sources, package: source})

    old_context, new_context = side(from_version, from_root), side(to_version, to_root)
    old_version, new_version = old_context.versions[package], new_context.versions[package]
    progress(
        f"comparing {package} {old_version} ({old_context.sources[package].origin}) with {new_version} ({new_context.sources[package].origin})"
    )
    old_index, new_index = UpstreamIndex(old_context.sources), UpstreamIndex(new_context.sources)
    lock = read_lock(repo_root / old_context.lock_path) if up_to_date(old_context) else None
    findings: list[Finding] = []
    if (
        lock is not None
    ):  # the committed lock describes exactly this old version: no need to regenerate it
        edits = committed_edits(repo_root)
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
        findings.extend(
            compare(lock, edits, old, new, own=own_names(repo_root), declared=declared(repo_root))
        )
        findings.extend(registry_findings(native_architectures(repo_root), old, new))
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
    )


def _generated_members(repo_root: Path) -> Iterator[tuple[str, str, MemberDecl]]:
    """Every member of the current overlay as generated: (generated class key, its base, member),
    the class key as the lock spells it."""
    for path in overlay_files(repo_root):
        overlay = load_overlay(repo_root, path)
        for overlay_class in overlay.classes:
            for base in overlay_class.bases:
                key = f"{overlay.generated_module}:{overlay_class.generated_name(base)}"
                for member in overlay_class.members:
                    yield key, str(base), member


def committed_edits(repo_root: Path) -> dict[tuple[str, str], tuple[Edit, ...]]:
    """Fork edits of the current overlay, keyed like the lock's classes (generated class, member)."""
    return {
        (key, member.name): member.edits
        for key, _, member in _generated_members(repo_root)
        if member.edits
    }


def declared(repo_root: Path) -> Declared:
    """The overlay's signatures of forks and overrides, with every release's deltas for each base,
    keyed by generated member (as the lock's ``used_by``)."""
    return {
        f"{key}.{member.name}": (
            member.signature,
            tuple(d for d in member.deltas if d.applies_to(base)),
        )
        for key, base, member in _generated_members(repo_root)
        if member.signature is not None
    }


def own_names(repo_root: Path) -> frozenset[str]:
    """The global names the overlay's own members (overrides, extends, attributes) use: the same
    code on every release."""
    names: set[str] = set()
    for path in overlay_files(repo_root):
        for overlay_class in load_overlay(repo_root, path).classes:
            for member in overlay_class.members:
                if member.kind is not MemberKind.FORK:
                    names |= global_names(member.node)
    return frozenset(names)


def _write(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


def drift_markdown(run: DriftRun) -> str:
    name = DISPLAY_NAMES.get(run.package, run.package)
    command = "python -m codegen drift" + (
        f" --package {run.package} --from {run.old_version}" if run.package != "vllm" else ""
    )
    intro = [
        f"Upstream {name} {run.old_version} -> {run.new_version}: every symbol in the lock (bases and MRO, overridden,",
        "forked and inherited methods, anchors, names the overlay and runtime import, registry keys, config fields).",
        f"Generated by `{command} --to {run.new_version}` in {run.seconds:.1f} s.",
    ]
    return as_markdown(run.findings, f"Drift: {name} {run.old_version} -> {run.new_version}", intro)


def cmd_drift(args: argparse.Namespace) -> int:
    from codegen.cli import _progress

    try:
        run = run_drift(
            args.repo,
            args.to,
            package=args.package,
            from_version=args.from_version,
            from_root=args.from_root,
            to_root=args.to_root,
            progress=_progress,
        )
    except UnknownPackage as exc:
        print(f"codegen drift: {exc}; exit 2", file=sys.stderr)
        return 2
    if args.format == "json":
        _write(as_json(run.findings, run.header()), args.out)
    elif args.format == "sarif":
        _write(as_sarif(run.findings, run.new_version), args.out)
    else:
        _write(drift_markdown(run), args.out)
    _progress(
        f"drift {run.package} {run.old_version} -> {run.new_version}: {summary(run.findings)} in {run.seconds:.1f} s"
    )
    return exit_code(run.findings)


# --------------------------------------------------------------------------- audit


def generated_diff(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """Unified diff of the generated files, old version -> new version (registry digests left out)."""
    lines: list[str] = []
    for path in sorted(set(old) | set(new)):
        if path.endswith("_generated/__init__.py"):
            continue
        a, b = old.get(path, "").splitlines(), new.get(path, "").splitlines()
        if a != b:
            lines += difflib.unified_diff(a, b, f"{path} (old)", f"{path} (new)", n=2, lineterm="")
    return lines


def work_list(findings: list[Finding]) -> list[str]:
    items = []
    for finding in ordered(findings):
        if finding.severity is Severity.INFO:
            continue
        where = finding.target or finding.ours or finding.upstream
        items.append(
            f"- [ ] **{finding.severity.value}** `{finding.code}` {finding.symbol}: {finding.message}"
            + (f" (`{where}`)" if where else "")
        )
        if finding.kind is Kind.DRIFT_RENAMED:  # the call sites and their re-anchored edits
            items.extend(f"    - `{line.strip()}`" for line in finding.details)
    return items


def uncovered(regeneration: list[Finding], drift: list[Finding]) -> list[Finding]:
    """Dry-run regeneration findings that no drift finding already explains: a lost anchor the
    rename or anchor finding names, a contract the broken-contract finding names."""
    covered = {f.symbol for f in drift}
    covered |= {line.split(" at ", 1)[0] for f in drift for line in f.details}
    contracts = {f.symbol.rsplit(":", 1)[-1].split(".", 1)[-1] for f in drift}
    return [
        f
        for f in regeneration
        if f.symbol not in covered
        and f.symbol.rsplit(":", 1)[-1].split(".", 1)[-1] not in contracts
    ]


def cmd_audit(args: argparse.Namespace) -> int:
    from codegen.cli import _progress
    from codegen.pipeline import generate, open_context, write_lock, write_output

    run = run_drift(args.repo, args.to, to_root=args.to_root, progress=_progress)
    _progress(f"dry-run regeneration against vllm {run.new_version}")
    current, _ = generate(open_context(args.repo, quiet=True))
    dry, _ = generate(
        open_context(args.repo, upstream_root=args.to_root, version=args.to, quiet=True)
    )
    diff = generated_diff(current.files, dry.files) if not dry.blocked else []
    shown = diff[:GENERATED_DIFF_LINES] + (
        [f"... {len(diff) - GENERATED_DIFF_LINES} more lines"]
        if len(diff) > GENERATED_DIFF_LINES
        else []
    )
    out = args.out or args.repo / ".afd-work" / "audit" / run.new_version
    out.mkdir(parents=True, exist_ok=True)
    title = f"Upgrade audit: vLLM {run.old_version} -> {run.new_version}"
    regen_state = (
        "blocked"
        if dry.blocked
        else f"succeeded ({len(dry.files)} files, {len(dry.classes)} classes)"
    )
    text = [
        f"# {title}",
        "",
        f"Made by `python -m codegen audit --to {run.new_version}` (`nox -s audit -- {run.new_version}`). Nothing in",
        "`overlay/` or the lock was changed. Sections: the work list, the dry-run regeneration, the diff of",
        "the generated code, and every drift finding.",
        "",
        f"- drift: **{summary(run.findings)}** ({run.seconds:.1f} s)",
        f"- dry-run regeneration against {run.new_version}: **{regen_state}**, {summary(dry.findings)}",
        f"- generated code: {sum(1 for line in diff if line.startswith('+++'))} file(s) change, {len(diff)} diff lines",
        "",
        "## Work list",
        "",
        *(
            work_list(run.findings + uncovered(dry.findings, run.findings))
            or ["Nothing to do by hand: add it to the supported releases (`--apply`)."]
        ),
        "",
        "## Dry-run regeneration findings",
        "",
        *([f.one_line() for f in ordered(dry.findings)] or ["none"]),
        "",
        "## Generated code diff",
        "",
        "```diff",
        *(shown or ["(no change)"]),
        "```",
        "",
        drift_markdown(run)
        .replace("# Drift:", "## Drift:", 1)
        .replace("\n## ", "\n### ")
        .replace("\n### Drift:", "\n## Drift:"),
    ]
    (out / "audit.md").write_text("\n".join(text).rstrip() + "\n")
    twin = {
        **run.header(),
        "regeneration": {
            "blocked": dry.blocked,
            "summary": summary(dry.findings),
            "findings": [f.as_dict() for f in ordered(dry.findings)],
        },
        "generated_diff_lines": len(diff),
        "drift": json.loads(as_json(run.findings, {})),
        "counts": counts(run.findings),
    }
    (out / "audit.json").write_text(json.dumps(twin, indent=2) + "\n")
    _progress(f"wrote {out / 'audit.md'} and audit.json")
    if args.apply:
        if dry.blocked:
            _progress(
                "--apply: nothing written, regeneration against the new version is blocked (see the work list)"
            )
            return EXIT_BLOCK
        pins = args.repo / PINS_PATH
        before = pins.read_text()
        try:
            support(pins, run.new_version)
            # the pins are an input of every generation: the new release's lock (from the tree
            # audited), then the code on disk (the installed release's, else the primary's)
            new, _ = generate(
                open_context(args.repo, upstream_root=args.to_root, version=run.new_version)
            )
            on_disk, _ = generate(
                open_context(args.repo, version=choose_version(load_pins(pins)["vllm"], None))
            )
            if new.blocked or on_disk.blocked:
                pins.write_text(before)
                _progress("--apply: nothing written, a regeneration with the new pins is blocked")
                return EXIT_BLOCK
            write_lock(args.repo, new)
            write_output(args.repo, on_disk)
        except BaseException:
            pins.write_text(before)
            raise
        _progress(
            f"--apply: vllm {run.new_version} added to the supported releases, its lock written; "
            "review `git diff`"
        )
    return exit_code(run.findings + dry.findings)


def support(pins: Path, version: str) -> None:
    """Add ``version`` to vLLM's ``also_supported`` releases in ``pins`` (kept in release order);
    the result must read back as exactly that window, else nothing is written."""
    pin = load_pins(pins)["vllm"]
    if version in pin.supported:
        return
    releases = sorted([*pin.also_supported, version], key=release_key)
    line = "also_supported = [" + ", ".join(f'"{v}"' for v in releases) + "]"
    text = pins.read_text()
    table = re.search(r'(?ms)^package = "vllm"$.*?(?=^\[\[upstream\]\]|\Z)', text)
    if table is None:
        raise SourceError(f'{pins}: no [[upstream]] table with package = "vllm"')
    body = table.group(0)
    if pin.also_supported:  # replace the list, however it is laid out
        body, count = re.subn(r"(?ms)^also_supported\s*=\s*\[.*?\]", line, body, count=1)
    else:  # a new key after the version
        body, count = re.subn(r"(?m)^(version\s*=.*)$", rf"\1\n{line}", body, count=1)
    updated = text[: table.start()] + body + text[table.end() :]
    check = pins.with_name(pins.name + ".new")
    check.write_text(updated)
    try:
        window = load_pins(check)["vllm"].supported if count else ()
    finally:
        check.unlink()
    if window != (pin.version, *releases):
        raise SourceError(
            f"{pins}: could not add {version} to vllm's also_supported; add it by hand: {line}"
        )
    pins.write_text(updated)


def add_drift_commands(sub: Any) -> None:
    drift = sub.add_parser(
        "drift", help="what an upstream version bump breaks, located and classified"
    )
    drift.add_argument("--to", required=True, help="the new version, e.g. 0.28.0")
    drift.add_argument(
        "--package",
        default="vllm",
        help="the pinned package whose versions to compare, e.g. vllm_ascend (default: vllm); "
        "the others stay at their pins",
    )
    drift.add_argument(
        "--from", dest="from_version", help="the old version (default: the pinned one)"
    )
    drift.add_argument("--from-root", type=Path, help="read the old version from this source tree")
    drift.add_argument("--to-root", type=Path, help="read the new version from this source tree")
    drift.add_argument("--format", choices=["md", "json", "sarif"], default="md")
    drift.add_argument("--out", type=Path, help="write the report here instead of stdout")
    drift.set_defaults(func=cmd_drift)

    audit = sub.add_parser(
        "audit",
        help="upgrade audit report: drift + dry-run regeneration + generated diff + work list",
    )
    audit.add_argument("--to", required=True, help="the new vLLM version, e.g. 0.28.0")
    audit.add_argument("--to-root", type=Path, help="read the new version from this source tree")
    audit.add_argument(
        "--out",
        type=Path,
        help="directory for audit.md and audit.json (default .afd-work/audit/<to>)",
    )
    audit.add_argument(
        "--apply",
        action="store_true",
        help="add the release to the supported ones and write its lock, when nothing blocks",
    )
    audit.set_defaults(func=cmd_audit)
