#!/usr/bin/env python3
"""Carry vLLM 0.26.0 (CUDA) to a GPU host that has torch 2.11 but no vLLM and no package index.

    python tools/gpu_bundle.py build --out DIR                      # networked machine
    python tools/gpu_bundle.py assemble --parts DIR --into DIR2     # verify, join, extract wheels
    python tools/gpu_bundle.py install --parts DIR [--target DIR3]  # GPU host: offline pip install

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
"""

# No ``from __future__ import annotations``: tools/gpu_check.py loads this file by path without
# registering it in sys.modules, and dataclasses look string annotations up there.

import argparse
import dataclasses
import enum
import hashlib
import json
import os
import platform as host_platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
# codegen.fetch is standard library only, like this file; the repository travels with it
sys.path.insert(0, str(REPO_ROOT))

from codegen.fetch import (  # noqa: E402
    FetchError,
    ReleaseFile,
    cache_root,
    download,
    normalize_name,
    sha256_file,
)

VLLM_VERSION = "0.26.0"
#: The torch release on the GPU host; it and its closure stay out of the bundle.
TORCH_VERSION = "2.11.0"
FORMAT = "afd-gpu-bundle/1"
MANIFEST_NAME = "manifest.json"
PART_PREFIX = "bundle.part"
MIB = 1 << 20
#: The largest file the transfer to the GPU host accepts.
MAX_PART_MIB = 60
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

_PART_NAME = re.compile(re.escape(PART_PREFIX) + r"\d{3,}")
_WHEEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+!-]*\.whl")
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: Legacy manylinux tags and the glibc version each stands for (PEP 600).
_LEGACY_MANYLINUX = {"manylinux2014": (2, 17), "manylinux2010": (2, 12), "manylinux1": (2, 5)}


def log(message: str) -> None:
    print(f"[gpu-bundle {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class BundleError(RuntimeError):
    """The bundle cannot be built, verified or installed; the message says what and what to do."""


class WheelRole(str, enum.Enum):
    """Why a wheel is in the bundle."""

    #: in vLLM's closure, not in torch's
    REQUIRED = "required"
    #: in torch's closure too, at another version: pip takes it only where the host's copy fails vLLM
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

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            **dataclasses.asdict(self.spec),
            "archive_sha256": self.archive_sha256,
            "archive_size": self.archive_size,
            "parts": [dataclasses.asdict(p) for p in self.parts],
            "wheels": [{**dataclasses.asdict(w), "role": w.role.value} for w in self.wheels],
            "host_provided": [dataclasses.asdict(h) for h in self.host_provided],
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> "Manifest":
        """Parse and validate; names never leave the directory they are read from."""
        if not isinstance(data, dict):
            raise BundleError(f"{where}: expected a JSON object, found {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise BundleError(
                f"{where}: format {data.get('format')!r} is not {FORMAT!r}, the only one this "
                "tool reads; rebuild the bundle with this checkout's tools/gpu_bundle.py"
            )
        spec = BundleSpec(
            **{f.name: _get(data, f.name, str, where) for f in dataclasses.fields(BundleSpec)}
        )
        parts = tuple(
            PartInfo(
                filename=_get(p, "filename", str, f"{where} parts[{i}]", _PART_NAME),
                size=_get(p, "size", int, f"{where} parts[{i}]"),
                sha256=_get(p, "sha256", str, f"{where} parts[{i}]", _SHA256),
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
                    filename=_get(w, "filename", str, at, _WHEEL_NAME),
                    name=_get(w, "name", str, at),
                    version=_get(w, "version", str, at),
                    sha256=_get(w, "sha256", str, at, _SHA256),
                    size=_get(w, "size", int, at),
                    role=WheelRole(role),
                )
            )
        host = tuple(
            HostDist(
                _get(h, "name", str, f"{where} host_provided[{i}]"),
                _get(h, "version", str, f"{where} host_provided[{i}]"),
            )
            for i, h in enumerate(_get(data, "host_provided", list, where))
        )
        return cls(
            spec=spec,
            wheels=tuple(wheels),
            host_provided=host,
            parts=parts,
            archive_sha256=_get(data, "archive_sha256", str, where, _SHA256),
            archive_size=_get(data, "archive_size", int, where),
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


def _mib(size: int) -> str:
    return f"{size / MIB:.1f} MiB"


def _write_atomic(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    partial.replace(path)


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


# --------------------------------------------------------------------------- build: resolve


def find_python(version: str, explicit: Path | None) -> Path:
    """An interpreter of ``version`` to run pip's resolution with (see the module docstring)."""
    if explicit is not None:
        found = _python_version_of(explicit)
        if found != version:
            raise BundleError(
                f"--python {explicit} is Python {found or '(does not run)'}, not {version}: pip "
                "evaluates environment markers with the interpreter that runs it"
            )
        return explicit
    candidates = [Path(sys.executable)]
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if _python_version_of(candidate) == version:
            return candidate
    raise BundleError(
        f"no Python {version} found (tried {', '.join(map(str, candidates))}); pip evaluates "
        f"environment markers with the interpreter that runs it, so pass --python /path/to/python{version}"
    )


def _python_version_of(python: Path) -> str | None:
    try:
        result = subprocess.run(
            [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except OSError:
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def read_report(report: Any, spec: BundleSpec, requirement: str) -> dict[str, ResolvedWheel]:
    """The distributions a ``pip install --dry-run --report`` picked, by canonical name.

    Raises if pip evaluated markers for another Python or machine than the bundle's.
    """
    environment = report.get("environment", {})
    _, arch = platform_glibc(spec.platform)
    expected = {
        "python_version": spec.python_version,
        "platform_machine": arch,
        "sys_platform": "linux",
    }
    wrong = {k: environment.get(k) for k, v in expected.items() if environment.get(k) != v}
    if wrong:
        raise BundleError(
            f"pip resolved {requirement} with markers for {wrong}, not {expected}: run the build with "
            f"a Python {spec.python_version} on a Linux {arch} machine (--python)"
        )
    closure: dict[str, ResolvedWheel] = {}
    for item in report.get("install", []):
        name = normalize_name(item["metadata"]["name"])
        info = item["download_info"]
        sha256 = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if not sha256:
            raise BundleError(
                f"{requirement}: pip's report has no sha256 for {name} ({info['url']})"
            )
        filename = urllib.parse.unquote(urllib.parse.urlsplit(info["url"]).path.rsplit("/", 1)[-1])
        closure[name] = ResolvedWheel(
            name, item["metadata"]["version"], filename, info["url"], sha256
        )
    return closure


def _pip_resolve(
    python: Path, requirement: str, spec: BundleSpec, scratch: Path
) -> dict[str, ResolvedWheel]:
    report = scratch / f"{normalize_name(requirement.split('==')[0])}.json"
    command = [
        str(python), "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
        "--report", str(report),
        # pip 23 accepts platform options only with --target, even for a dry run
        "--target", str(scratch / "target"),
        "--only-binary=:all:", "--implementation", "cp", "--python-version", spec.python_version,
        *(f"--platform={tag}" for tag in compatible_platforms(spec.platform)),
        # read METADATA by HTTP range requests: an index without PEP 658 metadata would otherwise
        # make pip download every wheel, torch and the CUDA libraries included (several GB)
        "--use-feature=fast-deps",
        requirement,
    ]  # fmt: skip
    log(
        f"resolving {requirement} for Python {spec.python_version}, {spec.platform} (metadata only)"
    )
    started = time.monotonic()
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise BundleError(f"pip took over {PIP_TIMEOUT_S} s to resolve {requirement}") from exc
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise BundleError(
            f"pip could not resolve {requirement} (exit {result.returncode}):\n{tail}"
        )
    closure = read_report(json.loads(report.read_text()), spec, requirement)
    log(f"  {len(closure)} distributions in {time.monotonic() - started:.0f} s")
    return closure


def plan_bundle(
    vllm_closure: dict[str, ResolvedWheel],
    torch_closure: dict[str, ResolvedWheel],
    spec: BundleSpec,
) -> Plan:
    """vLLM's closure minus torch's, by name; another version of a torch dependency is an alternate."""
    torch = vllm_closure.get("torch")
    if torch is None or torch.version != spec.torch_version:
        raise BundleError(
            f"vllm=={spec.vllm_version} resolved torch {torch.version if torch else '(none)'}, but the "
            f"GPU host has torch {spec.torch_version}: the bundle would not fit it"
        )
    wheels = []
    for name, wheel in sorted(vllm_closure.items()):
        on_host = torch_closure.get(name)
        if on_host is None:
            wheels.append(wheel)
        elif on_host.version != wheel.version:
            wheels.append(dataclasses.replace(wheel, role=WheelRole.ALTERNATE))
    host = tuple(HostDist(n, w.version) for n, w in sorted(torch_closure.items()))
    return Plan(tuple(wheels), host)


def _plan_to_json(plan: Plan, spec: BundleSpec) -> dict[str, Any]:
    return {
        "revision": RESOLUTION_REVISION,
        "spec": dataclasses.asdict(spec),
        "wheels": [{**dataclasses.asdict(w), "role": w.role.value} for w in plan.wheels],
        "host_provided": [dataclasses.asdict(h) for h in plan.host_provided],
    }


def _cached_plan(path: Path, spec: BundleSpec) -> Plan | None:
    """The resolution stored by an earlier build of the same spec, or None."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("revision") != RESOLUTION_REVISION or data.get("spec") != dataclasses.asdict(spec):
        return None
    wheels = tuple(ResolvedWheel(**{**w, "role": WheelRole(w["role"])}) for w in data["wheels"])
    return Plan(wheels, tuple(HostDist(**h) for h in data["host_provided"]))


# --------------------------------------------------------------------------- build: pack


def write_archive(wheels: Sequence[Path], archive: Path) -> None:
    """An uncompressed tar of ``wheels`` under their file names; the same files give the same bytes."""
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(wheels, key=lambda p: p.name):
            info = tarfile.TarInfo(path.name)
            info.size = path.stat().st_size
            info.mode = 0o644
            info.mtime = 0
            with path.open("rb") as handle:
                tar.addfile(info, handle)


def split_parts(archive: Path, out_dir: Path, part_bytes: int) -> list[PartInfo]:
    """Cut ``archive`` into ``bundle.part000``, ``bundle.part001``, ... of at most ``part_bytes``."""
    if not 1 <= part_bytes <= MAX_PART_MIB * MIB:
        raise BundleError(
            f"part_bytes={part_bytes} is outside the allowed range 1..{MAX_PART_MIB * MIB}"
        )
    parts: list[PartInfo] = []
    with archive.open("rb") as source:
        for data in iter(lambda: source.read(part_bytes), b""):
            part = PartInfo(
                f"{PART_PREFIX}{len(parts):03d}", len(data), hashlib.sha256(data).hexdigest()
            )
            _write_atomic(out_dir / part.filename, data)
            log(f"  wrote {part.filename} ({_mib(part.size)})")
            parts.append(part)
    return parts


def pack_bundle(
    wheels: Sequence[WheelInfo],
    wheels_dir: Path,
    out_dir: Path,
    spec: BundleSpec,
    *,
    part_bytes: int,
    host_provided: Sequence[HostDist] = (),
) -> Manifest:
    """Write the parts and ``manifest.json`` (last, so a crashed build leaves no manifest)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.iterdir():
        if stale.name == MANIFEST_NAME or _PART_NAME.fullmatch(stale.name):
            stale.unlink()
    archive = out_dir / ".bundle.tar.partial"
    try:
        write_archive([wheels_dir / w.filename for w in wheels], archive)
        archive_sha256, archive_size = sha256_file(archive), archive.stat().st_size
        log(
            f"archive: {len(wheels)} wheels, {_mib(archive_size)}; cutting into parts of <= {_mib(part_bytes)}"
        )
        parts = split_parts(archive, out_dir, part_bytes)
    finally:
        archive.unlink(missing_ok=True)
    manifest = Manifest(
        spec=spec,
        wheels=tuple(sorted(wheels, key=lambda w: w.filename)),
        host_provided=tuple(host_provided),
        parts=tuple(parts),
        archive_sha256=archive_sha256,
        archive_size=archive_size,
    )
    _write_atomic(
        out_dir / MANIFEST_NAME, (json.dumps(manifest.to_json(), indent=2) + "\n").encode()
    )
    return manifest


def build_bundle(
    out_dir: Path,
    spec: BundleSpec,
    *,
    part_bytes: int = MAX_PART_MIB * MIB,
    python: Path | None = None,
) -> Manifest:
    """Resolve (once per spec), download (once per wheel), pack and split into ``out_dir``.

    Parameters:
        out_dir: where the parts and ``manifest.json`` go.
        spec: the vLLM, torch, Python and platform the bundle is for.
        part_bytes: the largest part, in bytes.
        python: interpreter of ``spec.python_version`` for pip's resolution (found if None).
    """
    started = time.monotonic()
    check_spec(spec)
    cache = cache_root() / "gpu-bundle" / spec.key
    plan = _cached_plan(cache / "resolution.json", spec)
    if plan is not None:
        log(f"reusing the resolution in {cache}")
    else:
        interpreter = find_python(spec.python_version, python)
        with tempfile.TemporaryDirectory(prefix="afd-gpu-bundle-") as scratch:
            torch_closure = _pip_resolve(
                interpreter, f"torch=={spec.torch_version}", spec, Path(scratch)
            )
            vllm_closure = _pip_resolve(
                interpreter, f"vllm=={spec.vllm_version}", spec, Path(scratch)
            )
        plan = plan_bundle(vllm_closure, torch_closure, spec)
        cache.mkdir(parents=True, exist_ok=True)
        _write_atomic(
            cache / "resolution.json", json.dumps(_plan_to_json(plan, spec), indent=2).encode()
        )
    log(
        f"left to the GPU host ({len(plan.host_provided)}): "
        + ", ".join(f"{h.name} {h.version}" for h in plan.host_provided)
    )
    for wheel in plan.wheels:
        if wheel.role is WheelRole.ALTERNATE:
            host = next(h.version for h in plan.host_provided if h.name == wheel.name)
            log(
                f"alternate: {wheel.name} {wheel.version} (torch alone resolves {host}); used only if the host's copy fails vLLM"
            )
    wheels_dir = cache / "wheels"
    cached = sum((wheels_dir / w.filename).exists() for w in plan.wheels)
    log(f"{len(plan.wheels)} wheels for the bundle, {cached} already in {wheels_dir}")
    infos = []
    for index, wheel in enumerate(plan.wheels, 1):
        release = ReleaseFile(
            wheel.name, wheel.version, wheel.filename, wheel.url, wheel.sha256, "wheel"
        )
        if not (wheels_dir / wheel.filename).exists():
            log(f"  downloading [{index}/{len(plan.wheels)}] {wheel.filename}")
        try:
            path = download(release, wheels_dir, quiet=True)
        except FetchError as exc:
            raise BundleError(str(exc)) from exc
        infos.append(
            WheelInfo(
                wheel.filename,
                wheel.name,
                wheel.version,
                wheel.sha256,
                path.stat().st_size,
                wheel.role,
            )
        )
    log(f"{len(infos)} wheels in {wheels_dir}, {_mib(sum(w.size for w in infos))}")
    manifest = pack_bundle(
        infos, wheels_dir, out_dir, spec, part_bytes=part_bytes, host_provided=plan.host_provided
    )
    log(
        f"bundle ready in {out_dir}: {len(manifest.wheels)} wheels, {_mib(manifest.archive_size)} in "
        f"{len(manifest.parts)} parts of <= {_mib(part_bytes)} ({time.monotonic() - started:.0f} s)"
    )
    return manifest


# --------------------------------------------------------------------------- GPU host: assemble


def read_manifest(parts_dir: Path) -> Manifest:
    path = parts_dir / MANIFEST_NAME
    if not path.is_file():
        raise BundleError(f"no {MANIFEST_NAME} in {parts_dir}: copy it along with the parts")
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{path} is not valid JSON: {exc}") from exc
    return Manifest.from_json(data, str(path))


def assemble(parts_dir: Path, into: Path) -> list[Path]:
    """Verify every part, join them, check the archive, extract the wheels into ``into``.

    Returns:
        The extracted wheels, in the manifest's order.

    Raises:
        BundleError: naming every missing or damaged part with the size and sha256 it should have.
    """
    manifest = read_manifest(parts_dir)
    # sizes first: a missing or truncated part is reported before gigabytes are hashed
    problems = []
    for part in manifest.parts:
        path = parts_dir / part.filename
        expected = f"expected {part.size} bytes, sha256 {part.sha256}"
        if not path.is_file():
            problems.append(f"{part.filename} is missing ({expected})")
        elif path.stat().st_size != part.size:
            problems.append(f"{part.filename} has {path.stat().st_size} bytes ({expected})")
    if problems:
        raise BundleError(f"{parts_dir}: " + "; ".join(problems))
    into.mkdir(parents=True, exist_ok=True)
    joined = into / ".bundle.tar.partial"
    try:
        whole = hashlib.sha256()
        with joined.open("wb") as out:
            for part in manifest.parts:
                data = (parts_dir / part.filename).read_bytes()
                found = hashlib.sha256(data).hexdigest()
                if found != part.sha256:
                    problems.append(f"{part.filename} has sha256 {found}, expected {part.sha256}")
                whole.update(data)
                out.write(data)
        if problems:
            raise BundleError(
                f"{parts_dir}: corrupt parts, copy them again: " + "; ".join(problems)
            )
        size = joined.stat().st_size
        if (whole.hexdigest(), size) != (manifest.archive_sha256, manifest.archive_size):
            raise BundleError(
                f"{parts_dir}: the joined archive has sha256 {whole.hexdigest()} and {size} bytes, the "
                f"manifest says archive sha256 {manifest.archive_sha256} and {manifest.archive_size} "
                "bytes: the manifest does not belong to these parts"
            )
        log(f"{len(manifest.parts)} parts verified, archive {_mib(size)}; extracting into {into}")
        return _extract(joined, manifest, into)
    finally:
        joined.unlink(missing_ok=True)


def _extract(archive: Path, manifest: Manifest, into: Path) -> list[Path]:
    """Write exactly the manifest's wheels, each checked by size and sha256; nothing else."""
    expected = {w.filename: w for w in manifest.wheels}
    with tarfile.open(archive, "r:") as tar:
        members = tar.getmembers()
        # the whole listing is checked before the first write
        names = [m.name for m in members]
        if sorted(names) != sorted(expected) or not all(m.isfile() for m in members):
            raise BundleError(
                "the archive does not hold exactly the manifest's wheels: not listed "
                f"{sorted(set(names) - set(expected))}, missing {sorted(set(expected) - set(names))}"
                f", entries {len(names)} for {len(expected)} wheels"
            )
        for member in members:
            wheel = expected[member.name]
            source = tar.extractfile(member)
            data = source.read() if source is not None else b""
            found = hashlib.sha256(data).hexdigest()
            if (found, len(data)) != (wheel.sha256, wheel.size):
                raise BundleError(
                    f"{wheel.filename} in the archive has sha256 {found}, expected {wheel.sha256}"
                )
            _write_atomic(into / wheel.filename, data)
    return [into / w.filename for w in manifest.wheels]


# --------------------------------------------------------------------------- GPU host: install


@dataclass(frozen=True)
class HostFacts:
    """What the install checks about the running interpreter and machine."""

    #: ``major.minor``
    python_version: str
    #: ``sys.implementation.name``
    implementation: str
    #: ``platform.libc_ver()``: ``("glibc", "2.35")``, or empty strings elsewhere
    libc: tuple[str, str]
    machine: str
    #: ``torch.__version__``, or None if ``import torch`` failed
    torch_version: str | None
    #: the last line ``import torch`` printed when it failed
    torch_error: str = ""

    @classmethod
    def probe(cls) -> "HostFacts":
        command = [sys.executable, "-c", "import torch; print(torch.__version__)"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        lines = (result.stdout + result.stderr).strip().splitlines() or [""]
        return cls(
            python_version=f"{sys.version_info[0]}.{sys.version_info[1]}",
            implementation=sys.implementation.name,
            libc=host_platform.libc_ver(),
            machine=host_platform.machine(),
            torch_version=lines[-1] if result.returncode == 0 else None,
            torch_error="" if result.returncode == 0 else lines[-1],
        )


def host_problems(manifest: Manifest, facts: HostFacts) -> list[str]:
    """Why this host cannot take the bundle; empty when it can."""
    spec = manifest.spec
    problems = []
    if (facts.implementation, facts.python_version) != ("cpython", spec.python_version):
        problems.append(
            f"the bundle is for CPython {spec.python_version}, this is {facts.implementation} "
            f"{facts.python_version}: run with a Python {spec.python_version} or rebuild with "
            f"--python-version {facts.python_version}"
        )
    glibc, arch = platform_glibc(spec.platform)
    if facts.machine != arch:
        problems.append(
            f"the bundle is for {arch} ({spec.platform}), this machine is {facts.machine}"
        )
    version = tuple(int(n) for n in re.findall(r"\d+", facts.libc[1])[:2])
    if facts.libc[0] != "glibc" or version < glibc:
        problems.append(
            f"the bundle ({spec.platform}) needs glibc >= {glibc[0]}.{glibc[1]}, this host has "
            f"{' '.join(facts.libc).strip() or 'no glibc'}"
        )
    wanted = spec.torch_version.split(".")[:2]
    if facts.torch_version is None:
        problems.append(
            f"`import torch` failed ({facts.torch_error}); the bundle leaves torch "
            f"{'.'.join(wanted)}.x and its dependencies to the host"
        )
    elif re.findall(r"\d+", facts.torch_version)[:2] != wanted:
        problems.append(
            f"the bundle needs torch {'.'.join(wanted)}.x, this host has {facts.torch_version}"
        )
    return problems


def install(parts_dir: Path, *, target: Path | None = None) -> None:
    """Assemble the bundle and install ``vllm`` from it with pip, offline.

    Without ``target`` pip installs into the running interpreter's environment. With it, nothing
    there changes: pip first resolves against the host (a dry run, so the host's copies count and
    alternates are taken only where they fail vLLM), then installs exactly that selection into
    ``target``. The caller then puts ``target`` first on ``PYTHONPATH`` (``sys.path`` for this
    process, ``os.environ`` for vLLM's worker processes); ``target/bin`` holds the ``vllm`` script.

    Raises:
        BundleError: the host cannot take the bundle (Python, glibc, torch), a part is missing or
            damaged, or pip fails. Checks run before pip; the stamp is written only after success.
    """
    started = time.monotonic()
    manifest = read_manifest(parts_dir)
    problems = host_problems(manifest, HostFacts.probe())
    if problems:
        raise BundleError("this host cannot take the bundle:\n  - " + "\n  - ".join(problems))
    requirement = f"vllm=={manifest.spec.vllm_version}"
    stamp = None if target is None else target / STAMP_NAME
    if stamp is not None and stamp.is_file() and stamp.read_text() == manifest.archive_sha256:
        log(f"{target} already holds this bundle ({requirement}); nothing to do")
        return
    with tempfile.TemporaryDirectory(prefix="afd-gpu-bundle-") as scratch:
        wheels_dir = Path(scratch) / "wheels"
        assemble(parts_dir, wheels_dir)
        if target is None:
            _run_pip("install", "--no-index", "--find-links", str(wheels_dir), requirement)
            return
        chosen = _select_for_host(wheels_dir, requirement, Path(scratch) / "report.json")
        if chosen:
            log(f"installing {len(chosen)} wheels into {target}")
            _run_pip(
                "install",
                "--no-index",
                "--no-deps",
                "--upgrade",
                "--target",
                str(target),
                *map(str, chosen),
            )
        else:
            log(f"this host already satisfies {requirement}; nothing to install into {target}")
    _check_visible(target, manifest.spec.vllm_version)
    _write_atomic(target / STAMP_NAME, manifest.archive_sha256.encode())
    log(
        f"installed {requirement} into {target} in {time.monotonic() - started:.0f} s: put it "
        "first on PYTHONPATH"
    )


def _select_for_host(wheels_dir: Path, requirement: str, report: Path) -> list[Path]:
    """The wheels pip would install here for ``requirement``: it sees the host's distributions."""
    command = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index",
        "--find-links", str(wheels_dir), "--report", str(report), requirement,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise BundleError(
            f"pip cannot satisfy {requirement} on this host from the bundle (exit {result.returncode}); "
            "the bundle leaves torch's dependencies to the host, so one named below is missing or "
            f"at a version vLLM does not accept:\n{tail}"
        )
    chosen = []
    for item in json.loads(report.read_text())["install"]:
        path = Path(
            urllib.request.url2pathname(urllib.parse.urlsplit(item["download_info"]["url"]).path)
        )
        if path.resolve().parent != wheels_dir.resolve():
            raise BundleError(
                f"pip chose {path}, which is not from the bundle (a find-links in pip's config?)"
            )
        chosen.append(path)
    return chosen


def _run_pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", *args]
    log("$ pip " + " ".join(args[:6]) + (" ..." if len(args) > 6 else ""))
    result = subprocess.run(command, timeout=PIP_TIMEOUT_S)
    if result.returncode != 0:
        raise BundleError(f"pip {args[0]} failed (exit {result.returncode}); its output is above")


def _check_visible(target: Path, vllm_version: str) -> None:
    """With ``target`` first on PYTHONPATH, the vllm distribution found is the bundle's."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")])),
    )
    command = [sys.executable, "-c", "import importlib.metadata as m; print(m.version('vllm'))"]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env
    )
    found = result.stdout.strip() if result.returncode == 0 else "none"
    if found != vllm_version:
        raise BundleError(
            f"with {target} on PYTHONPATH the vllm found is {found}, not {vllm_version}"
        )


# --------------------------------------------------------------------------- CLI


def _part_mib(text: str) -> int:
    """argparse type of ``--part-mib``: a whole number of MiB in 1..60, returned in bytes."""
    try:
        mib = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number (allowed: 1..{MAX_PART_MIB})"
        ) from None
    if not 1 <= mib <= MAX_PART_MIB:
        raise argparse.ArgumentTypeError(
            f"{mib} is outside the allowed range 1..{MAX_PART_MIB} (MiB per part; "
            f"{MAX_PART_MIB} MiB is the transfer limit)"
        )
    return mib * MIB


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu_bundle.py",
        description=__doc__.split("\n\n")[0],
        epilog="See the module docstring of tools/gpu_bundle.py for what is bundled and why.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    build = commands.add_parser(
        "build",
        help="resolve, download, pack and split the bundle (networked machine)",
        description=(
            f"Resolve vllm=={VLLM_VERSION} for the GPU host's Python and platform, leave out "
            f"torch=={TORCH_VERSION} and its dependency closure (the host has them), download the "
            "rest as wheels into the project cache (a second build downloads nothing), and write "
            "bundle.partNNN files and manifest.json into --out."
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
        default=MAX_PART_MIB * MIB,
        metavar="MIB",
        help=f"largest part in MiB, 1..{MAX_PART_MIB} (default: {MAX_PART_MIB})",
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
        help="assemble, then pip install vllm offline (GPU host)",
        description=(
            "Check that this interpreter's Python version and glibc fit the bundle and that torch "
            "2.11.x imports, assemble the parts into a temporary directory, then run pip with "
            "--no-index. With --target, nothing in this environment changes: pip installs into "
            "DIR3, and the caller puts DIR3 first on PYTHONPATH; a rerun with the same bundle "
            "does nothing."
        ),
    )
    install_cmd.add_argument(
        "--parts", type=Path, required=True, help="directory with manifest.json and the parts"
    )
    install_cmd.add_argument(
        "--target", type=Path, metavar="DIR3", help="install here instead of into this environment"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
        print(f"gpu_bundle.py {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
