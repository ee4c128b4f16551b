"""The worker-class table (``afd_models/launch.py``): one row per platform and role, every class it
names generated for the supported releases (read from their locks), and no code spelling a
worker's path or name outside it (docs and docstrings may). ``codegen check`` imports each path
at run time (``PTH001``/``PTH002``, tests/cpu/test_checks_runtime.py)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from afd_models.config import Role
from afd_models.launch import WORKER_CLASSES, Runner, WorkerClass, worker_class
from afd_models.release_order import release_key
from afd_models.worker_config import MODEL_RUNNER_V2_FROM
from codegen.generate import PINS_PATH, lock_path
from codegen.lock import read_lock
from codegen.sources import load_pins

REPO = Path(__file__).resolve().parents[2]
#: where code may not spell a worker class (the table itself aside)
CODE_ROOTS = ("afd_models", "tools", "benchmarks")
TABLE = "afd_models/launch.py"
EXCLUDED = ("afd_models/_generated",)


def _generated_classes() -> dict[str, set[str]]:
    """vLLM release -> the generated classes (``module:Class``) its lock records."""
    pins = load_pins(REPO / PINS_PATH)
    primary = {package: pin.version for package, pin in pins.items()}
    classes = {}
    for release in pins["vllm"].supported:
        lock = read_lock(REPO / lock_path(primary, {**primary, "vllm": release}))
        assert lock is not None, release
        classes[release] = set(lock.classes)
    return classes


def test_one_row_per_platform_and_role() -> None:
    keys = [(row.platform, row.role) for row in WORKER_CLASSES]
    assert len(set(keys)) == len(keys)
    assert {platform for platform, _ in keys} == {"cpu", "cuda", "npu"}
    assert all((platform, role) in keys for platform, _ in keys for role in Role)
    assert worker_class("cuda", Role.FFN).path == "afd_models.workers.AFDFFNWorker"
    with pytest.raises(
        LookupError, match="no AFD ffn worker on platform 'tpu'; allowed: cpu, cuda"
    ):
        worker_class("tpu", Role.FFN)


@pytest.mark.parametrize("row", WORKER_CLASSES, ids=lambda row: row.name)
def test_every_class_of_a_row_is_generated_for_the_supported_releases(row: WorkerClass) -> None:
    """The worker and its V1 runner on every supported release; the Model Runner V2 runner on
    those from MODEL_RUNNER_V2_FROM. Each is its role's (``AFDAttention...``/``AFDFFN...``)."""
    prefix = "AFDAttention" if row.role is Role.ATTENTION else "AFDFFN"
    for release, generated in _generated_classes().items():
        assert row.generated in generated, (release, row.generated)
        for runner, path in row.runners.items():
            assert path.rpartition(":")[2].startswith(prefix), path
            if runner is Runner.V1 or release_key(release) >= release_key(MODEL_RUNNER_V2_FROM):
                assert path in generated, (release, path)
    assert row.name.startswith(prefix)


def spelled_worker_classes(root: Path, roots: tuple[str, ...], allowed: str) -> Iterator[str]:
    """``path:line`` of each string in the code under ``roots`` (docstrings aside) that names a
    worker class of the table (its path or its name), except in ``allowed``."""
    names = tuple(row.name for row in WORKER_CLASSES)
    for top in roots:
        for path in sorted((root / top).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative == allowed or any(relative.startswith(e + "/") for e in EXCLUDED):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), relative)
            docstrings = {
                id(node.body[0].value)
                for node in ast.walk(tree)
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
                and node.body
                and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
            }
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    spelled = [name for name in names if name in node.value]
                    if spelled and id(node) not in docstrings:
                        yield f"{relative}:{node.lineno}: {', '.join(spelled)}"


def test_no_code_spells_a_worker_class_outside_the_table() -> None:
    """Deploy, the checks, verify and the benchmarks read the table; a worker path written out
    elsewhere would drift from it unseen."""
    found = list(spelled_worker_classes(REPO, CODE_ROOTS, TABLE))
    assert not found, "worker classes spelled outside afd_models/launch.py:\n" + "\n".join(found)


def test_a_spelled_worker_class_is_found(tmp_path: Path) -> None:
    """A path in a string is found, in a docstring it is not, and the table itself may."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/a.py").write_text(
        '"""Run ``afd_models.workers.AFDFFNCPUWorker``."""\n\n'
        'def f():\n    """AFDAttentionCPUWorker."""\n    return f"--worker-cls={1}AFDFFNWorker"\n'
    )
    (tmp_path / "pkg/table.py").write_text('PATH = "afd_models.workers.AFDFFNWorker"\n')
    assert list(spelled_worker_classes(tmp_path, ("pkg",), "pkg/table.py")) == [
        "pkg/a.py:5: AFDFFNWorker"
    ]
