"""Quality of the drift checker: findings for real upgrades, and mutation testing against the real upstream.

python benchmarks/drift_quality.py [--count 120] [--seed 2026]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _results import write_section

from codegen.drift_cli import run_drift
from codegen.mutations import run, summarize
from codegen.report import counts

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=120)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    rows = []
    for version in ("0.27.0", "0.28.0"):
        result = run_drift(REPO, version)
        by = counts(result.findings)["by_severity"]
        rows.append(
            f"| 0.26.0 -> {version} | {len(result.findings)} | {by['block']} | {by['review']} | {by['info']} | {result.seconds:.1f} |"
        )
    report = summarize(run(args.count, args.seed))
    operators = "\n".join(f"| {name} | {score} |" for name, score in report["by_operator"].items())
    misses = (
        "\n".join(
            f"- {m['operator']} on {m['symbol']}: {', '.join(m['codes']) or 'no finding'}"
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
        f"Mutation testing (`python -m codegen.mutations --count {args.count} --seed {args.seed}`): "
        f"**{report['score']:.1%}** correct; mutations of recorded symbols detected {report['used_detected']}, "
        f"mutations of unrecorded symbols left silent {report['unused_silent']}.\n\n"
        "| operator | correct |\n| --- | --- |\n" + operators + f"\n\nMisses: {misses}",
    )


if __name__ == "__main__":
    main()
