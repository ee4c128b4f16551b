"""A lost fork anchor names the new body's code nearest to what it matched in the pinned body, as
an anchor to paste (:func:`codegen.drift.forks.nearest_code`)."""

from __future__ import annotations

import pytest

from codegen.drift.forks import nearest_code
from codegen.edit import parse_method
from codegen.pattern import find_matches, parse_pattern

#: a new upstream body whose ``def`` is line 10 of its file
BODY = """\
    def __init__(self, config, prefix=""):
        super().__init__()
        self.attention = attn_cls(config, prefix=f"{prefix}.attn")
        self.mlp = DeepseekV2DenseMLP(config)
        if config.use_norm:
            self.norm = RMSNorm(config.hidden_size)
"""


@pytest.mark.parametrize(
    ("anchor", "anchored", "line", "code"),
    [
        # a statement whose target upstream renamed: the lock's record of what it matched
        (
            "self.self_attn = attn_cls(...)",
            "self.self_attn = attn_cls(config, prefix=f'{prefix}.attn')",
            12,
            "self.attention = attn_cls(config, prefix=f'{prefix}.attn')",
        ),
        # no record (an alternative only the new release gets): the anchor's own text
        ("self.self_attn = attn_cls(...)", None, 12, None),
        # an expression anchor: the nearest expression of its node type
        ("DeepseekV2MLP", "DeepseekV2MLP", 13, "DeepseekV2DenseMLP"),
        # a run of statements: the nearest run as long, joined as the lock joins runs
        (
            "self.self_attn = $A(...)\nself.mlp = $M(...)",
            "self.self_attn = attn_cls(config) | self.mlp = DeepseekV2MLP(config)",
            12,
            "self.attention = attn_cls(config, prefix=f'{prefix}.attn') | "
            "self.mlp = DeepseekV2DenseMLP(config)",
        ),
    ],
)
def test_nearest_code_is_where_the_anchor_went(
    anchor: str, anchored: str | None, line: int, code: str | None
) -> None:
    """The nearest code is at the upstream line of the renamed code, and pasted as the anchor it
    matches that code exactly once."""
    parsed = parse_method(BODY, first_line=10)
    found = nearest_code(parsed, anchor, anchored)
    assert found is not None
    assert found.line == line
    if code is not None:
        assert found.code == code and found.ratio > 0.5
    assert len(find_matches(parse_pattern(found.anchor), parsed.function.body)) == 1


def test_no_code_of_the_anchors_shape_is_none() -> None:
    """An expression anchor of a node type the body never uses has no nearest code."""
    parsed = parse_method("    def f(self):\n        return 1\n", first_line=1)
    assert nearest_code(parsed, "self.a.b", "self.a.b") is None
