"""Render findings: text lines (the terminal), Markdown (for people), JSON (for machines), SARIF
(for code-scanning UIs); and the commands' progress lines on stderr.

All come from the same :class:`~codegen.findings.Finding` objects; JSON is ``as_dict``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from codegen.findings import Finding, Kind, Location, Severity, summary
from codegen.generate import LOCK_PATH

_ORDER = (Severity.BLOCK, Severity.REVIEW, Severity.INFO)
_SARIF_LEVEL = {Severity.BLOCK: "error", Severity.REVIEW: "warning", Severity.INFO: "note"}


def ordered(findings: Sequence[Finding]) -> list[Finding]:
    """Feature findings (what a release takes away) first, then by severity, code and symbol."""
    return sorted(
        findings,
        key=lambda f: (
            f.kind is not Kind.DRIFT_FEATURE_REMOVED,
            -f.severity.rank,
            f.code,
            f.symbol,
        ),
    )


def progress(message: str) -> None:
    """One progress line of a command, on stderr."""
    print(f"[codegen] {message}", file=sys.stderr, flush=True)


def print_findings(findings: Sequence[Finding], fmt: str, verbose: bool) -> None:
    """``fmt`` ``json``: the findings and their summary as JSON; else one line each (``verbose``:
    with locations, values and details)."""
    if fmt == "json":
        json.dump(
            {"findings": [f.as_dict() for f in ordered(findings)], "summary": summary(findings)},
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
        return
    for finding in ordered(findings):
        print(finding.verbose() if verbose else finding.one_line())


def counts(findings: Sequence[Finding]) -> dict[str, Any]:
    return {
        "by_severity": {s.value: sum(f.severity is s for f in findings) for s in _ORDER},
        "by_code": dict(sorted(Counter(f.code for f in findings).items())),
    }


def as_json(findings: Sequence[Finding], header: dict[str, Any]) -> str:
    body = {
        **header,
        "summary": summary(findings),
        "counts": counts(findings),
        "findings": [f.as_dict() for f in ordered(findings)],
    }
    return json.dumps(body, indent=2) + "\n"


def as_markdown(findings: Sequence[Finding], title: str, intro: Sequence[str] = ()) -> str:
    lines = [f"# {title}", "", *intro, "", f"**{summary(findings)}**", ""]
    table = counts(findings)["by_code"]
    if table:
        lines += ["| code | kind | count |", "| --- | --- | --- |"]
        kinds = {f.code: f.kind.describe for f in findings}
        lines += [f"| {code} | {kinds[code]} | {n} |" for code, n in table.items()]
        lines.append("")
    features = [f for f in findings if f.kind is Kind.DRIFT_FEATURE_REMOVED]
    if features:
        lines += ["## What the release takes away", ""]
        for feature in features:
            under = [f for f in ordered(findings) if f.folded_under == feature.symbol]
            lines.append(f"- **{feature.symbol}**: {len(under)} finding(s) below follow from it")
        lines.append("")
    for severity in _ORDER:
        group = [f for f in ordered(findings) if f.severity is severity]
        if not group:
            continue
        lines += [f"## {severity.value} ({len(group)})", ""]
        for finding in group:
            lines.append(f"### `{finding.code}` {finding.symbol}")
            lines.append("")
            lines.append(finding.message)
            facts = [
                ("before", finding.upstream),
                ("after", finding.target),
                ("ours", finding.ours),
                ("declared", finding.declared),
            ]
            if finding.folded_under:
                lines.append(f"- under: `{finding.folded_under}` (follows from its removal)")
            for label, value in facts:
                if value is not None:
                    lines.append(f"- {label}: `{value}`")
            if finding.old is not None or finding.new is not None:
                lines.append(f"- change: `{finding.old}` -> `{finding.new}`")
            if finding.details:
                lines += [
                    "",
                    "```diff"
                    if any(d.startswith(("+", "-", "@@")) for d in finding.details)
                    else "```",
                    *finding.details,
                    "```",
                ]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def as_sarif(
    findings: Sequence[Finding], tool_version: str, fallback: str = LOCK_PATH.as_posix()
) -> str:
    """SARIF 2.1.0 for code-scanning UIs, which show results on files of the repository scanned:
    each result is located at ``ours`` (repository-relative), else at ``fallback`` (the lock);
    the upstream places, which are no file of ours, go into the message."""
    rules = {f.code: f.kind.describe for f in findings}
    results = []
    for finding in ordered(findings):
        where = finding.ours or Location(fallback)
        upstream = [
            f"{label} {place}"
            for label, place in (("before", finding.upstream), ("after", finding.target))
            if place is not None
        ]
        text = f"{finding.symbol}: {finding.message}"
        if upstream:
            text += f" (upstream {', '.join(upstream)})"
        result: dict[str, Any] = {
            "ruleId": finding.code,
            "level": _SARIF_LEVEL[finding.severity],
            "message": {"text": text},
            "locations": [{"physicalLocation": _physical(where)}],
        }
        if finding.declared is not None:  # the overlay declaration beside the failing line
            result["relatedLocations"] = [
                {
                    "id": 1,
                    "physicalLocation": _physical(finding.declared),
                    "message": {"text": "the overlay declaration of this use"},
                }
            ]
        results.append(result)
    document = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "afd-codegen",
                        "version": tool_version,
                        "rules": [
                            {"id": code, "shortDescription": {"text": text}}
                            for code, text in sorted(rules.items())
                        ],
                    }
                },
                "results": results,
            }
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def _physical(where: Location) -> dict[str, Any]:
    physical: dict[str, Any] = {"artifactLocation": {"uri": where.path}}
    if where.line:
        physical["region"] = {"startLine": where.line}
    return physical
