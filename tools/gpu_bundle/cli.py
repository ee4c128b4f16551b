"""The bundle's command line: ``python -m tools.gpu_bundle build | assemble | install``.

Exit codes (the project's, :class:`afd_models.commandline.ExitCode`): 0 done; 3 bad usage, or the
bundle cannot be built, verified or installed (a damaged part, a host that does not fit, pip
failing; the message says which), or the tool itself crashed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from afd_models.commandline import CommandParser
from tools.gpu_bundle.build import build_bundle
from tools.gpu_bundle.install import assemble, install
from tools.gpu_bundle.manifest import (
    DEFAULT_PART_MIB,
    DEFAULT_PLATFORM,
    DEFAULT_PYTHON_VERSION,
    MIB,
    TORCH_VERSION,
    TRANSFER_MIB,
    VLLM_VERSION,
    BundleError,
    BundleSpec,
    log,
)
from tools.harness.cli import UsageError, guarded

PROG = "python -m tools.gpu_bundle"
DESCRIPTION = (
    "Carry vLLM 0.26.0 (CUDA) to a GPU host that has torch 2.11 but no vLLM and no package index."
)


def _part_mib(text: str) -> int:
    """argparse type of ``--part-mib``: a whole number of MiB, returned in bytes; whether it fits
    beside the checkout is checked before the build starts (``check_part_bytes``)."""
    try:
        return int(text) * MIB
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of MiB") from None


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog="See the docstring of tools/gpu_bundle/__init__.py for what is bundled and why. "
        "Exit codes: 0 done, 3 bad usage or the bundle cannot be built, verified or installed.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    build = commands.add_parser(
        "build",
        help="resolve, download, pack and split the bundle (networked machine)",
        description=(
            f"Resolve vllm=={VLLM_VERSION} for the GPU host's Python and platform, leave out "
            f"torch=={TORCH_VERSION} and its dependency closure (the host has them), download the "
            "rest as wheels into the project cache (a second build downloads nothing), keep the "
            "distributions the check imports and strip from the vllm wheel what a one-GPU sm_90 "
            "check never loads (the manifest lists what was left out, with sizes and why), and "
            "write bundle.partNNN files and manifest.json into --out."
        ),
    )
    build.add_argument(
        "--out", type=Path, required=True, help="directory for the parts and manifest.json"
    )
    build.add_argument(
        "--python-version",
        default=DEFAULT_PYTHON_VERSION,
        help="the GPU host's Python, major.minor (default: %(default)s)",
    )
    build.add_argument(
        "--platform",
        default=DEFAULT_PLATFORM,
        help="manylinux tag of the GPU host's glibc and machine; wheels for older tags count too "
        "(default: %(default)s: vLLM 0.26.0's llguidance has no x86_64 wheel for an older glibc)",
    )
    build.add_argument(
        "--part-mib",
        dest="part_bytes",
        type=_part_mib,
        default=DEFAULT_PART_MIB * MIB,
        metavar="MIB",
        help=f"largest part in MiB; a part travels with the checkout in one transfer of at most "
        f"{TRANSFER_MIB} MiB, so at most {TRANSFER_MIB} minus the checkout (default: "
        f"{DEFAULT_PART_MIB})",
    )
    build.add_argument(
        "--python",
        type=Path,
        help="a Python of --python-version with pip, to resolve with (default: this one, or "
        "python<version> on PATH); only the first build of a spec resolves",
    )
    assemble_cmd = commands.add_parser(
        "assemble",
        help="verify the parts, join them and extract the wheels (standard library only)",
        description=(
            "Check manifest.json and every part (present, size, sha256), join the parts, check "
            "the archive's sha256 and extract the wheels into --into."
        ),
    )
    assemble_cmd.add_argument(
        "--parts", type=Path, required=True, help="directory with manifest.json and the parts"
    )
    assemble_cmd.add_argument("--into", type=Path, required=True, help="directory for the wheels")
    install_cmd = commands.add_parser(
        "install",
        help="assemble, then pip install the wheels offline (GPU host)",
        description=(
            "Check that this interpreter's Python version and glibc fit the bundle and that torch "
            "2.11.x imports (before anything is assembled), assemble the parts into a temporary "
            "directory, then install exactly the bundle's wheels with pip --no-index --no-deps "
            "(the bundle holds what the check imports, not vLLM's whole closure). With --target, "
            "nothing in this environment changes: pip installs into DIR3, and the caller puts "
            "DIR3 first on PYTHONPATH; a rerun with the same bundle does nothing."
        ),
    )
    install_cmd.add_argument(
        "--parts", type=Path, required=True, help="directory with manifest.json and the parts"
    )
    install_cmd.add_argument(
        "--target", type=Path, metavar="DIR3", help="install here instead of into this environment"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """One command; a BundleError is the usage or tool error it names."""
    try:
        if args.command == "build":
            spec = BundleSpec(VLLM_VERSION, TORCH_VERSION, args.python_version, args.platform)
            build_bundle(args.out, spec, part_bytes=args.part_bytes, python=args.python)
        elif args.command == "assemble":
            wheels = assemble(args.parts, args.into)
            log(f"{len(wheels)} wheels in {args.into}")
        else:
            install(args.parts, target=args.target)
    except BundleError as exc:
        raise UsageError(str(exc)) from exc
    return 0


def main(argv: list[str] | None = None) -> int:
    """0 done; 3 bad usage, a bundle that cannot be built, verified or installed, or a crash."""
    args = build_parser().parse_args(argv)  # exits 3 on a malformed command line, 0 for --help
    return guarded(f"{PROG} {args.command}", lambda: run(args))
