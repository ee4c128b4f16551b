"""The generated AFD model equals native vLLM, layer by layer, for several configs and both gate placements.

Runs ``python -m afd_models.cli.verify`` (the command users run on their configs) and checks its
JSON: per-layer differences, output tokens, and the split of parameters between the roles.
"""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from afd_models.cli.tiny_models import tiny_config
from tests.verify_runs import Cases, VerifyRun, runs_of, selected

#: V2 (bitwise) and V3 (``noaux_tc``, grouped top-k) run on every supported vLLM release; the
#: other configurations vary AFD's own plan and run on the primary release only
CASES = [
    pytest.param("v2", "float32", marks=pytest.mark.every_release),
    pytest.param("v3", "bfloat16", marks=pytest.mark.every_release),
    ("v2-lite", "float32"),
    ("v2-grouped", "bfloat16"),
]


def verify_cases(session: pytest.Session) -> Cases:
    """This module's selected cases, for the session's verify runs (tests/verify_runs.py)."""
    cases = selected(session, __name__, "test_verify_passes", "variant", "dtype")
    return {case: (tiny_config(case[0]), ("--dtype", case[1])) for case in cases}


@pytest.fixture(scope="module")
def runs(verify_runs: dict[Hashable, VerifyRun]) -> dict[Hashable, VerifyRun]:
    return runs_of(verify_runs, __name__)


@pytest.mark.parametrize(
    ("variant", "dtype"),
    CASES,
    ids=["v2-float32", "v3-bfloat16", "v2-lite-float32", "v2-grouped-bfloat16"],
)
def test_verify_passes(variant: str, dtype: str, runs: dict[Hashable, VerifyRun]) -> None:
    """Both gate placements match native within the dtype's tolerance (bitwise for float32)."""
    data = runs[variant, dtype].data()
    for gate in ("ffn", "attention"):
        entry = data[f"gate_on_{gate}"]
        assert entry["tokens_equal"] and entry["forwards"] >= 2
        if dtype == "float32":
            assert entry["max_abs"] == 0.0
        split = entry["params"]
        assert split["missing"] == [] and split["extra"] == []
        assert not any(".self_attn." in name for name in split["ffn"])
        assert not any(
            ".mlp.experts." in name or "shared_experts" in name for name in split["attention"]
        )
        gate_params = sorted(n for n in split["ffn"] if ".mlp.gate." in n)
        assert split["both"] == (gate_params if gate == "attention" else [])
        assert not any("embed_tokens" in n or "lm_head" in n for n in split["ffn"])
