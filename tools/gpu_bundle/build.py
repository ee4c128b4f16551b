"""Building a bundle on a networked machine: resolve vLLM's closure and torch's (once per spec),
download the wheels (once each), keep what the check imports (:mod:`tools.gpu_bundle.trim`),
pack them into one tar and cut it into parts that fit beside the checkout in one transfer."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from codegen.fetch import FetchError, ReleaseFile, cache_root, download, normalize_name, sha256_file
from tools.gpu_bundle.manifest import (
    DEFAULT_PART_MIB,
    MANIFEST_NAME,
    MIB,
    PART_NAME,
    PART_PREFIX,
    PIP_TIMEOUT_S,
    PROBE_TIMEOUT_S,
    RESOLUTION_REVISION,
    TRANSFER_MIB,
    BundleError,
    BundleSpec,
    DroppedDist,
    HostDist,
    Manifest,
    PartInfo,
    Plan,
    ResolvedWheel,
    Stripped,
    WheelInfo,
    WheelRole,
    check_spec,
    compatible_platforms,
    log,
    mib,
    platform_glibc,
)
from tools.gpu_bundle.trim import files_to_strip, select, strip_rules, strip_wheel
from tools.harness.cli import write_atomic
from tools.harness.processes import REPO_ROOT

#: the generated code, which is not committed but travels with the checkout
GENERATED = Path("afd_models") / "_generated"


# --------------------------------------------------------------------------- part size


def measure_checkout(root: Path = REPO_ROOT) -> int:
    """Bytes the checkout adds to each transfer: the files git tracks or does not ignore, and the
    generated code (ignored, carried on purpose)."""
    try:
        listed = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
            check=True,
            timeout=PROBE_TIMEOUT_S,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise BundleError(f"cannot list the checkout's files in {root} with git: {exc}") from exc
    paths = [root / name for name in listed.decode().split("\0") if name]
    paths += [p for p in (root / GENERATED).rglob("*") if "__pycache__" not in p.parts]
    return sum(p.stat().st_size for p in paths if p.is_file())


def check_part_bytes(part_bytes: int, checkout_bytes: int) -> None:
    """Refuse a part that does not fit beside the checkout in one transfer, naming the range."""
    largest = (TRANSFER_MIB * MIB - checkout_bytes) // MIB
    if not 1 <= part_bytes <= largest * MIB:
        raise BundleError(
            f"--part-mib {part_bytes / MIB:g} does not fit: each transfer carries at most "
            f"{TRANSFER_MIB} MiB, the checkout takes {mib(checkout_bytes)} of it (tracked and "
            f"untracked files and {GENERATED}); allowed: 1..{largest}"
        )


# --------------------------------------------------------------------------- resolve


def find_python(version: str, explicit: Path | None) -> Path:
    """An interpreter of ``version`` to run pip's resolution with (see :mod:`tools.gpu_bundle`)."""
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


# --------------------------------------------------------------------------- pack


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
    if not 1 <= part_bytes <= TRANSFER_MIB * MIB:
        raise BundleError(
            f"part_bytes={part_bytes} is outside the allowed range 1..{TRANSFER_MIB * MIB}"
        )
    parts: list[PartInfo] = []
    with archive.open("rb") as source:
        for data in iter(lambda: source.read(part_bytes), b""):
            part = PartInfo(
                f"{PART_PREFIX}{len(parts):03d}", len(data), hashlib.sha256(data).hexdigest()
            )
            write_atomic(out_dir / part.filename, data)
            log(f"  wrote {part.filename} ({mib(part.size)})")
            parts.append(part)
    return parts


def pack_bundle(
    wheels: Sequence[tuple[WheelInfo, Path]],
    out_dir: Path,
    spec: BundleSpec,
    *,
    part_bytes: int,
    host_provided: Sequence[HostDist] = (),
    dropped: Sequence[DroppedDist] = (),
    stripped: Sequence[Stripped] = (),
) -> Manifest:
    """Write the parts of ``wheels`` (each with its file) and ``manifest.json`` (last, so a
    crashed build leaves no manifest)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.iterdir():
        if stale.name == MANIFEST_NAME or PART_NAME.fullmatch(stale.name):
            stale.unlink()
    archive = out_dir / ".bundle.tar.partial"
    try:
        write_archive([path for _, path in wheels], archive)
        archive_sha256, archive_size = sha256_file(archive), archive.stat().st_size
        log(
            f"archive: {len(wheels)} wheels, {mib(archive_size)}; cutting into parts of <= "
            f"{mib(part_bytes)}"
        )
        parts = split_parts(archive, out_dir, part_bytes)
    finally:
        archive.unlink(missing_ok=True)
    manifest = Manifest(
        spec=spec,
        wheels=tuple(sorted((w for w, _ in wheels), key=lambda w: w.filename)),
        host_provided=tuple(host_provided),
        parts=tuple(parts),
        archive_sha256=archive_sha256,
        archive_size=archive_size,
        dropped=tuple(sorted(dropped, key=lambda d: d.name)),
        stripped=tuple(stripped),
    )
    write_atomic(
        out_dir / MANIFEST_NAME, (json.dumps(manifest.to_json(), indent=2) + "\n").encode()
    )
    return manifest


def build_bundle(
    out_dir: Path,
    spec: BundleSpec,
    *,
    part_bytes: int = DEFAULT_PART_MIB * MIB,
    python: Path | None = None,
    checkout_bytes: int | None = None,
) -> Manifest:
    """Resolve (once per spec), download (once per wheel), keep what the check imports, strip
    what it never loads, pack and split into ``out_dir``.

    Parameters:
        out_dir: where the parts and ``manifest.json`` go.
        spec: the vLLM, torch, Python and platform the bundle is for.
        part_bytes: the largest part, in bytes; it must fit beside the checkout in one transfer.
        python: interpreter of ``spec.python_version`` for pip's resolution (found if None).
        checkout_bytes: what the checkout adds to a transfer (measured if None).
    """
    started = time.monotonic()
    check_spec(spec)
    check_part_bytes(part_bytes, measure_checkout() if checkout_bytes is None else checkout_bytes)
    cache = cache_root() / "gpu-bundle" / spec.key
    plan = _resolve(cache, spec, python)
    log(
        f"left to the GPU host ({len(plan.host_provided)}): "
        + ", ".join(f"{h.name} {h.version}" for h in plan.host_provided)
    )
    downloaded = _download(plan, cache / "wheels")
    kept, dropped = select([info for info, _ in downloaded])
    paths = {info.filename: path for info, path in downloaded}
    files: list[tuple[WheelInfo, Path]] = []
    stripped: list[Stripped] = []
    rules = strip_rules(spec)
    for info in kept:
        path = paths[info.filename]
        removed, summary = files_to_strip(path, rules.get(info.name, ()))
        if removed:
            info, path = _stripped(info, path, removed, cache / "stripped")
            stripped += summary
        files.append((info, path))
    log(
        f"the check imports {len(kept)} of {len(downloaded)} distributions; dropped "
        f"{len(dropped)} ({mib(sum(d.size for d in dropped))}), stripped "
        f"{sum(s.files for s in stripped)} files ({mib(sum(s.size for s in stripped))})"
    )
    manifest = pack_bundle(
        files,
        out_dir,
        spec,
        part_bytes=part_bytes,
        host_provided=plan.host_provided,
        dropped=dropped,
        stripped=stripped,
    )
    log(
        f"bundle ready in {out_dir}: {len(manifest.wheels)} wheels, {mib(manifest.archive_size)} in "
        f"{len(manifest.parts)} parts of <= {mib(part_bytes)} ({time.monotonic() - started:.0f} s)"
    )
    return manifest


def _resolve(cache: Path, spec: BundleSpec, python: Path | None) -> Plan:
    """The cached resolution of ``spec``, or a new one (stored for the next build)."""
    plan = _cached_plan(cache / "resolution.json", spec)
    if plan is not None:
        log(f"reusing the resolution in {cache}")
        return plan
    interpreter = find_python(spec.python_version, python)
    with tempfile.TemporaryDirectory(prefix="afd-gpu-bundle-") as scratch:
        torch_closure = _pip_resolve(
            interpreter, f"torch=={spec.torch_version}", spec, Path(scratch)
        )
        vllm_closure = _pip_resolve(interpreter, f"vllm=={spec.vllm_version}", spec, Path(scratch))
    plan = plan_bundle(vllm_closure, torch_closure, spec)
    cache.mkdir(parents=True, exist_ok=True)
    write_atomic(
        cache / "resolution.json", json.dumps(_plan_to_json(plan, spec), indent=2).encode()
    )
    return plan


def _download(plan: Plan, wheels_dir: Path) -> list[tuple[WheelInfo, Path]]:
    """Every wheel of the plan, from the cache or the index: the dropped ones too, whose sizes
    the manifest records."""
    cached = sum((wheels_dir / w.filename).exists() for w in plan.wheels)
    log(f"{len(plan.wheels)} wheels in vLLM's closure, {cached} already in {wheels_dir}")
    downloaded = []
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
        info = WheelInfo(
            wheel.filename, wheel.name, wheel.version, wheel.sha256, path.stat().st_size, wheel.role
        )
        downloaded.append((info, path))
    return downloaded


def _stripped(
    info: WheelInfo, path: Path, removed: Sequence[str], cache: Path
) -> tuple[WheelInfo, Path]:
    """``path`` without the ``removed`` files, written once per wheel and set of files."""
    key = hashlib.sha256("\n".join([info.sha256, *sorted(removed)]).encode())
    dest = cache / key.hexdigest()[:16] / info.filename
    if not dest.exists():
        log(f"stripping {len(removed)} files from {info.filename}")
        strip_wheel(path, dest, removed)
    stripped = dataclasses.replace(
        info, sha256=sha256_file(dest), size=dest.stat().st_size, stripped_from=info.sha256
    )
    return stripped, dest
