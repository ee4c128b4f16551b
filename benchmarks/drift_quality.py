"""Quality of the drift checker: findings for real upgrades, and mutation testing against the real upstream.

python benchmarks/drift_quality.py [--count 120] [--seed 2026]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _results import write_section
from mutations import run, summarize

from codegen.drift.run import run_drift
from codegen.report import counts

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=120)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    rows = []
    for version in ("0.27.0", "0.28.0", "0.30.0", "0.32.0"):
        result = run_drift(REPO, version)
        by = counts(result.findings)["by_severity"]
        rows.append(
            f"| 0.26.0 -> {version} | {len(result.findings)} | {by['block']} | {by['review']} | {by['info']} | {result.seconds:.1f} |"
        )
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
        "Real upgrades (drift from the pinned 0.26.0; reading of each finding in maintainers.md):\n\n"
        "| upgrade | findings | block | review | info | seconds |\n| --- | --- | --- | --- | --- | --- |\n"
        + "\n".join(rows)
        + "\n\n"
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
