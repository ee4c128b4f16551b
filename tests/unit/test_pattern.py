"""Anchor patterns: structural matching with wildcards and captures (codegen.pattern)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from codegen.pattern import PatternError, find_matches, normalized_code, parse_pattern

BODY = """
def f(self, config):
    super().__init__()
    # a comment the anchor does not mention
    self.experts = FusedMoE(
        shared_experts=self.shared,   # trailing comment
        gate=self.gate,
        num_experts=config.n,
    )
    self.gate = GateLinear(config.hidden, config.n, prefix='p.gate')
    if config.n > 4:
        self.big = True
    else:
        self.big = False
    for i in range(3):
        self.gate = None
"""


def _matches(pattern: str) -> list[str]:
    function = cst.parse_module(textwrap.dedent(BODY)).body[0]
    assert isinstance(function, cst.FunctionDef)
    return [
        " | ".join(normalized_code(n) for n in m.nodes())
        for m in find_matches(parse_pattern(pattern), function.body)
    ]


@pytest.mark.parametrize(
    ("pattern", "count"),
    [
        ("self.experts = FusedMoE(...)", 1),
        ("self.experts = FusedMoE(shared_experts=self.shared, ...)", 1),
        ("self.experts = FusedMoE(..., num_experts=config.n)", 1),
        ("self.experts = FusedMoE(gate=self.gate)", 0),  # other arguments exist
        ("FusedMoE($...A, gate=self.gate, $...B)", 1),
        ('self.gate = GateLinear(..., prefix="p.gate")', 1),  # quote style does not matter
        ("self.gate = ...", 2),  # one in the loop body
        ("self.gate = $X", 2),
        ("if config.n > 4:\n    ...\nelse:\n    ...", 1),
        ("if config.n > 4:\n    self.big = True", 0),  # the else branch is part of the statement
        ("super().__init__()", 1),
        ("self.big = True\nself.big = False", 0),  # not consecutive in one block
        ("self.experts = FusedMoE(...)\nself.gate = GateLinear(...)", 1),
        ("GateLinear", 1),
        ("config.n", 3),
    ],
)
def test_match_counts(pattern: str, count: int) -> None:
    """Each anchor matches exactly the expected number of places, formatting and comments aside."""
    assert len(_matches(pattern)) == count


def test_captures_bind_nodes() -> None:
    """``$X`` and ``$...X`` bind what they matched; a repeated ``$X`` must be equal code."""
    function = cst.parse_module(textwrap.dedent(BODY)).body[0]
    assert isinstance(function, cst.FunctionDef)
    (match,) = find_matches(
        parse_pattern("FusedMoE($...BEFORE, gate=$G, $...AFTER)"), function.body
    )
    assert normalized_code(match.bindings["G"]) == "self.gate"
    assert [normalized_code(a.value) for a in match.bindings["BEFORE"]] == ["self.shared"]
    assert len(find_matches(parse_pattern("self.big = $V if $V else $V"), function.body)) == 0


@pytest.mark.parametrize("pattern", ["self.x = (", "...\nself.x = 1", "", "self.x = 1\n..."])
def test_invalid_patterns(pattern: str) -> None:
    """Unparseable anchors and anchors that start or end with a run wildcard are refused."""
    with pytest.raises(PatternError):
        parse_pattern(pattern)
