"""The no-monkey-patch scanner: what it flags and what it leaves alone (codegen.checks.monkeypatch)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from codegen.checks.monkeypatch import scan, scan_source


@pytest.mark.parametrize(
    ("source", "codes"),
    [
        ("import torch\ntorch.set_num_threads = lambda n: None", ["MP001"]),
        (
            "from vllm.model_executor.models import deepseek_v2\ndeepseek_v2.FusedMoE = object",
            ["MP001"],
        ),
        ("from vllm.x import Cls\nCls.forward = None", ["MP001"]),
        ("from vllm.x import Cls\nCls.a.b += 1", ["MP001"]),
        ("from vllm.x import Cls\ndel Cls.forward", ["MP001"]),
        ("def f(x):\n    type(x).forward = None", ["MP001"]),
        ("def f(x):\n    x.__class__.forward = None", ["MP001"]),
        ("import vllm\nsetattr(vllm, 'x', 1)", ["MP002"]),
        ("def f(x):\n    setattr(type(x), 'y', 1)", ["MP002"]),
        ("import sys\nsys.modules['vllm'] = object()", ["MP003"]),
        ("import sys\nsys.modules.update({})", ["MP003"]),
        ("import sys\ndel sys.modules['vllm']", ["MP003"]),
        ("from unittest import mock\nwith mock.patch('vllm.x'):\n    pass", ["MP004"]),
        ("def test(monkeypatch):\n    monkeypatch.setattr('vllm.x.y', 1)", ["MP004"]),
        # allowed: instances and our own objects
        (
            "class A:\n    def __init__(self):\n        self.gate = None\n        self.gate.bias = 1",
            [],
        ),
        ("def f(config):\n    config.additional_config = {}", []),
        ("def f(obj):\n    setattr(obj, 'x', 1)", []),
        ("import os\nos.environ['X'] = '1'", []),
        ("def test(monkeypatch):\n    monkeypatch.setenv('X', '1')", []),
        ("import sys\nprint(sys.modules['vllm'])", []),
    ],
)
def test_scan_table(source: str, codes: list[str]) -> None:
    """Each snippet yields exactly the expected findings."""
    assert sorted(f.code for f in scan_source(textwrap.dedent(source), "x.py")) == codes


def test_findings_carry_file_and_line(tmp_path: Path) -> None:
    """A finding names the file and line of the patch."""
    (tmp_path / "afd_models").mkdir()
    (tmp_path / "afd_models" / "bad.py").write_text("import torch\n\n\ntorch.x = 1\n")
    (finding,) = scan(tmp_path)
    assert str(finding.ours) == "afd_models/bad.py:4"


def test_project_is_clean() -> None:
    """This repository itself has no monkey patch (generated code included)."""
    repo = Path(__file__).resolve().parents[2]
    assert [f.one_line() for f in scan(repo)] == []
