"""The inputs digest counts every generator module: each module of ``codegen/`` is a generator
module or excluded with a reason, and an edit to a generator module (the lock builder) makes
``regenerate`` regenerate, while one to an excluded module (the command line) does not."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

from codegen.digest import (
    GENERATOR_MODULES,
    NOT_GENERATOR,
    PACKAGE,
    RUNTIME_MODULES_OF_THE_GENERATOR,
)

from .fake_repo import HEADER, make_repo

REPO = Path(__file__).resolve().parents[2]
OVERLAY = (
    HEADER + "\n@subclass()\nclass A(Base):\n"
    "    @override\n    def helper(self, a: int, *, b: int = 2) -> int:\n        return a\n"
)


def test_every_codegen_module_is_counted_or_excluded_with_a_reason() -> None:
    """A module of ``codegen/`` (subpackages included) in neither list fails, as does one in both
    or an exclusion without a reason."""
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    counted, excluded = set(GENERATOR_MODULES), set(NOT_GENERATOR)
    unlisted = sorted(modules - counted - excluded)
    assert not unlisted, f"add each to GENERATOR_MODULES or NOT_GENERATOR: {unlisted}"
    assert not (counted | excluded) - modules, "listed, but not a module of codegen/"
    assert not counted & excluded
    assert all(reason.strip() for reason in NOT_GENERATOR.values())


def test_the_runtime_modules_the_generator_imports_count_by_their_bytes() -> None:
    """Every ``afd_models`` module a generator module imports (function-level imports included)
    is in ``RUNTIME_MODULES_OF_THE_GENERATOR``, and nothing else is."""
    imported = set()
    for name in GENERATOR_MODULES:
        for node in ast.walk(ast.parse((PACKAGE / name).read_text())):
            modules = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            imported |= {m for m in modules if m.startswith("afd_models.")}
    assert sorted(imported) == sorted(RUNTIME_MODULES_OF_THE_GENERATOR)


def test_an_edit_to_the_lock_builder_regenerates(tmp_path: Path) -> None:
    """`regenerate` run by a copy of codegen: up to date after a run, still after an edit to the
    command line, and regenerating after an edit to ``lock_build.py``."""
    context = make_repo(tmp_path, OVERLAY)
    tool = tmp_path / "tool"
    shutil.copytree(PACKAGE, tool / "codegen", ignore=shutil.ignore_patterns("__pycache__"))
    # `python -m` puts the working directory first: the copy's codegen runs, this checkout's
    # afd_models beside it
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [
        sys.executable,
        "-m",
        "codegen",
        "--repo",
        str(context.repo_root),
        "regenerate",
        "--upstream-root",
        str(context.sources["vllm"].root),
    ]

    def regenerate() -> str:
        done = subprocess.run(
            command, cwd=tool, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stderr

    assert "wrote" in regenerate()
    assert "up to date" in regenerate()
    for name, regenerates in (("cli.py", False), ("lock_build.py", True)):
        module = tool / "codegen" / name
        module.write_text(module.read_text() + "\n# edited\n")
        assert ("up to date" not in regenerate()) is regenerates, name
