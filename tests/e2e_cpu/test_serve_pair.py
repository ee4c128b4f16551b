"""AFD end to end on the compiled DeepSeek pairs: FFN and Attention ``vllm serve`` processes on
127.0.0.1 against one plain vLLM baseline, all in vLLM's default compiled mode.

The baseline serves from a checkout whose overlay changed after its code was generated (a ``git
pull`` that touched one): a plain ``vllm serve`` must be untouched by that, while an AFD worker
of that checkout fails at start naming the command that fixes it.

* **From the checkout** (the primary release), the gate on the FFN, the FFN started first, the
  restart window on (``peer_restart_timeout_s``, the AFD scheduler): greedy completions of 4
  concurrent requests equal the baseline's, token for token; both roles' ``/metrics`` show the
  AFD series of the exchanges; ``vllm bench serve`` completes its requests (as the demo runs it);
  the FFN engine refuses requests; once the group formed nothing listens on its rendezvous port,
  and neither role listens on more reachable addresses than plain vLLM (its own
  torch.distributed store). Then, on the same pair, the FFN engine killed under load and
  replaced, and the Attention engine killed under load and replaced (tests/e2e_cpu/restarts.py):
  no request lost, every completion the baseline's; last, the FFN engine kept away past the
  Attention engine's window: the request in flight fails (HTTP 500, an error finish) within it,
  the engine stays up and serves again on a new FFN engine. Both roles stop and release their
  ports.
* **From the installed wheel** (every release): the wheel carries code generated for the
  installed vLLM; the gate on Attention, Attention started first: each prompt's completion, sent
  one at a time, equals the baseline's; concurrent requests then share steps through the
  connector; SIGTERM stops both roles with exit code 0, leaving no process or port behind.

Token equality is checked with one sequence per engine step on both sides (``--max-num-seqs 1``,
or requests sent one after another), so each sequence is decoded in the same batch shape: vLLM's
CPU kernels are not batch-invariant, and a plain vLLM server does not reproduce its own outputs
when concurrent requests land in different batches (measured, see docs/testing.md).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from afd_models.cli import bench_serve, serve
from afd_models.freshness import installed_vllm
from tests import probes
from tests.checkout import REPO, tracked_copy
from tests.e2e_cpu import restarts
from tests.e2e_cpu.conftest import WheelVenv
from tests.engine import run_python

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
#: the restarted Attention engine's peer_restart_timeout_s: the FFN engine stays away longer
LOST_AFTER_S = 20
#: one sequence per engine step: the same batch shapes on the baseline and the AFD pair
ONE_SEQUENCE = ("--max-num-seqs", "1")
#: the overlay the stale checkout edits after generation
STALE_OVERLAY = "overlay/vllm/model_executor/models/deepseek_v2.py"
#: what vLLM logs when a general plugin raises while it loads
PLUGIN_FAILED = "Failed to load plugin"


@pytest.fixture(scope="module")
def stale_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkout with its generated code, then an overlay edited (a `git pull` that touched one)."""
    root = tracked_copy(tmp_path_factory.mktemp("stale") / "checkout")
    shutil.copytree(REPO / "afd_models" / "_generated", root / "afd_models" / "_generated")
    with (root / STALE_OVERLAY).open("a") as overlay:
        overlay.write("\n# edited after generation\n")
    return root


@pytest.fixture(scope="module")
def baseline(model: Path, logs: Path, stale_checkout: Path) -> Iterator[serve.Server]:
    """Plain vLLM, compiled, one sequence per step, loading its plugins from the stale checkout;
    started, not yet ready: a test starts its pair before it asks for :func:`expected`, so that
    the two start-ups overlap."""
    server = serve.start(
        "baseline",
        model,
        serve.free_port(),
        logs,
        cpu=serve.cpu(0),
        extra=ONE_SEQUENCE,
        env={"PYTHONPATH": str(stale_checkout)},
    )
    try:
        yield server
    finally:
        serve.stop(server)


@pytest.fixture(scope="module")
def expected(baseline: serve.Server) -> dict[str, list[int]]:
    """The baseline's greedy tokens of each prompt, its requests sent at once."""
    serve.wait_ready([baseline], START_TIMEOUT_S)
    assert serve.ran_compiled(baseline), baseline.log_tail()
    tokens = dict(zip(PROMPTS, _concurrently(baseline), strict=True))
    assert all(len(t) == MAX_TOKENS for t in tokens.values())
    return tokens


def _concurrently(server: serve.Server) -> list[list[int]]:
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(lambda p: serve.complete(server, p, MAX_TOKENS), PROMPTS))


@dataclass
class CheckoutPair:
    """The compiled pair from the checkout (gate on the FFN, the FFN started first, with a
    restart window and the AFD scheduler), as the tests before left it: a restart replaces an
    engine, on the same ports."""

    model: Path
    logs: Path
    #: where each engine's own Prometheus directory goes
    prometheus: Path
    afd: dict[str, Any]
    ffn_port: int = field(default_factory=serve.free_port)
    attention_port: int = field(default_factory=serve.free_port)
    #: every engine started, in order (the last of each role serves)
    servers: list[serve.Server] = field(default_factory=list)
    #: the serving Attention engine's ``peer_restart_timeout_s``
    window_s: float = restarts.RESTART_S

    @property
    def ffn(self) -> serve.Server:
        return next(s for s in reversed(self.servers) if s.name.startswith("ffn"))

    @property
    def attention(self) -> serve.Server:
        return next(s for s in reversed(self.servers) if s.name.startswith("attention"))

    def _env(self, name: str) -> dict[str, str]:
        # each server's own fresh directory: vLLM's /metrics then serves its workers' series too
        directory = self.prometheus / name
        directory.mkdir(parents=True)
        return {"PROMETHEUS_MULTIPROC_DIR": str(directory)}

    def start_ffn(self, name: str) -> serve.Server:
        server = serve.start_ffn(
            name,
            self.model,
            self.ffn_port,
            self.logs,
            self.afd,
            cpu=serve.cpu(1),
            env=self._env(name),
        )
        self.servers.append(server)
        return server

    def start_attention(self, name: str, window_s: float = restarts.RESTART_S) -> serve.Server:
        server = serve.start_attention(
            name,
            self.model,
            self.attention_port,
            self.logs,
            {**self.afd, "peer_restart_timeout_s": window_s},
            cpu=serve.cpu(0),
            extra=(*ONE_SEQUENCE, *restarts.ATTENTION_ARGS),
            env=self._env(name),
        )
        self.servers.append(server)
        self.window_s = window_s
        return server

    def ready(self) -> None:
        serve.wait_ready([self.ffn, self.attention], START_TIMEOUT_S)


@pytest.fixture(scope="module")
def pair(
    model: Path, logs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CheckoutPair]:
    """The pair, started (its first test waits for it, after the baseline's start)."""
    afd: dict[str, Any] = {"port": serve.free_port(), **restarts.RESTART_SECTION}
    started = CheckoutPair(model, logs, tmp_path_factory.mktemp("prometheus"), afd)
    try:
        started.start_ffn("ffn-checkout")
        time.sleep(5)  # the second role really starts later
        started.start_attention("attention-checkout")
        yield started
    finally:
        for server in reversed(started.servers):
            serve.stop(server)


#: the labels of the pair's one connection, on each side
ON_ATTENTION = {"role": "attention", "rank": "0", "lane": "0", "peer": "ffn0"}
ON_FFN = {"role": "ffn", "rank": "0", "lane": "0", "peer": "attention0"}


def test_pair_matches_baseline_and_reports_its_exchanges(
    pair: CheckoutPair, baseline: serve.Server, request: pytest.FixtureRequest
) -> None:
    """Tokens equal the baseline's; both roles' ``/metrics`` show the AFD series of the
    exchanges; vLLM's own client completes its requests; the FFN engine refuses requests; no
    role listens more widely than plain vLLM."""
    expected: dict[str, list[int]] = request.getfixturevalue("expected")
    pair.ready()
    ffn, attention = pair.ffn, pair.attention
    assert _concurrently(attention) == list(expected.values())
    assert serve.ran_compiled(attention), attention.log_tail()
    _check_metrics(attention, ffn, tokens=len(PROMPTS) * MAX_TOKENS)
    # vLLM's own client, as the demo and benchmarks/serving.py drive it
    cores = (serve.cpu(0), serve.cpu(1))
    run = bench_serve.bench_serve(
        bench_serve.Deployment("AFD pair", attention, cores, plain=False), pair.model, 2, 4
    )
    assert run.output_tokens_per_s > 0 and run.tpot_median_ms > 0, run
    status, _ = serve.post(
        ffn, "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2}
    )
    assert status == 404  # the FFN engine registers no generation routes
    _check_listening(ffn, attention, baseline, pair.afd["port"])


def test_either_role_restarts_under_load_without_losing_a_request(
    pair: CheckoutPair, expected: dict[str, list[int]]
) -> None:
    """The FFN engine killed under load and a new one started; then the Attention engine
    (the new one gives up on a step sooner, for the next test)."""
    pair.ready()
    restarts.restart_ffn_under_load(
        pair.attention,
        pair.ffn,
        lambda: pair.start_ffn("ffn-restarted"),
        expected,
        max_tokens=MAX_TOKENS,
        lanes=[ON_ATTENTION],
    )
    attention = restarts.restart_attention_under_load(
        pair.ffn,
        pair.attention,
        lambda: pair.start_attention("attention-restarted", LOST_AFTER_S),
        expected,
        max_tokens=MAX_TOKENS,
        ffn_lanes=[ON_FFN],
        tp=1,
    )
    assert serve.ran_compiled(attention), attention.log_tail()


def test_an_ffn_engine_away_past_the_window_fails_only_the_step_in_flight(
    pair: CheckoutPair, expected: dict[str, list[int]]
) -> None:
    """The FFN engine stays away past the Attention engine's window: the request fails within
    it, the engine stays up, and serves again once an FFN engine is back."""
    if pair.window_s != LOST_AFTER_S:  # run on its own: an Attention engine of the short window
        serve.stop(pair.attention)
        pair.start_attention("attention-short-window", LOST_AFTER_S)
    pair.ready()
    attention = pair.attention
    serve.kill_group(pair.ffn)
    started = time.monotonic()
    with pytest.raises(serve.ServerError, match="completion answered 500"):
        serve.complete(attention, PROMPTS[0], MAX_TOKENS, restarts.REQUEST_TIMEOUT_S)
    assert LOST_AFTER_S <= time.monotonic() - started < LOST_AFTER_S + restarts.TIMEOUT_S + 30
    restarts.wait_for_lines(attention, "failing the step's 1 requests (the engine stays up", 1, 30)
    assert serve.health(attention) == 200 and attention.alive()
    errors = {"finished_reason": "error"}
    assert probes.metric_value(attention, "vllm:request_success_total", **errors) == 1
    ffn = pair.start_ffn("ffn-back")
    # with no request in flight: its API server comes up once the Attention engine connected
    serve.wait_ready([ffn], START_TIMEOUT_S)
    restarts.wait_for_lines(attention, "an FFN engine connected; the next step runs on it", 1, 30)
    assert {p: serve.complete(attention, p, MAX_TOKENS) for p in PROMPTS} == expected
    assert probes.metric_value(attention, "afd_reconnects_total", **ON_ATTENTION) == 1
    assert probes.metric_value(attention, "vllm:request_success_total", **errors) == 1


def test_the_pair_stops_and_frees_its_ports(pair: CheckoutPair) -> None:
    """Every engine the pair's tests started is gone after its stop, and every port is free."""
    for server in reversed(pair.servers):
        serve.stop(server)
    assert not any(serve.group_alive(s) for s in pair.servers)
    for port in (pair.afd["port"], pair.ffn_port, pair.attention_port):
        assert probes.port_is_free(port), port


def test_a_stale_checkout_leaves_plain_vllm_alone_and_stops_afd_workers(
    stale_checkout: Path,
    baseline: serve.Server,
    expected: dict[str, list[int]],
    model: Path,
    logs: Path,
) -> None:
    """With an overlay edited after generation, loading vLLM's plugins logs nothing from this
    project and still registers the AFD names; the plain baseline serves from it without a
    word; an AFD worker fails at start with the command that fixes it."""
    env = {"PYTHONPATH": str(stale_checkout)}
    probe = run_python(
        """
        import json, afd_models
        from vllm import ModelRegistry
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        afd = sorted(a for a in ModelRegistry.get_supported_archs() if a.startswith("AFD"))
        print(json.dumps([afd_models.__file__, afd]))
        """,
        {**os.environ, **env},
        cwd=stale_checkout,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    module, registered = json.loads(probe.stdout.splitlines()[-1])
    assert Path(module).is_relative_to(stale_checkout), module
    assert "AFDDeepseekV2ForCausalLM" in registered, registered
    assert PLUGIN_FAILED not in probe.stderr and "Traceback" not in probe.stderr, probe.stderr
    # read while it serves: vLLM's own shutdown may log a traceback of its engine client
    assert len(serve.complete(baseline, PROMPTS[0], 4)) == 4
    log = baseline.log.read_text(errors="replace")
    assert PLUGIN_FAILED not in log and "Traceback" not in log, log[-3000:]

    afd = {"port": serve.free_port(), "connector_extra_config": {"connect_timeout_s": 30}}
    attention = serve.start_attention(
        "attention-stale", model, serve.free_port(), logs, afd, env=env, eager=True
    )
    try:
        with pytest.raises(serve.ServerError, match="exited with"):
            serve.wait_ready([attention], START_TIMEOUT_S)
    finally:
        serve.stop(attention)
    log = attention.log.read_text(errors="replace")
    assert f"{STALE_OVERLAY} changed since the code was generated" in log, attention.log_tail()
    assert "nox -s regenerate" in log, attention.log_tail()
    assert not serve.group_alive(attention)


@pytest.mark.every_release
def test_wheel_pair_matches_baseline_batches_and_stops_cleanly(
    baseline: serve.Server,
    wheel_venv: WheelVenv,
    model: Path,
    logs: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The gate on Attention, Attention started first, both roles running the installed wheel's
    code: completions sent one at a time equal the baseline's; concurrent requests share steps
    through the connector; SIGTERM stops both roles with exit code 0. (Stopping the Attention
    role first also ends the FFN engine, which then reports its peer gone.)"""
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
    ffn = None
    try:
        time.sleep(5)  # the second role really starts later
        ffn = serve.start_ffn(
            "ffn-wheel", model, serve.free_port(), logs, afd, cpu=serve.cpu(1), **from_wheel
        )
        expected: dict[str, list[int]] = request.getfixturevalue("expected")
        serve.wait_ready([ffn, attention], START_TIMEOUT_S)
        assert {p: serve.complete(attention, p, MAX_TOKENS) for p in PROMPTS} == expected
        assert serve.ran_compiled(attention), attention.log_tail()
        before = serve.connector_stats(attention)["steps"]
        assert [len(tokens) for tokens in _concurrently(attention)] == [MAX_TOKENS] * len(PROMPTS)
        steps = serve.connector_stats(attention)["steps"] - before
        assert MAX_TOKENS <= steps < len(PROMPTS) * MAX_TOKENS  # sequences shared steps
    finally:
        # FFN first: the Attention role notices nothing while idle
        ffn_code = None if ffn is None else serve.stop(ffn)
        attention_code = serve.stop(attention)
    assert ffn is not None and (attention_code, ffn_code) == (0, 0)
    assert not serve.group_alive(attention) and not serve.group_alive(ffn)
    assert probes.port_is_free(afd["port"])
    assert "AFD FFN server: stopped after" in ffn.log.read_text(errors="replace")


@pytest.mark.every_release
def test_wheel_carries_code_generated_for_the_installed_vllm(wheel_venv: WheelVenv) -> None:
    """On every supported release (one other than the primary named with ``-C vllm=``), the
    venv's AFD workers import from the wheel, pass their freshness check against the lock the
    wheel carries, and were generated for the installed vLLM; the build left the clone alone."""
    where = run_python(
        """
        import afd_models.workers, afd_models._generated as generated
        print(afd_models.workers.__file__, generated.UPSTREAM["vllm"], generated.LOCK)
        """,
        dict(os.environ),
        python=wheel_venv.python,
        cwd=wheel_venv.root,
    )
    assert where.returncode == 0, where.stderr[-3000:]
    module, generated_for, lock = where.stdout.splitlines()[-1].split()
    assert Path(module).is_relative_to(wheel_venv.root), module  # not this checkout's
    assert generated_for == installed_vllm()
    assert (Path(module).parent / "_generated" / Path(lock).name).is_file()
    assert not (wheel_venv.clone / "afd_models" / "_generated").exists()


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
    steps = probes.metric_value(attention, "afd_steps_total", **ON_ATTENTION)
    assert steps >= tokens
    assert probes.metric_value(ffn, "afd_steps_total", **ON_FFN) == steps
    assert probes.metric_value(attention, "afd_tokens_total", **ON_ATTENTION) >= tokens
    assert (
        probes.metric_value(attention, "afd_exchange_seconds_count", **ON_ATTENTION, layer="1")
        == steps
    )
    for direction in ("sent", "received"):
        assert (
            probes.metric_value(attention, "afd_bytes_total", **ON_ATTENTION, direction=direction)
            > 0
        )
        assert probes.metric_value(ffn, "afd_bytes_total", **ON_FFN, direction=direction) > 0
    assert probes.metric_value(attention, "afd_peer_connected", **ON_ATTENTION) == 1
    assert probes.metric_value(ffn, "afd_peer_connected", **ON_FFN) == 1
