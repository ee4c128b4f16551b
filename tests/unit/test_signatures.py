"""Exact signatures: every difference kind, declared deltas exact / inexact / unused (codegen.signatures)."""

from __future__ import annotations

import ast

import pytest

from codegen.findings import Location
from codegen.markers import Delta, DifferenceKind, delta
from codegen.model import Signature
from codegen.signatures import check_signature, differences


def sig(source: str) -> Signature:
    function = ast.parse(source).body[0]
    assert isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
    return Signature.from_ast(function)


UPSTREAM = "def f(self, a: int, b: str = 'x', *args, c: float = 1.0, **kw) -> None: pass"
HERE = Location("overlay/x.py", 1)


@pytest.mark.parametrize(
    ("ours", "codes"),
    [
        (UPSTREAM, []),
        (
            'def f(self, a: int, b: str = "x", *args, c: float = 1.0, **kw) -> None: pass',
            [],
        ),  # quotes
        (
            "def f(self, a: int, b: str = 'x', *args, c: float = 1.0, d=0, **kw) -> None: pass",
            ["SIG001"],
        ),
        ("def f(self, a: int, *args, c: float = 1.0, **kw) -> None: pass", ["SIG002"]),
        (
            "def f(self, z: int, b: str = 'x', *args, c: float = 1.0, **kw) -> None: pass",
            ["SIG003"],
        ),
        (
            "def f(self, a: int, /, b: str = 'x', *args, c: float = 1.0, **kw) -> None: pass",
            ["SIG004", "SIG004"],
        ),
        (
            "def f(self, a: int, b: str = 'y', *args, c: float = 1.0, **kw) -> None: pass",
            ["SIG005"],
        ),
        (
            "def f(self, a: int, b: bytes = 'x', *args, c: float = 1.0, **kw) -> None: pass",
            ["SIG006"],
        ),
        ("def f(self, a: int, b: str = 'x', *args, c: float = 1.0, **kw): pass", ["SIG007"]),
        (
            "@staticmethod\ndef f(self, a: int, b: str = 'x', *args, c: float = 1.0, **kw) -> None: pass",
            ["SIG008"],
        ),
        (
            "async def f(self, a: int, b: str = 'x', *args, c: float = 1.0, **kw) -> None: pass",
            ["SIG009"],
        ),
        (
            "def f(self, b: str = 'x', a: int = 0, *args, c: float = 1.0, **kw) -> None: pass",
            ["SIG005", "SIG012"],
        ),
    ],
)
def test_every_difference_is_reported(ours: str, codes: list[str]) -> None:
    """Each kind of signature change yields its own code, and nothing else."""
    findings = check_signature(
        "m.C.f", sig(UPSTREAM), sig(ours), [], ours_at=HERE, upstream_at=HERE
    )
    assert sorted(f.code for f in findings) == sorted(codes)


def test_exact_delta_explains_the_difference() -> None:
    """A delta naming the exact difference (kind, parameter, both values) makes it pass."""
    ours = sig(
        "def f(self, a: int, b: str = 'x', *args, c: float = 1.0, d: int = 0, **kw) -> None: pass"
    )
    declared = [delta("param_added", "d", upstream=None, ours="d: int = 0", why="needed")]
    assert (
        check_signature("m.C.f", sig(UPSTREAM), ours, declared, ours_at=HERE, upstream_at=HERE)
        == []
    )


def test_inexact_delta_is_an_error() -> None:
    """A delta with the right kind but other values is SIG011, and says what to declare."""
    ours = sig("def f(self, a: int, b: str = 'y', *args, c: float = 1.0, **kw) -> None: pass")
    declared = [delta("param_default", "b", upstream="'x'", ours="'z'", why="needed")]
    (finding,) = check_signature(
        "m.C.f", sig(UPSTREAM), ours, declared, ours_at=HERE, upstream_at=HERE
    )
    assert finding.code == "SIG011"
    assert "ours=\"'y'\"" in finding.message


def test_unused_delta_is_an_error() -> None:
    """A delta that explains no difference is SIG010."""
    declared = [delta("return_annotation", upstream="None", ours=None, why="stale")]
    (finding,) = check_signature(
        "m.C.f", sig(UPSTREAM), sig(UPSTREAM), declared, ours_at=HERE, upstream_at=HERE
    )
    assert finding.code == "SIG010"


def test_unexplained_difference_prints_the_delta_to_declare() -> None:
    """The message of an unexplained difference contains a delta(...) call to paste."""
    ours = sig("def f(self, a: int, b: str = 'x', *args, c: float = 1.0, **kw): pass")
    (finding,) = check_signature("m.C.f", sig(UPSTREAM), ours, [], ours_at=HERE, upstream_at=HERE)
    assert "delta('return_annotation', upstream='None', ours=None" in finding.message


def test_delta_scoped_to_one_base() -> None:
    """A delta for one base applies to that base only."""
    scoped = Delta(DifferenceKind.DECORATORS, None, "@x", None, "why", base="Worker")
    assert scoped.applies_to("vllm.v1.worker.gpu_worker:Worker")
    assert not scoped.applies_to("vllm.v1.worker.cpu_worker:CPUWorker")


def test_differences_are_stable() -> None:
    """The difference list is deterministic (the lock and reports depend on its order)."""
    a, b = sig(UPSTREAM), sig("def f(self, z, b: bytes = 'y', *args, **kw): pass")
    assert differences(a, b) == differences(a, b)
    assert [d.kind.value for d in differences(a, b)] == [
        "param_renamed",
        "param_annotation",
        "param_default",
        "param_annotation",
        "param_removed",
        "return_annotation",
    ]
