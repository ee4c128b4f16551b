"""The GPU check's command line: ``python -m tools.gpu_check``.

Exit codes (the project's, :class:`afd_models.commandline.ExitCode`): 0 every run that ran passed; 2 a
comparison or counter check failed; 3 bad usage, a host that cannot run the check (no vLLM and no
``--bundle``, no CUDA device, stale generated code), or the check itself crashed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from afd_models.commandline import CommandParser
from tools.gpu_check.host import base_env, default_target, install_bundle, prepare
from tools.gpu_check.modes import MODES, VLLM_VERSION, Gate, Mode
from tools.gpu_check.plan import Deadline, Runner, check, run_order
from tools.gpu_check.report import Report, render
from tools.gpu_check.runs import CHILDREN, Setup
from tools.harness.cli import UsageError, guarded, write_json

PROG = "python -m tools.gpu_check"
DESCRIPTION = (
    "Check the AFD CUDA runtime against native vLLM on this GPU host, on vLLM's V1 runner and "
    "on Model Runner V2 (vLLM 0.30+), and report."
)


@dataclass(frozen=True)
class Options:
    modes: tuple[Mode, ...]
    gates: tuple[Gate, ...]
    bundle: Path | None = None
    target: Path | None = None
    json_path: Path | None = None
    work_dir: Path | None = None
    engine_timeout_s: float = 300.0
    nccl: bool = True
    #: seconds from the command's start after which no run starts that would not finish
    deadline_s: float | None = None


EPILOG = (
    "Order: the modes full-decode-only, piecewise, eager (then dbo and the -v2 modes where they "
    "run) with the gate on the FFN role, then the same with the gate on attention; the NCCL "
    "pair (two devices) last. A mode's native engine runs before its first AFD run. "
    "Deadline: with --deadline S no run starts that is not expected to end within S seconds of "
    "the command's start (install and model included; each mode's expected time per engine on "
    "an H100 is in the report and in docs/gpu.md). "
    "Report: written as JSON after every run (atomically) to --json, default WORK_DIR/report.json, "
    'so a check cut off keeps every finished run ("finished": false); the table is printed at '
    "the end. Exit codes: 0 passed, 2 a check failed, 3 bad usage, unusable host or crash."
)


def build_parser() -> argparse.ArgumentParser:
    runnable = ", ".join(m.name for m in MODES)
    parser = CommandParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=f"Modes: {runnable}; in the NCCL pair only: "
        + ", ".join(m.name for m in MODES if m.no_loopback)
        + ". "
        + EPILOG,
    )
    parser.add_argument(
        "--bundle",
        type=Path,
        metavar="DIR",
        help="parts from `python -m tools.gpu_bundle build`: install vLLM from them first",
    )
    parser.add_argument(
        "--target",
        type=Path,
        metavar="DIR",
        help=f"where --bundle installs (default: {default_target()})",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="MODE",
        help=f"run only this mode (repeatable): {runnable}",
    )
    parser.add_argument(
        "--gate",
        metavar="WHERE",
        help="run only this gate placement: attention or ffn (default: both)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="the JSON report, rewritten after every run (default: WORK_DIR/report.json)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        metavar="S",
        help="seconds from the start (install included) after which no run starts that is not "
        "expected to finish in time (default: none)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        metavar="DIR",
        help="model, logs and caches (default: a new temporary directory)",
    )
    parser.add_argument(
        "--engine-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds one engine may take (default: %(default)s)",
    )
    parser.add_argument("--skip-nccl", action="store_true", help="do not run the two-GPU NCCL pair")
    return parser


def options_from(args: argparse.Namespace) -> Options:
    """Validate the arguments. Raises UsageError naming the bad value and the allowed ones."""
    allowed = ", ".join(m.name for m in MODES)
    chosen = []
    for name in args.only or [m.name for m in MODES]:
        mode = next((m for m in MODES if m.name == name), None)
        if mode is None:
            raise UsageError(f"--only {name!r} is not a mode; allowed: {allowed}")
        if mode not in chosen:
            chosen.append(mode)
    gates = tuple(Gate)
    if args.gate is not None:
        if args.gate not in {g.value for g in Gate}:
            raise UsageError(
                f"--gate {args.gate!r} is not a gate placement; allowed: attention, ffn"
            )
        gates = (Gate(args.gate),)
    if args.engine_timeout <= 0:
        raise UsageError(
            f"--engine-timeout {args.engine_timeout} is not allowed; allowed: seconds > 0"
        )
    ordered = tuple(m for m in MODES if m in chosen)
    if args.deadline is not None:
        first = run_order([m for m in ordered if m.no_loopback is None] or ordered, gates)[0]
        least = first.expected_s(native_done=False)
        if not args.deadline >= least:
            raise UsageError(
                f"--deadline {args.deadline:g} leaves no time for the first run ({first.label()}: "
                f"a native and an AFD engine, expected {least:.0f} s on an H100, after the install "
                f"and the model); allowed: seconds >= {least:.0f}"
            )
    if args.json is not None:
        parent = args.json.resolve().parent
        if not (parent.is_dir() and os.access(parent, os.W_OK)):
            # found now, not after the first run: its report would be lost
            raise UsageError(
                f"--json {args.json}: {parent} is not a writable directory; allowed: a path "
                "in a writable directory"
            )
    if args.bundle is not None and not (args.bundle / "manifest.json").is_file():
        raise UsageError(
            f"--bundle {args.bundle} has no manifest.json: pass the directory of the parts"
        )
    return Options(
        modes=ordered,
        gates=gates,
        bundle=args.bundle,
        target=args.target,
        json_path=args.json,
        work_dir=args.work_dir,
        engine_timeout_s=args.engine_timeout,
        nccl=not args.skip_nccl,
        deadline_s=args.deadline,
    )


def vllm_importable() -> bool:
    """Whether this interpreter finds vLLM (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def resolve_env(
    options: Options, vllm_found: bool, install: Callable[[Path, Path], None] = install_bundle
) -> dict[str, str]:
    """The engines' environment; installs the bundle (with ``install``) when one is given.
    Raises UsageError when vLLM is missing and no bundle is given."""
    if options.bundle is None:
        if not vllm_found:
            raise UsageError(
                f"vLLM is not importable by {sys.executable}: pass --bundle DIR (the parts of "
                "`python -m tools.gpu_bundle build`), or run with a Python that has a "
                f"supported vLLM's CUDA build (the bundle's: {VLLM_VERSION})"
            )
        return base_env()
    target = options.target or default_target()
    CHILDREN.log(f"installing the bundle {options.bundle} into {target}")
    install(options.bundle, target)
    return base_env([target])


@dataclass(frozen=True)
class Host:
    """What the check asks of the machine; the unit tests pass fakes."""

    #: whether this interpreter finds vLLM
    vllm_importable: Callable[[], bool] = vllm_importable
    #: install a bundle's parts into a target directory
    install: Callable[[Path, Path], None] = install_bundle
    #: probe the host and write the model (:func:`prepare`)
    prepare: Callable[[Path, Mapping[str, str], float], Setup] = prepare
    #: runs the engines; None: :mod:`tools.gpu_check.runs`
    runner: Runner | None = None


def run(options: Options, host: Host, started: float | None = None) -> int:
    """The whole check for validated options; its exit code. ``started``: when the command
    started (``time.monotonic()``), from which ``--deadline`` counts."""
    deadline = Deadline(options.deadline_s, time.monotonic() if started is None else started)
    env = resolve_env(options, host.vllm_importable(), host.install)
    work_dir = options.work_dir or Path(tempfile.mkdtemp(prefix="afd-gpu-check-"))
    json_path = options.json_path or work_dir / "report.json"
    setup = host.prepare(work_dir, env, options.engine_timeout_s)

    def save(report: Report) -> None:
        write_json(report.as_dict(), json_path)
        CHILDREN.log(f"report so far in {json_path} ({deadline.elapsed():.0f} s)")

    report = check(
        options.modes,
        options.gates,
        setup,
        nccl=options.nccl,
        deadline=deadline,
        runner=host.runner,
        on_progress=save,
    )
    write_json(report.as_dict(), json_path)
    print(render(report), flush=True)
    CHILDREN.log(f"JSON report in {json_path}; whole check: {deadline.elapsed():.0f} s")
    return int(report.exit_code())


def main(argv: list[str] | None = None, host: Host | None = None) -> int:
    """0 passed, 2 a check failed, 3 bad usage, a host that cannot run it, or a crash."""
    started = time.monotonic()
    args = build_parser().parse_args(argv)  # exits 3 on a malformed command line, 0 for --help
    return guarded(PROG, lambda: run(options_from(args), host or Host(), started))
