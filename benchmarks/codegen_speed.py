"""Codegen speed: cold and no-change ``regenerate`` and ``drift`` against the time to libcst-parse the inputs once.

    python benchmarks/codegen_speed.py [--repeat 3]

Targets (docs/benchmarks.md): a cold ``regenerate --all-versions`` (the generated code of the
installed release and the lock of every supported one) <= 1.5x the libcst parse of the inputs of
every supported release, a no-change regenerate < 1 s, ``drift`` from the newest supported release
to the next (warm caches) <= 2x one cold regenerate of all releases. All measured in one run as
fresh processes, the best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import libcst as cst
from _results import write_section

from codegen.generate import PINS_PATH
from codegen.pipeline import generate, open_context
from codegen.sources import load_pins

REPO = Path(__file__).resolve().parent.parent
#: the release after the newest supported one, as a maintainer's next upgrade compares it
NEXT_RELEASE = "0.33.0"


def wall(*args: str, ok: tuple[int, ...] = (0,)) -> float:
    """Seconds ``python -m codegen ARGS`` took. A command that fails (an exit status not in
    ``ok``) ends the benchmark with its output: a failure is never timed as a fast success."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "codegen", *args],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.perf_counter() - started
    if done.returncode not in ok:
        raise SystemExit(
            f"`python -m codegen {' '.join(args)}` exited {done.returncode}, not timed:\n"
            f"{done.stdout}{done.stderr}"
        )
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    supported = load_pins(REPO / PINS_PATH)["vllm"].supported
    sources = []
    for version in supported:
        _, index = generate(open_context(REPO, version=version, quiet=True))
        sources += [info.source for info in index.loaded()]
    parse_times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        for source in sources:
            cst.parse_module(source)
        parse_times.append(time.perf_counter() - started)
    parse = min(parse_times)
    # exit 1: generated, with findings to review; 2: blocked, nothing written; 3: the tool failed
    cold = min(
        wall("regenerate", "--force", "--all-versions", ok=(0, 1)) for _ in range(args.repeat)
    )
    warm = min(wall("regenerate", ok=(0, 1)) for _ in range(args.repeat))
    # drift exits 1 or 2 when it has findings to review or that block
    drift = min(
        wall("drift", "--to", NEXT_RELEASE, "--out", "/dev/null", ok=(0, 1, 2))
        for _ in range(args.repeat)
    )
    kib = sum(len(s) for s in sources) // 1024
    write_section(
        "codegen_speed",
        f"""
| measurement | seconds | ratio | target |
| --- | --- | --- | --- |
| libcst parse of the {len(sources)} upstream input files of {", ".join(supported)} ({kib} KiB), once | {parse:.2f} | 1.00 | |
| cold `regenerate --force --all-versions` (fresh process) | {cold:.2f} | {cold / parse:.2f} x parse | <= 1.5 x parse |
| no-change `regenerate` (fresh process) | {warm:.2f} | | < 1 s |
| `drift --to {NEXT_RELEASE}` (from {supported[-1]}), warm caches (fresh process) | {drift:.2f} | {drift / cold:.2f} x regenerate | <= 2 x regenerate |

Why cold generation stays close to one libcst parse of its inputs: the generator indexes upstream
with Python's `ast` (C parser) and parses only the forked methods with libcst; files are parsed
once per content hash.
""",
    )


if __name__ == "__main__":
    main()
