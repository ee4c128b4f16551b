"""A role restart under load, with ``peer_restart_timeout_s``: real ``vllm serve`` engines on
127.0.0.1, the Attention engine in vLLM's default compiled mode.

The FFN engine is killed (SIGKILL of its process group) while requests stream, and a new one is
started on the same rendezvous port: the Attention engine stays healthy, holds the step in
flight, runs it again on the new FFN engine, and no request fails; every completion equals the
one the pair gave before the kill, token for token. Then the Attention engine is killed and
restarted, also under load: the FFN engine stays up, waits for it, and serves it. Each side's
``afd_reconnects_total`` counts its reconnect. Last, the FFN engine is killed and stays away past
the Attention engine's timeout: the request in flight fails (HTTP 500, counted as an error
finish), the Attention engine stays up, connects to a new FFN engine with no request in flight,
and serves the same tokens again. At the end nothing is left running and every port is free.

Requests run with ``--max-num-seqs 1`` and no prefix caching, so every completion of a prompt is
computed in the same batch shapes (test_serve_pair.py says why that matters on the CPU).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from afd_models.cli import serve
from tests import probes

PROMPTS = ["Hello world, the license", "The quick brown fox", "Attention and experts"]
MAX_TOKENS = 16
RESTART_S = 240
#: the restarted Attention engine's peer_restart_timeout_s: the FFN engine stays away longer
LOST_AFTER_S = 20
START_TIMEOUT_S = 600
#: what the Attention engine's requests may take while an FFN engine restarts
REQUEST_TIMEOUT_S = RESTART_S + 60
SAME_BATCHES = ("--max-num-seqs", "1", "--no-enable-prefix-caching")

# the engines killed and restarted on the primary release (five server starts, three phases);
# on every release, tests/cpu/test_peer_restart.py runs the generated AFD scheduler through a
# lost step with vLLM's own scheduler code


class Load:
    """Requests sent one after another from a thread until stopped: each prompt's tokens, or the
    error it got."""

    def __init__(self, server: serve.Server):
        self.server = server
        self.results: list[tuple[str, list[int] | str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        index = 0
        while not self._stop.is_set():
            prompt = PROMPTS[index % len(PROMPTS)]
            index += 1
            try:
                tokens: list[int] | str = serve.complete(
                    self.server, prompt, MAX_TOKENS, REQUEST_TIMEOUT_S
                )
            except serve.ServerError as exc:
                tokens = str(exc)
            self.results.append((prompt, tokens))

    def wait_for(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.results) < count:
            assert time.monotonic() < deadline, f"{len(self.results)} of {count} requests done"
            time.sleep(0.2)

    def stop(self) -> list[tuple[str, list[int] | str]]:
        self._stop.set()
        self._thread.join(REQUEST_TIMEOUT_S)
        return self.results


def _prometheus(tmp_path: Path, name: str) -> dict[str, str]:
    """The environment giving engine ``name`` a Prometheus directory of its own."""
    directory = tmp_path / f"prometheus-{name}"
    directory.mkdir()
    return {"PROMETHEUS_MULTIPROC_DIR": str(directory)}


def _wait_for_line(server: serve.Server, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in server.log.read_text(errors="replace"):
        assert time.monotonic() < deadline, (
            f"{server.name} never logged {text!r}:\n{server.log_tail()}"
        )
        time.sleep(0.5)


def test_either_role_restarts_under_load_without_losing_a_request(
    model: Path, logs: Path, tmp_path: Path
) -> None:
    afd = {
        "port": serve.free_port(),
        "peer_restart_timeout_s": RESTART_S,
        "connector_extra_config": {"timeout_s": 10, "connect_timeout_s": 300},
    }
    on_attention = {"role": "attention", "rank": "0", "lane": "0", "peer": "ffn0"}
    on_ffn = {"role": "ffn", "rank": "0", "lane": "0", "peer": "attention0"}

    ffn_port, attention_port = serve.free_port(), serve.free_port()
    start_ffn: Callable[[str], serve.Server] = lambda name: serve.start_ffn(  # noqa: E731
        name, model, ffn_port, logs, afd, cpu=serve.cpu(1), env=_prometheus(tmp_path, name)
    )

    def start_attention(name: str, restart_s: float = RESTART_S) -> serve.Server:
        return serve.start_attention(
            name,
            model,
            attention_port,
            logs,
            {**afd, "peer_restart_timeout_s": restart_s},
            cpu=serve.cpu(0),
            extra=(*SAME_BATCHES, "--scheduler-cls", "afd_models.scheduler.AFDScheduler"),
            env=_prometheus(tmp_path, name),
        )

    servers = [start_ffn("restart-ffn-1"), start_attention("restart-attention-1")]
    ffn, attention = servers
    try:
        serve.wait_ready(servers, START_TIMEOUT_S)
        expected = {p: serve.complete(attention, p, MAX_TOKENS) for p in PROMPTS}

        # --- the FFN engine dies under load and a new one takes its place
        load = Load(attention)
        load.wait_for(2, 120)
        serve.kill_group(ffn)
        time.sleep(3)  # the step in flight is held, the engine stays up and takes requests
        assert serve.health(attention) == 200
        ffn = start_ffn("restart-ffn-2")
        servers.append(ffn)
        _wait_for_line(attention, "running the step again", REQUEST_TIMEOUT_S)
        done = len(load.results)
        load.wait_for(done + 3, REQUEST_TIMEOUT_S)
        results = load.stop()
        assert [r for r in results if r[1] != expected[r[0]]] == []
        assert probes.metric_value(attention, "afd_reconnects_total", **on_attention) == 1
        assert probes.metric_value(attention, "afd_peer_connected", **on_attention) == 1

        # --- the Attention engine dies under load; the FFN engine waits for the restarted one
        serve.wait_ready([ffn], START_TIMEOUT_S)  # its API server comes up after it connected
        load = Load(attention)
        load.wait_for(1, 120)
        serve.kill_group(attention)
        load.stop()  # the requests in flight were the dead engine's own
        _wait_for_line(ffn, "waiting up to 240 s (peer_restart_timeout_s)", 60)
        assert serve.health(ffn) == 200 and ffn.alive()
        # (this one gives up on a step sooner, for the next part)
        attention = start_attention("restart-attention-2", LOST_AFTER_S)
        servers.append(attention)
        serve.wait_ready([attention], START_TIMEOUT_S)
        assert {p: serve.complete(attention, p, MAX_TOKENS) for p in PROMPTS} == expected
        assert serve.ran_compiled(attention), attention.log_tail()
        assert probes.metric_value(ffn, "afd_reconnects_total", **on_ffn) == 1
        assert probes.metric_value(ffn, "afd_peer_connected", **on_ffn) == 1

        # --- the FFN engine stays away past the timeout: the request fails, the engine stays
        # up, and serves again once an FFN engine is back
        serve.kill_group(ffn)
        started = time.monotonic()
        with pytest.raises(serve.ServerError, match="completion answered 500"):
            serve.complete(attention, PROMPTS[0], MAX_TOKENS, REQUEST_TIMEOUT_S)
        assert time.monotonic() - started >= LOST_AFTER_S
        _wait_for_line(attention, "failing the step's 1 requests (the engine stays up", 30)
        assert serve.health(attention) == 200 and attention.alive()
        errors = {"finished_reason": "error"}
        assert probes.metric_value(attention, "vllm:request_success_total", **errors) == 1
        ffn = start_ffn("restart-ffn-3")
        servers.append(ffn)
        # with no request in flight: its API server comes up once the Attention engine connected
        serve.wait_ready([ffn], START_TIMEOUT_S)
        _wait_for_line(attention, "an FFN engine connected; the next step runs on it", 30)
        assert {p: serve.complete(attention, p, MAX_TOKENS) for p in PROMPTS} == expected
        assert probes.metric_value(attention, "afd_reconnects_total", **on_attention) == 1
        assert probes.metric_value(attention, "vllm:request_success_total", **errors) == 1
    finally:
        codes = {s.name: serve.stop(s) for s in reversed(servers)}
    assert not any(serve.group_alive(s) for s in servers)
    for port in (afd["port"], ffn_port, attention_port):
        assert probes.port_is_free(port), port
    assert codes[attention.name] is not None and codes[ffn.name] is not None


@dataclass(frozen=True)
class Partners:
    """A deployment whose workers have partners: ``tp`` TP workers per role, ``dp`` Attention
    ranks in one Attention engine, all served by FFN rank 0."""

    name: str
    tp: int
    dp: int

    def tp_args(self) -> tuple[str, ...]:
        return ("--tensor-parallel-size", str(self.tp)) if self.tp > 1 else ()

    def dp_args(self) -> tuple[str, ...]:
        return ("--data-parallel-size", str(self.dp)) if self.dp > 1 else ()

    def lanes(self) -> list[dict[str, str]]:
        """The labels of every Attention worker's connection to its FFN rank."""
        return [
            {"role": "attention", "rank": str(rank), "lane": str(lane), "peer": "ffn0"}
            for rank in range(self.dp)
            for lane in range(self.tp)
        ]


PARTNERS = [Partners("1A1F-TP2", tp=2, dp=1), Partners("2A1F", tp=1, dp=2)]


@pytest.mark.parametrize("partners", PARTNERS, ids=lambda p: p.name)
def test_workers_with_partners_survive_either_role_restarting_under_load(
    partners: Partners, model: Path, logs: Path, tmp_path: Path
) -> None:
    """TP partners (each lane its own connection) and the two DP ranks of one Attention engine
    (one busy with the load, the other stepping dummy batches): the FFN engine dies under load
    and a new one takes its place with no request lost and equal tokens; then the Attention
    engine dies under load and the FFN engine, every lane of it, waits and serves a new one.
    Eager engines: the compiled restart is the test above."""
    afd = {
        "port": serve.free_port(),
        "num_attention_ranks": partners.dp,
        "peer_restart_timeout_s": RESTART_S,
        "connector_extra_config": {"timeout_s": 10, "connect_timeout_s": 300},
    }
    workers = "|".join(serve.cpu(w) for w in range(partners.tp * partners.dp))
    ffn_port, attention_port = serve.free_port(), serve.free_port()

    def start_ffn(name: str) -> serve.Server:
        return serve.start_ffn(
            name,
            model,
            ffn_port,
            logs,
            afd,
            cpu="|".join(serve.cpu(w) for w in range(partners.tp)),
            eager=True,
            extra=partners.tp_args(),
            env=_prometheus(tmp_path, name),
        )

    def start_attention(name: str) -> serve.Server:
        return serve.start_attention(
            name,
            model,
            attention_port,
            logs,
            afd,
            cpu=workers,
            eager=True,
            extra=(
                *SAME_BATCHES,
                *partners.tp_args(),
                *partners.dp_args(),
                "--kv-cache-memory-bytes",
                "128M",
                "--scheduler-cls",
                "afd_models.scheduler.AFDScheduler",
            ),
            env=_prometheus(tmp_path, name),
        )

    servers = [start_ffn(f"{partners.name}-ffn-1"), start_attention(f"{partners.name}-attention-1")]
    ffn, attention = servers
    try:
        serve.wait_ready(servers, START_TIMEOUT_S)
        expected = {p: serve.complete(attention, p, MAX_TOKENS) for p in PROMPTS}

        # --- the FFN engine dies under load and a new one takes its place
        load = Load(attention)
        load.wait_for(2, 120)
        serve.kill_group(ffn)
        ffn = start_ffn(f"{partners.name}-ffn-2")
        servers.append(ffn)
        _wait_for_line(attention, "running the step again", REQUEST_TIMEOUT_S)
        load.wait_for(len(load.results) + 3, REQUEST_TIMEOUT_S)
        results = load.stop()
        assert [r for r in results if r[1] != expected[r[0]]] == []
        log = attention.log.read_text(errors="replace")
        # every worker held the step and ran it again, whether its own exchange was lost
        assert log.count("running the step again") >= partners.tp * partners.dp, log[-4000:]
        for labels in partners.lanes():
            assert probes.metric_value(attention, "afd_reconnects_total", **labels) == 1, labels

        # --- the Attention engine dies under load; every FFN lane waits for the restarted one
        serve.wait_ready([ffn], START_TIMEOUT_S)
        load = Load(attention)
        load.wait_for(1, 120)
        serve.kill_group(attention)
        load.stop()
        deadline = time.monotonic() + 60
        while ffn.log.read_text(errors="replace").count("(peer_restart_timeout_s)") < partners.tp:
            assert time.monotonic() < deadline, ffn.log_tail()
            time.sleep(0.5)
        assert serve.health(ffn) == 200 and ffn.alive()
        attention = start_attention(f"{partners.name}-attention-2")
        servers.append(attention)
        serve.wait_ready([attention], START_TIMEOUT_S)
        assert {p: serve.complete(attention, p, MAX_TOKENS) for p in PROMPTS} == expected
        for lane in range(partners.tp):
            for rank in range(partners.dp):
                labels = {"role": "ffn", "rank": "0", "lane": str(lane), "peer": f"attention{rank}"}
                assert probes.metric_value(ffn, "afd_reconnects_total", **labels) == 1, labels
    finally:
        codes = {s.name: serve.stop(s) for s in reversed(servers)}
    assert not any(serve.group_alive(s) for s in servers)
    assert codes[attention.name] is not None and codes[ffn.name] is not None
