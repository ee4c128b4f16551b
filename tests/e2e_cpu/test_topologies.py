"""Topologies beyond 1A1F end to end: 2A2F, 3A2F and 1A1F with TP 2, as separate ``vllm serve``
processes, on the primary release. (2A1F is 3A2F's first FFN rank with its two peers: it adds no
case of its own.)

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

Like the pair tests, sequences are decoded one per rank (``--max-num-seqs 1``) on both sides, so
each is computed in the same batch shape as on the baseline; the tiny model's large logit margins
keep greedy tokens stable when an FFN rank computes two peers' rows in one batch. Engines run
eagerly: compiled mode is covered by test_serve_pair.py, and these tests are about ranks. The
baseline runs eagerly too: the compiled baseline of the pair tests cannot stand in for it (tried
2026-12-03, to save an engine start per release: 2A2F's and 3A2F's eager tokens differed from
it after a few tokens). The pair tests and `verify` run on every release; these, about two
minutes each, on the primary only (the CI budget, docs/environment.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from afd_models.cli import serve
from tests import probes

PROMPTS = [
    "Hello world, the license",
    "The quick brown fox jumps over the lazy dog again",
    "Numbers like 0 1 2",
    "Attention and experts, served apart",
]
MAX_TOKENS = 16
START_TIMEOUT_S = 600
#: one sequence per engine step and rank, a small KV cache per Attention worker
ENGINE_ARGS = ("--max-num-seqs", "1")
ATTENTION_ARGS = (*ENGINE_ARGS, "--kv-cache-memory-bytes", "128M")
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}  # /collective_rpc, to read the FFN workers' steps
#: this machine's memory; the whole deployment (and the baseline, stopped before) must fit
MACHINE_BYTES = 24 * 2**30


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

    @property
    def num_attention_ranks(self) -> int:
        return sum(self.attention_engines)

    @property
    def num_ffn_ranks(self) -> int:
        return len(self.peers)


TOPOLOGIES = [
    # one engine's DP ranks served by two FFN engines
    Topology("2A2F", attention_engines=(2,), peers=((0,), (1,))),
    # each FFN rank on its own loopback address, as FFN ranks on two nodes
    Topology(
        "3A2F",
        attention_engines=(2, 1),
        peers=((0, 1), (2,)),
        ffn_hosts=("127.0.0.2", "127.0.0.3"),
    ),
    Topology("1A1F-TP2", attention_engines=(1,), peers=((0,),), tp=2),
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
    """Plain vLLM baselines by TP size, made on first use (:func:`_baseline_for`)."""
    return {}


def _baseline_for(tp: int, baselines: dict[int, Baseline], model: Path, logs: Path) -> Baseline:
    """A TP 2 engine sums its all-reduced partial results in another order than a TP 1 engine,
    so each topology is compared with a baseline of its own TP size."""
    if tp not in baselines:
        baselines[tp] = _baseline(model, logs, tp)
    return baselines[tp]


def _baseline(model: Path, logs: Path, tp: int) -> Baseline:
    """Plain vLLM's greedy tokens, eager, one sequence per step; the server is stopped after."""
    server = serve.start(
        f"baseline-eager-tp{tp}",
        model,
        serve.free_port(),
        logs,
        cpu="|".join(serve.cpu(t) for t in range(tp)),
        extra=(*ENGINE_ARGS, *_tp_args(tp)),
        eager=True,
    )
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


def _start(
    topology: Topology, model: Path, logs: Path
) -> tuple[list[serve.Server], list[serve.Server]]:
    """The FFN engines (one per FFN rank) and the Attention engines of ``topology``."""
    afd = {
        "port": serve.free_port(),
        "num_attention_ranks": topology.num_attention_ranks,
        "num_ffn_ranks": topology.num_ffn_ranks,
        "connector_extra_config": {"timeout_s": 30, "connect_timeout_s": 300},
        **({"ffn_hosts": list(topology.ffn_hosts)} if topology.ffn_hosts else {}),
    }
    ffns, attentions = [], []
    try:
        for k in range(topology.num_ffn_ranks):
            # its workers' series in its /metrics (checked per TP lane below)
            prometheus = logs / f"prometheus-{topology.name}-ffn{k}"
            prometheus.mkdir()
            ffns.append(
                serve.start_ffn(
                    f"{topology.name}-ffn{k}",
                    model,
                    serve.free_port(),
                    logs,
                    {**afd, "rank_offset": k},
                    cpu=_cpus(k * topology.tp, topology.tp),
                    env={**DEV_MODE, "PROMETHEUS_MULTIPROC_DIR": str(prometheus)},
                    eager=True,
                    extra=(*ENGINE_ARGS, *_tp_args(topology.tp)),
                )
            )
        offset = 0
        for i, dp in enumerate(topology.attention_engines):
            dp_args = ("--data-parallel-size", str(dp)) if dp > 1 else ()
            attentions.append(
                serve.start_attention(
                    f"{topology.name}-attention{i}",
                    model,
                    serve.free_port(),
                    logs,
                    {**afd, "rank_offset": offset},
                    cpu=_cpus(offset * topology.tp, dp * topology.tp),
                    eager=True,
                    extra=(*ATTENTION_ARGS, *dp_args, *_tp_args(topology.tp)),
                )
            )
            offset += dp
    except BaseException:
        for server in ffns + attentions:
            serve.stop(server)
        raise
    return ffns, attentions


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


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=lambda t: t.name)
def test_topology_serves_baseline_tokens_with_aggregated_ffn_steps(
    topology: Topology,
    model: Path,
    logs: Path,
    baselines: dict[int, Baseline],
    memory: dict[str, tuple[int, int]],
) -> None:
    baseline = _baseline_for(topology.tp, baselines, model, logs)
    ffns, attentions = _start(topology, model, logs)
    servers = ffns + attentions
    try:
        serve.wait_ready(servers, START_TIMEOUT_S)
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
            memory[f"{topology.name}/{server.name.removeprefix(topology.name + '-')}"] = (
                rss,
                probes.pss_bytes(server),
            )
            deployment += rss
        assert 0 < deployment < MACHINE_BYTES, deployment
    finally:
        for server in attentions + ffns:
            serve.stop(server)
    assert not any(serve.group_alive(s) for s in servers)


def _untimed(step: dict[str, Any]) -> dict[str, Any]:
    """An FFN step's record without its timings (which differ between TP partners)."""
    return {key: value for key, value in step.items() if key != "layer_seconds"}
