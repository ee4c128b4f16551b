"""Draw docs/plots/serving.png from the figures ``benchmarks/serving.py`` wrote.

    python benchmarks/plot_serving.py      (``nox -s plots`` runs it with matplotlib)

Two panels against concurrency: output tokens/s, and TPOT median, one line per deployment.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: write the file only
import matplotlib.pyplot as plt

PLOTS = Path(__file__).resolve().parent.parent / "docs" / "plots"


def main() -> int:
    figures = PLOTS / "serving.json"
    if not figures.exists():
        print(f"{figures} is missing: run `python benchmarks/serving.py` first", file=sys.stderr)
        return 2
    lines: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for run in json.loads(figures.read_text()):
        lines[run["deployment"]].append(
            (run["concurrency"], run["output_tokens_per_s"], run["tpot_median_ms"])
        )
    fig, (throughput, tpot) = plt.subplots(1, 2, figsize=(10, 4))
    for name, points in lines.items():
        points.sort()
        concurrency = [p[0] for p in points]
        style = "-o" if name.startswith("AFD") else "--s"
        throughput.plot(concurrency, [p[1] for p in points], style, label=name)
        tpot.plot(concurrency, [p[2] for p in points], style, label=name)
    ticks = sorted({p[0] for points in lines.values() for p in points})
    for axes, label in ((throughput, "output tokens/s"), (tpot, "TPOT median, ms")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(ticks, [str(t) for t in ticks])
        axes.minorticks_off()
        axes.set_xlabel("concurrent requests (vllm bench serve)")
        axes.set_ylabel(label)
        axes.grid(True, alpha=0.3)
    throughput.legend(fontsize=8)
    fig.suptitle("Tiny DeepSeek-V2 on the same two CPU cores: the AFD pair and plain vLLM")
    fig.tight_layout()
    out = PLOTS / "serving.png"
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
