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


def _found(source: str) -> list[tuple[str, int]]:
    return sorted(
        (f.code, f.ours.line if f.ours else 0) for f in scan_source(textwrap.dedent(source), "x.py")
    )


SUBPROCESS_CONSTANT = """\
import subprocess, sys
CODE = "import torch\\ntorch.x = 1"
subprocess.run([sys.executable, "-c", CODE])
"""
SUBPROCESS_DEDENT = '''\
import subprocess
import sys
import textwrap

subprocess.check_output(
    [sys.executable, "-c", textwrap.dedent(
        """
        import vllm
        vllm.x = 1
        """
    )]
)
'''
SUBPROCESS_DEDENT_CONSTANT = '''\
import subprocess
import sys
from textwrap import dedent

CODE = dedent("""
    import sys
    sys.modules["vllm"] = None
""")
subprocess.Popen(("python3", "-c", CODE))
'''
SUBPROCESS_HELPER = '''\
import subprocess, sys, textwrap
def run_python(code, env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env)
run_python(
    """
    from vllm.x import Cls
    Cls.forward = None
    """,
    {},
)
'''
SUBPROCESS_FORMAT_TEMPLATE = '''\
import subprocess, sys
TEMPLATE = """
from vllm import LLM, envs
envs.environment_variables.update({{}})
LLM(model={model!r})
"""
def run_python(code):
    return subprocess.run([sys.executable, "-c", code])
run_python(code=TEMPLATE.format(model="m"))
'''
SUBPROCESS_F_STRING = '''\
import subprocess, sys
def run_python(code):
    return subprocess.run([sys.executable, "-c", code])
def test(kwargs):
    run_python(f"""
import vllm
vllm.LLM(model="m", {kwargs})
vllm.x = 1
""")
'''


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # class swapping, delattr and the dunder spellings of setattr
        pytest.param("def f(obj):\n    obj.__class__ = Other", [("MP001", 2)], id="class-swap"),
        pytest.param(
            "def f(obj):\n    setattr(obj, '__class__', Other)",
            [("MP002", 2)],
            id="class-swap-setattr",
        ),
        pytest.param(
            "from vllm.x import Cls\ndelattr(Cls, 'forward')", [("MP002", 2)], id="delattr"
        ),
        pytest.param(
            "import vllm\nobject.__setattr__(vllm, 'x', 1)", [("MP002", 2)], id="object-setattr"
        ),
        pytest.param(
            "from vllm.x import Cls\ntype.__setattr__(Cls, 'forward', None)",
            [("MP002", 2)],
            id="type-setattr",
        ),
        pytest.param(
            "from vllm.x import Cls\nobject.__delattr__(Cls, 'forward')",
            [("MP002", 2)],
            id="object-delattr",
        ),
        pytest.param(
            "import vllm\nvllm.__setattr__('x', 1)", [("MP002", 2)], id="bound-dunder-setattr"
        ),
        # modules bound by a call, and aliases of imported names
        pytest.param(
            "import importlib\nmod = importlib.import_module('vllm.x')\nmod.f = None",
            [("MP001", 3)],
            id="import-module",
        ),
        pytest.param(
            "from importlib import import_module\nm = import_module('vllm')\nsetattr(m, 'x', 1)",
            [("MP002", 3)],
            id="import-module-from",
        ),
        pytest.param("m = __import__('vllm')\nm.x = 1", [("MP001", 2)], id="dunder-import"),
        pytest.param(
            "import importlib\nimportlib.import_module('vllm').x = 1",
            [("MP001", 2)],
            id="import-module-unbound",
        ),
        pytest.param(
            "from vllm.x import Cls\nC = Cls\nC.m = None", [("MP001", 3)], id="alias-name"
        ),
        pytest.param(
            "from vllm.x import mod\nC = mod.Cls\nC.m = None", [("MP001", 3)], id="alias-attribute"
        ),
        pytest.param(
            "import vllm\nA = vllm.x\nB = A.Cls\nB.m = 1", [("MP001", 4)], id="alias-of-alias"
        ),
        pytest.param(
            "import sys\nm = sys.modules\nm['vllm'] = None", [("MP003", 3)], id="alias-sys-modules"
        ),
        # writes into imported containers
        pytest.param(
            "from vllm import ModelRegistry\nModelRegistry.models['X'] = None",
            [("MP001", 2)],
            id="container-item",
        ),
        pytest.param(
            "from vllm import ModelRegistry\ndel ModelRegistry.models['X']",
            [("MP001", 2)],
            id="container-del-item",
        ),
        pytest.param(
            "from vllm.x import Cls\nCls.counts['k'] += 1", [("MP001", 2)], id="container-augassign"
        ),
        pytest.param(
            "import vllm.envs\nvllm.envs.environment_variables.update({})",
            [("MP001", 2)],
            id="container-update",
        ),
        pytest.param(
            "from vllm.x import SomeClass\nSomeClass.registry.append(1)",
            [("MP001", 2)],
            id="container-append",
        ),
        pytest.param(
            "from vllm.envs import environment_variables\nenvironment_variables.update({})",
            [("MP001", 2)],
            id="container-imported-directly",
        ),
        pytest.param(
            "from vllm.x import Cls\nCls.table['a'].append(1)",
            [("MP001", 2)],
            id="container-item-append",
        ),
        pytest.param(
            "def f(x):\n    type(x).registry['k'] = 1", [("MP001", 2)], id="container-of-type"
        ),
        # import hooks and builtins
        pytest.param(
            "import sys\nsys.meta_path.insert(0, finder)", [("MP005", 2)], id="meta-path-insert"
        ),
        pytest.param(
            "import sys\nsys.meta_path.append(finder)", [("MP005", 2)], id="meta-path-append"
        ),
        pytest.param("import sys\nsys.meta_path = [finder]", [("MP005", 2)], id="meta-path-assign"),
        pytest.param(
            "import sys\nsys.path_hooks.append(hook)", [("MP005", 2)], id="path-hooks-append"
        ),
        pytest.param("import sys\nsys.path_hooks[0] = hook", [("MP005", 2)], id="path-hooks-item"),
        pytest.param("__builtins__['open'] = f", [("MP005", 1)], id="dunder-builtins-item"),
        pytest.param("import builtins\nbuiltins.open = f", [("MP005", 2)], id="builtins-assign"),
        pytest.param(
            "import builtins\nsetattr(builtins, 'open', f)", [("MP005", 2)], id="builtins-setattr"
        ),
        pytest.param("import sys\nsys.modules = {}", [("MP003", 2)], id="sys-modules-assign"),
        # mock patching under other names, pytest's MonkeyPatch
        pytest.param(
            "from unittest.mock import patch as p\np('vllm.x.y')", [("MP004", 2)], id="patch-as"
        ),
        pytest.param(
            "from unittest import mock as m\nm.patch('vllm.x')\nm.patch.object(Cls, 'f')",
            [("MP004", 2), ("MP004", 3)],
            id="mock-as",
        ),
        pytest.param("def test(mocker):\n    mocker.patch('vllm.x')", [("MP004", 2)], id="mocker"),
        pytest.param(
            "import pytest\nmp = pytest.MonkeyPatch()", [("MP004", 2)], id="monkeypatch-class"
        ),
        pytest.param(
            "from pytest import MonkeyPatch\nwith MonkeyPatch.context() as mp:\n    pass",
            [("MP004", 2)],
            id="monkeypatch-class-context",
        ),
        pytest.param(
            "def test(monkeypatch):\n    with monkeypatch.context() as m:\n        pass",
            [("MP004", 2)],
            id="monkeypatch-context",
        ),
        pytest.param(
            "import sys\ndef test(monkeypatch):\n    monkeypatch.delitem(sys.modules, 'vllm')",
            [("MP004", 3)],
            id="monkeypatch-delitem",
        ),
        # code a subprocess runs: findings at the string's lines
        pytest.param(SUBPROCESS_CONSTANT, [("MP001", 2)], id="subprocess-constant"),
        pytest.param(SUBPROCESS_DEDENT, [("MP001", 9)], id="subprocess-dedent"),
        pytest.param(SUBPROCESS_DEDENT_CONSTANT, [("MP003", 7)], id="subprocess-dedent-constant"),
        pytest.param(SUBPROCESS_HELPER, [("MP001", 7)], id="subprocess-helper"),
        pytest.param(SUBPROCESS_FORMAT_TEMPLATE, [("MP001", 4)], id="subprocess-format-template"),
        pytest.param(SUBPROCESS_F_STRING, [("MP001", 8)], id="subprocess-f-string"),
    ],
)
def test_scan_holes(source: str, expected: list[tuple[str, int]]) -> None:
    """Each way around the rule is flagged, at the line that patches."""
    assert _found(source) == expected


@pytest.mark.parametrize(
    "method",
    [
        "update",
        "append",
        "extend",
        "insert",
        "pop",
        "popitem",
        "setdefault",
        "clear",
        "remove",
        "add",
        "discard",
        "__setitem__",
        "__delitem__",
    ],
)
def test_container_mutators(method: str) -> None:
    """Every in-place method of a container reached from an imported class is flagged."""
    assert _found(f"from vllm.x import Cls\nCls.items.{method}(1)") == [("MP001", 2)]


def test_helper_in_another_file(tmp_path: Path) -> None:
    """A code string run through a helper of another file (as tests.engine.run_python) is scanned."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "engine.py").write_text(
        "import subprocess, sys, textwrap\n\n\n"
        "def run_python(code, env):\n"
        '    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env)\n'
    )
    (tmp_path / "tests" / "test_x.py").write_text(
        "from tests.engine import run_python\n\n\n"
        "def test_x():\n"
        '    run_python("""\n'
        "        import sys\n"
        "        sys.meta_path.insert(0, object())\n"
        '    """, {})\n'
    )
    assert [str(f.ours) for f in scan(tmp_path)] == ["tests/test_x.py:7"]


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(
            "def f(self):\n    self.registry['k'] = 1\n    self.items.append(1)", id="instance"
        ),
        pytest.param(
            "def f():\n    d = {}\n    d['k'] = 1\n    items = []\n    items.append(1)\n    items.pop()",
            id="local-containers",
        ),
        pytest.param(
            "import vllm\ndef f():\n    out = vllm.x\ndef g():\n    out = []\n    out.append(1)",
            id="name-bound-twice-is-no-alias",
        ),
        pytest.param(
            "from vllm import ModelRegistry\nModelRegistry.register_model('A', 'm:C')",
            id="register-model",
        ),
        pytest.param(
            "from vllm.model_executor.custom_op import CustomOp\n"
            "@CustomOp.register_oot(name='X')\nclass X(CustomOp):\n    pass",
            id="register-oot",
        ),
        pytest.param(
            "from vllm.utils.torch_utils import direct_register_custom_op\n"
            "direct_register_custom_op('op', f)",
            id="direct-register-custom-op",
        ),
        pytest.param(
            "import torch\nlib = torch.library.Library('afd', 'FRAGMENT')\nlib.define('x() -> ()')",
            id="library-fragment",
        ),
        pytest.param(
            "import os\nos.environ.update({})\nos.environ.pop('X')\nos.environ.setdefault('X', '1')",
            id="environ",
        ),
        pytest.param("import sys\nsys.path.insert(0, 'tools')", id="sys-path"),
        pytest.param("import os\nos.remove('f')", id="module-function"),
        pytest.param("import torch\ntorch.ops.aten.add(1, 2)", id="operator-namespace"),
        pytest.param(
            "def test(monkeypatch):\n    monkeypatch.setenv('X', '1')\n    monkeypatch.delenv('Y')\n"
            "    monkeypatch.chdir('/')\n    monkeypatch.syspath_prepend('d')",
            id="monkeypatch-env",
        ),
        pytest.param(
            "class A:\n    def __post_init__(self):\n        object.__setattr__(self, 'x', 1)",
            id="frozen-dataclass",
        ),
        pytest.param(
            "import torch\nclass M(torch.nn.Module):\n    def __setattr__(self, n, v):\n"
            "        torch.nn.Module.__setattr__(self, n, v)\n        super().__setattr__('y', v)",
            id="parent-setattr",
        ),
        pytest.param(
            "import subprocess\nsubprocess.run(['bash', '-c', 'import vllm; vllm.x = 1'])",
            id="bash-script",
        ),
        pytest.param(
            "import subprocess, sys, textwrap\ndef f(code):\n    code = textwrap.dedent(code)\n"
            "    subprocess.run([sys.executable, '-c', code])\nf('print(1)')",
            id="subprocess-clean-code",
        ),
        pytest.param("x: int\nimport vllm\nvllm.y: int", id="annotation-only"),
    ],
)
def test_allowed(source: str) -> None:
    """Instances, local containers, vLLM's registration APIs and process state are fine."""
    assert _found(source) == []


def test_registration_apis_are_named() -> None:
    """The allow-list is explicit and names vLLM's registration APIs."""
    from codegen.checks.monkeypatch import REGISTRATION_APIS

    assert {api.rsplit(".", 1)[-1] for api in REGISTRATION_APIS} == {
        "register_model",
        "register_oot",
        "direct_register_custom_op",
        "Library",
    }


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
