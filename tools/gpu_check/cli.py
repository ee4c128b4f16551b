"""The GPU check's command line: ``python -m tools.gpu_check``.

Exit codes (the project's, :class:`codegen.findings.ExitCode`): 0 every run that ran passed; 2 a
comparison or counter check failed; 3 bad usage, a host that cannot run the check (no vLLM and no
``--bundle``, no CUDA device, stale generated code), or the check itself crashed.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from afd_models.commandline import CommandParser
from afd_models.release_order import release_key
from tools.gpu_check import runs
from tools.gpu_check.host import base_env, default_target, install_bundle, prepare
from tools.gpu_check.modes import MODES, VLLM_VERSION, Gate, Mode
from tools.gpu_check.report import ModeReport, ModeStatus, NcclReport, NcclStatus, Report, render
from tools.gpu_check.runs import CHILDREN, Setup
from tools.gpu_check.verdict import PairResult
from tools.harness.cli import UsageError, guarded, write_json
from tools.harness.results import EngineResult

PROG = "python -m tools.gpu_check"
DESCRIPTION = (
    "Check the AFD CUDA runtime against native vLLM on this GPU host, on vLLM's V1 runner and "
    "on Model Runner V2 (vLLM 0.30+), and report."
)


class Runner(Protocol):
    """What runs the engines: :mod:`tools.gpu_check.runs`, or the unit tests' fakes."""

    def run_native(self, mode: Mode, setup: Setup) -> EngineResult: ...

    def run_pair(
        self, mode: Mode, gate: Gate, setup: Setup, native: EngineResult
    ) -> PairResult: ...

    def run_nccl_pair(
        self, mode: Mode, gate: Gate, setup: Setup, native: EngineResult
    ) -> PairResult: ...


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


def build_parser() -> argparse.ArgumentParser:
    runnable = ", ".join(m.name for m in MODES)
    parser = CommandParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=f"Modes: {runnable}; in the NCCL pair only: "
        + ", ".join(m.name for m in MODES if m.no_loopback)
        + ". Exit codes: 0 passed, 2 a check failed, 3 bad usage, unusable host or crash.",
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
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the report as JSON")
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
    if args.bundle is not None and not (args.bundle / "manifest.json").is_file():
        raise UsageError(
            f"--bundle {args.bundle} has no manifest.json: pass the directory of the parts"
        )
    ordered = tuple(m for m in MODES if m in chosen)
    return Options(
        modes=ordered,
        gates=gates,
        bundle=args.bundle,
        target=args.target,
        json_path=args.json,
        work_dir=args.work_dir,
        engine_timeout_s=args.engine_timeout,
        nccl=not args.skip_nccl,
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


def check(options: Options, setup: Setup, runner: Runner | None = None) -> Report:
    """Run every selected mode and gate (and the NCCL pair when two devices are visible).

    ``runner`` runs the engines (:mod:`tools.gpu_check.runs` by default; the unit tests pass
    fakes).
    """
    engines: Runner = runs if runner is None else runner
    too_old = {m.name: why for m in options.modes if (why := needs_newer_vllm(m, setup.host.vllm))}
    nccl_modes = [m for m in options.modes if m.nccl and m.name not in too_old]
    nccl_skipped: str | None = None
    if not options.nccl:
        nccl_skipped = "--skip-nccl"
    elif len(setup.host.device_ids) < 2:
        nccl_skipped = (
            f"needs two CUDA devices, found {len(setup.host.device_ids)}: NCCL cannot put two "
            "ranks of one communicator on one GPU"
        )
    elif not nccl_modes:
        runs_it = ", ".join(m.name for m in MODES if m.nccl)
        nccl_skipped = f"no selected mode runs it ({runs_it} do)"
    reports: list[ModeReport] = []
    natives: dict[str, EngineResult] = {}
    for mode in MODES:
        if mode not in options.modes:
            reports.append(ModeReport(mode, ModeStatus.NOT_SELECTED, "left out by --only"))
            continue
        if mode.name in too_old:
            reports.append(ModeReport(mode, ModeStatus.NEEDS_NEWER_VLLM, too_old[mode.name]))
            continue
        if mode.no_loopback is not None:
            # the native run serves the NCCL pair, when it runs
            if nccl_skipped is None:
                natives[mode.name] = engines.run_native(mode, setup)
            reason = mode.no_loopback + (
                f"; the NCCL pair is skipped: {nccl_skipped}" if nccl_skipped else ""
            )
            reports.append(ModeReport(mode, ModeStatus.NCCL_ONLY, reason))
            continue
        natives[mode.name] = engines.run_native(mode, setup)
        pairs = [engines.run_pair(mode, gate, setup, natives[mode.name]) for gate in options.gates]
        for pair in pairs:
            verdict = "PASS" if pair.passed else "FAIL"
            CHILDREN.log(f"{mode.name}, gate on {pair.gate.value}: {verdict}")
        reports.append(ModeReport(mode, ModeStatus.RAN, runs=tuple(pairs)))
    if nccl_skipped is not None:
        nccl = NcclReport(NcclStatus.SKIPPED, nccl_skipped)
    else:
        nccl_pairs = [
            engines.run_nccl_pair(mode, gate, setup, natives[mode.name])
            for mode in nccl_modes
            for gate in options.gates
        ]
        nccl = NcclReport(NcclStatus.RAN, runs=tuple(nccl_pairs))
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return Report(date, setup.host, tuple(reports), nccl, str(setup.work_dir))


def needs_newer_vllm(mode: Mode, vllm_version: str) -> str | None:
    """Why ``mode`` cannot run with the host's vLLM (its runner came later), None if it can."""
    since = mode.runner.since
    if since is None or release_key(vllm_version) >= release_key(since):
        return None
    return (
        f"the AFD Attention role runs on Model Runner {mode.runner.value.upper()} from vLLM "
        f"{since}; this host has vLLM {vllm_version}"
    )


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


def run(options: Options, host: Host) -> int:
    """The whole check for validated options; its exit code."""
    began = time.monotonic()
    env = resolve_env(options, host.vllm_importable(), host.install)
    work_dir = options.work_dir or Path(tempfile.mkdtemp(prefix="afd-gpu-check-"))
    setup = host.prepare(work_dir, env, options.engine_timeout_s)
    report = check(options, setup, host.runner)
    print(render(report), flush=True)
    if options.json_path is not None:
        write_json(report.as_dict(), options.json_path)
        CHILDREN.log(f"JSON report in {options.json_path}")
    CHILDREN.log(f"whole check: {time.monotonic() - began:.0f} s")
    return int(report.exit_code())


def main(argv: list[str] | None = None, host: Host | None = None) -> int:
    """0 passed, 2 a check failed, 3 bad usage, a host that cannot run it, or a crash."""
    args = build_parser().parse_args(argv)  # exits 3 on a malformed command line, 0 for --help
    return guarded(PROG, lambda: run(options_from(args), host or Host()))
