"""Edit actions, one transformer each: before/after pairs (codegen.edit)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from codegen.edit import EditError, RelativeImportRewriter, SuperRewriter, apply_edits
from codegen.markers import Edit, delete, insert_after, insert_before, replace, wrap
from codegen.pattern import PatternError

BEFORE = """
def __init__(self, size):
    super().__init__()
    self.gate = make(size)
    self.experts = make(size, gate=self.gate, prefix="e")
    self.done = True
"""


def assert_edit(edits: list[Edit], after: str, before: str = BEFORE) -> None:
    """Apply ``edits`` to ``before``; the result must equal ``after`` (both dedented)."""
    function = cst.parse_module(textwrap.dedent(before)).body[0]
    assert isinstance(function, cst.FunctionDef)
    result = apply_edits(function, edits)
    assert cst.Module(body=[result]).code.strip() == textwrap.dedent(after).strip()


def test_replace_statement() -> None:
    """replace swaps the matched statement for the code's statements."""
    assert_edit(
        [replace("self.experts = make(...)", "self.experts = None", id="e", why="w")],
        """
        def __init__(self, size):
            super().__init__()
            self.gate = make(size)
            self.experts = None
            self.done = True
        """,
    )


def test_replace_expression_with_captures() -> None:
    """An expression anchor replaces only the expression; captures carry upstream arguments over."""
    assert_edit(
        [
            replace(
                "make($...ARGS, gate=$G, $...REST)",
                "remote($...ARGS, owner=$G, $...REST)",
                id="e",
                why="w",
            )
        ],
        """
        def __init__(self, size):
            super().__init__()
            self.gate = make(size)
            self.experts = remote(size, owner=self.gate, prefix="e")
            self.done = True
        """,
    )


def test_insert_before_and_after() -> None:
    """insert_before / insert_after put statements around the match, in edit order."""
    assert_edit(
        [
            insert_after("super().__init__()", "plan = 1", id="a", why="w"),
            insert_before("self.done = True", "self.extra = plan", id="b", why="w"),
        ],
        """
        def __init__(self, size):
            super().__init__()
            plan = 1
            self.gate = make(size)
            self.experts = make(size, gate=self.gate, prefix="e")
            self.extra = plan
            self.done = True
        """,
    )


def test_delete() -> None:
    """delete removes the matched statements."""
    assert_edit(
        [delete("self.gate = make(...)\nself.experts = make(...)", id="d", why="w")],
        """
        def __init__(self, size):
            super().__init__()
            self.done = True
        """,
    )


def test_delete_leaves_pass_in_empty_block() -> None:
    """Deleting a block's only statement leaves ``pass``."""
    assert_edit(
        [delete("self.x = 1", id="d", why="w")],
        """
        def f(self):
            if self.a:
                pass
        """,
        before="def f(self):\n    if self.a:\n        self.x = 1\n",
    )


def test_wrap_if_with_else() -> None:
    """wrap puts the matched run under an ``if`` header, with an optional ``else``."""
    assert_edit(
        [
            wrap(
                "self.experts = make(...)",
                "if plan.here:",
                orelse="self.experts = None",
                id="w",
                why="w",
            )
        ],
        """
        def __init__(self, size):
            super().__init__()
            self.gate = make(size)
            if plan.here:
                self.experts = make(size, gate=self.gate, prefix="e")
            else:
                self.experts = None
            self.done = True
        """,
    )


def test_wrap_with() -> None:
    """wrap accepts a ``with`` header."""
    assert_edit(
        [wrap("self.gate = make(...)", "with scope():", id="w", why="w")],
        """
        def __init__(self, size):
            super().__init__()
            with scope():
                self.gate = make(size)
            self.experts = make(size, gate=self.gate, prefix="e")
            self.done = True
        """,
    )


@pytest.mark.parametrize(
    ("anchor", "count", "found"),
    [("self.missing = 1", 1, 0), ("self.$X = $Y", 1, 3), ("make(...)", 3, 2)],
)
def test_count_mismatch(anchor: str, count: int, found: int) -> None:
    """A lost or ambiguous anchor is an EditError reporting how many places it matched."""
    function = cst.parse_module(textwrap.dedent(BEFORE)).body[0]
    assert isinstance(function, cst.FunctionDef)
    with pytest.raises(EditError) as raised:
        apply_edits(function, [replace(anchor, "pass", id="x", why="w", count=count)])
    assert raised.value.found == found


def test_unbound_capture_in_code() -> None:
    """Edit code may only use captures the anchor binds."""
    function = cst.parse_module(textwrap.dedent(BEFORE)).body[0]
    assert isinstance(function, cst.FunctionDef)
    with pytest.raises(PatternError, match=r"\$Y"):
        apply_edits(function, [replace("self.gate = $X", "self.gate = $Y", id="x", why="w")])


def test_super_rewrite() -> None:
    """A forked body's bare super() names the upstream class that wrote it."""
    function = cst.parse_module(textwrap.dedent(BEFORE)).body[0]
    rewritten = function.visit(SuperRewriter("Base", "self"))
    assert "super(Base, self).__init__()" in cst.Module(body=[rewritten]).code


@pytest.mark.parametrize(
    ("package", "statement", "absolute"),
    [
        ("pkg.quant", "from .adapters import A, B", "from pkg.quant.adapters import A, B"),
        ("pkg.quant", "from ..ops.linear import L", "from pkg.ops.linear import L"),
        ("pkg.quant", "from . import adapters", "from pkg.quant import adapters"),
        ("pkg.quant", "from pkg.ops import L", "from pkg.ops import L"),
    ],
)
def test_relative_imports_in_a_forked_body_become_absolute(
    package: str, statement: str, absolute: str
) -> None:
    """A forked body moves to another package, so its relative imports are spelled out from the
    upstream module's package (vLLM-Ascend imports lazily inside methods)."""
    function = cst.parse_module(f"def get(self):\n    {statement}\n    return 1\n").body[0]
    rewritten = function.visit(RelativeImportRewriter(package))
    assert cst.Module(body=[rewritten]).code.splitlines()[1].strip() == absolute


def test_a_relative_import_above_the_top_package_is_refused() -> None:
    function = cst.parse_module("def get(self):\n    from ... import x\n").body[0]
    with pytest.raises(ValueError, match=r"above the top of package pkg\.quant"):
        function.visit(RelativeImportRewriter("pkg.quant"))
