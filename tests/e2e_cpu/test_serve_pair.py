"""AFD end to end: FFN and Attention ``vllm serve`` processes on 127.0.0.1 against a plain vLLM baseline.

Both pairs run in vLLM's default compiled mode, against one baseline compiled the same way.

* **From the checkout** (the primary release), the gate on the FFN, the FFN started first:
  greedy completions of 4 concurrent requests equal the baseline's, token for token; both roles'
  ``/metrics`` show the AFD series of the exchanges; ``vllm bench serve`` completes its requests
  (as the demo runs it); the FFN engine refuses requests; once the group formed nothing listens
  on its rendezvous port, and neither role listens on more reachable addresses than plain vLLM
  (its own torch.distributed store); killing the
  FFN makes Attention requests fail with a clear error within the connector timeout; both roles
  stop and release their ports.
* **From the installed wheel** (every release; tests/e2e_cpu/test_install.py checks the wheel
  itself), the gate on Attention, Attention started first: each prompt's completion, sent one at
  a time, equals the baseline's; concurrent requests then share steps through the connector;
  SIGTERM stops both roles with exit code 0, leaving no process or port behind.

Token equality is checked with one sequence per engine step on both sides (``--max-num-seqs 1``,
or requests sent one after another), so each sequence is decoded in the same batch shape: vLLM's
CPU kernels are not batch-invariant, and a plain vLLM server does not reproduce its own outputs
when concurrent requests land in different batches (measured, see docs/testing.md).
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from afd_models.cli import bench_serve, serve
from tests import probes
from tests.e2e_cpu.conftest import WheelVenv

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


def test_pair_matches_baseline_and_fails_cleanly(
    model: Path,
    logs: Path,
    baseline: serve.Server,
    tmp_path: Path,
) -> None:
    """The gate on the FFN, the FFN started first: tokens equal the baseline; both roles'
    ``/metrics`` show the AFD series of the exchanges; a dead FFN gives a clear, bounded failure."""
    afd = {
        "port": serve.free_port(),
        "connector_extra_config": {"timeout_s": TIMEOUT_S, "connect_timeout_s": 240},
    }
    # each server's own fresh directory: vLLM's /metrics then serves its workers' series too
    prometheus = {role: tmp_path / f"prometheus-{role}" for role in ("ffn", "attention")}
    for directory in prometheus.values():
        directory.mkdir()
    ffn = serve.start_ffn(
        "ffn-checkout",
        model,
        serve.free_port(),
        logs,
        afd,
        cpu=serve.cpu(1),
        env={"PROMETHEUS_MULTIPROC_DIR": str(prometheus["ffn"])},
    )
    time.sleep(5)  # the second role really starts later
    attention = serve.start_attention(
        "attention-checkout",
        model,
        serve.free_port(),
        logs,
        afd,
        cpu=serve.cpu(0),
        extra=ONE_SEQUENCE,
        env={"PROMETHEUS_MULTIPROC_DIR": str(prometheus["attention"])},
    )
    try:
        serve.wait_ready([ffn, attention], START_TIMEOUT_S)
        expected = _concurrently(baseline)
        assert _concurrently(attention) == expected
        assert all(len(tokens) == MAX_TOKENS for tokens in expected)
        assert serve.ran_compiled(attention), attention.log_tail()
        _check_metrics(attention, ffn, tokens=len(PROMPTS) * MAX_TOKENS)
        # vLLM's own client, as the demo and benchmarks/serving.py drive it
        cores = (serve.cpu(0), serve.cpu(1))
        run = bench_serve.bench_serve(
            bench_serve.Deployment("AFD pair", attention, cores, plain=False), model, 2, 4
        )
        assert run.output_tokens_per_s > 0 and run.tpot_median_ms > 0, run

        status, _ = serve.post(
            ffn, "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2}
        )
        assert status == 404  # the FFN engine registers no generation routes
        _check_listening(ffn, attention, baseline, afd["port"])

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


@pytest.mark.every_release
def test_wheel_pair_matches_baseline_batches_and_stops_cleanly(
    wheel_venv: WheelVenv, model: Path, logs: Path, baseline: serve.Server, tmp_path: Path
) -> None:
    """The gate on Attention, Attention started first, both roles running the installed wheel's
    code: completions sent one at a time equal the baseline's; concurrent requests share steps
    through the connector; SIGTERM stops both roles with exit code 0. (Stopping the Attention
    role first also ends the FFN engine, which then reports its peer gone: the test above.)"""
    afd = {
        "port": serve.free_port(),
        "compute_gate_on_attention": True,
        "connector_extra_config": {"timeout_s": TIMEOUT_S, "connect_timeout_s": 240},
    }
    from_wheel = {"python": wheel_venv.python, "cwd": tmp_path}
    attention = serve.start_attention(
        "attention-wheel",
        model,
        serve.free_port(),
        logs,
        afd,
        cpu=serve.cpu(0),
        env={"VLLM_SERVER_DEV_MODE": "1"},  # /collective_rpc, for the connector's step count
        **from_wheel,
    )
    time.sleep(5)  # the second role really starts later
    ffn = serve.start_ffn(
        "ffn-wheel", model, serve.free_port(), logs, afd, cpu=serve.cpu(1), **from_wheel
    )
    try:
        serve.wait_ready([ffn, attention], START_TIMEOUT_S)
        expected = [serve.complete(baseline, p, MAX_TOKENS) for p in PROMPTS]
        assert [serve.complete(attention, p, MAX_TOKENS) for p in PROMPTS] == expected
        assert all(len(tokens) == MAX_TOKENS for tokens in expected)
        assert serve.ran_compiled(attention), attention.log_tail()
        before = serve.connector_stats(attention)["steps"]
        assert [len(tokens) for tokens in _concurrently(attention)] == [MAX_TOKENS] * len(PROMPTS)
        steps = serve.connector_stats(attention)["steps"] - before
        assert MAX_TOKENS <= steps < len(PROMPTS) * MAX_TOKENS  # sequences shared steps
    finally:
        ffn_code = serve.stop(ffn)  # FFN first: the Attention role notices nothing while idle
        attention_code = serve.stop(attention)
    assert (attention_code, ffn_code) == (0, 0)
    assert not serve.group_alive(attention) and not serve.group_alive(ffn)
    assert probes.port_is_free(afd["port"])
    assert "AFD FFN server: stopped after" in ffn.log.read_text(errors="replace")


def _exposed(server: serve.Server) -> list[tuple[str, int]]:
    """The server's listening sockets on an address other machines can reach."""
    sockets = probes.listening_sockets(serve.group_members(server))
    return [s for s in sockets if not ipaddress.ip_address(s[0]).is_loopback]


def _check_listening(
    ffn: serve.Server, attention: serve.Server, baseline: serve.Server, rendezvous: int
) -> None:
    """Once the group formed, nothing listens on the rendezvous port, and each role's engine
    listens on no more reachable addresses than the plain engine does (vLLM's own: the store of
    its torch.distributed world, which torch binds to every interface)."""
    for server in (ffn, attention):
        sockets = probes.listening_sockets(serve.group_members(server))
        assert rendezvous not in {port for _, port in sockets}, (server.name, sockets)
        assert len(_exposed(server)) == len(_exposed(baseline)), (server.name, sockets)


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
