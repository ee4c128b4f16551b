"""Who gets into a connector group (issue 35): with a shared secret, the real Attention peer is
admitted and served, while strangers (no secret, a wrong secret, a replayed exchange, garbage,
silence) get nothing but the FFN worker's hello and never stop its rendezvous; a secret on one
role only is refused by the Attention side with a message saying so; the FFN worker listens on
its configured address only, and only until its group formed.

The FFN connector runs in a thread of this process, the peers in this one (the handshake is the
same between processes: ``test_gloo_connector.py`` runs it so)."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from typing import Any

import pytest

from afd_models.cli.serve import free_port
from afd_models.connectors.base import AFDConnectionError
from afd_models.connectors.gloo import GlooAttentionConnector, GlooFFNConnector
from afd_models.connectors.p2p.auth import HELLO, MAGIC, NONCE_BYTES, PROOF_BYTES, respond
from afd_models.connectors.p2p.ffn import MAX_OPENINGS
from afd_models.connectors.specs import GlooExtraConfig
from afd_models.topology import groups
from tests import probes
from tests.logs import AFDLines
from tests.probes import FFNInThread

SECRET = b"s3cret-token-of-the-deployment-0123"
#: a stranger's silence is dropped within timeout_s
EXTRA = GlooExtraConfig(connect_timeout_s=60, timeout_s=2)
#: seconds a refused Attention side may take to fail
FAST_S = 10.0


def _gives_up(channel: socket.socket) -> None:
    """A real peer's side of the opening, on an FFN side that never proves the secret back."""
    with pytest.raises(AFDConnectionError):
        respond(channel, SECRET)


def _recorded_reply(hello: bytes) -> bytes:
    """What a real Attention peer answers to ``hello``: its nonce and its proof of SECRET."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(hello)
        peer = threading.Thread(target=_gives_up, args=(theirs,))
        peer.start()
        reply = b""
        while len(reply) < NONCE_BYTES + PROOF_BYTES:
            reply += ours.recv(4096)
        ours.shutdown(socket.SHUT_RDWR)  # no proof back: the peer gives up
        peer.join(10)
    return reply


def _attention(port: int, secret: bytes | None) -> GlooAttentionConnector:
    return GlooAttentionConnector("127.0.0.1", groups(1, 1, port)[0], 0, EXTRA, secret=secret)


def _real_peer_served(ffn: FFNInThread) -> bool:
    return probes.real_peer_served(ffn, SECRET, EXTRA)


def _ffn(port: int) -> FFNInThread:
    return FFNInThread(port, SECRET, EXTRA)


def test_strangers_get_nothing_and_the_real_peer_is_served() -> None:
    """Garbage for a proof, a real proof replayed from another connection, silence: each
    stranger reads the hello and then the end of the connection (or its reset), nothing else; a peer with
    another secret or none is told nothing more either (its own side fails). Each is logged with
    its address, and then the real peer is admitted and served."""
    port = free_port()
    with AFDLines() as lines:
        ffn = _ffn(port)
        strangers = {}
        # a recorded exchange: what a real peer answered to another connection's hello
        with ffn.step_channel() as recorded:
            hello = probes.hello_of(recorded)
        assert HELLO.unpack(hello)[:2] == (MAGIC, True)
        for name, sends in {
            "garbage": b"\xff" * 200,
            "replayed": _recorded_reply(hello),
            "silent": b"",
        }.items():
            channel = ffn.step_channel()
            assert HELLO.unpack(probes.hello_of(channel))[:2] == (MAGIC, True)
            channel.sendall(sends)
            strangers[name] = channel
        with ffn.step_channel() as other_secret:
            with pytest.raises(AFDConnectionError, match="the two roles have different secrets"):
                respond(other_secret, b"another-secret-of-32-bytes-00000")
        with ffn.step_channel() as no_secret:
            with pytest.raises(AFDConnectionError, match="requires the deployment's shared secret"):
                respond(no_secret, None)
        for name, channel in strangers.items():
            with channel:
                assert probes.received_until_closed(channel) == b"", name
        assert _real_peer_served(ffn)
    dropped = [line for line in lines if "dropped a connection from 127.0.0.1:" in line]
    failed = [line for line in dropped if "failed authentication" in line]
    assert len(failed) == 3, dropped  # garbage, replayed, other secret
    assert sum("sent no whole handshake within 2 s" in line for line in dropped) == 1, dropped
    assert "AFD gloo ffn: peers must prove the deployment's shared secret" in lines


def test_a_wrong_secret_fails_fast_and_the_ffn_waits_on() -> None:
    """An Attention engine with another secret fails within seconds, saying so; the FFN worker
    drops it and admits the right one after."""
    port = free_port()
    ffn = _ffn(port)
    started = time.monotonic()
    with pytest.raises(AFDConnectionError) as refused:
        _attention(port, b"another-secret-of-32-bytes-00000")
    assert time.monotonic() - started < FAST_S
    assert str(refused.value) == (
        f"AFD gloo attention: the FFN worker at 127.0.0.1:{port}: it closed the step channel at "
        "this engine's proof of the shared secret: the two roles have different secrets "
        "(AFD_AUTH_TOKEN or additional_config.afd.auth_token_file)"
    )
    assert _real_peer_served(ffn)


@pytest.mark.parametrize(
    ("ffn_secret", "attention_secret", "message"),
    [
        (SECRET, None, "it requires the deployment's shared secret, and this engine has none"),
        (None, SECRET, "it does not authenticate its peers, but this engine has a shared secret"),
    ],
    ids=["ffn-only", "attention-only"],
)
def test_a_secret_on_one_role_only_is_refused(
    ffn_secret: bytes | None, attention_secret: bytes | None, message: str
) -> None:
    port = free_port()
    stop = threading.Event()
    extra = dataclasses.replace(EXTRA, connect_timeout_s=30)
    group = groups(1, 1, port)[0]
    outcome: dict[str, Any] = {}

    def host() -> None:
        try:
            GlooFFNConnector("127.0.0.1", group, extra, stop=stop, secret=ffn_secret)
        except AFDConnectionError as exc:
            outcome["ffn"] = str(exc)

    thread = threading.Thread(target=host)
    thread.start()
    try:
        started = time.monotonic()
        with pytest.raises(AFDConnectionError, match=message):
            _attention(port, attention_secret)
        assert time.monotonic() - started < FAST_S
    finally:
        stop.set()
        thread.join(30)
    assert outcome["ffn"].startswith("AFD gloo ffn: stopped while waiting for attention ranks [0]")


def _listening() -> set[tuple[str, int]]:
    return probes.listening_sockets([os.getpid()])


def test_the_ffn_listens_on_its_address_only_and_only_until_the_group_formed() -> None:
    """While it waits for its peer the FFN connector listens on one socket, the group's
    configured address and port (not every interface); once the group formed over shared memory,
    nothing of the connector listens. The Attention side never listens."""
    port, host = free_port(), "127.0.0.2"
    group = groups(1, 1, port)[0]
    before = _listening()
    ffn: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: ffn.update(connector=GlooFFNConnector(host, group, EXTRA, secret=SECRET))
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not (_listening() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _listening() - before == {(host, port)}
    attention = GlooAttentionConnector(host, group, 0, EXTRA, secret=SECRET)
    thread.join(30)
    try:
        assert attention.data_plane.startswith("shared memory")
        assert _listening() - before == set()
    finally:
        attention.close()
        ffn["connector"].close()


def test_a_flood_of_silent_connections_holds_few_threads_and_delays_the_peer_only() -> None:
    """More silent connections at once than the FFN worker opens: it runs at most MAX_OPENINGS
    openings (a thread each) and closes the rest at once; the real peer, turned away while they
    last, tries again and is admitted once they timed out (``timeout_s``)."""
    port = free_port()
    before = threading.active_count()
    ffn = _ffn(port)
    flood = [ffn.step_channel() for _ in range(MAX_OPENINGS + 8)]
    try:
        most = 0
        for _ in range(20):
            most = max(most, threading.active_count() - before)
            time.sleep(0.05)
        assert MAX_OPENINGS <= most <= MAX_OPENINGS + 1  # the openings and the connecting thread
        started = time.monotonic()
        with AFDLines() as lines:
            served = _real_peer_served(ffn)
        assert time.monotonic() - started < EXTRA.timeout_s + FAST_S
    finally:
        for channel in flood:
            channel.close()
    assert served
    turned_away = [line for line in lines if "handshakes in progress already" in line]
    assert turned_away and any(line.endswith("; trying again") for line in lines), lines
