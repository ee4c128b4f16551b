"""A role restart under load, on a deployment a test already started: the FFN engine killed while
requests stream and a new one started in its place, then the Attention engine killed and a new
one started. With ``peer_restart_timeout_s`` and the AFD scheduler, no request fails and every
completion equals the expected one, token for token; each side counts its reconnect.

test_serve_pair.py runs it on the compiled 1A1F pair, test_topologies.py on 3A2F (its first FFN
rank serving an Attention engine of DP 2: 2A1F) and on 1A1F with TP 2, so that every topology
that can restart does, on an engine already started for its other checks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

from afd_models.cli import serve
from tests import probes

#: the connector's restart window the deployments get: long enough for an engine start
RESTART_S = 240
#: seconds an exchange may take: a held step may take the window plus three of them, which must
#: stay below vLLM's executor timeout (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, 300 s; the workers
#: refuse more)
TIMEOUT_S = 10
#: the AFD section's settings of a deployment that restarts
RESTART_SECTION = {
    "peer_restart_timeout_s": RESTART_S,
    "connector_extra_config": {"timeout_s": TIMEOUT_S, "connect_timeout_s": 300},
}
#: what a request may take while an engine restarts
REQUEST_TIMEOUT_S = RESTART_S + 60
START_TIMEOUT_S = 600
#: the Attention engine's flags for a restart: its scheduler fails a lost step's requests, and
#: without prefix caching each prompt is computed in the same batch shapes every time
ATTENTION_ARGS = (
    "--no-enable-prefix-caching",
    "--scheduler-cls",
    "afd_models.scheduler.AFDScheduler",
)


class Load:
    """Requests sent one after another from a thread until stopped (at the latest when its
    ``with`` block ends): each prompt's tokens, or the error it got."""

    def __init__(self, server: serve.Server, prompts: Sequence[str], max_tokens: int):
        self.server, self.prompts, self.max_tokens = server, prompts, max_tokens
        self.results: list[tuple[str, list[int] | str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        index = 0
        while not self._stop.is_set():
            prompt = self.prompts[index % len(self.prompts)]
            index += 1
            try:
                tokens: list[int] | str = serve.complete(
                    self.server, prompt, self.max_tokens, REQUEST_TIMEOUT_S
                )
            except serve.ServerError as exc:
                tokens = str(exc)
                self._stop.wait(0.5)  # a dead engine fails at once: no busy loop
            self.results.append((prompt, tokens))

    def __enter__(self) -> Load:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def wait_for(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.results) < count:
            assert time.monotonic() < deadline, f"{len(self.results)} of {count} requests done"
            time.sleep(0.2)

    def stop(self) -> list[tuple[str, list[int] | str]]:
        self._stop.set()
        self._thread.join(REQUEST_TIMEOUT_S)
        return self.results


def wait_for_lines(server: serve.Server, text: str, count: int, timeout_s: float) -> None:
    """Until ``server``'s log holds ``text`` ``count`` times."""
    deadline = time.monotonic() + timeout_s
    while server.log.read_text(errors="replace").count(text) < count:
        assert time.monotonic() < deadline, (
            f"{server.name} logged {text!r} fewer than {count} times:\n{server.log_tail()}"
        )
        time.sleep(0.5)


def restart_ffn_under_load(
    attention: serve.Server,
    ffn: serve.Server,
    relaunch: Callable[[], serve.Server],
    expected: Mapping[str, list[int]],
    *,
    max_tokens: int,
    lanes: Sequence[Mapping[str, str]],
) -> serve.Server:
    """Kill ``ffn`` while ``attention`` streams requests, start a new one (``relaunch``): the
    Attention engine stays healthy and every worker (``lanes``: the labels of each of its
    connections to the killed FFN engine) holds the step and runs it again, no request fails,
    every completion equals ``expected``, and each lane counts one reconnect. Returns the new
    FFN engine."""
    with Load(attention, list(expected), max_tokens) as load:
        load.wait_for(2, 120)
        serve.kill_group(ffn)
        time.sleep(3)  # the step in flight is held, the engine stays up and takes requests
        assert serve.health(attention) == 200
        ffn = relaunch()
        wait_for_lines(attention, "running the step again", len(lanes), REQUEST_TIMEOUT_S)
        load.wait_for(len(load.results) + 3, REQUEST_TIMEOUT_S)
    results = load.results
    assert [r for r in results if r[1] != expected[r[0]]] == []
    for labels in lanes:
        assert probes.metric_value(attention, "afd_reconnects_total", **labels) == 1, labels
        assert probes.metric_value(attention, "afd_peer_connected", **labels) == 1, labels
    return ffn


def restart_attention_under_load(
    ffn: serve.Server,
    attention: serve.Server,
    relaunch: Callable[[], serve.Server],
    expected: Mapping[str, list[int]],
    *,
    max_tokens: int,
    ffn_lanes: Sequence[Mapping[str, str]],
    tp: int,
) -> serve.Server:
    """Kill ``attention`` while it streams requests: every TP lane (``tp``) of the FFN engine
    waits for its peer and stays healthy; a new Attention engine (``relaunch``) is served
    ``expected``, and each of the FFN engine's lanes to it (``ffn_lanes``) counts one reconnect.
    Returns the new Attention engine."""
    serve.wait_ready([ffn], START_TIMEOUT_S)  # its API server comes up after it connected
    with Load(attention, list(expected), max_tokens) as load:
        load.wait_for(1, 120)
        serve.kill_group(attention)
    # the requests in flight were the dead engine's own
    wait_for_lines(ffn, f"waiting up to {RESTART_S} s (peer_restart_timeout_s)", tp, 60)
    assert serve.health(ffn) == 200 and ffn.alive()
    attention = relaunch()
    serve.wait_ready([attention], START_TIMEOUT_S)
    assert {p: serve.complete(attention, p, max_tokens) for p in expected} == expected
    for labels in ffn_lanes:
        assert probes.metric_value(ffn, "afd_reconnects_total", **labels) == 1, labels
        assert probes.metric_value(ffn, "afd_peer_connected", **labels) == 1, labels
    return attention
