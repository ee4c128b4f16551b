"""A restart of either role with ``peer_restart_timeout_s``, over real gloo connectors: the
Attention side holds a step whose FFN worker was killed, connects to a restarted one and runs the
step again (:func:`afd_models.runner_roles.forward_across_restarts`), or, past the timeout, gives
the step up and serves the next one on the FFN worker started after; the FFN server waits for a
restarted Attention engine instead of failing, and still stops at once while it waits. The peer
of the side under test runs in processes of its own (vLLM's gloo set-up redirects the process's
stdout, which two sides forming at once in one process would tangle). The engines themselves are
restarted in ``tests/e2e_cpu/restarts.py``, on the pairs and topologies the e2e tests start."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from prometheus_client import REGISTRY
from vllm.config import SchedulerConfig, VllmConfig
from vllm.v1.outputs import ModelRunnerOutput

from afd_models.cli.serve import free_port
from afd_models.config import AFDConfigError, parse_afd_config
from afd_models.connectors.base import AFDConnectionError, AFDPeerGoneError, AFDPeerLostError
from afd_models.connectors.gloo import GlooAttentionConnector, GlooFFNConnector
from afd_models.connectors.specs import GlooExtraConfig
from afd_models.ffn_server import FFNServer
from afd_models.runner_roles import (
    FFNRejoin,
    StepRestarts,
    fail_lost_step,
    forward_across_restarts,
)
from afd_models.scheduler import SCHEDULER_CLS
from afd_models.step_failures import failed_requests, failed_step_output
from afd_models.step_vote import StepVote
from afd_models.topology import Group, groups
from tests.logs import AFDLines
from tests.probes import port_is_free

HIDDEN = 16
LAYERS = [1, 2]
EXTRA = GlooExtraConfig(connect_timeout_s=30, timeout_s=10)


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
    group: Group,
    restart_s: float,
    failures: list[BaseException] | None = None,
    *,
    model: DoublingModel | None = None,
    vote: StepVote | None = None,
) -> FFNServer:
    """An FFN worker's server, connected (this waits for the Attention side) and serving."""
    config = _config("ffn", restart_s)
    server = FFNServer(
        model or DoublingModel(),
        config,
        GlooFFNConnector("127.0.0.1", group, EXTRA),
        afd=parse_afd_config(config.additional_config["afd"]),
        hidden_size=HIDDEN,
        dtype=torch.float32,
        device=torch.device("cpu"),
        on_failure=(failures if failures is not None else []).append,
        forward_context=lambda config, tokens: contextlib.nullcontext(),
        reconnect=lambda stop: GlooFFNConnector(
            "127.0.0.1",
            group,
            GlooExtraConfig(connect_timeout_s=restart_s, timeout_s=EXTRA.timeout_s),
            stop=stop,
        ),
        vote=vote,
    )
    server.start()
    return server


class DyingModel(DoublingModel):
    """An FFN worker that crashes (its process ends at once) when asked for its layer number
    ``dies_at`` (counting from 1 over all steps)."""

    def __init__(self, dies_at: int):
        self.dies_at, self.layers = dies_at, 0

    def compute_ffn_output(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: torch.Tensor | None = None
    ) -> torch.Tensor:
        self.layers += 1
        if self.layers == self.dies_at:
            os._exit(1)
        return super().compute_ffn_output(layer_idx, hidden_states, router_logits)


def _ffn_engine(group: Group, steps: multiprocessing.Queue, dies_at: int | None = None) -> None:
    """An FFN engine in a process of its own: it serves until killed (or ``dies_at``, see
    :class:`DyingModel`), reporting the step numbers it served each time it served one more."""
    model = DoublingModel() if dies_at is None else DyingModel(dies_at)
    server, reported = _ffn_server(group, 0, model=model), 0
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
    steps = [SPAWN.Queue() for _ in range(3)]  # what each FFN engine served
    first = SPAWN.Process(target=_ffn_engine, args=(group, steps[0]))
    first.start()
    connector = GlooAttentionConnector("127.0.0.1", group, 0, EXTRA)
    connector.set_layers(LAYERS)
    runner = SimpleNamespace(afd_connector=connector, afd_restarts=StepRestarts(60, None))
    hidden = torch.arange(3 * HIDDEN, dtype=torch.float32).reshape(3, HIDDEN)
    reconnects = _sample("afd_reconnects_total", "attention", "ffn0")
    second, third = (SPAWN.Process(target=_ffn_engine, args=(group, steps[i])) for i in (1, 2))
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
        # with no restart timeout the step fails at once, as it did before restarts existed
        runner.afd_restarts = None
        started = time.monotonic()
        with pytest.raises(AFDPeerGoneError):
            forward_across_restarts(runner, lambda: _forward(connector, hidden))
        assert time.monotonic() - started < 3
        # with one, the step is lost once it passed, and so is the next while no FFN is back
        runner.afd_restarts = StepRestarts(2, None)
        for lost in ("connecting to a restarted FFN engine failed", "no FFN engine connected"):
            started = time.monotonic()
            with pytest.raises(AFDPeerLostError, match=lost):
                forward_across_restarts(runner, lambda: _forward(connector, hidden))
            assert 2 <= time.monotonic() - started < 8
        # an FFN engine started later is connected from the background, before any step
        third.start()
        assert runner.afd_rejoin.wait(60)
        assert _sample("afd_peer_connected", "attention", "ffn0") == 1
        out = forward_across_restarts(runner, lambda: _forward(connector, hidden + 2))
        assert torch.equal(out, _expected(hidden + 2)) and runner.afd_rejoin is None
        assert steps[2].get(timeout=30) == [0]
        assert _sample("afd_reconnects_total", "attention", "ffn0") == reconnects + 2
    finally:
        connector.close()
        for process in (first, second, third):
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
        ("attention", 2, 1, "mp", "300", False, None),  # TP partners vote on a lost step
        ("ffn", 2, 1, "mp", "300", False, None),
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
    """A KV connector would save the step's layers twice, and the multiprocess executor gives up
    on a step after VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS; TP and DP partners are allowed (they vote
    on a lost step, see the partner tests below)."""
    from afd_models.worker_config import check_restart

    monkeypatch.setenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", env_timeout)
    engine = SimpleNamespace(
        parallel_config=SimpleNamespace(
            tensor_parallel_size=tp_size,
            data_parallel_size=dp_size,
            distributed_executor_backend=backend,
        ),
        kv_transfer_config=object() if kv_transfer else None,
        scheduler_config=SchedulerConfig.default_factory(scheduler_cls=SCHEDULER_CLS),
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


@pytest.mark.parametrize(
    ("num_attention_ranks", "num_ffn_ranks", "rank_offset", "dp", "served"),
    [
        (2, 1, 0, 2, None),
        (4, 2, 2, 2, None),
        (2, 2, 0, 2, "[0, 1]"),
        (3, 2, 0, 3, "[0, 1]"),
    ],
)
def test_an_attention_engine_holds_steps_only_if_its_dp_ranks_share_an_ffn_rank(
    num_attention_ranks: int, num_ffn_ranks: int, rank_offset: int, dp: int, served: str | None
) -> None:
    """An engine's ranks decide a lost step together, so its DP ranks must all talk to one FFN
    rank: 2A1F, or 4A2F as two engines of DP 2, hold steps; an engine of 2A2F or 3A2F is refused
    by name."""
    from afd_models.worker_config import check_restart

    engine = SimpleNamespace(
        parallel_config=SimpleNamespace(
            tensor_parallel_size=1, data_parallel_size=dp, distributed_executor_backend="uni"
        ),
        kv_transfer_config=None,
        scheduler_config=SchedulerConfig.default_factory(scheduler_cls=SCHEDULER_CLS),
    )
    afd = parse_afd_config(
        {
            "role": "attention",
            "num_attention_ranks": num_attention_ranks,
            "num_ffn_ranks": num_ffn_ranks,
            "rank_offset": rank_offset,
            "peer_restart_timeout_s": 120,
        }
    )
    if served is None:
        check_restart(engine, afd)
        return
    with pytest.raises(AFDConfigError) as raised:
        check_restart(engine, afd)
    assert str(raised.value).startswith(
        f"additional_config.afd.peer_restart_timeout_s=120 with --data-parallel-size={dp} is not "
        f"allowed here: this engine's DP ranks send their steps to FFN ranks {served}, "
    ), raised.value
    assert "allowed: an Attention engine whose DP ranks share one FFN rank" in str(raised.value)


@pytest.mark.parametrize(
    ("scheduler_cls", "async_scheduling", "message"),
    [
        (SCHEDULER_CLS, False, None),
        ("afd_models._generated.vllm.v1.core.sched.scheduler.AFDScheduler", None, None),
        (
            None,
            None,
            "with --scheduler-cls vllm.v1.core.sched.scheduler.Scheduler (vLLM's default) is not "
            "allowed: once no FFN engine came back within the timeout, the requests of the step "
            "are failed by the AFD scheduler (and the engine stays up); allowed: --scheduler-cls "
            "afd_models.scheduler.AFDScheduler, or peer_restart_timeout_s=0",
        ),
        (
            "vllm.v1.core.sched.scheduler.Scheduler",
            False,
            "with --scheduler-cls vllm.v1.core.sched.scheduler.Scheduler is not allowed",
        ),
        (SCHEDULER_CLS, True, "with --async-scheduling is not allowed"),
    ],
)
def test_an_attention_engine_that_could_not_fail_a_lost_step_is_refused(
    scheduler_cls: str | None, async_scheduling: bool | None, message: str | None
) -> None:
    """Past the timeout, a step's requests are failed by the AFD scheduler, which a synchronous
    engine core hands the failed step: vLLM's own schedulers, or async scheduling, are refused
    on the Attention role (the FFN engine schedules nothing)."""
    from afd_models.worker_config import check_restart

    engine = VllmConfig()
    # set after the config's checks: vLLM's CPU platform turns async scheduling off
    engine.scheduler_config = SchedulerConfig.default_factory(
        scheduler_cls=scheduler_cls, async_scheduling=async_scheduling
    )
    extra = {"connector_extra_config": {"timeout_s": 10}}
    afd = parse_afd_config({"role": "attention", "peer_restart_timeout_s": 120, **extra})
    if message is None:
        check_restart(engine, afd)
        return
    with pytest.raises(AFDConfigError, match=re.escape(message)):
        check_restart(engine, afd)
    check_restart(engine, dataclasses.replace(afd, peer_restart_timeout_s=0.0))  # off: no check
    check_restart(engine, parse_afd_config({"role": "ffn", "peer_restart_timeout_s": 120, **extra}))


def test_looking_for_an_ffn_engine_survives_errors_and_stops() -> None:
    """The background rejoin: a shutdown while no FFN engine hosts the group ends it at once; an
    unexpected error while connecting is logged and tried again; a shutdown during a connect
    leaves the connector to the thread, which closes it once the connect returned or failed."""

    class FFN:
        def __init__(self, hosting: bool, connect_s: float = 0.0, fail_first: bool = False):
            self.hosting, self.connect_s, self.fail_first = hosting, connect_s, fail_first
            self.connects = self.closes = 0

        def ffn_is_hosting(self) -> bool:
            return self.hosting

        def reconnect(self, connect_timeout_s: float) -> None:
            self.connects += 1
            time.sleep(self.connect_s)
            if self.fail_first and self.connects == 1:
                raise RuntimeError("gloo: unexpected")

        def close(self) -> None:
            self.closes += 1

    absent = FFN(hosting=False)
    rejoin = FFNRejoin(absent, 60)
    assert not rejoin.wait(1.5)
    started = time.monotonic()
    assert rejoin.stop() is True
    assert time.monotonic() - started < 1.5 and absent.connects == 0

    flaky = FFN(hosting=True, fail_first=True)
    with AFDLines() as lines:
        assert FFNRejoin(flaky, 60).wait(10)
    assert flaky.connects == 2 and any("trying again" in line for line in lines), lines

    for slow in (FFN(hosting=True, connect_s=3), FFN(True, connect_s=3, fail_first=True)):
        rejoin = FFNRejoin(slow, 60)
        time.sleep(1)  # the connect is under way
        assert rejoin.stop() is False and slow.closes == 0
        deadline = time.monotonic() + 10
        while slow.closes == 0:
            assert time.monotonic() < deadline, "the connector was never closed"
            time.sleep(0.1)
        time.sleep(1)  # a failed connect is not tried again after a stop
        assert not rejoin.wait(0) and slow.closes == 1 and slow.connects == 1


def test_a_step_after_a_lost_one_has_one_budget() -> None:
    """A step that waited for the background rejoin retries only within what is left of its
    peer_restart_timeout_s (the mp executor's bound counts one budget per step)."""

    class Returning:
        def __init__(self) -> None:
            self.timeouts: list[float] = []

        def ffn_is_hosting(self) -> bool:
            return True

        def reconnect(self, connect_timeout_s: float) -> None:
            self.timeouts.append(connect_timeout_s)
            time.sleep(min(connect_timeout_s, 1.0))

        # every forward loses its peer again
        lost_step = "the FFN engine went away again"

        def holding_lost_steps(self) -> contextlib.AbstractContextManager[None]:
            return contextlib.nullcontext()

    connector = Returning()
    runner = SimpleNamespace(
        afd_restarts=StepRestarts(3, None),
        afd_connector=connector,
        afd_rejoin=FFNRejoin(connector, 3),
    )
    started = time.monotonic()
    with pytest.raises(AFDPeerLostError, match="went away again"):
        forward_across_restarts(runner, lambda: None)
    assert time.monotonic() - started < 3 + 1
    assert connector.timeouts[0] == 3 and all(t < 2 for t in connector.timeouts[1:])
    assert len(connector.timeouts) >= 2
    runner.afd_rejoin.stop()


@pytest.mark.every_release
def test_a_lost_step_fails_its_requests() -> None:
    """The output the Attention runner returns for a lost step names the step's requests, samples
    nothing for them, and is the only output whose requests the AFD scheduler fails."""
    scheduled = SimpleNamespace(num_scheduled_tokens={"a": 5, "b": 1})
    with AFDLines() as lines:
        output = fail_lost_step(scheduled, AFDPeerLostError("no FFN engine within 2 s"))
    assert output.req_ids == ["a", "b"] and output.req_id_to_index == {"a": 0, "b": 1}
    assert output.sampled_token_ids == []
    assert failed_requests(output) == ["a", "b"]
    assert failed_requests(ModelRunnerOutput(req_ids=["a"], req_id_to_index={"a": 0})) == []
    assert any("failing the step's 2 requests (the engine stays up" in line for line in lines)


@pytest.mark.every_release
def test_the_afd_scheduler_fails_the_requests_of_a_lost_step_and_goes_on(tiny_v2: Path) -> None:
    """vLLM's scheduler, as the AFD one, given a lost step: its requests finish with an error
    (nothing sampled), leave the runner's batch with the next step, the blocks the step wrote
    leave the prefix cache, and the requests that came after are scheduled as usual."""
    from vllm.config import CacheConfig, ModelConfig
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.engine import FinishReason
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from afd_models.scheduler import AFDScheduler

    config = VllmConfig(
        model_config=ModelConfig(model=str(tiny_v2), max_model_len=64),
        cache_config=CacheConfig(block_size=16),
    )
    config.cache_config.num_gpu_blocks = 16  # what the engine sets once it measured the KV cache
    # vLLM's CPU platform turns prefix caching off for an MLA model; the scheduler keeps it
    config.cache_config.enable_prefix_caching = True
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv_cache = KVCacheConfig(
        num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    scheduler = AFDScheduler(config, kv_cache, StructuredOutputManager(config), block_size=16)
    init_none_hash(sha256)
    block_hasher = get_request_block_hasher(16, sha256)

    def add(request_id: str, prompt: list[int]) -> None:
        request = Request(
            request_id, prompt, SamplingParams(max_tokens=4), None, block_hasher=block_hasher
        )
        scheduler.add_request(request)

    add("lost-0", list(range(1, 41)))  # two full blocks of 16, which upstream caches at once
    add("lost-1", [1, 2, 3])
    lost = scheduler.schedule()
    assert lost.num_scheduled_tokens == {"lost-0": 40, "lost-1": 3}
    add("later", list(range(1, 41)))  # the same prompt: no hit on blocks the lost step wrote
    outputs = scheduler.update_from_output(lost, failed_step_output(lost))
    finished = sorted((o.request_id, o.finish_reason, o.new_token_ids) for o in outputs[0].outputs)
    assert finished == [("lost-0", FinishReason.ERROR, []), ("lost-1", FinishReason.ERROR, [])]
    assert scheduler.get_num_unfinished_requests() == 1
    after = scheduler.schedule()
    assert after.finished_req_ids == {"lost-0", "lost-1"}
    assert after.num_scheduled_tokens == {"later": 40}
    # a step that ran is no failure: its request goes on with the sampled token
    ran = ModelRunnerOutput(
        req_ids=["later"], req_id_to_index={"later": 0}, sampled_token_ids=[[7]]
    )
    outputs = scheduler.update_from_output(after, ran)
    assert [(o.request_id, o.finish_reason, o.new_token_ids) for o in outputs[0].outputs] == [
        ("later", None, [7])
    ]


def test_only_a_peer_that_went_away_is_waited_for() -> None:
    """Any other connection error (a malformed or mismatched exchange) goes up at once, with
    no reconnect, whatever the restart timeout."""

    class Unreachable:
        def reconnect(self, connect_timeout_s: float) -> None:
            raise AssertionError("reconnected after an error of a live peer")

        def holding_lost_steps(self) -> contextlib.AbstractContextManager[None]:
            return contextlib.nullcontext()

    runner = SimpleNamespace(afd_restarts=StepRestarts(60, None), afd_connector=Unreachable())

    def forward() -> None:
        raise AFDConnectionError("layer 3 of micro-batch 0 sent out of order")

    started = time.monotonic()
    with pytest.raises(AFDConnectionError, match="out of order"):
        forward_across_restarts(runner, forward)
    assert time.monotonic() - started < 1


# --- partners: workers that run every step together (TP lanes, or the DP ranks of one engine) ---


def _lanes(tp_size: int = 2) -> list[Group]:
    """The connector groups of a 1A1F deployment's TP lanes, one port each."""
    base = free_port()
    return [groups(1, 1, base, tp_size=tp_size, lane=lane)[0] for lane in range(tp_size)]


def _partners_vote(port: int, rank: int, size: int = 2) -> StepVote:
    """This process as partner ``rank`` of ``size`` (a gloo group, as vLLM's world group of an
    engine), and their vote."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    return StepVote(dist.group.WORLD)


def _mean_over_partners(tensor: torch.Tensor) -> torch.Tensor:
    """What TP partners do at every layer: a collective over all of them (equal inputs give the
    input back; partners at different layers would pair the wrong collectives)."""
    dist.all_reduce(tensor)
    return tensor / dist.get_world_size()


def _attention_partner(
    lane_group: Group, vote_port: int, results: multiprocessing.Queue, steps: int
) -> None:
    """An Attention worker of a TP pair in a process of its own: ``steps`` forwards through
    forward_across_restarts, each layer's FFN output followed by a collective with its partner;
    each result (whether it is the expected one) and at the end its log lines are reported."""
    vote = _partners_vote(vote_port, lane_group.lane)
    connector = GlooAttentionConnector("127.0.0.1", lane_group, 0, EXTRA)
    connector.set_layers(LAYERS)
    runner = SimpleNamespace(afd_connector=connector, afd_restarts=StepRestarts(60, vote))
    hidden = torch.ones(2, HIDDEN)

    def forward() -> torch.Tensor:
        out = hidden
        for layer in LAYERS:
            connector.send(layer, out, None)
            out = _mean_over_partners(connector.recv(layer, out))
        return out

    with AFDLines() as lines:
        for _ in range(steps):
            out = forward_across_restarts(runner, forward)
            results.put((lane_group.lane, torch.equal(out, _expected(hidden))))
    results.put((lane_group.lane, list(lines)))
    connector.close()


def test_tp_partners_run_a_step_lost_on_one_lane_again_together() -> None:
    """One FFN lane's worker crashes in the middle of a step: its Attention partner loses the
    second layer's answer while the other lane got it and finished the forward. The lost lane
    finishes on zeros (every per-layer collective still pairs), both vote, both reconnect to the
    restarted FFN engine and run the step again together, bit for bit."""
    lanes, vote_port = _lanes(), free_port()
    served = [SPAWN.Queue() for _ in range(4)]  # the first engine's lanes, then the second's
    # lane 1 dies at the second step's second layer (layers counted from 1: 1, 2, 3, [4])
    first = [
        SPAWN.Process(target=_ffn_engine, args=(lanes[lane], served[lane], dies_at))
        for lane, dies_at in ((0, None), (1, 4))
    ]
    second = [
        SPAWN.Process(target=_ffn_engine, args=(lanes[lane], served[2 + lane])) for lane in (0, 1)
    ]
    results = SPAWN.Queue()
    partners = [
        SPAWN.Process(target=_attention_partner, args=(lanes[lane], vote_port, results, 3))
        for lane in (0, 1)
    ]
    processes = [*first, *partners, *second]
    try:
        for process in (*first, *partners):
            process.start()
        first[1].join(120)  # crashed mid-step; vLLM ends the engine's other worker with it
        assert first[1].exitcode == 1
        first[0].kill()
        first[0].join(10)
        for process in second:
            process.start()
        reported: dict[int, list[object]] = {0: [], 1: []}
        for _ in range(2 * 4):
            lane, value = results.get(timeout=120)
            reported[lane].append(value)
        for lane in (0, 1):
            *equal, lines = reported[lane]
            assert equal == [True, True, True], (lane, equal)
            assert isinstance(lines, list)
            assert sum("running the step again" in line for line in lines) == 1, (lane, lines)
        # lane 1 lost its answer; lane 0 ran the step again for its partner's loss
        assert "a partner's FFN peer went away" in " ".join(reported[0][-1])  # type: ignore[arg-type]
        assert "a partner's FFN peer went away" not in " ".join(reported[1][-1])  # type: ignore[arg-type]
        # the restarted engine's lanes both served two steps: the step run again, then one more
        for queue in served[2:]:
            steps: list[int] = []
            while len(steps) < 2:
                steps = queue.get(timeout=30)
            assert steps == [0, 1]
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()


class ReducingModel(DoublingModel):
    """An FFN worker of a TP pair: every layer's output goes through a collective with its
    partner, as vLLM's MoE all-reduce does."""

    def compute_ffn_output(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _mean_over_partners(super().compute_ffn_output(layer_idx, hidden_states))


def _ffn_partner(lane_group: Group, vote_port: int, reports: multiprocessing.Queue) -> None:
    """An FFN worker of a TP pair in a process of its own, waiting for restarted Attention peers;
    it reports its steps, reconnects and failures whenever they change."""
    vote = _partners_vote(vote_port, lane_group.lane)
    failures: list[BaseException] = []
    server = _ffn_server(lane_group, 60, failures, model=ReducingModel(), vote=vote)
    last = None
    while True:
        now = (lane_group.lane, server.steps, server.reconnects, [str(f) for f in failures])
        if now != last:
            reports.put(now)
            last = now
        time.sleep(0.05)


def _attention_lane(
    lane_group: Group, results: multiprocessing.Queue, last_step: tuple[str, ...] | None
) -> None:
    """One lane of an Attention engine with no partner logic: a step, its result reported; then,
    given ``last_step`` (the exchanges it gets through of the next step, "send" and "recv" in
    layer order), it dies there without closing anything, as a killed engine's worker does."""
    connector = GlooAttentionConnector("127.0.0.1", lane_group, 0, EXTRA)
    connector.set_layers(LAYERS)
    hidden = torch.ones(2, HIDDEN)
    results.put(torch.equal(_forward(connector, hidden), _expected(hidden)))
    if last_step is None:
        connector.close()
        return
    out = hidden
    for layer, op in zip([layer for layer in LAYERS for _ in (0, 1)], last_step, strict=False):
        if op == "send":
            connector.send(layer, out, None)
        else:
            out = connector.recv(layer, out)
    time.sleep(0.5)  # what was sent leaves before the process ends
    os._exit(0)


def test_ffn_tp_partners_host_again_together_after_one_lane_lost_its_peer() -> None:
    """The Attention engine dies while its lanes are a layer apart: lane 0 sent its second
    layer, lane 1 did not. The FFN worker of lane 0 computes it, and its collective waits for
    its partner; lane 1's worker, whose peer is gone, computes the layer on zeros so that the
    collective pairs, then both vote and host the group again together, and serve a restarted
    Attention engine."""
    lanes, vote_port = _lanes(), free_port()
    reports, results = SPAWN.Queue(), SPAWN.Queue()
    ffn = [SPAWN.Process(target=_ffn_partner, args=(lane, vote_port, reports)) for lane in lanes]
    dying = [
        SPAWN.Process(target=_attention_lane, args=(lanes[0], results, ("send", "recv", "send"))),
        SPAWN.Process(target=_attention_lane, args=(lanes[1], results, ("send", "recv"))),
    ]
    restarted = [
        SPAWN.Process(target=_attention_lane, args=(lane, results, None)) for lane in lanes
    ]
    processes = [*ffn, *dying, *restarted]
    try:
        for process in (*ffn, *dying):
            process.start()
        assert [results.get(timeout=120) for _ in dying] == [True, True]
        for process in dying:
            process.join(30)
        for process in restarted:
            process.start()
        assert [results.get(timeout=120) for _ in restarted] == [True, True]
        latest: dict[int, tuple[int, int, list[str]]] = {}
        deadline = time.monotonic() + 30
        # each lane served the first engine's step, the held one, and the restarted engine's
        while any(latest.get(lane, (0, 0, []))[:2] != (3, 1) for lane in (0, 1)):
            assert time.monotonic() < deadline, latest
            lane, steps, reconnects, failures = reports.get(timeout=30)
            latest[lane] = (steps, reconnects, failures)
        assert all(failures == [] for _, _, failures in latest.values()), latest
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
