"""A restart of either role with ``peer_restart_timeout_s``, over real gloo connectors: the
Attention side holds a step whose FFN worker was killed, connects to a restarted one and runs the
step again (:func:`afd_models.runner_roles.forward_across_restarts`); the FFN server waits for a
restarted Attention engine instead of failing, and still stops at once while it waits. The peer
of the side under test runs in processes of its own (vLLM's gloo set-up redirects the process's
stdout, which two sides forming at once in one process would tangle). The engines themselves are
restarted in ``tests/e2e_cpu/test_peer_restart.py``."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import re
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
from prometheus_client import REGISTRY
from vllm.config import VllmConfig

from afd_models.config import AFDConfigError, P2PExtraConfig, parse_afd_config
from afd_models.connectors.base import AFDConnectionError
from afd_models.connectors.gloo import GlooAttentionConnector, GlooFFNConnector
from afd_models.ffn_server import FFNServer
from afd_models.runner_roles import forward_across_restarts
from afd_models.testing.serve import free_port, port_is_free
from afd_models.topology import Group, groups
from tests.logs import AFDLines

HIDDEN = 16
LAYERS = [1, 2]
EXTRA = P2PExtraConfig(connect_timeout_s=30, timeout_s=10)


class DoublingModel:
    def ffn_layer_indices(self) -> list[int]:
        return LAYERS

    def compute_ffn_output(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: torch.Tensor | None = None
    ) -> torch.Tensor:
        return hidden_states * 2 + layer_idx


def _config(role: str, restart_s: float) -> VllmConfig:
    return VllmConfig(
        additional_config={"afd": {"role": role, "peer_restart_timeout_s": restart_s}}
    )


def _forward(connector: GlooAttentionConnector, hidden: torch.Tensor) -> torch.Tensor:
    """What the Attention model's remote layers do in one forward."""
    for layer in LAYERS:
        connector.send(layer, hidden, None)
        hidden = connector.recv(layer, hidden)
    return hidden


def _expected(hidden: torch.Tensor) -> torch.Tensor:
    for layer in LAYERS:
        hidden = hidden * 2 + layer
    return hidden


def _sample(name: str, role: str, peer: str) -> float:
    labels = {"role": role, "rank": "0", "lane": "0", "peer": peer}
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _ffn_server(
    group: Group, restart_s: float, failures: list[BaseException] | None = None
) -> FFNServer:
    """An FFN worker's server, connected (this waits for the Attention side) and serving."""
    server = FFNServer(
        DoublingModel(),
        _config("ffn", restart_s),
        GlooFFNConnector("127.0.0.1", group, EXTRA),
        hidden_size=HIDDEN,
        dtype=torch.float32,
        device=torch.device("cpu"),
        on_failure=(failures if failures is not None else []).append,
        forward_context=lambda config, tokens: contextlib.nullcontext(),
        reconnect=lambda stop: GlooFFNConnector(
            "127.0.0.1",
            group,
            P2PExtraConfig(connect_timeout_s=restart_s, timeout_s=EXTRA.timeout_s),
            stop=stop,
        ),
    )
    server.start()
    return server


def _ffn_engine(group: Group, steps: multiprocessing.Queue) -> None:
    """An FFN engine in a process of its own: it serves until killed, reporting the step numbers
    it served each time it served one more."""
    server, reported = _ffn_server(group, 0), 0
    while True:
        time.sleep(0.05)
        if server.steps > reported:
            reported = server.steps
            steps.put([step["step"] for step in server.recent_steps()])


def _attention_engine(
    group: Group, scale: float, results: multiprocessing.Queue, mid_step: bool
) -> None:
    """An Attention engine in a process of its own: one step, its result reported, then it dies
    without closing anything (as a killed engine does), between two steps or (``mid_step``)
    after sending the first layer of the next one."""
    connector = GlooAttentionConnector("127.0.0.1", group, 0, EXTRA)
    connector.set_layers(LAYERS)
    hidden = torch.ones(4, HIDDEN) * scale
    results.put(torch.equal(_forward(connector, hidden), _expected(hidden)))
    if mid_step:
        connector.send(LAYERS[0], hidden, None)
    time.sleep(0.5)
    os._exit(0)


SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def group() -> Iterator[Group]:
    group = groups(1, 1, free_port())[0]
    yield group
    deadline = time.monotonic() + 10
    while not port_is_free(group.port):  # every store and listener of the test released it
        assert time.monotonic() < deadline, f"port {group.port} still taken"
        time.sleep(0.1)


def test_the_attention_side_runs_a_step_again_on_a_restarted_ffn(group: Group) -> None:
    steps = [SPAWN.Queue(), SPAWN.Queue()]  # what each FFN engine served
    first = SPAWN.Process(target=_ffn_engine, args=(group, steps[0]))
    first.start()
    connector = GlooAttentionConnector("127.0.0.1", group, 0, EXTRA)
    connector.set_layers(LAYERS)
    runner = SimpleNamespace(vllm_config=_config("attention", 60), afd_connector=connector)
    hidden = torch.arange(3 * HIDDEN, dtype=torch.float32).reshape(3, HIDDEN)
    reconnects = _sample("afd_reconnects_total", "attention", "ffn0")
    second = SPAWN.Process(target=_ffn_engine, args=(group, steps[1]))
    try:
        assert torch.equal(_forward(connector, hidden), _expected(hidden))
        assert steps[0].get(timeout=30) == [0]
        first.kill()  # the FFN engine dies; a restarted one comes up later
        first.join(10)
        second.start()
        with AFDLines() as lines:
            out = forward_across_restarts(runner, lambda: _forward(connector, hidden))
        assert torch.equal(out, _expected(hidden))
        assert any("holding the step and waiting up to 60 s" in line for line in lines), lines
        assert any("running the step again" in line for line in lines), lines
        assert _sample("afd_reconnects_total", "attention", "ffn0") == reconnects + 1
        assert _sample("afd_peer_connected", "attention", "ffn0") == 1
        # the restarted engine served the step run again as its first, then the next one
        assert steps[1].get(timeout=30) == [0]
        assert torch.equal(_forward(connector, hidden + 1), _expected(hidden + 1))
        assert steps[1].get(timeout=30) == [0, 1]
        second.kill()
        second.join(10)
        # with no restart timeout the step fails at once; with one, once it has passed
        for restart_s, within_s in ((0, 3.0), (2, 8.0)):
            runner.vllm_config = _config("attention", restart_s)
            started = time.monotonic()
            with pytest.raises(AFDConnectionError):
                forward_across_restarts(runner, lambda: _forward(connector, hidden))
            assert time.monotonic() - started < within_s, restart_s
            assert time.monotonic() - started >= restart_s, restart_s
    finally:
        connector.close()
        for process in (first, second):
            if process.is_alive():
                process.kill()


def test_the_ffn_server_waits_for_a_restarted_attention_engine(group: Group) -> None:
    results = SPAWN.Queue()
    reconnects = _sample("afd_reconnects_total", "ffn", "attention0")
    # the first engine dies in the middle of a step, the restarted one between two
    engines = [
        SPAWN.Process(target=_attention_engine, args=(group, scale, results, mid_step))
        for scale, mid_step in ((1, True), (3, False))
    ]
    failures: list[BaseException] = []
    with AFDLines() as lines:
        engines[0].start()
        server = _ffn_server(group, 60, failures)
        try:
            assert results.get(timeout=30) is True
            engines[0].join(30)  # it died; a restarted one connects
            engines[1].start()
            assert results.get(timeout=60) is True
            engines[1].join(30)
            deadline = time.monotonic() + 30
            while sum("peer_restart_timeout_s" in line for line in lines) < 2:
                # the second engine died too: the server waits again
                assert time.monotonic() < deadline and not failures, failures
                time.sleep(0.05)
            assert failures == [] and server.error is None
            assert server.steps == 2 and server.reconnects == 1
            assert any("connected again after" in line for line in lines), lines
            assert _sample("afd_reconnects_total", "ffn", "attention0") == reconnects + 1
            # a stop while it waits for peers ends the wait at once, and is no failure
            stopped = time.monotonic()
            server.stop()
            assert time.monotonic() - stopped < 3
            assert failures == [] and server.error is None
        finally:
            server.stop()
            server.connector.close()
            for engine in engines:
                if engine.is_alive():
                    engine.kill()


@pytest.mark.parametrize(
    ("role", "tp_size", "dp_size", "backend", "env_timeout", "kv_transfer", "message"),
    [
        ("attention", 1, 1, "uni", "300", False, None),
        ("attention", 1, 1, "mp", "300", False, None),  # 120 + 3 * 10 s < 300 s
        ("attention", 2, 1, "mp", "300", False, "with --tensor-parallel-size=2 is not allowed"),
        ("ffn", 1, 2, "mp", "300", False, "with --data-parallel-size=2 is not allowed"),
        ("attention", 1, 1, "uni", "300", True, "with --kv-transfer-config is not allowed"),
        (
            "attention",
            1,
            1,
            "mp",
            "150",
            False,
            "with connector_extra_config.timeout_s=10 is not allowed with "
            "--distributed-executor-backend mp: a held step may take peer_restart_timeout_s + "
            "3 * timeout_s = 150 s, and the executor gives a step "
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=150 s",
        ),
        ("attention", 1, 1, "uni", "100", False, None),  # no executor timeout in one process
        ("ffn", 1, 1, "mp", "100", False, None),  # the FFN server waits outside any step
    ],
)
def test_a_peer_restart_timeout_is_refused_where_a_step_cannot_run_again(
    role: str,
    tp_size: int,
    dp_size: int,
    backend: str,
    env_timeout: str,
    kv_transfer: bool,
    message: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TP or DP partners would re-enter their collectives at other layers, a KV connector would
    save the step's layers twice, and the multiprocess executor gives up on a step after
    VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS."""
    from afd_models.connectors.factory import check_restart

    monkeypatch.setenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", env_timeout)
    engine = SimpleNamespace(
        parallel_config=SimpleNamespace(
            tensor_parallel_size=tp_size,
            data_parallel_size=dp_size,
            distributed_executor_backend=backend,
        ),
        kv_transfer_config=object() if kv_transfer else None,
    )
    afd = parse_afd_config(
        {"role": role, "peer_restart_timeout_s": 120, "connector_extra_config": {"timeout_s": 10}}
    )
    check_restart(engine, dataclasses.replace(afd, peer_restart_timeout_s=0.0))  # off: no check
    if message is None:
        check_restart(engine, afd)
        return
    with pytest.raises(AFDConfigError, match=re.escape(message)) as raised:
        check_restart(engine, afd)
    assert str(raised.value).startswith("additional_config.afd.peer_restart_timeout_s=120 ")


def test_only_a_peer_that_went_away_is_waited_for() -> None:
    """Any other connection error (a malformed or mismatched exchange) goes up at once, with
    no reconnect, whatever the restart timeout."""

    class Unreachable:
        def reconnect(self, connect_timeout_s: float) -> None:
            raise AssertionError("reconnected after an error of a live peer")

    runner = SimpleNamespace(vllm_config=_config("attention", 60), afd_connector=Unreachable())

    def forward() -> None:
        raise AFDConnectionError("layer 3 of micro-batch 0 sent out of order")

    started = time.monotonic()
    with pytest.raises(AFDConnectionError, match="out of order"):
        forward_across_restarts(runner, forward)
    assert time.monotonic() - started < 1
