"""``python -m codegen`` / ``afd-codegen``: regenerate, check, show, drift, audit.

Exit codes for every command (:class:`~afd_models.commandline.ExitCode`): 0 clean, 1 something to
review, 2 something blocks, 3 a usage error or the tool itself failed. An exception is never a
pass.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from afd_models.commandline import CommandParser, ExitCode
from codegen.audit import run_audit
from codegen.checks.suite import run_checks
from codegen.drift_run import UnknownPackage, drift_markdown, run_drift
from codegen.fetch import FetchError
from codegen.findings import Finding, exit_code, summary
from codegen.generate import PINS_PATH
from codegen.pipeline import generate, open_context, up_to_date, write_lock, write_output
from codegen.report import as_json, as_sarif, print_findings, progress
from codegen.show import ShowError, show
from codegen.sources import SourceError, choose_version, load_pins

REPO_ROOT = Path(__file__).resolve().parent.parent


def _vllm_version(args: argparse.Namespace) -> str:
    """``--vllm-version``, else the installed vLLM, else the primary pin (supported ones only)."""
    pin = load_pins(args.repo / PINS_PATH)["vllm"]
    reads_installed = not args.no_installed and args.upstream_root is None
    return choose_version(pin, args.vllm_version, use_installed=reads_installed)


def _all_versions_alone(args: argparse.Namespace) -> bool:
    """Whether ``--all-versions`` comes without options naming one release (else it says so)."""
    if args.vllm_version or args.upstream_root:
        print(
            f"codegen {args.command}: --all-versions reads every supported release itself; drop "
            f"--vllm-version and --upstream-root; exit {ExitCode.ERROR.value}",
            file=sys.stderr,
        )
        return False
    return True


def _regenerate_locks(args: argparse.Namespace, on_disk: str) -> int:
    """``--all-versions``: the lock of every supported release other than ``on_disk``."""
    if not _all_versions_alone(args):
        return ExitCode.ERROR
    for version in load_pins(args.repo / PINS_PATH)["vllm"].supported:
        if version == on_disk:
            continue
        context = open_context(args.repo, use_installed=not args.no_installed, version=version)
        progress(f"vllm {version}: generating its lock")
        generation, _ = generate(context)
        if generation.blocked:
            print_findings(generation.findings, "text", verbose=True)
            progress(f"vllm {version}: nothing written: {summary(generation.findings)}")
            return ExitCode.BLOCK
        write_lock(args.repo, generation)
        progress(f"vllm {version}: wrote {generation.lock_path}")
    return ExitCode.CLEAN


def cmd_regenerate(args: argparse.Namespace) -> int:
    started = time.monotonic()
    version = _vllm_version(args)
    if args.all_versions and (status := _regenerate_locks(args, version)):
        return status
    context = open_context(
        args.repo,
        upstream_root=args.upstream_root,
        use_installed=not args.no_installed,
        version=version,
    )
    origins = ", ".join(
        f"{s.package} {s.version} from {s.origin}" for s in context.sources.values()
    )
    if not args.force and up_to_date(context):
        progress(f"up to date ({origins}) in {time.monotonic() - started:.2f} s")
        return ExitCode.CLEAN
    progress(f"generating against {origins}")
    generation, _ = generate(context)
    if generation.blocked:
        print_findings(generation.findings, "text", verbose=True)
        progress(f"nothing written: {summary(generation.findings)}")
        return ExitCode.BLOCK
    write_output(args.repo, generation)
    print_findings(generation.findings, "text", verbose=args.verbose)
    progress(
        f"wrote {len(generation.files)} files, {len(generation.classes)} classes, {generation.lock_path} "
        f"in {time.monotonic() - started:.2f} s ({summary(generation.findings)})"
    )
    return exit_code(generation.findings)


def cmd_check(args: argparse.Namespace) -> int:
    if args.all_versions:
        if not _all_versions_alone(args):
            return ExitCode.ERROR
        versions = load_pins(args.repo / PINS_PATH)["vllm"].supported
    else:
        versions = (_vllm_version(args),)
    findings: list[Finding] = []
    for version in versions:
        findings.extend(
            run_checks(
                args.repo,
                upstream_root=args.upstream_root,
                use_installed=not args.no_installed,
                version=version,
                runtime=not args.no_runtime,
                progress=progress,
                tag=len(versions) > 1,
            )
        )
    findings = list(dict.fromkeys(findings))  # the repository-wide scans ran once per release
    print_findings(findings, args.format, args.verbose)
    if args.format == "text":
        print(f"codegen check: {summary(findings)}")
    return exit_code(findings)


def cmd_show(args: argparse.Namespace) -> int:
    try:
        text = show(
            args.repo,
            args.symbol,
            upstream_root=args.upstream_root,
            use_installed=not args.no_installed,
            version=_vllm_version(args),
        )
    except ShowError as exc:  # a usage error, not a crash: no traceback
        print(f"codegen show: {exc}; exit {ExitCode.ERROR.value}", file=sys.stderr)
        return ExitCode.ERROR
    print(text)
    return ExitCode.CLEAN


def cmd_drift(args: argparse.Namespace) -> int:
    try:
        run = run_drift(
            args.repo,
            args.to,
            package=args.package,
            from_version=args.from_version,
            from_root=args.from_root,
            to_root=args.to_root,
            progress=progress,
        )
    except UnknownPackage as exc:
        print(f"codegen drift: {exc}; exit {ExitCode.ERROR.value}", file=sys.stderr)
        return ExitCode.ERROR
    if args.format == "json":
        _write(as_json(run.findings, run.header()), args.out)
    elif args.format == "sarif":
        _write(as_sarif(run.findings, run.new_version), args.out)
    else:
        _write(drift_markdown(run), args.out)
    progress(
        f"drift {run.package} {run.old_version} -> {run.new_version}: {summary(run.findings)} in {run.seconds:.1f} s"
    )
    return exit_code(run.findings)


def cmd_audit(args: argparse.Namespace) -> int:
    return run_audit(
        args.repo,
        args.to,
        from_version=args.from_version,
        to_root=args.to_root,
        out=args.out,
        apply=args.apply,
        progress=progress,
    )


def _write(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


def _add_source_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--upstream-root", type=Path, help="read vLLM from this source tree instead"
    )
    parser.add_argument(
        "--no-installed",
        action="store_true",
        help="ignore an installed vLLM; use the download cache",
    )
    parser.add_argument(
        "--vllm-version",
        help="a supported vLLM release (overlay/pins.toml); default: the installed one, else the primary pin",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m codegen", description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)

    regenerate = sub.add_parser(
        "regenerate", help="write afd_models/_generated/ and overlay/overlay.lock"
    )
    _add_source_options(regenerate)
    regenerate.add_argument(
        "--force", action="store_true", help="regenerate even if nothing changed"
    )
    regenerate.add_argument(
        "--all-versions",
        action="store_true",
        help="also write the lock of every other supported vLLM release (generated code: one release)",
    )
    regenerate.add_argument("-v", "--verbose", action="store_true")
    regenerate.set_defaults(func=cmd_regenerate)

    check = sub.add_parser(
        "check",
        help="signatures, lock, generated files, runtime parity, dotted paths, monkey patches",
    )
    _add_source_options(check)
    check.add_argument("--format", choices=["text", "json"], default="text")
    check.add_argument("--no-runtime", action="store_true", help="skip the checks that import vLLM")
    check.add_argument(
        "--all-versions",
        action="store_true",
        help="check every supported vLLM release from source (runtime checks: the installed one, with its code on disk)",
    )
    check.add_argument("-v", "--verbose", action="store_true")
    check.set_defaults(func=cmd_check)

    show = sub.add_parser("show", help="print a generated member with its edit regions marked")
    _add_source_options(show)
    show.add_argument("symbol", help="e.g. AFDDeepseekV2MoE.__init__")
    show.set_defaults(func=cmd_show)

    _add_drift_commands(sub)
    return parser


def _add_drift_commands(sub: Any) -> None:
    drift = sub.add_parser(
        "drift", help="what an upstream version bump breaks, located and classified"
    )
    drift.add_argument("--to", required=True, help="the new version, e.g. 0.28.0")
    drift.add_argument(
        "--package",
        default="vllm",
        help="the pinned package whose versions to compare, e.g. vllm_ascend (default: vllm); "
        "the others stay at their pins",
    )
    drift.add_argument(
        "--from",
        dest="from_version",
        help="the old version (default: for vllm the newest supported release below --to, else "
        "the primary; for another package its pin)",
    )
    drift.add_argument("--from-root", type=Path, help="read the old version from this source tree")
    drift.add_argument("--to-root", type=Path, help="read the new version from this source tree")
    drift.add_argument("--format", choices=["md", "json", "sarif"], default="md")
    drift.add_argument("--out", type=Path, help="write the report here instead of stdout")
    drift.set_defaults(func=cmd_drift)

    audit = sub.add_parser(
        "audit",
        help="upgrade audit report: drift + dry-run regeneration + generated diff + work list",
    )
    audit.add_argument(
        "--to",
        required=True,
        help="the new vLLM version, e.g. 0.28.0, compared with the newest supported release "
        "below it (else the primary)",
    )
    audit.add_argument(
        "--from",
        dest="from_version",
        help="the vLLM release to compare with (default: the newest supported release below --to)",
    )
    audit.add_argument("--to-root", type=Path, help="read the new version from this source tree")
    audit.add_argument(
        "--out",
        type=Path,
        help="directory for audit.md and audit.json (default .afd-work/audit/<to>)",
    )
    audit.add_argument(
        "--apply",
        action="store_true",
        help="add the release to the supported ones and write its lock, when nothing blocks",
    )
    audit.set_defaults(func=cmd_audit)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (SourceError, FetchError) as exc:  # upstream not available: nothing was analysed
        print(f"codegen {args.command}: {exc}; exit {ExitCode.ERROR.value}", file=sys.stderr)
        return ExitCode.ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.ERROR
    except Exception as exc:  # a crash of a checker is never a pass
        traceback.print_exc()
        print(
            f"codegen {args.command}: internal error ({type(exc).__name__}: {exc}); exit {ExitCode.ERROR.value}",
            file=sys.stderr,
        )
        return ExitCode.ERROR
