"""How drift decides whether one of AFD's recorded calls binds to an upstream signature."""

from __future__ import annotations

import ast

import pytest

from codegen.drift.call_sites import _shifted, binding_problem
from codegen.lock import Place, Site, SiteKind
from codegen.model import Signature
from codegen.upstream_values import _field_default


def signature(text: str) -> Signature:
    node = ast.parse(f"def f{text}: pass").body[0]
    assert isinstance(node, ast.FunctionDef)
    return Signature.from_ast(node)


def call(positional: int = 0, *keywords: str, unpacked: bool = False) -> Site:
    return Site(
        Place("afd_models/x.py", "f"),
        SiteKind.CALL,
        "afd_models/x.py",
        positional,
        tuple(keywords),
        unpacked,
    )


@pytest.mark.parametrize(
    ("text", "site"),
    [
        ("(a, b=1)", call(1)),
        ("(a, b=1)", call(0, "a", "b")),
        ("(a, *, b=1, c=2)", call(1, "c")),
        ("(a, *args)", call(5)),
        ("(**kwargs)", call(0, "anything")),
        ("(a, b)", call(1, unpacked=True)),
    ],
)
def test_calls_that_bind(text: str, site: Site) -> None:
    assert binding_problem(signature(text), site) is None


@pytest.mark.parametrize(
    ("text", "site", "problem"),
    [
        ("(a)", call(2), "takes 1 positional argument(s), AFD passes 2"),
        ("(a, b=1)", call(1, "c"), "has no parameter 'c'"),
        ("(a, /, b=1)", call(0, "a"), "has no parameter 'a'"),
        ("(a, b=1)", call(1, "a"), "gets 'a' twice"),
        ("(a, b)", call(1), "requires 'b'"),
        ("(a, *, b)", call(1), "requires 'b'"),
    ],
)
def test_calls_that_do_not_bind(text: str, site: Site, problem: str) -> None:
    found = binding_problem(signature(text), site)
    assert found is not None and found.startswith(problem)


@pytest.mark.parametrize("how", [SiteKind.READ, SiteKind.WRITE])
def test_a_read_or_write_always_binds(how: SiteKind) -> None:
    assert binding_problem(signature("(a)"), Site(Place("x.py", "f"), how, "x.py")) is None


@pytest.mark.parametrize(
    ("before", "after", "shifted"),
    [
        ("(a, b)", "(a, c, b)", "takes AFD's positional argument 2 as 'c', not 'b'"),
        ("(a, b)", "(a, renamed)", None),  # renamed in place: the argument still lands there
        ("(a, b)", "(a, b, c=1)", None),
    ],
)
def test_a_positional_argument_binding_another_parameter(
    before: str, after: str, shifted: str | None
) -> None:
    assert _shifted(signature(before), signature(after), 2) == shifted


@pytest.mark.parametrize(
    ("value", "default"),
    [
        ("", None),
        ("= 1", "1"),
        ("= field(default_factory=list)", "field(default_factory=list)"),
        ("= field(repr=False)", None),  # no default: required
    ],
)
def test_a_fields_default(value: str, default: str | None) -> None:
    statement = ast.parse(f"x: int {value}").body[0]
    assert isinstance(statement, ast.AnnAssign)
    assert _field_default(statement.value) == default
