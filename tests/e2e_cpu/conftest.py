"""What the e2e tests that start servers from the harness share: one tiny model, one log
directory, and the venv the documented wheel commands install into."""

from __future__ import annotations

import os
import shutil
import sysconfig
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from afd_models.cli.tiny_models import write_tiny_model
from afd_models.freshness import installed_vllm
from afd_models.generated_registry import registry_data
from tests.checkout import REPO, tracked_copy
from tests.e2e_cpu.test_documented_launch import GUIDE, documented_blocks, run_block


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The float32 tiny V2 model with widened logit and router margins (docs/testing.md)."""
    return write_tiny_model(
        tmp_path_factory.mktemp("model") / "tiny", "v2", seed=0, dtype="float32", margin_scale=50.0
    )


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@dataclass(frozen=True)
class WheelVenv:
    #: the fresh venv, with the wheel installed and vLLM beside it
    root: Path
    #: its python
    python: str
    #: the fresh clone the wheel was built in
    clone: Path


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WheelVenv]:
    """The documented wheel commands run in a fresh clone, with a fresh venv's pip first on
    PATH; the venv sees vLLM through a ``.pth`` line naming the CPU env's packages, not this
    checkout. test_serve_pair.py checks what it installed and serves from it."""
    root = tmp_path_factory.mktemp("wheel")
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=True)
    packages = Path(sysconfig.get_paths(vars={"base": str(env_dir)})["purelib"])
    (packages / "cpu-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # the wheel is for the installed vLLM: the primary needs no setting, another release names
    # itself (pip reads PIP_CONFIG_SETTINGS as --config-settings)
    release = installed_vllm()
    primary = str(registry_data(REPO)["SUPPORTED"]["vllm"][0])
    shell = {
        "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(env_dir),
        **({} if release == primary else {"PIP_CONFIG_SETTINGS": f"vllm={release}"}),
    }
    clone = tracked_copy(root / "clone")
    built = run_block(documented_blocks(GUIDE, ("wheel",))["wheel"], 600, cwd=clone, env=shell)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    yield WheelVenv(env_dir, str(env_dir / "bin" / "python"), clone)
    shutil.rmtree(env_dir, ignore_errors=True)
