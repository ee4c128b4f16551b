"""The GPU bundle: parts, manifest and assembly, resolution planning, host checks, CLI (tools.gpu_bundle)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import random
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tools.gpu_bundle import build, cli, install, trim
from tools.gpu_bundle.install import HostFacts
from tools.gpu_bundle.manifest import (
    FORMAT,
    MIB,
    BundleError,
    BundleSpec,
    DroppedDist,
    HostDist,
    Manifest,
    ResolvedWheel,
    Stripped,
    WheelInfo,
    WheelRole,
    compatible_platforms,
)
from tools.harness.processes import REPO_ROOT

from .gpu_fakes import FAKE_TORCH, tiny_wheel, write_packages

#: the command as documented, run from the repository root
COMMAND = [sys.executable, "-m", "tools.gpu_bundle"]
SPEC = BundleSpec("0.26.0", "2.11.0", "3.12", "manylinux_2_31_x86_64")
#: Small enough that a few KiB of fake wheels make several parts.
PART_BYTES = 2048


def _fake_wheels(
    directory: Path, sizes: tuple[int, ...] = (3000, 5000, 1500)
) -> list[tuple[WheelInfo, Path]]:
    """Random bytes under wheel names: parts and assembly never open a wheel."""
    directory.mkdir(parents=True, exist_ok=True)
    wheels = []
    for i, size in enumerate(sizes):
        data = random.Random(i).randbytes(size)
        path = directory / f"pkg{i}-1.{i}-py3-none-any.whl"
        path.write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        info = WheelInfo(path.name, f"pkg{i}", f"1.{i}", sha, size, WheelRole.REQUIRED, "traced")
        wheels.append((info, path))
    return wheels


@dataclasses.dataclass
class Packed:
    wheels_dir: Path
    out: Path
    manifest: Manifest


@pytest.fixture
def packed(tmp_path: Path) -> Packed:
    wheels_dir = tmp_path / "wheels"
    out = tmp_path / "out"
    packed = build.pack_bundle(
        _fake_wheels(wheels_dir),
        out,
        SPEC,
        part_bytes=PART_BYTES,
        host_provided=[HostDist("torch", "2.11.0")],
        dropped=[DroppedDist("tilelang", "0.1.9", 45_000_000, "never imported")],
        stripped=[Stripped("pkg0-1.0-py3-none-any.whl", "pkg0/x[.]so", 1, 99, "sm100 only")],
    )
    return Packed(wheels_dir, out, packed)


# --------------------------------------------------------------------------- parts and manifest


def test_round_trip(packed: Packed, tmp_path: Path) -> None:
    """assemble gives back exactly the packed wheels, byte for byte, and nothing else."""
    into = tmp_path / "into"
    paths = install.assemble(packed.out, into)
    assert [p.name for p in paths] == [w.filename for w in packed.manifest.wheels]
    for path in paths:
        assert path.read_bytes() == (packed.wheels_dir / path.name).read_bytes()
    assert sorted(p.name for p in into.iterdir()) == sorted(p.name for p in paths)


def test_parts_respect_the_limit(packed: Packed) -> None:
    """Every part is at most the limit, only the last is shorter, and they join to the archive."""
    parts = packed.manifest.parts
    assert len(parts) == math.ceil(packed.manifest.archive_size / PART_BYTES) > 2
    assert all(p.size == PART_BYTES for p in parts[:-1]) and 0 < parts[-1].size <= PART_BYTES
    joined = b"".join((packed.out / p.filename).read_bytes() for p in parts)
    assert [p.filename for p in parts] == [f"bundle.part{i:03d}" for i in range(len(parts))]
    assert hashlib.sha256(joined).hexdigest() == packed.manifest.archive_sha256
    assert len(joined) == packed.manifest.archive_size


def test_manifest_on_disk(packed: Packed) -> None:
    """manifest.json carries the spec, wheels, parts and archive, and reads back unchanged."""
    data = json.loads((packed.out / "manifest.json").read_text())
    assert data["format"] == FORMAT
    assert (data["vllm_version"], data["python_version"], data["platform"]) == (
        "0.26.0",
        "3.12",
        "manylinux_2_31_x86_64",
    )
    assert {w["name"] for w in data["wheels"]} == {"pkg0", "pkg1", "pkg2"}
    assert set(data["wheels"][0]) == {
        "filename", "name", "version", "sha256", "size", "role", "why", "stripped_from",
    }  # fmt: skip
    assert set(data["parts"][0]) == {"filename", "size", "sha256"}
    assert data["dropped"] == [
        {"name": "tilelang", "version": "0.1.9", "size": 45_000_000, "why": "never imported"}
    ]
    assert data["stripped"][0]["pattern"] == "pkg0/x[.]so" and data["stripped"][0]["files"] == 1
    assert data["sizes"] == {"wheels": 9500, "dropped": 45_000_000, "stripped": 99}
    assert install.read_manifest(packed.out) == packed.manifest


def test_archive_is_reproducible(packed: Packed, tmp_path: Path) -> None:
    """Packing the same wheels again gives the same archive and parts, and removes stale parts."""
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "bundle.part099").write_bytes(b"stale")
    wheels = [(w, packed.wheels_dir / w.filename) for w in packed.manifest.wheels]
    again = build.pack_bundle(wheels, tmp_path / "again", SPEC, part_bytes=PART_BYTES)
    assert again.archive_sha256 == packed.manifest.archive_sha256
    assert again.parts == packed.manifest.parts
    assert not (tmp_path / "again" / "bundle.part099").exists()


def _flip_byte(out: Path) -> None:
    path = out / "bundle.part001"
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))


def _edit_manifest(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def edit(out: Path) -> None:
        data = json.loads((out / "manifest.json").read_text())
        change(data)
        (out / "manifest.json").write_text(json.dumps(data))

    return edit


DAMAGE = [
    pytest.param(_flip_byte, ["bundle.part001 has sha256", "expected"], id="corrupt-part"),
    pytest.param(
        lambda out: (out / "bundle.part002").unlink(), ["bundle.part002 is missing"], id="missing"
    ),
    pytest.param(
        lambda out: (out / "bundle.part000").write_bytes(b"short"),
        ["bundle.part000 has 5 bytes", f"expected {PART_BYTES} bytes"],
        id="truncated",
    ),
    pytest.param(
        _edit_manifest(lambda d: d.update(archive_sha256="0" * 64)),
        ["manifest says archive sha256 " + "0" * 64, "does not belong"],
        id="archive-hash",
    ),
    pytest.param(
        _edit_manifest(lambda d: d.update(format="other/1")),
        ["format 'other/1' is not 'afd-gpu-bundle/2'"],
        id="format",
    ),
    pytest.param(
        lambda out: (out / "manifest.json").unlink(), ["no manifest.json in"], id="no-manifest"
    ),
    pytest.param(
        _edit_manifest(lambda d: d["parts"][0].update(filename="../escape")),
        ["parts[0]: 'filename' is '../escape'"],
        id="part-name-leaves-dir",
    ),
    pytest.param(
        _edit_manifest(lambda d: d.pop("wheels")), ["key 'wheels' is missing"], id="missing-key"
    ),
    pytest.param(
        _edit_manifest(lambda d: d["wheels"].pop(0)),
        ["not listed ['pkg0-1.0-py3-none-any.whl']"],
        id="unlisted-wheel",
    ),
]


@pytest.mark.parametrize(("damage", "messages"), DAMAGE)
def test_damage_is_named(
    packed: Packed, tmp_path: Path, damage: Callable[[Path], None], messages: list[str]
) -> None:
    """A missing or corrupt part, a wrong archive hash or a bad manifest is an error that says which, and nothing is extracted."""
    damage(packed.out)
    into = tmp_path / "into"
    with pytest.raises(BundleError) as caught:
        install.assemble(packed.out, into)
    for message in messages:
        assert message in str(caught.value)
    assert not into.exists() or not any(into.iterdir())


def test_every_bad_part_is_named(packed: Packed, tmp_path: Path) -> None:
    """Several damaged parts are reported together, each with the sha256 it should have."""
    _flip_byte(packed.out)
    (packed.out / "bundle.part003").write_bytes(b"x" * PART_BYTES)
    with pytest.raises(BundleError) as caught:
        install.assemble(packed.out, tmp_path / "into")
    for part in (packed.manifest.parts[1], packed.manifest.parts[3]):
        assert f"{part.filename} has sha256" in str(caught.value)
        assert f"expected {part.sha256}" in str(caught.value)


@pytest.mark.parametrize("part_bytes", [0, -1, 64 * MIB + 1])
def test_split_refuses_bad_sizes(tmp_path: Path, part_bytes: int) -> None:
    """split_parts takes 1 byte to one 64 MiB transfer per part, nothing else."""
    archive = tmp_path / "archive.tar"
    archive.write_bytes(b"x" * 100)
    with pytest.raises(BundleError, match=f"part_bytes={part_bytes} is outside the allowed range"):
        build.split_parts(archive, tmp_path, part_bytes)


# --------------------------------------------------------------------------- resolution


def _wheel(name: str, version: str) -> ResolvedWheel:
    return ResolvedWheel(name, version, f"{name}-{version}.whl", f"https://x/{name}", "a" * 64)


def _closure(*pins: str) -> dict[str, ResolvedWheel]:
    return {n: _wheel(n, v) for n, v in (pin.split("==") for pin in pins)}


def test_plan_leaves_torch_closure_to_the_host() -> None:
    """torch's closure stays out by name; another version of one of its members is an alternate."""
    vllm = _closure(
        "vllm==0.26.0", "torch==2.11.0", "numpy==2.3.5", "setuptools==80.9.0", "sympy==1.14"
    )
    torch = _closure("torch==2.11.0", "setuptools==81.0.0", "sympy==1.14", "triton==3.6.0")
    plan = build.plan_bundle(vllm, torch, SPEC)
    assert [(w.name, w.version, w.role) for w in plan.wheels] == [
        ("numpy", "2.3.5", WheelRole.REQUIRED),
        ("setuptools", "80.9.0", WheelRole.ALTERNATE),
        ("vllm", "0.26.0", WheelRole.REQUIRED),
    ]
    assert plan.host_provided == (
        HostDist("setuptools", "81.0.0"),
        HostDist("sympy", "1.14"),
        HostDist("torch", "2.11.0"),
        HostDist("triton", "3.6.0"),
    )


def test_plan_refuses_another_torch() -> None:
    """A vLLM resolution with a torch other than the host's is refused, not bundled."""
    with pytest.raises(
        BundleError, match=r"resolved torch 2\.10\.0, but the GPU host has torch 2\.11\.0"
    ):
        build.plan_bundle(
            _closure("vllm==0.26.0", "torch==2.10.0"), _closure("torch==2.11.0"), SPEC
        )


ENVIRONMENT = {"python_version": "3.12", "platform_machine": "x86_64", "sys_platform": "linux"}


def _report(environment: dict[str, str], archive_info: dict[str, Any]) -> dict[str, Any]:
    url = "https://files.example/p/jinja2-3.1.6-py3-none-any.whl"
    item = {
        "metadata": {"name": "Jinja2", "version": "3.1.6"},
        "download_info": {"url": url, "archive_info": archive_info},
    }
    return {"environment": environment, "install": [item]}


def test_report_is_read_by_canonical_name() -> None:
    """A pip report maps canonical names to version, file name, URL and sha256."""
    report = _report(ENVIRONMENT, {"hashes": {"sha256": "b" * 64}})
    assert build.read_report(report, SPEC, "vllm") == {
        "jinja2": ResolvedWheel(
            "jinja2",
            "3.1.6",
            "jinja2-3.1.6-py3-none-any.whl",
            "https://files.example/p/jinja2-3.1.6-py3-none-any.whl",
            "b" * 64,
        )
    }


@pytest.mark.parametrize(
    ("environment", "archive_info", "message"),
    [
        (
            {**ENVIRONMENT, "python_version": "3.11"},
            {"hashes": {"sha256": "b" * 64}},
            "'python_version': '3.11'",
        ),
        (
            {**ENVIRONMENT, "platform_machine": "aarch64"},
            {"hashes": {"sha256": "b" * 64}},
            "'platform_machine': 'aarch64'",
        ),
        (ENVIRONMENT, {}, "no sha256 for jinja2"),
    ],
)
def test_report_is_refused(
    environment: dict[str, str], archive_info: dict[str, Any], message: str
) -> None:
    """Markers evaluated for another Python or machine, or a wheel without a hash, stop the build."""
    with pytest.raises(BundleError, match=message):
        build.read_report(_report(environment, archive_info), SPEC, "vllm")


def test_compatible_platforms() -> None:
    """A manylinux tag brings every older tag of its architecture, newest first, and no newer one."""
    tags = compatible_platforms("manylinux_2_31_x86_64")
    assert tags[:2] == ["manylinux_2_31_x86_64", "manylinux_2_30_x86_64"]
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_32_x86_64" not in tags and len(tags) == (31 - 5 + 1) + 3
    legacy = compatible_platforms("manylinux2014_aarch64")
    assert legacy[0] == "manylinux_2_17_aarch64" and "manylinux_2_18_aarch64" not in legacy


@pytest.mark.parametrize("tag", ["macosx_11_0_arm64", "linux_x86_64", "manylinux_3_1_x86_64"])
def test_non_manylinux_platform_is_refused(tag: str) -> None:
    """Only manylinux tags are accepted, and the error names the value and the allowed forms."""
    with pytest.raises(BundleError, match=f"--platform '{tag}' is not a manylinux tag; allowed"):
        compatible_platforms(tag)


# --------------------------------------------------------------------------- host checks


def _manifest(spec: BundleSpec = SPEC) -> Manifest:
    return Manifest(spec, (), (), (), "0" * 64, 0)


GOOD_HOST = HostFacts("3.12", "cpython", ("glibc", "2.35"), "x86_64", "2.11.0+cu130")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({}, None),
        ({"torch_version": "2.11.1"}, None),
        ({"python_version": "3.11"}, "the bundle is for CPython 3.12, this is cpython 3.11"),
        ({"implementation": "pypy"}, "this is pypy 3.12"),
        ({"libc": ("glibc", "2.28")}, "needs glibc >= 2.31, this host has glibc 2.28"),
        ({"libc": ("", "")}, "this host has no glibc"),
        (
            {"machine": "aarch64"},
            "the bundle is for x86_64 (manylinux_2_31_x86_64), this machine is aarch64",
        ),
        (
            {"torch_version": "2.10.0"},
            "the bundle needs torch 2.11.x (it was built for torch 2.11.0), this host has torch "
            "2.10.0",
        ),
        (
            {"torch_version": None, "torch_error": "ModuleNotFoundError: No module named 'torch'"},
            "`import torch` failed (ModuleNotFoundError: No module named 'torch')",
        ),
    ],
)
def test_host_problems(change: dict[str, Any], message: str | None) -> None:
    """Each way a host does not fit is reported on its own; a fitting host has no problems."""
    problems = install.host_problems(_manifest(), dataclasses.replace(GOOD_HOST, **change))
    if message is None:
        assert problems == []
    else:
        assert len(problems) == 1 and message in problems[0]


# --------------------------------------------------------------------------- CLI


@pytest.mark.parametrize(
    ("command", "mentions"),
    [
        ([], "install"),
        (["build"], "--part-mib"),
        (["assemble"], "--into"),
        (["install"], "--target"),
    ],
)
def test_help_needs_only_the_standard_library(command: list[str], mentions: str) -> None:
    """--help of the tool and of each command exits 0 with site-packages and PYTHONPATH switched
    off (-S -E), from the repository root."""
    result = subprocess.run(
        [sys.executable, "-S", "-E", *COMMAND[1:], *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.startswith("usage: python -m tools.gpu_bundle") and mentions in result.stdout
    )


def test_the_install_the_gpu_check_calls_needs_only_the_standard_library() -> None:
    """tools.gpu_check imports the bundle's install as a module of the package, with
    site-packages and PYTHONPATH switched off (-S -E), as on a GPU host without vLLM."""
    code = "from tools.gpu_check.host import install_bundle; print(install_bundle.__name__)"
    result = subprocess.run(
        [sys.executable, "-S", "-E", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["install_bundle"]


#: the largest part that fits beside this checkout in one 64 MiB transfer
LARGEST_PART_MIB = (64 * MIB - build.measure_checkout()) // MIB


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "--part-mib 0 does not fit"),
        ("-3", "--part-mib -3 does not fit"),
        (str(LARGEST_PART_MIB + 1), f"--part-mib {LARGEST_PART_MIB + 1} does not fit"),
        ("64", "--part-mib 64 does not fit"),
        ("abc", "argument --part-mib: 'abc' is not a whole number of MiB"),
    ],
)
def test_a_part_that_cannot_fit_beside_the_checkout_is_refused(
    tmp_path: Path, value: str, message: str
) -> None:
    """A --part-mib that does not leave room for the checkout in a 64 MiB transfer stops the
    build before anything runs (a usage error, exit 3), naming the value and the range."""
    result = subprocess.run(
        [*COMMAND, "build", "--out", str(tmp_path / "out"), f"--part-mib={value}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 3, result.stderr
    assert message in result.stderr
    if value != "abc":
        last = result.stderr.strip().splitlines()[-1]
        assert last.endswith(f"allowed: 1..{LARGEST_PART_MIB}") and "the checkout takes" in last
    assert not (tmp_path / "out").exists()


def test_the_default_part_fits_beside_this_checkout() -> None:
    """48 MiB parts leave room for the checkout (tracked and untracked files and the generated
    code, about 11 MiB); this fails once the checkout outgrows 16 MiB."""
    checkout = build.measure_checkout()
    generated = sum(p.stat().st_size for p in (REPO_ROOT / build.GENERATED).rglob("*.py"))
    assert generated > 0 and checkout > generated + (REPO_ROOT / "README.md").stat().st_size
    default = cli.build_parser().parse_args(["build", "--out", "x"]).part_bytes
    assert default == 48 * MIB
    build.check_part_bytes(default, checkout)
    build.check_part_bytes(LARGEST_PART_MIB * MIB, checkout)
    with pytest.raises(BundleError, match=f"allowed: 1..{LARGEST_PART_MIB}$"):
        build.check_part_bytes((LARGEST_PART_MIB + 1) * MIB, checkout)


# --------------------------------------------------------------------------- install, offline


def _install(parts: Path, target: Path, fake_torch: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(fake_torch))
    return subprocess.run(
        [*COMMAND, "install", "--parts", str(parts), "--target", str(target)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=REPO_ROOT,
    )


@pytest.fixture
def host_bundle(tmp_path: Path) -> tuple[Path, Path]:
    """Parts of a bundle of one tiny ``vllm`` wheel for this interpreter that requires a
    distribution the bundle left out, and a fake torch 2.11."""
    fake_torch = write_packages(tmp_path / "torch", FAKE_TORCH)
    wheels = tmp_path / "wheels"
    # a version no environment has, so pip must take it from the bundle
    spec = BundleSpec(
        "0.0.1.dev7",
        "2.11.0",
        f"{sys.version_info[0]}.{sys.version_info[1]}",
        f"manylinux_2_17_{platform.machine()}",
    )
    info = tiny_wheel(wheels, "vllm", spec.vllm_version, requires=["tilelang==0.1.9"])
    dropped = [DroppedDist("tilelang", "0.1.9", 45_000_000, "never imported")]
    build.pack_bundle(
        [(info, wheels / info.filename)],
        tmp_path / "parts",
        spec,
        part_bytes=4096,
        dropped=dropped,
    )
    return tmp_path / "parts", fake_torch


def test_install_into_target_offline(host_bundle: tuple[Path, Path], tmp_path: Path) -> None:
    """install --target puts exactly the bundle's wheels there with pip offline, without what
    they require and the bundle left out; a rerun does nothing."""
    parts, fake_torch = host_bundle
    target = tmp_path / "target"
    first = _install(parts, target, fake_torch)
    assert first.returncode == 0, first.stderr
    assert (target / "vllm-0.0.1.dev7.dist-info" / "METADATA").is_file()
    assert not any(path.name.startswith("tilelang") for path in target.iterdir())
    assert "already holds this bundle" not in first.stderr
    second = _install(parts, target, fake_torch)
    assert second.returncode == 0, second.stderr
    assert "already holds this bundle" in second.stderr


def test_install_refuses_another_python(host_bundle: tuple[Path, Path], tmp_path: Path) -> None:
    """A bundle for another Python is refused (exit 3) before pip runs, with the versions in the
    message."""
    parts, fake_torch = host_bundle
    data = json.loads((parts / "manifest.json").read_text())
    data["python_version"] = "3.99"
    (parts / "manifest.json").write_text(json.dumps(data))
    result = _install(parts, tmp_path / "target", fake_torch)
    assert result.returncode == 3
    assert "the bundle is for CPython 3.99" in result.stderr
    assert "python -m tools.gpu_bundle install: error: this host cannot take" in result.stderr
    assert not (tmp_path / "target").exists()


def test_another_torch_is_refused_before_any_assembly(
    host_bundle: tuple[Path, Path], tmp_path: Path
) -> None:
    """A host whose torch is not the bundle's is refused at once, naming both versions, before a
    part is read: with a part missing, the torch is what the error names."""
    parts, fake_torch = host_bundle
    (parts / "bundle.part000").unlink()
    env = {"FAKE_TORCH_VERSION": "2.10.0+cu126"}
    result = subprocess.run(
        [*COMMAND, "install", "--parts", str(parts), "--target", str(tmp_path / "target")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(fake_torch), **env},
        cwd=REPO_ROOT,
    )
    assert result.returncode == 3
    last = result.stderr.strip().splitlines()[-1]
    assert last.endswith(
        "the bundle needs torch 2.11.x (it was built for torch 2.11.0), this host has torch "
        "2.10.0+cu126"
    )
    assert "missing" not in result.stderr and not (tmp_path / "target").exists()


# --------------------------------------------------------------------------- what the check needs


def _wheel_info(name: str, role: WheelRole = WheelRole.REQUIRED, size: int = 1000) -> WheelInfo:
    return WheelInfo(f"{name}-1.0-py3-none-any.whl", name, "1.0", "a" * 64, size, role)


def test_the_bundle_keeps_what_the_check_imports_and_says_why_it_drops_the_rest() -> None:
    """Traced distributions, vLLM's CUDA-path imports and its Python 3.12-only requirements are
    kept, each with why; the rest is dropped with its size and why: optional imports the check
    never uses, alternates wanted only by what was dropped, and what nothing imports."""
    kept, dropped = trim.select(
        [
            _wheel_info("vllm"),
            _wheel_info("flashinfer-python"),
            _wheel_info("six"),
            _wheel_info("setuptools", WheelRole.ALTERNATE),
            _wheel_info("cuda-bindings", WheelRole.ALTERNATE),
            _wheel_info("opencv-python-headless", size=63_000_000),
            _wheel_info("tilelang", size=45_000_000),
        ]
    )
    assert {w.name: w.why for w in kept} == {
        "vllm": trim.TRACED_WHY,
        "flashinfer-python": trim.CUDA_PATH["flashinfer-python"],
        "six": "vLLM requires six on Python > 3.11",
        "setuptools": "vLLM requires setuptools<81 on Python > 3.11; torch's closure has 81",
    }
    assert dropped == [
        DroppedDist("cuda-bindings", "1.0", 1000, trim.ALTERNATE_WHY),
        DroppedDist(
            "opencv-python-headless", "1.0", 63_000_000, trim.OPTIONAL["opencv-python-headless"]
        ),
        DroppedDist("tilelang", "1.0", 45_000_000, trim.DROPPED_WHY),
    ]
    assert "opencv-python-headless" in trim.TRACED  # imported by the trace, yet not needed


VLLM_FILES = {
    "vllm/__init__.py": "",
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "fa2" * 1000,
    "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": "fa3",
    "vllm/vllm-rs": "rust",
    "vllm/third_party/fmha_sm100/__init__.py": "",
    "vllm/third_party/fmha_sm100/cute/kernel.py": "",
    "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so": "311",
    "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so": "312",
}


def test_stripping_removes_what_an_sm90_check_never_loads(tmp_path: Path) -> None:
    """FA2, the Rust frontend, the SM100 kernels and DeepGEMM for other Pythons go, with their
    RECORD lines; the rest keeps its bytes and permissions, and pip installs the result."""
    info = tiny_wheel(
        tmp_path / "in",
        "vllm",
        "0.26.0",
        VLLM_FILES,
        executable={"vllm/vllm-rs", "vllm/__init__.py"},
    )
    source = tmp_path / "in" / info.filename
    removed, summary = trim.files_to_strip(source, trim.strip_rules(SPEC)["vllm"])
    assert sorted(removed) == [
        "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so",
        "vllm/third_party/fmha_sm100/__init__.py",
        "vllm/third_party/fmha_sm100/cute/kernel.py",
        "vllm/vllm-rs",
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    ]
    assert sorted((s.pattern, s.files) for s in summary) == [
        (r"vllm/third_party/deep_gemm/_C\.cpython-(?!312-)\d+-[^/]*\.so", 1),
        ("vllm/third_party/fmha_sm100/.*", 2),
        ("vllm/vllm-rs", 1),
        (r"vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so", 1),
    ]
    assert all(s.wheel == info.filename and s.size > 0 and s.why for s in summary)
    dest = tmp_path / "out" / info.filename
    trim.strip_wheel(source, dest, removed)
    with zipfile.ZipFile(dest) as stripped, zipfile.ZipFile(source) as original:
        names = set(stripped.namelist())
        assert names == set(original.namelist()) - set(removed)
        record = stripped.read("vllm-0.26.0.dist-info/RECORD").decode()
        assert not any(path in record for path in removed) and "_vllm_fa3_C" in record
        for name in names - {"vllm-0.26.0.dist-info/RECORD"}:
            assert stripped.read(name) == original.read(name)
            assert stripped.getinfo(name).external_attr == original.getinfo(name).external_attr
    target = tmp_path / "target"
    pip = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet"]
    result = subprocess.run(
        [*pip, "--target", str(target), str(dest)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert (target / "vllm" / "vllm_flash_attn" / "_vllm_fa3_C.abi3.so").is_file()
    assert not (target / "vllm" / "vllm-rs").exists()
