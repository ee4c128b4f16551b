"""What a GPU bundle is: its spec, its wheels and parts, ``manifest.json`` (written and checked),
and the manylinux platform tags it is built for."""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass
from typing import Any

from tools.harness.cli import log as harness_log

VLLM_VERSION = "0.26.0"
#: The torch release on the GPU host; it and its closure stay out of the bundle.
TORCH_VERSION = "2.11.0"
FORMAT = "afd-gpu-bundle/2"
MANIFEST_NAME = "manifest.json"
PART_PREFIX = "bundle.part"
MIB = 1 << 20
#: The most one transfer to the GPU host carries: a part, the checkout and the generated code.
TRANSFER_MIB = 64
#: The default part: leaves 16 MiB of each transfer to the checkout (about 11 MiB today).
DEFAULT_PART_MIB = 48
DEFAULT_PYTHON_VERSION = "3.12"
#: vLLM 0.26.0 needs llguidance>=1.7,<1.8, whose x86_64 wheels all need glibc 2.31.
DEFAULT_PLATFORM = "manylinux_2_31_x86_64"
#: Bump when the resolution recipe changes: cached resolutions of other revisions are not reused.
RESOLUTION_REVISION = 1
#: Seconds any single pip run may take.
PIP_TIMEOUT_S = 1800
#: Seconds a probe (an interpreter's version, ``import torch``) may take.
PROBE_TIMEOUT_S = 300
#: The archive sha256, written into ``--target`` last: a rerun with the same bundle skips the install.
STAMP_NAME = ".afd-gpu-bundle.sha256"

PART_NAME = re.compile(re.escape(PART_PREFIX) + r"\d{3,}")
WHEEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+!-]*\.whl")
SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
#: Legacy manylinux tags and the glibc version each stands for (PEP 600).
_LEGACY_MANYLINUX = {"manylinux2014": (2, 17), "manylinux2010": (2, 12), "manylinux1": (2, 5)}


def log(message: str) -> None:
    """A progress line of the bundle's commands."""
    harness_log("gpu-bundle", message)


class BundleError(RuntimeError):
    """The bundle cannot be built, verified or installed; the message says what and what to do."""


class WheelRole(str, enum.Enum):
    """Why a wheel is in the bundle."""

    #: in vLLM's closure, not in torch's
    REQUIRED = "required"
    #: in torch's closure too, at another version: dropped, the host's copy serving, unless the
    #: host's Python needs this one (``trim.PYTHON_312``)
    ALTERNATE = "alternate"


@dataclass(frozen=True)
class BundleSpec:
    """What a bundle is for; the build's cache is keyed by it."""

    #: the vLLM release bundled
    vllm_version: str
    #: the torch release the GPU host has
    torch_version: str
    #: the GPU host's Python, ``major.minor``
    python_version: str
    #: the manylinux tag of the GPU host's glibc and machine, e.g. ``manylinux_2_31_x86_64``
    platform: str

    @property
    def key(self) -> str:
        return (
            f"vllm{self.vllm_version}-torch{self.torch_version}-py{self.python_version}"
            f"-{self.platform}-r{RESOLUTION_REVISION}"
        )


@dataclass(frozen=True)
class ResolvedWheel:
    """One distribution a pip resolution picked, and where its wheel is."""

    #: canonical distribution name (PEP 503)
    name: str
    version: str
    filename: str
    url: str
    sha256: str
    role: WheelRole = WheelRole.REQUIRED


@dataclass(frozen=True)
class HostDist:
    """A distribution left to the GPU host: torch's closure as resolved alone at build time."""

    name: str
    version: str


@dataclass(frozen=True)
class Plan:
    """What goes into the bundle and what is left to the host."""

    wheels: tuple[ResolvedWheel, ...]
    host_provided: tuple[HostDist, ...]


@dataclass(frozen=True)
class WheelInfo:
    """One wheel in the archive."""

    filename: str
    name: str
    version: str
    sha256: str
    size: int
    role: WheelRole
    #: why the check needs it (:mod:`tools.gpu_bundle.trim`)
    why: str = ""
    #: the index's sha256 when files were stripped from the wheel (``Manifest.stripped``), else ""
    stripped_from: str = ""


@dataclass(frozen=True)
class DroppedDist:
    """A distribution of vLLM's closure the bundle leaves out, because the check never imports it."""

    name: str
    version: str
    #: bytes of its wheel
    size: int
    why: str


@dataclass(frozen=True)
class Stripped:
    """Files one rule removed from a bundled wheel: a one-GPU sm_90 check never loads them."""

    #: the wheel's file name
    wheel: str
    #: the rule: a regular expression the files' paths in the wheel match in full
    pattern: str
    files: int
    #: compressed bytes they took in the wheel
    size: int
    why: str


@dataclass(frozen=True)
class PartInfo:
    """One piece of the archive."""

    filename: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``: what the parts make up and how to check them."""

    spec: BundleSpec
    wheels: tuple[WheelInfo, ...]
    host_provided: tuple[HostDist, ...]
    parts: tuple[PartInfo, ...]
    archive_sha256: str
    archive_size: int
    dropped: tuple[DroppedDist, ...] = ()
    stripped: tuple[Stripped, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            **dataclasses.asdict(self.spec),
            "archive_sha256": self.archive_sha256,
            "archive_size": self.archive_size,
            # for readers: what the bundle weighs against what it leaves out (derived, not read)
            "sizes": {
                "wheels": sum(w.size for w in self.wheels),
                "dropped": sum(d.size for d in self.dropped),
                "stripped": sum(f.size for f in self.stripped),
            },
            "parts": [dataclasses.asdict(p) for p in self.parts],
            "wheels": [{**dataclasses.asdict(w), "role": w.role.value} for w in self.wheels],
            "host_provided": [dataclasses.asdict(h) for h in self.host_provided],
            "dropped": [dataclasses.asdict(d) for d in self.dropped],
            "stripped": [dataclasses.asdict(f) for f in self.stripped],
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> Manifest:
        """Parse and validate; names never leave the directory they are read from."""
        if not isinstance(data, dict):
            raise BundleError(f"{where}: expected a JSON object, found {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise BundleError(
                f"{where}: format {data.get('format')!r} is not {FORMAT!r}, the only one this "
                "tool reads; rebuild the bundle with this checkout's tools.gpu_bundle"
            )
        spec = BundleSpec(
            **{f.name: _get(data, f.name, str, where) for f in dataclasses.fields(BundleSpec)}
        )
        parts = tuple(
            PartInfo(
                filename=_get(p, "filename", str, f"{where} parts[{i}]", PART_NAME),
                size=_get(p, "size", int, f"{where} parts[{i}]"),
                sha256=_get(p, "sha256", str, f"{where} parts[{i}]", SHA256_PATTERN),
            )
            for i, p in enumerate(_get(data, "parts", list, where))
        )
        wheels = []
        for i, w in enumerate(_get(data, "wheels", list, where)):
            at = f"{where} wheels[{i}]"
            role = _get(w, "role", str, at)
            if role not in {r.value for r in WheelRole}:
                raise BundleError(
                    f"{at}: role {role!r} is not one of {[r.value for r in WheelRole]}"
                )
            wheels.append(
                WheelInfo(
                    filename=_get(w, "filename", str, at, WHEEL_NAME),
                    name=_get(w, "name", str, at),
                    version=_get(w, "version", str, at),
                    sha256=_get(w, "sha256", str, at, SHA256_PATTERN),
                    size=_get(w, "size", int, at),
                    role=WheelRole(role),
                    why=_get(w, "why", str, at),
                    stripped_from=_get(w, "stripped_from", str, at),
                )
            )
        host = tuple(
            HostDist(
                _get(h, "name", str, f"{where} host_provided[{i}]"),
                _get(h, "version", str, f"{where} host_provided[{i}]"),
            )
            for i, h in enumerate(_get(data, "host_provided", list, where))
        )
        dropped = tuple(
            DroppedDist(
                _get(d, "name", str, f"{where} dropped[{i}]"),
                _get(d, "version", str, f"{where} dropped[{i}]"),
                _get(d, "size", int, f"{where} dropped[{i}]"),
                _get(d, "why", str, f"{where} dropped[{i}]"),
            )
            for i, d in enumerate(_get(data, "dropped", list, where))
        )
        stripped = tuple(
            Stripped(
                _get(f, "wheel", str, f"{where} stripped[{i}]"),
                _get(f, "pattern", str, f"{where} stripped[{i}]"),
                _get(f, "files", int, f"{where} stripped[{i}]"),
                _get(f, "size", int, f"{where} stripped[{i}]"),
                _get(f, "why", str, f"{where} stripped[{i}]"),
            )
            for i, f in enumerate(_get(data, "stripped", list, where))
        )
        return cls(
            spec=spec,
            wheels=tuple(wheels),
            host_provided=host,
            parts=parts,
            archive_sha256=_get(data, "archive_sha256", str, where, SHA256_PATTERN),
            archive_size=_get(data, "archive_size", int, where),
            dropped=dropped,
            stripped=stripped,
        )


def _get(
    data: Any, key: str, kind: type, where: str, pattern: re.Pattern[str] | None = None
) -> Any:
    """``data[key]``, checked to be a ``kind`` (and to match ``pattern``), or a BundleError naming it."""
    if not isinstance(data, dict) or key not in data:
        raise BundleError(f"{where}: key {key!r} is missing")
    value: Any = data[key]
    # ``type() is``, not isinstance: a JSON true must not pass for an int
    valid = type(value) is kind and not (isinstance(value, int) and value < 0)
    if not valid:
        wanted = "non-negative int" if kind is int else kind.__name__
        raise BundleError(f"{where}: {key!r} is {value!r}, expected a {wanted}")
    if pattern is not None and not pattern.fullmatch(value):
        raise BundleError(f"{where}: {key!r} is {value!r}, which does not match {pattern.pattern}")
    return value


def mib(size: int) -> str:
    return f"{size / MIB:.1f} MiB"


# --------------------------------------------------------------------------- platform tags


def platform_glibc(platform: str) -> tuple[tuple[int, int], str]:
    """The glibc version and the architecture a manylinux platform tag stands for."""
    match = re.fullmatch(r"manylinux_2_(\d+)_([a-z0-9_]+)", platform)
    if match:
        return (2, int(match[1])), match[2]
    match = re.fullmatch(r"(manylinux2014|manylinux2010|manylinux1)_([a-z0-9_]+)", platform)
    if match:
        return _LEGACY_MANYLINUX[match[1]], match[2]
    raise BundleError(
        f"--platform {platform!r} is not a manylinux tag; allowed: manylinux_2_<glibc minor>_<arch> "
        f"(e.g. {DEFAULT_PLATFORM}) or manylinux2014_<arch>"
    )


def compatible_platforms(platform: str) -> list[str]:
    """``platform`` and every older manylinux tag of its architecture, newest first.

    pip 23 takes ``--platform`` literally: a ``manylinux_2_17_x86_64`` wheel does not count for
    ``--platform manylinux_2_31_x86_64`` unless the older tags are passed too.
    """
    (_, minor), arch = platform_glibc(platform)
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 4, -1)]
    tags += [f"{tag}_{arch}" for tag, glibc in _LEGACY_MANYLINUX.items() if glibc[1] <= minor]
    return tags


def check_spec(spec: BundleSpec) -> None:
    if not re.fullmatch(r"3\.\d{1,2}", spec.python_version):
        raise BundleError(
            f"--python-version {spec.python_version!r} is not a CPython 3 version such as 3.12"
        )
    platform_glibc(spec.platform)
