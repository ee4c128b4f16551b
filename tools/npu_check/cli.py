"""The NPU check's command line: ``python -m tools.npu_check``.

Exit codes (the project's, :class:`afd_models.commandline.ExitCode`): 0 both checks passed; 2 a check
failed; 3 bad usage, a host that cannot run the check (no torch_npu or vLLM-Ascend, the ``afd_npu``
platform plugin not installed or not selected by ``VLLM_PLUGINS``, no NPU, other versions, stale
generated code), or the check itself crashed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from afd_models.commandline import CommandParser
from tools.harness.cli import UsageError, guarded, write_json
from tools.harness.processes import REPO_ROOT
from tools.npu_check import checks
from tools.npu_check.checks import CheckResult
from tools.npu_check.host import (
    CHILDREN,
    Setup,
    installed_platform_plugins,
    plugins_problem,
    prepare,
)
from tools.npu_check.report import Report, render
from tools.npu_check.settings import (
    AFD_PLUGINS,
    ENGINE_ENV,
    PLATFORM_PLUGIN,
    VLLM_ASCEND_VERSION,
)

PROG = "python -m tools.npu_check"
DESCRIPTION = "Validate an AFD install on an Ascend NPU host (vLLM-Ascend 0.26.0rc1), and report."


class Runner(Protocol):
    """What runs the checks: :mod:`tools.npu_check.checks`, or the unit tests' fakes."""

    def run_origin_check(self, setup: Setup) -> CheckResult: ...

    def run_parity(self, setup: Setup) -> CheckResult: ...


def _os_environ() -> Mapping[str, str]:
    return os.environ


@dataclass(frozen=True)
class Host:
    """What the check asks of the machine; the unit tests pass fakes."""

    #: whether this interpreter finds a module (without importing it)
    find_spec: Callable[[str], object | None] = importlib.util.find_spec
    #: the installed ``vllm.platform_plugins`` entry point names
    platform_plugins: Callable[[], set[str]] = installed_platform_plugins
    #: the operator's environment
    environ: Callable[[], Mapping[str, str]] = _os_environ
    #: probe the host and write the model (:func:`tools.npu_check.host.prepare`)
    prepare: Callable[[Path, Mapping[str, str], float], Setup] = prepare
    #: runs the checks; None: :mod:`tools.npu_check.checks`
    runner: Runner | None = None


def resolve_env(host: Host) -> dict[str, str]:
    """The environment of the processes this check starts. Raises UsageError, before anything
    runs, naming what is missing and what to install or set."""
    missing = [name for name in ("torch_npu", "vllm_ascend") if host.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"{' and '.join(missing)} not importable by {sys.executable} (no Ascend NPU stack): "
            f"install CANN and torch_npu as vLLM-Ascend {VLLM_ASCEND_VERSION}'s installation guide "
            'says, then `pip install -e ".[npu,codegen]"` from this checkout (docs/npu.md), and '
            "run this with that Python"
        )
    if PLATFORM_PLUGIN not in host.platform_plugins():
        raise UsageError(
            f"the {PLATFORM_PLUGIN!r} vllm.platform_plugins entry point is not installed for "
            f'{sys.executable}: `pip install -e ".[npu,codegen]"` from this checkout'
        )
    environ = host.environ()
    problem = plugins_problem(environ.get("VLLM_PLUGINS"))
    if problem is not None:
        raise UsageError(f"{problem}; set exactly: export VLLM_PLUGINS={AFD_PLUGINS}")
    env = {**environ, **ENGINE_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), environ.get("PYTHONPATH")]))
    return env


def check(setup: Setup, runner: Runner | None = None) -> Report:
    """Both checks; ``runner`` runs them (:mod:`tools.npu_check.checks` by default; the unit
    tests pass fakes)."""
    chosen: Runner = checks if runner is None else runner
    results = (chosen.run_origin_check(setup), chosen.run_parity(setup))
    for result in results:
        CHILDREN.log(f"{result.name}: {'PASS' if result.passed else 'FAIL'}")
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return Report(date, setup.host, results, str(setup.work_dir))


@dataclass(frozen=True)
class Options:
    json_path: Path | None = None
    work_dir: Path | None = None
    engine_timeout_s: float = 600.0


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=f"Needs VLLM_PLUGINS={AFD_PLUGINS}. Exit codes: 0 passed, 2 a check failed, "
        "3 bad usage, unusable host or crash.",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the report as JSON")
    parser.add_argument(
        "--work-dir",
        type=Path,
        metavar="DIR",
        help="model, logs and reports (default: a new temporary directory)",
    )
    parser.add_argument(
        "--engine-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds one engine may take (default: %(default)s)",
    )
    return parser


def options_from(args: argparse.Namespace) -> Options:
    """Validate the arguments. Raises UsageError naming the bad value and the allowed ones."""
    if not args.engine_timeout > 0:
        raise UsageError(
            f"--engine-timeout {args.engine_timeout} is not allowed; allowed: seconds > 0"
        )
    if args.json is not None and args.json.is_dir():
        raise UsageError(f"--json {args.json} is a directory; allowed: a file path")
    return Options(args.json, args.work_dir, args.engine_timeout)


def run(options: Options, host: Host) -> int:
    """The whole check for validated options; its exit code."""
    began = time.monotonic()
    env = resolve_env(host)
    work_dir = options.work_dir or Path(tempfile.mkdtemp(prefix="afd-npu-check-"))
    setup = host.prepare(work_dir, env, options.engine_timeout_s)
    report = check(setup, host.runner)
    print(render(report), flush=True)
    if options.json_path is not None:
        write_json(report.as_dict(), options.json_path)
        CHILDREN.log(f"JSON report in {options.json_path}")
    CHILDREN.log(f"whole check: {time.monotonic() - began:.0f} s")
    return int(report.exit_code())


def main(argv: Sequence[str] | None = None, host: Host | None = None) -> int:
    """0 passed, 2 a check failed, 3 bad usage, a host that cannot run it, or a crash."""
    args = build_parser().parse_args(argv)  # exits 3 on a malformed command line, 0 for --help
    return guarded(PROG, lambda: run(options_from(args), host or Host()))
