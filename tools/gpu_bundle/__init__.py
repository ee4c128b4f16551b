"""Carry vLLM 0.26.0 (CUDA) to a GPU host that has torch 2.11 but no vLLM and no package index.

    python -m tools.gpu_bundle build --out DIR                      # networked machine
    python -m tools.gpu_bundle assemble --parts DIR --into DIR2     # verify, join, extract wheels
    python -m tools.gpu_bundle install --parts DIR [--target DIR3]  # GPU host: offline pip install

The bundle holds the ``vllm==0.26.0`` wheel and its dependency closure as wheels, minus what the
GPU host already has: ``torch==2.11.0`` and torch's own closure, found by resolving
``torch==2.11.0`` alone for the same Python and platform and subtracting those distributions by
name. The host's copies are what count: install never replaces one that satisfies vLLM. Where
vLLM's resolution picked another version of one of them (``setuptools<81`` on Python 3.12, say),
that version travels too, as an *alternate*; pip takes it only where the host's copy does not
satisfy vLLM, and it satisfies torch 2.11.0 as well, since it comes from a resolution that
includes torch. torchvision and torchaudio are in the bundle: vLLM 0.26.0 pins them.

The wheels go into one uncompressed tar (wheels are compressed already) cut into parts of at most
``--part-mib`` MiB, because files reach the GPU host in pieces of at most 60 MiB;
``manifest.json`` records every wheel, every part and the whole archive by size and sha256.

``assemble``, ``install`` and ``--help`` need only the standard library (``install`` also runs the
host's pip). ``build`` needs pip and a Python of the target version, because pip evaluates
environment markers (``python_version > "3.11"``) with the interpreter that runs it, whatever
``--python-version`` says.

One job per module: :mod:`~tools.gpu_bundle.manifest` (what a bundle is),
:mod:`~tools.gpu_bundle.build` (resolve, download, pack), :mod:`~tools.gpu_bundle.install` (the
GPU host's side), :mod:`~tools.gpu_bundle.cli`. Exit codes: 0 done; 3 bad usage, or the bundle
cannot be built, verified or installed (the message says why).
"""

from tools.gpu_bundle.build import (
    build_bundle,
    pack_bundle,
    plan_bundle,
    read_report,
    split_parts,
    write_archive,
)
from tools.gpu_bundle.cli import build_parser, main
from tools.gpu_bundle.install import HostFacts, assemble, host_problems, install, read_manifest
from tools.gpu_bundle.manifest import (
    FORMAT,
    MANIFEST_NAME,
    MIB,
    BundleError,
    BundleSpec,
    HostDist,
    Manifest,
    PartInfo,
    Plan,
    ResolvedWheel,
    WheelInfo,
    WheelRole,
    compatible_platforms,
    platform_glibc,
)

__all__ = [
    "FORMAT",
    "MANIFEST_NAME",
    "MIB",
    "BundleError",
    "BundleSpec",
    "HostDist",
    "HostFacts",
    "Manifest",
    "PartInfo",
    "Plan",
    "ResolvedWheel",
    "WheelInfo",
    "WheelRole",
    "assemble",
    "build_bundle",
    "build_parser",
    "compatible_platforms",
    "host_problems",
    "install",
    "main",
    "pack_bundle",
    "plan_bundle",
    "platform_glibc",
    "read_manifest",
    "read_report",
    "split_parts",
    "write_archive",
]
