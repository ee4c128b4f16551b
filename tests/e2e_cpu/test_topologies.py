"""Topologies beyond 1A1F end to end: 2A2F, 3A2F and 1A1F with TP 2, as separate ``vllm serve``
processes, on the primary release.

Each topology is started as an operator starts one (docs/deployment.md): the test writes its
deployment spec and runs ``python -m afd_models.deploy up`` on it, 2A2F in the foreground (then
SIGINT, as Ctrl-C) and the others with ``--detach`` (then ``deploy down``); every engine's process
group is gone after.

Attention ranks come from vLLM data parallel inside one Attention engine (``--data-parallel-size``)
and from several Attention engines, each naming its first rank with ``rank_offset``; every FFN
rank is its own engine (the FFN role refuses vLLM DP). 1A1F-TP2 runs both roles with
``--tensor-parallel-size 2``: TP rank t of Attention exchanges with TP rank t of the FFN. For each
topology:

* greedy tokens of every Attention engine equal a plain vLLM baseline, token for token;
* FFN TP partners recorded the same steps (peers, counts, rows), each from its own lane;
* every step each FFN rank served came from exactly the Attention ranks the ``a * F // A`` rule
  gives it (written out below, not computed with the code under test), and it computed on the
  sum of their tokens: the rows its layers received equal the sum of the counts its peers
  announced, including steps where peers carried different counts; the steps of more than one
  token are exactly the prompts' prefills;
* the memory of every engine is measured (peak RSS and PSS); the deployment's peak RSS, summed
  over its processes (an upper bound: they share library pages), fits this machine.

The topologies whose Attention engines may restart (``peer_restart_timeout_s``: each engine's
DP ranks share one FFN rank) then restart on the deployment already started
(tests/e2e_cpu/restarts.py): 3A2F's first FFN rank, which serves an Attention engine of DP 2 (one
rank busy with the load, the other stepping dummy batches: 2A1F), and 1A1F-TP2 (each TP lane its
own connection). The FFN engine dies under load and a new one takes its place with no request
lost, every worker running the held step again; then the Attention engine dies under load and
every FFN lane waits for, and serves, a new one; each side counts its reconnect per lane.

Like the pair tests, sequences are decoded one per rank (``--max-num-seqs 1``) on both sides, so
each is computed in the same batch shape as on the baseline; the tiny model's large logit margins
keep greedy tokens stable when an FFN rank computes two peers' rows in one batch. Engines run
eagerly: compiled mode is covered by test_serve_pair.py, and these tests are about ranks. The
baseline runs eagerly too: the compiled baseline of the pair tests cannot stand in for it (tried
2026-12-03, to save an engine start per release: 2A2F's and 3A2F's eager tokens differed from
it after a few tokens). The pair tests and `verify` run on every release; these on the primary
only (the CI budget, docs/testing.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from afd_models import supervisor
from afd_models.cli import serve
from afd_models.deploy.commands import Command, deployment_commands
from afd_models.deploy.run import recorded_servers, start_engine
from afd_models.deploy.spec import load_spec
from tests import probes
from tests.e2e_cpu import restarts

PROMPTS = [
    "Hello world, the license",
    "The quick brown fox jumps over the lazy dog again",
    "Numbers like 0 1 2",
    "Attention and experts, served apart",
]
MAX_TOKENS = 16
START_TIMEOUT_S = 600
#: ``deploy up --timeout-s``: its engines' start, within the test's wait for it
UP_TIMEOUT_S = str(START_TIMEOUT_S - 120)
#: one sequence per engine step and rank, a small KV cache per Attention worker
ENGINE_ARGS = ("--max-num-seqs", "1")
KV_CACHE_ARGS = ("--kv-cache-memory-bytes", "128M")
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}  # /collective_rpc, to read the FFN workers' steps
#: this machine's memory, which the whole deployment must fit
MACHINE_BYTES = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class Topology:
    name: str
    #: DP size of each Attention engine; engine i's rank_offset is the ranks before it
    attention_engines: tuple[int, ...]
    #: Attention ranks each FFN rank serves, by the a * F // A rule, written out
    peers: tuple[tuple[int, ...], ...]
    #: --tensor-parallel-size of every engine (TP rank t of one role exchanges with TP rank t
    #: of the other)
    tp: int = 1
    #: ``ffn_hosts``: FFN rank k's rendezvous address, as on separate nodes (empty: ``host``)
    ffn_hosts: tuple[str, ...] = ()
    #: ``deploy up`` in the foreground, stopped by SIGINT (else ``--detach`` and ``down``)
    foreground: bool = False
    #: with ``peer_restart_timeout_s``: FFN rank 0 and the first Attention engine restart
    restart: bool = False

    @property
    def num_attention_ranks(self) -> int:
        return sum(self.attention_engines)

    @property
    def num_ffn_ranks(self) -> int:
        return len(self.peers)


TOPOLOGIES = [
    # one engine's DP ranks served by two FFN engines (which cannot restart: the engine's ranks
    # decide a lost step together, afd_models/step_vote.py)
    Topology("2A2F", attention_engines=(2,), peers=((0,), (1,)), foreground=True),
    # each FFN rank on its own loopback address, as FFN ranks on two nodes; FFN rank 0 serves
    # the first engine's two DP ranks (2A1F)
    Topology(
        "3A2F",
        attention_engines=(2, 1),
        peers=((0, 1), (2,)),
        ffn_hosts=("127.0.0.2", "127.0.0.3"),
        restart=True,
    ),
    Topology("1A1F-TP2", attention_engines=(1,), peers=((0,),), tp=2, restart=True),
]


def _complete_all(server: serve.Server) -> list[list[int]]:
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(lambda p: serve.complete(server, p, MAX_TOKENS), PROMPTS))


@dataclass(frozen=True)
class Baseline:
    #: greedy tokens of each prompt
    tokens: list[list[int]]
    #: token count of each prompt
    prompt_lengths: list[int]


def _tp_args(tp: int) -> tuple[str, ...]:
    return ("--tensor-parallel-size", str(tp)) if tp > 1 else ()


@pytest.fixture(scope="module")
def baselines() -> dict[int, Baseline]:
    """Plain vLLM baselines by TP size, made on first use (:func:`_start_baseline`)."""
    return {}


def _start_baseline(tp: int, model: Path, logs: Path) -> serve.Server:
    """Plain vLLM, eager, one sequence per step, of TP size ``tp`` (a TP 2 engine sums its
    all-reduced partial results in another order than a TP 1 engine, so each topology is
    compared with a baseline of its own TP size); started, read by :func:`_baseline_of` once
    the deployment started beside it."""
    return serve.start(
        f"baseline-eager-tp{tp}",
        model,
        serve.free_port(),
        logs,
        cpu="|".join(serve.cpu(t) for t in range(tp)),
        extra=(*ENGINE_ARGS, *_tp_args(tp)),
        eager=True,
    )


def _baseline_of(server: serve.Server) -> Baseline:
    """The started baseline's greedy tokens and prompt lengths; the server is stopped after."""
    try:
        serve.wait_ready([server], START_TIMEOUT_S)
        tokens = _complete_all(server)
        lengths = [
            serve.post(server, "/tokenize", {"model": "tiny", "prompt": p})[1]["count"]
            for p in PROMPTS
        ]
    finally:
        serve.stop(server)
    assert all(len(t) == MAX_TOKENS for t in tokens)
    # distinct lengths above one, so each prompt's prefill step is told apart
    assert len(set(lengths)) == len(PROMPTS) and min(lengths) > 1, lengths
    return Baseline(tokens, lengths)


def _engine_ranks(
    topology: Topology, attentions: list[serve.Server]
) -> list[tuple[serve.Server, range]]:
    """Each Attention engine with its Attention ranks (engine i's start after those before it)."""
    ranks, offset = [], 0
    for attention, dp in zip(attentions, topology.attention_engines, strict=True):
        ranks.append((attention, range(offset, offset + dp)))
        offset += dp
    return ranks


def _log(server: serve.Server) -> str:
    return server.log.read_text(errors="replace")


def _cpus(first: int, workers: int) -> str:
    """One CPU per worker of an engine (DP x TP of them): vLLM splits the binding at "|"."""
    return "|".join(serve.cpu(first + w) for w in range(workers))


@dataclass
class Launched:
    """A topology started by ``python -m afd_models.deploy up`` from its spec: the command's
    process group, and a handle on each engine it started (from the state file it records)."""

    spec: Path
    log_dir: Path
    #: ``up`` itself when it runs in the foreground, None after ``up --detach``
    up: supervisor.Group | None
    ffns: list[serve.Server]
    attentions: list[serve.Server]
    #: every engine's command, as ``up`` ran it
    commands: list[Command]
    #: engines the test started again in place of killed ones (``down`` knows only the first)
    restarted: list[serve.Server] = field(default_factory=list)

    def relaunch(self, engine: str) -> Callable[[], serve.Server]:
        """What starts ``engine`` again, as ``up`` started it, its log beside the first one's."""
        command = next(c for c in self.commands if c.engine.name == engine)

        def start() -> serve.Server:
            server = start_engine(command, self.log_dir, f"{engine}-restarted")
            self.restarted.append(server)
            return server

        return start


def _consecutive_free_ports(count: int) -> int:
    """The first of ``count`` free ports in a row (engine i of a role serves on its table's
    ``api_port`` + i)."""
    for _ in range(100):
        first = serve.free_port()
        if first + count < 65536 and all(probes.port_is_free(first + i) for i in range(count)):
            return first
    raise AssertionError(f"no {count} consecutive free ports")


def _spec(topology: Topology, model: Path) -> str:
    """``topology`` as a deployment spec: eager engines, one sequence per step, one CPU per
    worker, the FFN engines' workers readable through /collective_rpc (dev mode)."""
    engine_args = [*serve.COMMON_ARGS, *ENGINE_ARGS, "--enforce-eager"]
    ffn_cpus = [_cpus(k * topology.tp, topology.tp) for k in range(topology.num_ffn_ranks)]
    attention_cpus, offset = [], 0
    for dp in topology.attention_engines:
        attention_cpus.append(_cpus(offset * topology.tp, dp * topology.tp))
        offset += dp
    afd: dict[str, Any] = {
        "port": serve.free_port(),
        "connector_extra_config": {"timeout_s": 30, "connect_timeout_s": 300},
    }
    attention_args = [*engine_args, *KV_CACHE_ARGS]
    if topology.restart:
        afd.update(restarts.RESTART_SECTION)
        attention_args += restarts.ATTENTION_ARGS
    if topology.ffn_hosts:
        afd["ffn_hosts"] = list(topology.ffn_hosts)
    return "\n".join(
        [
            f"model = {json.dumps(str(model))}",
            'dtype = "float32"',
            f"tensor_parallel_size = {topology.tp}",
            "[afd]",
            *(f"{key} = {_toml(value)}" for key, value in afd.items()),
            "[attention]",
            f"engines = {list(topology.attention_engines)}",
            f"api_port = {_consecutive_free_ports(len(topology.attention_engines))}",
            f"cpus = {json.dumps(attention_cpus)}",
            f"args = {json.dumps(attention_args)}",
            f"env = {_toml(serve.SERVER_ENV)}",
            "[ffn]",
            f"ranks = {topology.num_ffn_ranks}",
            f"api_port = {_consecutive_free_ports(topology.num_ffn_ranks)}",
            f"cpus = {json.dumps(ffn_cpus)}",
            f"args = {json.dumps(engine_args)}",
            f"env = {_toml({**serve.SERVER_ENV, **DEV_MODE})}",
            "",
        ]
    )


def _toml(value: Any) -> str:
    """``value`` (numbers, strings, lists and tables of them) as a TOML value."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def _deploy(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "afd_models.deploy", *map(str, args)]


def _launch(topology: Topology, model: Path, logs: Path) -> Launched:
    """Write ``topology``'s spec and start it as an operator would: ``deploy up`` in the
    foreground (stopped by SIGINT, as Ctrl-C) or ``deploy up --detach`` (stopped by ``deploy
    down``)."""
    spec = logs / f"{topology.name}.toml"
    spec.write_text(_spec(topology, model))
    log_dir = logs / topology.name
    output = logs / f"{topology.name}-deploy.log"
    up_args = ("up", spec, "--log-dir", log_dir, "--timeout-s", UP_TIMEOUT_S)
    up: supervisor.Group | None = None
    if topology.foreground:
        up = supervisor.launch(f"deploy up {topology.name}", _deploy(*up_args), output)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while "serving; Ctrl-C stops every engine" not in up.log_tail(400):
                assert up.alive(), up.log_tail(400)
                assert time.monotonic() < deadline, up.log_tail(400)
                time.sleep(1)
        except BaseException:
            supervisor.stop(up, 120, signal.SIGINT)  # it stops the engines it started
            raise
    else:
        # up's own deadline first: it then stops what it started before this one kills it
        done = subprocess.run(
            _deploy(*up_args, "--detach"), capture_output=True, text=True, timeout=START_TIMEOUT_S
        )
        output.write_text(done.stdout + done.stderr)
        assert done.returncode == 0, output.read_text()
    servers = recorded_servers(log_dir)
    return Launched(
        spec,
        log_dir,
        up,
        [servers[f"ffn{k}"] for k in range(topology.num_ffn_ranks)],
        [servers[f"attention{i}"] for i in range(len(topology.attention_engines))],
        deployment_commands(load_spec(spec), serve.vllm_command()),
    )


def _stop(launched: Launched) -> None:
    """Stop the deployment the way it was started, the engines started again first; every
    engine's process group is gone after."""
    for server in launched.restarted:
        serve.stop(server)
    if launched.up is not None:
        assert supervisor.stop(launched.up, 120, signal.SIGINT) == 0, launched.up.log_tail()
    else:
        done = subprocess.run(
            _deploy("down", launched.spec, "--log-dir", launched.log_dir),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def memory(logs: Path) -> Iterator[dict[str, tuple[int, int]]]:
    """Per engine: peak RSS (the sum of its processes' peaks) and PSS after serving, in bytes;
    written to ``logs/engine_memory.json`` and printed (docs/testing.md quotes a run)."""
    measured: dict[str, tuple[int, int]] = {}
    yield measured
    (logs / "engine_memory.json").write_text(json.dumps(measured, indent=1))
    print("\nengine memory, MiB (peak RSS, PSS):")
    for engine, (rss, pss) in measured.items():
        print(f"  {engine}: {rss // 2**20}, {pss // 2**20}")


@dataclass(frozen=True)
class Deployed:
    """A topology started, and the baseline its tokens are compared with."""

    topology: Topology
    launched: Launched
    baseline: Baseline


@pytest.fixture(scope="module", params=TOPOLOGIES, ids=lambda t: t.name)
def deployed(
    request: pytest.FixtureRequest, model: Path, logs: Path, baselines: dict[int, Baseline]
) -> Iterator[Deployed]:
    """Each topology in turn, started as an operator starts it and stopped as it was started,
    after every test of it; no engine is left."""
    topology: Topology = request.param
    # the baseline starts beside the deployment, the first time its TP size is needed
    starting = None if topology.tp in baselines else _start_baseline(topology.tp, model, logs)
    try:
        launched = _launch(topology, model, logs)
    except BaseException:
        if starting is not None:
            serve.stop(starting)
        raise
    try:
        if starting is not None:
            baselines[topology.tp] = _baseline_of(starting)
        yield Deployed(topology, launched, baselines[topology.tp])
    finally:
        _stop(launched)
    engines = [*launched.ffns, *launched.attentions, *launched.restarted]
    assert not any(serve.group_alive(s) for s in engines)


def test_topology_serves_baseline_tokens_with_aggregated_ffn_steps(
    deployed: Deployed, memory: dict[str, tuple[int, int]]
) -> None:
    topology, launched, baseline = deployed.topology, deployed.launched, deployed.baseline
    ffns, attentions = launched.ffns, launched.attentions
    servers = ffns + attentions
    # steps before the requests: vLLM's profiling forward of each Attention rank
    served_from = [len(probes.ffn_steps(ffn)[0]) for ffn in ffns]
    with ThreadPoolExecutor(len(attentions)) as pool:
        outputs = list(pool.map(_complete_all, attentions))
    for attention, tokens in zip(attentions, outputs, strict=True):
        assert tokens == baseline.tokens, attention.name

    for ffn, peers in zip(ffns, topology.peers, strict=True):
        # each TP lane's worker counts its own steps from each peer in /metrics (a series
        # shared by the lanes would count them TP times): between the steps recorded
        # before and after reading them, plus the one a lane may be serving (a DP dummy
        # step may still be arriving; a step is counted when its header arrives and
        # recorded once it is served)
        before = [len(lane) for lane in probes.ffn_steps(ffn)]
        counted = {
            (lane, rank): probes.metric_value(
                ffn, "afd_steps_total", role="ffn", lane=str(lane), peer=f"attention{rank}"
            )
            for lane in range(topology.tp)
            for rank in peers
        }
        after = [len(lane) for lane in probes.ffn_steps(ffn)]
        for (lane, rank), steps in counted.items():
            assert before[lane] <= steps <= after[lane] + 1, (ffn.name, lane, rank, steps)

    counts_of_rank: dict[int, list[int]] = {}  # Attention rank -> its count in every step
    uneven = 0
    for ffn, peers, first in zip(ffns, topology.peers, served_from, strict=True):
        lanes = probes.ffn_steps(ffn)
        # FFN TP partners computed on identical tokens, each received on its own lane (a
        # DP dummy step may still be running on one: compare the steps all have finished)
        assert len(lanes) == topology.tp, ffn.name
        done = min(len(lane) for lane in lanes)
        same = [[_untimed(step) for step in lane[:done]] for lane in lanes]
        assert all(lane == same[0] for lane in same), ffn.name
        steps = [step for step in lanes[0] if step["step"] >= first]
        assert len(steps) >= MAX_TOKENS, (ffn.name, len(steps))
        for step in steps:
            assert sorted(step["peers"]) == list(peers), (ffn.name, step)
            total = sum(step["peers"].values())
            assert step["tokens"] == total, (ffn.name, step)
            assert step["rows"] and set(step["rows"]) == {total}, (ffn.name, step)
            # an eager step times each layer: receiving, computing, sending
            seconds = step["layer_seconds"]
            assert len(seconds) == len(step["rows"]), (ffn.name, step)
            assert all(len(s) == 3 and min(s) >= 0 for s in seconds), (ffn.name, step)
            uneven += len(set(step["peers"].values())) > 1
            for rank, count in step["peers"].items():
                counts_of_rank.setdefault(rank, []).append(count)
    if any(len(p) > 1 for p in topology.peers):
        assert uneven, "no step where an FFN rank's peers carried different token counts"
    for k, host in enumerate(topology.ffn_hosts):
        # FFN rank k hosted its group on its own address, and exactly the engines of its
        # peers joined it there
        assert f"hosting group {k} at {host}:" in ffns[k].log.read_text(errors="replace")
        joined = [a for a in attentions if f"joining group {k} at {host}:" in _log(a)]
        assert joined == [
            a
            for a, ranks in _engine_ranks(topology, attentions)
            if set(ranks) & set(topology.peers[k])
        ], [a.name for a in joined]
    # one sequence per step and rank: a step of more than one token is a prefill, and each
    # engine's prompts were prefilled by its ranks, so their step counts above one are
    # exactly the prompt lengths
    for attention, ranks in _engine_ranks(topology, attentions):
        prefills = [c for r in ranks for c in counts_of_rank[r] if c > 1]
        assert sorted(prefills) == sorted(baseline.prompt_lengths), attention.name

    deployment = 0
    for server in servers:
        rss = probes.peak_rss_bytes(server)
        memory[f"{topology.name}/{server.name}"] = (
            rss,
            probes.pss_bytes(server),
        )
        deployment += rss
    assert 0 < deployment < MACHINE_BYTES, deployment


def test_either_role_restarts_under_load_without_losing_a_request(deployed: Deployed) -> None:
    """FFN rank 0 killed under the first Attention engine's load and started again, then that
    Attention engine killed under load and started again (tests/e2e_cpu/restarts.py)."""
    topology, launched, baseline = deployed.topology, deployed.launched, deployed.baseline
    if not topology.restart:
        pytest.skip(
            f"{topology.name} cannot restart: an Attention engine's DP ranks send their steps to "
            "different FFN ranks and decide a lost step together (its workers refuse "
            "peer_restart_timeout_s: tests/cpu/test_peer_restart.py)"
        )
    dp, tp = topology.attention_engines[0], topology.tp
    expected = dict(zip(PROMPTS, baseline.tokens, strict=True))
    attention, ffn = launched.attentions[0], launched.ffns[0]
    ffn = restarts.restart_ffn_under_load(
        attention,
        ffn,
        launched.relaunch("ffn0"),
        expected,
        max_tokens=MAX_TOKENS,
        lanes=[
            {"role": "attention", "rank": str(rank), "lane": str(lane), "peer": "ffn0"}
            for rank in range(dp)
            for lane in range(tp)
        ],
    )
    restarts.restart_attention_under_load(
        ffn,
        attention,
        launched.relaunch("attention0"),
        expected,
        max_tokens=MAX_TOKENS,
        ffn_lanes=[
            {"role": "ffn", "rank": "0", "lane": str(lane), "peer": f"attention{rank}"}
            for lane in range(tp)
            for rank in range(dp)
        ],
        tp=tp,
    )


def _untimed(step: dict[str, Any]) -> dict[str, Any]:
    """An FFN step's record without its timings (which differ between TP partners)."""
    return {key: value for key, value in step.items() if key != "layer_seconds"}
