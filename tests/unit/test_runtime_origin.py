"""``RT005``: a method whose live code comes from another package (as after a platform plugin's
patch) is told apart from upstream's own code, decorators included; with a fake plugin's patch
packages applied as vLLM-Ascend applies its own, forks, relied-on inherited methods and imported
names that a patch replaced are reported, and nothing else."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from codegen.checks.runtime import foreign_code, foreign_object, platform_package

#: where the "plugin" code of these tests lives: outside this package
PATCH_FILE = "/opt/other_package/patch.py"


def _foreign_function(name: str):
    namespace: dict[str, object] = {}
    exec(compile(f"def {name}(*args):\n    return 'patched'\n", PATCH_FILE, "exec"), namespace)
    return namespace[name]


class Upstream:
    def forward(self) -> str:
        return "upstream"

    @staticmethod
    def helper() -> str:
        return "upstream"

    @contextlib.contextmanager  # standard-library wrappers, as on vLLM's set_forward_context
    def scope(self) -> Iterator[str]:
        yield "upstream"

    @functools.lru_cache  # noqa: B019
    def cached(self) -> str:
        return "upstream"


def _same_package_decorator(method):  # like vLLM's own decorators: code in the same package
    @functools.wraps(method)
    def wrapper(self):
        return method(self)

    return wrapper


class Decorated(Upstream):
    forward = _same_package_decorator(Upstream.forward)


class Patched(Upstream):
    """What a plugin's patch leaves behind: code from another package, even when it copies
    the original's metadata with ``functools.wraps``."""

    forward = functools.wraps(Upstream.forward)(_foreign_function("forward"))
    helper = staticmethod(_foreign_function("helper"))
    scope = contextlib.contextmanager(_foreign_function("scope"))
    cached = functools.lru_cache(_foreign_function("cached"))


def test_upstream_code_is_not_foreign() -> None:
    """Upstream's own code, also behind its own or standard-library decorators."""
    for name in ("forward", "helper", "scope", "cached"):
        assert foreign_code(Upstream, name) is None, name
    assert foreign_code(Decorated, "forward") is None


def test_code_from_another_package_is_named() -> None:
    """A patch's code, also behind a standard-library decorator."""
    for name in ("forward", "helper", "scope", "cached"):
        assert foreign_code(Patched, name) == PATCH_FILE, name


def test_imported_objects_are_judged_by_their_code_or_module() -> None:
    """Functions by their code, classes by their module's file; instances are not checked."""
    assert foreign_object(Upstream, __name__) is None
    assert foreign_object(Upstream.scope, __name__) is None
    assert foreign_object(_foreign_function("replacement"), __name__) == PATCH_FILE
    pytest_file = Path(str(sys.modules[pytest.Item.__module__].__file__)).resolve()
    assert foreign_object(pytest.Item, __name__) == str(pytest_file)
    assert foreign_object(Upstream(), __name__) is None


def test_members_without_code_are_skipped() -> None:
    assert foreign_code(Upstream, "missing") is None
    assert foreign_code(Upstream, "__init__") is None  # object's C slot


# --- RT005 on a platform plugin's patches, applied as the plugin applies them at run time ---

REPO = Path(__file__).resolve().parents[2]

#: a fake upstream package, a fake generated module subclassing it, and fake platform plugins:
#: ``fakeplatform``'s patch packages replace upstream code when imported, as vLLM-Ascend's do;
#: ``bareplatform`` has none; ``brokenplatform``'s patch module fails to import
FAKE_TREE = {
    "fakeupstream/__init__.py": "",
    "fakeupstream/models.py": """
        def make_layer():
            return "upstream"


        class Model:
            def __init__(self):
                self.layer = make_layer()

            def forward(self):
                return self.layer

            def name(self):
                return "model"
        """,
    "fakegen.py": """
        from fakeupstream.models import Model, make_layer


        class AFDModel(Model):
            def __init__(self):  # a fork of Model.__init__; relies on the inherited forward
                self.layer = make_layer()
        """,
    "fakeplatform/__init__.py": "",
    "fakeplatform/patch/__init__.py": "",
    "fakeplatform/patch/platform.py": """
        import fakeupstream.models


        def make_layer():
            return "patched"


        fakeupstream.models.make_layer = make_layer
        """,
    "fakeplatform/patch/worker.py": """
        from fakeupstream.models import Model


        def __init__(self):
            self.layer = "patched"


        def forward(self):
            return "patched"


        def name(self):
            return "patched model"


        Model.__init__ = __init__
        Model.forward = forward
        Model.name = name
        """,
    "bareplatform/__init__.py": "",
    "brokenplatform/__init__.py": "",
    "brokenplatform/patch/__init__.py": "",
    "brokenplatform/patch/platform.py": "import missing_dependency\n",
}

#: applies the patches of the plugin named in argv[1], then prints what RT005's checks find on
#: the fake generated class (a fork, a relied-on inherited method) and two imported names
CHECK = """
    import json
    import sys
    from pathlib import Path

    import libcst as cst

    from codegen.checks.runtime import apply_platform_patches, check_classes, check_imports
    from codegen.lock import SymbolDescription, SymbolEntry, SymbolKind, SymbolUse
    from codegen.markers import contract
    from codegen.model import (
        GeneratedClass, GeneratedMember, MemberDecl, MemberKind, OverlayClass, SymbolRef,
    )

    applied = apply_platform_patches(sys.argv[1])
    base = SymbolRef("fakeupstream.models", "Model")
    init = cst.parse_statement("def __init__(self): ...")
    fork = MemberDecl("__init__", MemberKind.FORK, init, None)
    relies_on = {
        "forward": (contract("return self.layer", id="returns-its-layer", if_broken="wrong"),),
        "name": (contract("return $NAME", id="returns-a-name", if_broken="nameless"),),
    }
    overlay = OverlayClass("AFDModel", (base,), "AFDModel", relies_on, (fork,), (), None, 1)
    generated = GeneratedClass(
        "AFDModel",
        "fakegen",
        base,
        overlay,
        Path("overlay/fake.py"),
        (GeneratedMember(fork, base.member("__init__"), None, init),),
        {"forward": base.member("forward"), "name": base.member("name")},
    )
    def entry(kind, use, *used_by):
        return SymbolEntry(SymbolDescription(kind), frozenset({use}), used_by)

    symbols = {
        "fakeupstream.models:make_layer": entry(
            SymbolKind.FUNCTION, SymbolUse.IMPORTED_BY_GENERATED, "fakegen:make_layer"
        ),
        "fakeupstream.models:Model": entry(
            SymbolKind.CLASS, SymbolUse.IMPORTED_BY_OVERLAY, "fakegen:Model"
        ),
        "fakeupstream.models:Model.forward": entry(
            SymbolKind.METHOD, SymbolUse.INHERITED_RELIED_ON
        ),
    }
    accepted = frozenset(sys.argv[2:])
    findings = [*check_classes([generated]), *check_imports(symbols, accepted)]
    print(json.dumps({
        "applied": applied,
        "findings": {f.symbol: [f.code, f.message] for f in findings},
        "severities": {f.symbol: f.severity.value for f in findings},
    }))
"""


@pytest.fixture(scope="module")
def fake_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fake_tree")
    for name, text in FAKE_TREE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def _check(tree: Path, plugin: str, *accepted: str) -> subprocess.CompletedProcess[str]:
    """CHECK in a fresh interpreter that finds the fake tree on PYTHONPATH (nothing here is patched)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHECK), plugin, *accepted],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(REPO)])},
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def patched(fake_tree: Path) -> dict[str, Any]:
    result = _check(fake_tree, "fakeplatform")
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return report


def test_patch_packages_are_imported_platform_then_worker(patched: dict[str, Any]) -> None:
    """The plugin's platform patches, then its worker patches, as vLLM-Ascend applies them."""
    assert patched["applied"] == ["fakeplatform.patch.platform", "fakeplatform.patch.worker"]


def test_exactly_the_replaced_code_is_reported(patched: dict[str, Any]) -> None:
    """A fork, two relied-on methods and an imported name; the class itself was not replaced."""
    assert {symbol: code for symbol, (code, _) in patched["findings"].items()} == {
        "fakegen:AFDModel.__init__": "RT005",
        "fakegen:AFDModel.forward": "RT005",
        "fakegen:AFDModel.name": "RT005",
        "fakeupstream.models:make_layer": "RT005",
    }


def test_patched_relied_on_method_breaking_a_contract_blocks(patched: dict[str, Any]) -> None:
    """An inherited method the overlay relies on, replaced by a worker patch whose body breaks
    the contract: it blocks, naming the contract and what AFD would do wrong."""
    _, message = patched["findings"]["fakegen:AFDModel.forward"]
    assert message == (
        "relied-on Model.forward is patched by fakeplatform.patch.worker: "
        "contracts broken in the patch: returns-its-layer (wrong)"
    )
    assert patched["severities"]["fakegen:AFDModel.forward"] == "block"


def test_patched_relied_on_method_keeping_its_contracts_is_info(patched: dict[str, Any]) -> None:
    """vLLM-Ascend replaces DeepseekV2Model.forward with a body that keeps AFD's contracts: the
    contracts are evaluated on the replacement's source, and holding there is shown, not blocking."""
    _, message = patched["findings"]["fakegen:AFDModel.name"]
    assert message == (
        "relied-on Model.name is patched by fakeplatform.patch.worker; every contract holds in "
        "the patch (returns-a-name)"
    )
    assert patched["severities"]["fakegen:AFDModel.name"] == "info"


def test_patched_imported_name_is_reported(patched: dict[str, Any]) -> None:
    """An upstream function the generated code imports, replaced by a platform patch."""
    _, message = patched["findings"]["fakeupstream.models:make_layer"]
    assert message == (
        "imported make_layer is patched by fakeplatform.patch.platform: "
        "AFD (fakegen:make_layer) was checked against vLLM's definition, not this one"
    )


def test_an_accepted_replacement_of_an_imported_name_is_info(fake_tree: Path) -> None:
    """A replacement the pins accept (vLLM-Ascend's FusedMoE factory) is shown, not blocking;
    the other replaced code still blocks."""
    result = _check(fake_tree, "fakeplatform", "fakeplatform.patch.platform:make_layer")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["severities"] == {
        "fakegen:AFDModel.__init__": "block",
        "fakegen:AFDModel.forward": "block",
        "fakegen:AFDModel.name": "info",
        "fakeupstream.models:make_layer": "info",
    }
    assert report["findings"]["fakeupstream.models:make_layer"][1] == (
        "imported make_layer is fakeplatform.patch.platform:make_layer, a patch "
        "overlay/pins.toml accepts: AFD (fakegen:make_layer) uses it as upstream code would"
    )


def test_patched_fork_is_reported(patched: dict[str, Any]) -> None:
    """A forked method, replaced by a worker patch: the fork would drop the patch."""
    _, message = patched["findings"]["fakegen:AFDModel.__init__"]
    assert message == (
        "forked Model.__init__ is patched by fakeplatform.patch.worker: "
        "AFD's fork was made from vLLM's body and drops this patch"
    )


def test_nothing_is_reported_without_patch_packages(fake_tree: Path) -> None:
    """A plugin without patch packages applies nothing, and upstream's own code is not reported."""
    result = _check(fake_tree, "bareplatform")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["applied"] == [] and report["findings"] == {}


def test_a_patch_module_that_fails_to_import_is_not_hidden(fake_tree: Path) -> None:
    """What a patch module imports being missing is an error, not a plugin without patches."""
    result = _check(fake_tree, "brokenplatform")
    assert result.returncode != 0
    assert "No module named 'missing_dependency'" in result.stderr


class _InTree:
    def is_out_of_tree(self) -> bool:
        return False


class _OutOfTree:
    def is_out_of_tree(self) -> bool:
        return True


def test_platform_package_is_the_out_of_tree_platforms_package() -> None:
    """vLLM's own platforms have no patches to apply; an out-of-tree one names its package."""
    assert platform_package(_InTree()) is None
    assert platform_package(_OutOfTree()) == __name__.partition(".")[0]


def test_afds_platform_subclass_stands_for_the_plugin_it_derives_from() -> None:
    """AFD's NPU platform lives in afd_models; the patches to apply are its base's plugin's."""
    afd_platform = type(
        "AFDPlatform", (_OutOfTree,), {"__module__": "afd_models._generated.vllm_ascend.platform"}
    )
    assert platform_package(afd_platform()) == __name__.partition(".")[0]


def test_a_module_import_is_a_symbol_of_its_own() -> None:
    """A generated module that imports a whole module records it as ``module:`` (a forked body
    using ``torch.tensor``); the import check loads it instead of crashing on the key."""
    from codegen.checks.runtime import check_imports, load
    from codegen.lock import SymbolDescription, SymbolEntry, SymbolKind, SymbolUse
    from codegen.model import SymbolRef

    ref = SymbolRef.parse("json:")
    assert ref == SymbolRef("json", "") and str(ref) == "json:"
    assert load(ref) is json
    entry = SymbolEntry(
        SymbolDescription(SymbolKind.EXTERNAL),
        frozenset({SymbolUse.IMPORTED_BY_GENERATED}),
        ("m:json",),
    )
    assert list(check_imports({"json:": entry})) == []
    with pytest.raises(ValueError, match="not a 'module:Name' reference"):
        SymbolRef.parse("json")


def test_torchs_inference_mode_decorator_is_judged_by_what_it_wraps() -> None:
    """vLLM decorates runner methods with ``@torch.inference_mode()`` (Model Runner V2's
    ``execute_model``, which the AFD V2 runner forks): torch's wrapper code lies outside the
    upstream package but only runs the method it wraps; a patch behind it is still named."""
    import torch

    class Runner:
        @torch.inference_mode()
        def execute_model(self) -> str:
            return "upstream"

    class PatchedRunner:
        execute_model = torch.inference_mode()(_foreign_function("execute_model"))

    assert foreign_code(Runner, "execute_model") is None
    assert foreign_code(PatchedRunner, "execute_model") == PATCH_FILE
