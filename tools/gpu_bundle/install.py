"""The GPU host's side of a bundle: verify and join the parts, extract exactly the manifest's
wheels, check that this host fits the bundle, and install its wheels with pip, offline."""

from __future__ import annotations

import hashlib
import json
import os
import platform as host_platform
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tools.gpu_bundle.manifest import (
    MANIFEST_NAME,
    PIP_TIMEOUT_S,
    PROBE_TIMEOUT_S,
    STAMP_NAME,
    BundleError,
    Manifest,
    log,
    mib,
    platform_glibc,
)
from tools.harness.cli import write_atomic


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
        log(f"{len(manifest.parts)} parts verified, archive {mib(size)}; extracting into {into}")
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
            write_atomic(into / wheel.filename, data)
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
    def probe(cls) -> HostFacts:
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
            f"the bundle needs torch {'.'.join(wanted)}.x (it was built for torch "
            f"{spec.torch_version}), this host has torch {facts.torch_version}"
        )
    return problems


def install(parts_dir: Path, *, target: Path | None = None) -> None:
    """Assemble the bundle and install its wheels with pip, offline.

    The bundle holds what the check imports, not vLLM's whole closure, so pip installs exactly
    its wheels (``--no-deps``; ``--no-compile``: each module is compiled when first imported).
    Without ``target`` pip installs into the running interpreter's environment. With it, nothing
    there changes: the caller puts ``target`` first on ``PYTHONPATH`` (``sys.path`` for this
    process, ``os.environ`` for vLLM's worker processes); ``target/bin`` holds the scripts.

    Raises:
        BundleError: the host cannot take the bundle (Python, glibc, torch: checked before
            anything is assembled), a part is missing or damaged, or pip fails. The stamp is
            written only after success.
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
        wheels = assemble(parts_dir, Path(scratch) / "wheels")
        where = [] if target is None else ["--target", str(target), "--upgrade"]
        log(f"installing {len(wheels)} wheels into {target or sys.prefix}")
        _run_pip(
            "install", "--no-index", "--no-deps", "--no-compile", "--quiet", *where,
            *map(str, wheels),
        )  # fmt: skip
    if target is not None:
        _check_visible(target, manifest.spec.vllm_version)
        write_atomic(target / STAMP_NAME, manifest.archive_sha256.encode())
    log(
        f"installed {requirement} into {target or sys.prefix} in "
        f"{time.monotonic() - started:.0f} s" + (": put it first on PYTHONPATH" if target else "")
    )


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
