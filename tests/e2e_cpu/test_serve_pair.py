"""AFD end to end: FFN and Attention ``vllm serve`` processes on 127.0.0.1 against a plain vLLM baseline.

For both gate placements (each started in a different order), in vLLM's default compiled mode:
greedy completions of 4 concurrent requests equal a baseline compiled the same way, token for
token; the FFN engine refuses requests; killing the FFN makes Attention requests fail with a
clear error within the connector timeout; both roles stop cleanly and release their ports.
Eager mode (``--enforce-eager``) serving batched requests and a clean stop are in
test_install.py, where the pair runs from a wheel, on every release.

Token equality is checked with ``--max-num-seqs 1`` on both sides, so each sequence is decoded in
the same batch shape on both: vLLM's eager CPU kernels are not batch-invariant, and a plain vLLM
server does not reproduce its own outputs when concurrent requests land in different batches
(measured, see docs/testing.md). Batched serving is covered by test_install.py, which sends
4 concurrent requests with up to 16 sequences per step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from afd_models.cli import serve
from tests import probes

PROMPTS = [
    "Hello world, the license",
    "The quick brown fox",
    "Numbers like 0 1 2",
    "Attention and experts",
]
MAX_TOKENS = 24
TIMEOUT_S = 10
#: engine start-up, including the Attention engine's compilation on 2 shared cores
START_TIMEOUT_S = 600


#: the pair every supported release serves (the others run on the primary)
EVERY_RELEASE = pytest.mark.every_release
#: one sequence per engine step: the same batch shapes on the baseline and the AFD pair
ONE_SEQUENCE = ("--max-num-seqs", "1")


@pytest.fixture(scope="module")
def baseline(model: Path, logs: Path) -> Iterator[serve.Server]:
    server = serve.start(
        "baseline", model, serve.free_port(), logs, cpu=serve.cpu(0), extra=ONE_SEQUENCE
    )
    try:
        serve.wait_ready([server], START_TIMEOUT_S)
        assert serve.ran_compiled(server), server.log_tail()
        yield server
    finally:
        serve.stop(server)


def _concurrently(server: serve.Server) -> list[list[int]]:
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(lambda p: serve.complete(server, p, MAX_TOKENS), PROMPTS))


@pytest.mark.parametrize(
    ("gate_on_attention", "ffn_first"),
    [
        # on every supported release: the gate on Attention, where AFD's experts run the gate
        # themselves; the other placement is checked layer by layer on every release
        # (test_equivalence.py) and served here on the primary
        pytest.param(False, True, id="gate-on-ffn/ffn-first"),
        pytest.param(True, False, id="gate-on-attention/attention-first", marks=EVERY_RELEASE),
    ],
)
def test_pair_matches_baseline_and_fails_cleanly(
    gate_on_attention: bool,
    ffn_first: bool,
    model: Path,
    logs: Path,
    baseline: serve.Server,
    tmp_path: Path,
) -> None:
    """Start order does not matter; tokens equal the baseline; both roles' ``/metrics`` show the
    AFD series of the exchanges; a dead FFN gives a clear, bounded failure."""
    afd = {
        "port": serve.free_port(),
        "compute_gate_on_attention": gate_on_attention,
        "connector_extra_config": {"timeout_s": TIMEOUT_S, "connect_timeout_s": 240},
    }
    tag = "attention" if gate_on_attention else "ffn"
    # each server's own fresh directory: vLLM's /metrics then serves its workers' series too
    prometheus = {role: tmp_path / f"prometheus-{role}" for role in ("ffn", "attention")}
    for directory in prometheus.values():
        directory.mkdir()
    starters = [
        lambda: serve.start_ffn(
            f"ffn-{tag}",
            model,
            serve.free_port(),
            logs,
            afd,
            cpu=serve.cpu(1),
            env={"PROMETHEUS_MULTIPROC_DIR": str(prometheus["ffn"])},
        ),
        lambda: serve.start_attention(
            f"attention-{tag}",
            model,
            serve.free_port(),
            logs,
            afd,
            cpu=serve.cpu(0),
            extra=ONE_SEQUENCE,
            env={"PROMETHEUS_MULTIPROC_DIR": str(prometheus["attention"])},
        ),
    ]
    if not ffn_first:
        starters.reverse()
    first = starters[0]()
    time.sleep(5)  # the second role really starts later
    second = starters[1]()
    ffn, attention = (first, second) if ffn_first else (second, first)
    try:
        serve.wait_ready([ffn, attention], START_TIMEOUT_S)
        expected = _concurrently(baseline)
        assert _concurrently(attention) == expected
        assert all(len(tokens) == MAX_TOKENS for tokens in expected)
        assert serve.ran_compiled(attention), attention.log_tail()
        _check_metrics(attention, ffn, tokens=len(PROMPTS) * MAX_TOKENS)

        status, _ = serve.post(
            ffn, "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2}
        )
        assert status == 404  # the FFN engine registers no generation routes

        serve.kill_group(ffn)
        started = time.monotonic()
        status, body = serve.post(
            attention, "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 4}, 120
        )
        assert status != 200, body
        assert time.monotonic() - started < TIMEOUT_S + 30
        assert "AFD gloo connector" in attention.log.read_text(errors="replace")
    finally:
        codes = {s.name: serve.stop(s) for s in (attention, ffn)}
    assert not serve.group_alive(attention) and not serve.group_alive(ffn)
    assert probes.port_is_free(afd["port"]) and probes.port_is_free(attention.port)
    assert codes[attention.name] is not None


def _check_metrics(attention: serve.Server, ffn: serve.Server, tokens: int) -> None:
    """One sequence per step, so at least a step per generated token crossed, every layer of it,
    and both sides count the same steps (the FFN's by its peer, attention rank 0)."""
    on_attention = {"role": "attention", "rank": "0", "lane": "0", "peer": "ffn0"}
    on_ffn = {"role": "ffn", "rank": "0", "lane": "0", "peer": "attention0"}
    steps = probes.metric_value(attention, "afd_steps_total", **on_attention)
    assert steps >= tokens
    assert probes.metric_value(ffn, "afd_steps_total", **on_ffn) == steps
    assert probes.metric_value(attention, "afd_tokens_total", **on_attention) >= tokens
    assert (
        probes.metric_value(attention, "afd_exchange_seconds_count", **on_attention, layer="1")
        == steps
    )
    for direction in ("sent", "received"):
        assert (
            probes.metric_value(attention, "afd_bytes_total", **on_attention, direction=direction)
            > 0
        )
        assert probes.metric_value(ffn, "afd_bytes_total", **on_ffn, direction=direction) > 0
    assert probes.metric_value(attention, "afd_peer_connected", **on_attention) == 1
    assert probes.metric_value(ffn, "afd_peer_connected", **on_ffn) == 1
