"""``python -m codegen audit``: the upgrade audit, for people and machines.

    python -m codegen audit --to 0.28.0 [--from 0.26.0] [--to-root DIR] [--out DIR] [--apply]

Drift from the default base (the newest supported release below the target, see
:func:`codegen.drift_run.default_base`), plus a dry-run regeneration against the new version (in
memory), the diff of the code generated for the base and for the new version, and a work list,
as Markdown with a JSON twin. It touches neither the overlay nor the lock; ``--apply`` adds the
release to the supported ones and writes its lock only when nothing blocks, for review in a
normal diff.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
from pathlib import Path

from afd_models.commandline import ExitCode
from afd_models.release_order import release_key
from codegen.drift.features import fold
from codegen.drift_run import DriftRun, drift_markdown, judged_finding, run_drift
from codegen.findings import Finding, Kind, Severity, exit_code, summary
from codegen.generate import PINS_PATH
from codegen.pipeline import generate, open_context, write_lock, write_output
from codegen.report import as_json, counts, ordered
from codegen.sources import SourceError, choose_version, load_pins

GENERATED_DIFF_LINES = 400


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
    """The block and review findings as a checklist: what the release takes away first (each
    with the findings that follow from it beneath it), then the rest by severity."""
    items = []
    for finding in ordered(findings):
        if finding.severity is Severity.INFO or finding.folded_under:
            continue
        items.append(_item(finding, "- [ ]"))
        if finding.kind is Kind.DRIFT_RENAMED:  # the call sites and their re-anchored edits
            items.extend(f"    - `{line.strip()}`" for line in finding.details)
        under = [f for f in ordered(findings) if f.folded_under == finding.symbol]
        alarms = [f for f in under if f.severity is not Severity.INFO]
        if under:
            items.append(
                f"    - {len(under)} finding(s) follow from it, {len(alarms)} of them block or "
                "review (fixed with it):"
            )
            items.extend(_item(f, "        -") for f in alarms)
    return items


def _item(finding: Finding, bullet: str) -> str:
    # where to edit (ours, the overlay declaration beside it), then where upstream it changed
    places = (finding.ours, finding.declared, finding.target or finding.upstream)
    where = ", ".join(f"`{place}`" for place in places if place)
    return (
        f"{bullet} **{finding.severity.value}** `{finding.code}` {finding.symbol}: {finding.message}"
        + (f" ({where})" if where else "")
    )


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


def run_audit(
    repo_root: Path,
    to_version: str,
    *,
    from_version: str | None = None,
    to_root: Path | None = None,
    out: Path | None = None,
    apply: bool = False,
    progress: Callable[[str], None] = lambda _: None,
    drift: DriftRun | None = None,
) -> ExitCode:
    """Write ``audit.md`` and ``audit.json`` into ``out`` (default ``.afd-work/audit/<to>``);
    with ``apply``, also support the release and write its lock when nothing blocks. ``drift``:
    the drift run of this very comparison, when the caller made it already. Returns the exit
    code."""
    run = drift or run_drift(
        repo_root, to_version, from_version=from_version, to_root=to_root, progress=progress
    )
    progress(f"dry-run regeneration against vllm {run.new_version}")
    # the code of the base, so that the diff shows what the new release changes in the classes
    # that release gets (those limited by when= to newer releases included)
    current, _ = generate(open_context(repo_root, version=run.old_version, quiet=True))
    dry, _ = generate(
        open_context(repo_root, upstream_root=to_root, version=to_version, quiet=True)
    )
    diff = generated_diff(current.files, dry.files) if not dry.blocked else []
    shown = diff[:GENERATED_DIFF_LINES] + (
        [f"... {len(diff) - GENERATED_DIFF_LINES} more lines"]
        if len(diff) > GENERATED_DIFF_LINES
        else []
    )
    # what the dry run adds to drift, of the packages judged against the new release, folded
    # under the loss that explains it
    extra = fold(
        [
            f
            for f in uncovered(dry.findings, run.findings)
            if judged_finding(f, run.lock, run.unjudged)
        ],
        run.lock,
        [f for f in run.findings if f.kind is Kind.DRIFT_FEATURE_REMOVED],
    )
    out = out or repo_root / ".afd-work" / "audit" / run.new_version
    out.mkdir(parents=True, exist_ok=True)
    title = f"Upgrade audit: vLLM {run.old_version} -> {run.new_version}"
    regen_state = (
        "blocked"
        if dry.blocked
        else f"succeeded ({len(dry.files)} files, {len(dry.classes)} classes)"
    )
    base = "" if run.old_version == run.default_from else f" --from {run.old_version}"
    text = [
        f"# {title}",
        "",
        f"Made by `python -m codegen audit --to {run.new_version}{base}` (`nox -s audit -- {run.new_version}{base}`). Nothing in",
        "`overlay/` or the lock was changed. Sections: the work list, the dry-run regeneration, the diff of",
        "the generated code, and every drift finding.",
        "",
        f"- base {run.old_version}: {run.base_reason}",
        f"- drift: **{summary(run.findings)}** ({run.seconds:.1f} s)",
        f"- dry-run regeneration against {run.new_version}: **{regen_state}**, {summary(dry.findings)}",
        f"- generated code: {sum(1 for line in diff if line.startswith('+++'))} file(s) change, {len(diff)} diff lines",
        "",
        "## Work list",
        "",
        *(
            work_list(run.findings + extra)
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
    progress(f"wrote {out / 'audit.md'} and audit.json")
    if apply:
        if dry.blocked:
            progress(
                "--apply: nothing written, regeneration against the new version is blocked (see the work list)"
            )
            return ExitCode.BLOCK
        pins = repo_root / PINS_PATH
        before = pins.read_text()
        try:
            support(pins, run.new_version)
            # the pins are an input of every generation: the new release's lock (from the tree
            # audited), then the code on disk (the installed release's, else the primary's)
            new, _ = generate(
                open_context(repo_root, upstream_root=to_root, version=run.new_version)
            )
            on_disk, _ = generate(
                open_context(repo_root, version=choose_version(load_pins(pins)["vllm"], None))
            )
            if new.blocked or on_disk.blocked:
                pins.write_text(before)
                progress("--apply: nothing written, a regeneration with the new pins is blocked")
                return ExitCode.BLOCK
            write_lock(repo_root, new)
            write_output(repo_root, on_disk)
        except BaseException:
            pins.write_text(before)
            raise
        progress(
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
