"""Qwen3-MoE end to end: one FFN + Attention ``vllm serve`` pair against one plain vLLM baseline.

Both roles started in vLLM's default compiled mode (the Attention role compiles its model with
the exchange op inside; the FFN worker runs its layers eagerly, as always), the gate on Attention (the Attention role runs the
Qwen3 gate in its experts' proxy, the FFN role's experts take an external router; the other
placement is covered, bitwise per layer, by tests/cpu/test_qwen3_moe.py). Greedy completions of
concurrent requests equal the baseline's token for token, with one sequence per step on both sides
as in test_serve_pair.py, whose helpers this reuses. The baseline and the pair start at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from afd_models.cli import serve
from afd_models.cli.tiny_models import write_tiny_model
from tests.e2e_cpu.test_serve_pair import (
    MAX_TOKENS,
    ONE_SEQUENCE,
    START_TIMEOUT_S,
    TIMEOUT_S,
    _concurrently,
)

# the second family's serving, on the primary release: on every supported release the compiled
# pair runs with DeepSeek (test_serve_pair.py) and Qwen3-MoE's layers are checked bitwise by
# `verify` (tests/cpu/test_qwen3_moe.py)


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The float32 tiny Qwen3-MoE model (one dense layer, two MoE layers) with widened margins."""
    return write_tiny_model(
        tmp_path_factory.mktemp("model") / "qwen3-moe",
        "qwen3-moe",
        seed=0,
        dtype="float32",
        margin_scale=50.0,
    )


def test_qwen3_moe_pair_matches_baseline(qwen3_model: Path, logs: Path) -> None:
    """The baseline and the pair start at once (their start-ups are mostly one core's work
    each); the baseline's tokens first, then the pair's, each one sequence per step."""
    afd = {
        "port": serve.free_port(),
        "compute_gate_on_attention": True,
        "connector_extra_config": {"timeout_s": TIMEOUT_S, "connect_timeout_s": 240},
    }
    baseline = serve.start(
        "baseline-qwen3",
        qwen3_model,
        serve.free_port(),
        logs,
        cpu=serve.cpu(1),
        extra=ONE_SEQUENCE,
    )
    ffn = serve.start_ffn("ffn-qwen3", qwen3_model, serve.free_port(), logs, afd, cpu=serve.cpu(1))
    attention = serve.start_attention(
        "attention-qwen3",
        qwen3_model,
        serve.free_port(),
        logs,
        afd,
        cpu=serve.cpu(0),
        env={"VLLM_SERVER_DEV_MODE": "1"},  # /collective_rpc, to read the connector's steps
        extra=ONE_SEQUENCE,
    )
    servers = [baseline, ffn, attention]
    try:
        serve.wait_ready([baseline], START_TIMEOUT_S)
        assert serve.ran_compiled(baseline), baseline.log_tail()
        expected = _concurrently(baseline)
        assert all(len(tokens) == MAX_TOKENS for tokens in expected)
        serve.stop(baseline)
        serve.wait_ready([ffn, attention], START_TIMEOUT_S)
        before = serve.connector_stats(attention)["steps"]
        assert _concurrently(attention) == expected
        # every token of every sequence crossed the connector (one sequence per step)
        steps = serve.connector_stats(attention)["steps"] - before
        assert steps >= len(expected) * MAX_TOKENS, steps
        assert serve.ran_compiled(attention), attention.log_tail()
    finally:
        codes = {s.name: serve.stop(s) for s in reversed(servers)}
    assert not any(serve.group_alive(s) for s in servers)
    assert codes[attention.name] is not None
