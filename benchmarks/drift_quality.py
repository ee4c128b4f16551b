"""Quality of the drift checker: findings for real upgrades, and mutation testing against the real upstream.

python benchmarks/drift_quality.py [--count 120] [--seed 2026]
"""

from __future__ import annotations

import argparse
import itertools
import re
import tempfile
import time
from pathlib import Path

from _results import write_section
from mutations import run, summarize

from afd_models.release_order import release_key
from codegen.audit import run_audit
from codegen.drift_run import run_drift
from codegen.findings import Finding, Severity
from codegen.report import counts
from codegen.sources import load_pins

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "docs" / "reports"
#: one row of a reading's table: ``| n | severity | `CODE` | `symbol` | T, t or F | ... |``
READING_ROW = re.compile(
    r"^\| \d+ \| (?:block|review) \| `(DRF\d+)` \| `([^`]+)` \| ([TtF]) \|", re.M
)
#: the vLLM releases after the supported window (move them on when the window grows)
NEXT_RELEASES = ("0.33.0", "0.34.0")
#: how many lines of each audit's work list the section shows
WORK_LIST_LINES = 3


def real_upgrades() -> list[tuple[str, str]]:
    """Each supported vLLM release to the next one, and the newest to each of
    :data:`NEXT_RELEASES`: the upgrades the overlay made or faces, each from the release it
    already handled."""
    pin = load_pins(REPO / "overlay" / "pins.toml")["vllm"]
    supported = sorted(pin.supported, key=release_key)
    return [
        *itertools.pairwise(supported),
        *((supported[-1], release) for release in NEXT_RELEASES),
    ]


#: how the work-list heads shorten the package of generated classes: a class generated only for
#: a release after the window does not import here, and docs/*.md's dotted paths must
#: (``codegen check``, PTH001)
GENERATED_SHORT = ("afd_models._generated.", "_generated.")


def work_list_heads() -> list[str]:
    """The first lines of the audit of each release after the window (its default base), as
    a maintainer reads them first (generated classes as ``_generated.module:Class``)."""
    lines = []
    for release in NEXT_RELEASES:
        with tempfile.TemporaryDirectory(prefix="afd-audit-") as out:
            run_audit(REPO, release, out=Path(out))
            text = (Path(out) / "audit.md").read_text()
        items = text.split("## Work list\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
        heads = [
            line[:400].replace(*GENERATED_SHORT) + (" ..." if len(line) > 400 else "")
            for line in items[:WORK_LIST_LINES]
        ]
        lines += [f"`python -m codegen audit --to {release}`:", "", "```", *heads, "```", ""]
    return lines


def false_share(old: str, new: str, findings: list[Finding]) -> str:
    """The share of block and review findings the committed reading marks F (false), or why it
    cannot be told: a reading that misses a finding of this run is stale, not a number."""
    name = f"drift-{old}-to-{new}.reading.md"
    alarms = [f for f in findings if f.severity is not Severity.INFO]
    if not alarms:
        return "none to read"
    if not (REPORTS / name).exists():
        return "no reading"
    text = (REPORTS / name).read_text()
    marks = {(code, symbol): mark for code, symbol, mark in READING_ROW.findall(text)}
    unread = {(f.code, f.symbol) for f in alarms} - marks.keys()
    if unread:
        return f"reading stale: {len(unread)} finding(s) unread"
    false = sum(marks[(f.code, f.symbol)] == "F" for f in alarms)
    return f"{false}/{len(alarms)} = {false / len(alarms):.0%} ([reading](reports/{name}))"


def upgrade_rows() -> list[str]:
    rows = []
    for old, new in real_upgrades():
        result = run_drift(REPO, new, from_version=old)
        by = counts(result.findings)["by_severity"]
        rows.append(
            f"| {old} -> {new} | {len(result.findings)} | {by['block']} | {by['review']} | {by['info']} "
            f"| {false_share(old, new, result.findings)} | {result.seconds:.1f} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=120)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    rows = upgrade_rows()
    heads = work_list_heads()
    started = time.monotonic()
    report = summarize(run(args.count, args.seed))
    report["seconds"] = time.monotonic() - started
    operators = "\n".join(f"| {name} | {score} |" for name, score in report["by_operator"].items())
    misses = (
        "\n".join(
            f"- {m['operator']} on `{m['symbol']}` ({m['path']}:{m['line']}): expected "
            f"{m['expected']}, got {', '.join(m['codes']) or 'no finding'}"
            for m in report["misses"]
        )
        or "none"
    )
    write_section(
        "drift_quality",
        "Real upgrades (each supported release to the next, and the newest to the next release), "
        "each compared with the release before it as `codegen drift` does by default. False alarms: "
        "the block and review findings the committed reading in docs/reports marks F (needed no "
        "change and told nothing new):\n\n"
        "| upgrade | findings | block | review | info | false alarms | seconds |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n\n"
        "The first lines of each audit's work list (what a maintainer does first; "
        "`_generated.` is `afd_models._generated.`):\n\n" + "\n".join(heads) + "\n"
        f"Mutation testing (`python benchmarks/mutations.py --count {args.count} --seed {args.seed}`, "
        f"{report['seconds']:.0f} s): **{report['score']:.1%}** correct. A mutation of a symbol the "
        "lock records counts as detected only if drift reports the code that names the break "
        "(the table in benchmarks/mutations.py); a mutation of a function or method the "
        "lock does not record, in an upstream file it tracks, must get no finding at all. "
        f"Recorded symbols detected {report['used_detected']}, unrecorded symbols left silent "
        f"{report['unused_silent']}.\n\n"
        "| operator | correct |\n| --- | --- |\n" + operators + f"\n\nMisses:\n\n{misses}",
    )


if __name__ == "__main__":
    main()
