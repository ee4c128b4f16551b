"""The project's PEP 517 build backend: setuptools', with the generated code built into each wheel.

``pip install .``, ``pip wheel .`` and ``python -m build`` produce a wheel that carries
``afd_models/_generated`` and the lock it was generated with, made from the pinned upstream
source of one vLLM release: the primary pin of ``overlay/pins.toml``, or the release named by the
``vllm`` config setting (``pip wheel . -C vllm=0.28.0``, ``python -m build -C vllm=0.28.0``).
Generation runs in a temporary copy of the source tree, so a build never rewrites the checkout.
Editable installs and sdists are setuptools' own: an editable install runs the checkout's code,
which ``nox -s regenerate`` generates.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Any

from setuptools import build_meta
from setuptools.build_meta import (  # noqa: F401  (the rest of the backend is setuptools')
    build_editable,
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

#: the config setting that picks the vLLM release a wheel is generated for
RELEASE_SETTING = "vllm"
#: what of the tree a wheel build needs (the package sources, the overlay with its pins and
#: locks, the project metadata); nothing else is copied
NEEDED = ("afd_models", "codegen", "overlay", "pyproject.toml", "MANIFEST.in", "README.md")
#: left out of the copied directories: earlier generated code and bytecode
SKIPPED = ("_generated", "__pycache__", "*.pyc")
#: seconds the generation may take (a cold cache first downloads vLLM's and vLLM-Ascend's source)
GENERATE_TIMEOUT_S = 1800


def _log(message: str, started: float) -> None:
    print(f"[afd wheel {time.monotonic() - started:5.1f} s] {message}", file=sys.stderr, flush=True)


def _release(config_settings: dict[str, Any] | None) -> list[str]:
    value = (config_settings or {}).get(RELEASE_SETTING)
    if value is None:
        return []
    if not isinstance(value, str) or not value:
        raise ValueError(
            f"config setting {RELEASE_SETTING}={value!r} is not allowed; allowed: one supported "
            "vLLM release of overlay/pins.toml, e.g. -C vllm=0.28.0"
        )
    return ["--vllm-version", value]


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    """Generate the code in a copy of the tree, then build the wheel there with setuptools."""
    started = time.monotonic()
    release = _release(config_settings)
    source = Path.cwd()
    out = str(Path(wheel_directory).resolve())
    with tempfile.TemporaryDirectory(prefix="afd-wheel-") as scratch:
        tree = Path(scratch) / "tree"
        for name in NEEDED:
            if (source / name).is_dir():
                shutil.copytree(source / name, tree / name, ignore=shutil.ignore_patterns(*SKIPPED))
            else:
                tree.mkdir(exist_ok=True)
                shutil.copy2(source / name, tree / name)
        (tree / "tools").mkdir()
        shutil.copy2(source / "tools" / "wheel_backend.py", tree / "tools" / "wheel_backend.py")
        _log(
            "generating afd_models/_generated from the pinned upstream source (a cold download "
            "cache fetches it from PyPI first)",
            started,
        )
        command = [sys.executable, "-m", "codegen", "regenerate", "--no-installed", *release]
        # the copy's codegen, whatever the build environment has on its path
        env = {**os.environ, "PYTHONPATH": str(tree)}
        try:
            done = subprocess.run(
                command, cwd=tree, env=env, check=False, timeout=GENERATE_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"building the wheel generates its code first, and `{' '.join(command[1:])}` "
                f"did not finish within {GENERATE_TIMEOUT_S} s (downloading the upstream source?)"
            ) from None
        if done.returncode != 0:
            raise RuntimeError(
                f"building the wheel generates its code first, and `{' '.join(command[1:])}` "
                f"exited with {done.returncode} (its output is above)"
            )
        _ship_lock(tree, env)
        _log("building the wheel with setuptools", started)
        previous = Path.cwd()
        os.chdir(tree)  # setuptools builds the project in the working directory
        try:
            wheel_name: str = build_meta.build_wheel(out, config_settings)
        finally:
            os.chdir(previous)
        _log(f"wrote {wheel_name}", started)
        return wheel_name


#: prints the lock the generation named in the copy's registry (``LOCK``), as JSON; run in the copy
READ_LOCK = (
    "import json, pathlib; from afd_models.generated_registry import registry_data; "
    "print(json.dumps((registry_data(pathlib.Path('.')) or {}).get('LOCK')))"
)


def _ship_lock(tree: Path, env: dict[str, str]) -> None:
    """Copy the generation's lock into the generated package, where the installed wheel's
    freshness check reads it (``afd_models.freshness``). The copy's own registry reader names
    it, in a fresh interpreter run in the copy, as the generation ran."""
    done = subprocess.run(
        [sys.executable, "-c", READ_LOCK],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    lock_name = json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else None
    if not isinstance(lock_name, str):
        raise RuntimeError(
            "the generation wrote no afd_models/_generated/__init__.py naming its LOCK; "
            f"the wheel would carry no lock ({done.stderr.strip()[-2000:] or 'no error output'})"
        )
    lock = PurePosixPath(lock_name)
    shutil.copy2(tree / lock, tree / "afd_models" / "_generated" / lock.name)
