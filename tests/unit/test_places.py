"""Places of hand-written code: the qualified function around a node (what the lock records), and
the line a recorded use is on now (what a finding shows)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from codegen.lock import Place, Site, SiteKind
from codegen.model import SymbolRef
from codegen.places import MODULE_LEVEL, Places, Scopes

SOURCE = textwrap.dedent(
    """
    from vllm.layers import Base as Upstream, make_experts

    LIMIT = make_experts(1)


    class Worker(Upstream):
        @fork(replace("x", "make_experts(2, gate=None)", id="e", why="w"))
        def load(self) -> None:
            def step() -> None:
                self.helper(0)

            make_experts(3)
            make_experts(4, prefix="p")
            self.size = self.size + 1

        class Inner:
            def run(self) -> None:
                Upstream(5)
    """
)
EXPERTS = SymbolRef("vllm.layers", "make_experts")


def _line(text: str) -> int:
    return next(n for n, line in enumerate(SOURCE.splitlines(), 1) if text in line)


def _locate(tmp_path: Path, site: Site, ref: SymbolRef = EXPERTS) -> tuple[str, int]:
    (tmp_path / "w.py").write_text(SOURCE)
    found = Places(tmp_path).location(site, ref)
    return found.path, found.line


def _site(function: str, how: SiteKind = SiteKind.CALL, *keywords: str) -> Site:
    return Site(Place("w.py", function), how, "w.py", 1, keywords)


def test_qualified_names_follow_python() -> None:
    """Methods, nested functions (``<locals>``), nested classes, module level; a definition's
    decorators count as its own."""
    tree = ast.parse(SOURCE)
    scopes = Scopes.of(tree)
    names = {ast.unparse(n): scopes.name(n) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert names["make_experts(1)"] == MODULE_LEVEL
    assert names["self.helper(0)"] == "Worker.load.<locals>.step"
    assert names["make_experts(3)"] == "Worker.load"
    assert names["Upstream(5)"] == "Worker.Inner.run"
    assert names["fork(replace('x', 'make_experts(2, gate=None)', id='e', why='w'))"] == (
        "Worker.load"
    )


@pytest.mark.parametrize(
    ("site", "ref", "text"),
    [
        (_site("Worker.load"), EXPERTS, "make_experts(3)"),
        (_site("Worker.load", SiteKind.CALL, "prefix"), EXPERTS, 'make_experts(4, prefix="p")'),
        (_site(MODULE_LEVEL), EXPERTS, "LIMIT = "),
        # the class imported under another name
        (
            _site("Worker.Inner.run", SiteKind.CONSTRUCT),
            SymbolRef("vllm.layers", "Base"),
            "Upstream(5)",
        ),
        (
            _site("Worker.load.<locals>.step"),
            SymbolRef("vllm.layers", "Base.helper"),
            "self.helper(0)",
        ),
        (
            _site("Worker.load", SiteKind.READ),
            SymbolRef("vllm.layers", "Base.size"),
            "self.size = ",
        ),
        # a fork edit's code: the string that holds it
        (
            _site("Worker.load", SiteKind.CALL, "gate"),
            SymbolRef("vllm.layers", "other"),
            "def load",
        ),
    ],
)
def test_the_line_of_a_recorded_use(tmp_path: Path, site: Site, ref: SymbolRef, text: str) -> None:
    assert _locate(tmp_path, site, ref) == ("w.py", _line(text))


def test_a_call_of_a_fork_edit_is_found_in_its_code(tmp_path: Path) -> None:
    """A call no node of the function makes as recorded: the decorator string holding it, before
    the function's other calls of the same name."""
    site = _site("Worker.load", SiteKind.CALL, "gate")
    assert _locate(tmp_path, site) == ("w.py", _line("@fork("))


def test_a_function_that_is_gone_names_the_file(tmp_path: Path) -> None:
    assert _locate(tmp_path, _site("Worker.gone")) == ("w.py", 0)
    assert Places(tmp_path).location(_site("x"), EXPERTS).path == "w.py"
