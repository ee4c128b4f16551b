"""``python -m codegen`` / ``afd-codegen``: regenerate, check, show (and drift, audit).

Exit codes for every command: 0 ok, 1 something to review, 2 something blocks, 3 the tool
itself failed. An exception is never a pass.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from codegen.findings import EXIT_BLOCK, EXIT_TOOL_ERROR, Finding, exit_code, summary

REPO_ROOT = Path(__file__).resolve().parent.parent


def _progress(message: str) -> None:
    print(f"[codegen] {message}", file=sys.stderr, flush=True)


def _print_findings(findings: Sequence[Finding], fmt: str, verbose: bool) -> None:
    ordered = sorted(findings, key=lambda f: (-f.severity.rank, f.code, f.symbol))
    if fmt == "json":
        json.dump(
            {"findings": [f.as_dict() for f in ordered], "summary": summary(ordered)},
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
        return
    for finding in ordered:
        print(finding.verbose() if verbose else finding.one_line())


def _vllm_version(args: argparse.Namespace) -> str:
    """``--vllm-version``, else the installed vLLM, else the primary pin (supported ones only)."""
    from codegen.generate import PINS_PATH
    from codegen.sources import choose_version, load_pins

    pin = load_pins(args.repo / PINS_PATH)["vllm"]
    reads_installed = not args.no_installed and args.upstream_root is None
    return choose_version(pin, args.vllm_version, use_installed=reads_installed)


def _all_versions_alone(args: argparse.Namespace) -> bool:
    """Whether ``--all-versions`` comes without options naming one release (else it says so)."""
    if args.vllm_version or args.upstream_root:
        print(
            f"codegen {args.command}: --all-versions reads every supported release itself; drop "
            f"--vllm-version and --upstream-root; exit {EXIT_TOOL_ERROR}",
            file=sys.stderr,
        )
        return False
    return True


def _regenerate_locks(args: argparse.Namespace, on_disk: str) -> int:
    """``--all-versions``: the lock of every supported release other than ``on_disk``."""
    from codegen.generate import PINS_PATH
    from codegen.pipeline import generate, open_context, write_lock
    from codegen.sources import load_pins

    if not _all_versions_alone(args):
        return EXIT_TOOL_ERROR
    for version in load_pins(args.repo / PINS_PATH)["vllm"].supported:
        if version == on_disk:
            continue
        context = open_context(args.repo, use_installed=not args.no_installed, version=version)
        _progress(f"vllm {version}: generating its lock")
        generation, _ = generate(context)
        if generation.blocked:
            _print_findings(generation.findings, "text", verbose=True)
            _progress(f"vllm {version}: nothing written: {summary(generation.findings)}")
            return EXIT_BLOCK
        write_lock(args.repo, generation)
        _progress(f"vllm {version}: wrote {generation.lock_path}")
    return 0


def cmd_regenerate(args: argparse.Namespace) -> int:
    from codegen.pipeline import generate, open_context, up_to_date, write_output

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
        _progress(f"up to date ({origins}) in {time.monotonic() - started:.2f} s")
        return 0
    _progress(f"generating against {origins}")
    generation, _ = generate(context)
    if generation.blocked:
        _print_findings(generation.findings, "text", verbose=True)
        _progress(f"nothing written: {summary(generation.findings)}")
        return EXIT_BLOCK
    write_output(args.repo, generation)
    _print_findings(generation.findings, "text", verbose=args.verbose)
    _progress(
        f"wrote {len(generation.files)} files, {len(generation.classes)} classes, {generation.lock_path} "
        f"in {time.monotonic() - started:.2f} s ({summary(generation.findings)})"
    )
    return exit_code(generation.findings)


def cmd_check(args: argparse.Namespace) -> int:
    from codegen.checks.suite import run_checks
    from codegen.generate import PINS_PATH
    from codegen.sources import load_pins

    if args.all_versions:
        if not _all_versions_alone(args):
            return EXIT_TOOL_ERROR
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
                progress=_progress,
                tag=len(versions) > 1,
            )
        )
    findings = list(dict.fromkeys(findings))  # the repository-wide scans ran once per release
    _print_findings(findings, args.format, args.verbose)
    if args.format == "text":
        print(f"codegen check: {summary(findings)}")
    return exit_code(findings)


def cmd_show(args: argparse.Namespace) -> int:
    from codegen.show import show

    print(
        show(
            args.repo,
            args.symbol,
            upstream_root=args.upstream_root,
            use_installed=not args.no_installed,
            version=_vllm_version(args),
        )
    )
    return 0


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
    parser = argparse.ArgumentParser(prog="python -m codegen", description=__doc__.splitlines()[0])
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

    from codegen.drift_cli import add_drift_commands

    add_drift_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from codegen.fetch import FetchError
    from codegen.sources import SourceError

    try:
        return int(args.func(args))
    except (SourceError, FetchError) as exc:  # upstream not available: nothing was analysed
        print(f"codegen {args.command}: {exc}; exit {EXIT_TOOL_ERROR}", file=sys.stderr)
        return EXIT_TOOL_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_TOOL_ERROR
    except Exception as exc:  # a crash of a checker is never a pass
        traceback.print_exc()
        print(
            f"codegen {args.command}: internal error ({type(exc).__name__}: {exc}); exit {EXIT_TOOL_ERROR}",
            file=sys.stderr,
        )
        return EXIT_TOOL_ERROR
