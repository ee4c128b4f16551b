"""The generated AFD model equals native vLLM, layer by layer, for several configs and both gate placements.

Runs ``python -m afd_models.cli.verify`` (the command users run on their configs) and checks its
JSON: per-layer differences, output tokens, and the split of parameters between the roles.
"""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from afd_models.cli.tiny_models import tiny_config
from tests.verify_runs import VerifyRun, run_all, selected

#: V2 (bitwise) and V3 (``noaux_tc``, grouped top-k) run on every supported vLLM release; the
#: other configurations vary AFD's own plan and run on the primary release only
CASES = [
    pytest.param("v2", "float32", marks=pytest.mark.every_release),
    pytest.param("v3", "bfloat16", marks=pytest.mark.every_release),
    ("v2-lite", "float32"),
    ("v2-grouped", "bfloat16"),
]


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    vllm_env: dict[str, str],
) -> dict[Hashable, VerifyRun]:
    """Every selected case's ``verify`` run, two at a time (tests/verify_runs.py)."""
    env = {k: v for k, v in vllm_env.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    cases = selected(request, "test_verify_passes", "variant", "dtype")
    configs = {case: (tiny_config(case[0]), ("--dtype", case[1])) for case in cases}
    return run_all(configs, tmp_path_factory.mktemp("verify"), env)


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
