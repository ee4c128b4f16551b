"""Probes of a served AFD group that only the tests read: whether a port is free again, Prometheus
samples, the FFN workers' recent steps and the processes' memory; and a gloo connector group in
this process, its FFN side hosting in a thread, whose real Attention peer is served or not.

Starting, querying and stopping the servers is :mod:`afd_models.cli.serve`, which the demo and
benchmarks use too.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from afd_models.cli.serve import Server, ServerError, collective_rpc, group_members
from afd_models.topology import groups

if TYPE_CHECKING:
    from afd_models.connectors.gloo import GlooFFNConnector
    from afd_models.connectors.specs import GlooExtraConfig


def listening_sockets(pids: Iterable[int]) -> set[tuple[str, int]]:
    """The TCP sockets processes ``pids`` listen on, as (address, port), from /proc (Linux)."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                link = os.readlink(fd)
            except OSError:  # closed meanwhile, or the process ended
                continue
            if link.startswith("socket:["):
                inodes.add(link[len("socket:[") : -1])
    found = set()
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            address, port = local.split(":")
            raw = bytes.fromhex(address)
            # the kernel writes each 32-bit word in host (little-endian) order
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((str(ipaddress.ip_address(words[:width])), int(port, 16)))
    return found


def connect_when_listening(port: int, timeout_s: float = 30.0) -> socket.socket:
    """A connection to ``127.0.0.1:port`` once something listens there (within ``timeout_s``),
    with ``timeout_s`` for its reads."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            channel = socket.create_connection(("127.0.0.1", port), timeout_s)
            channel.settimeout(timeout_s)
            return channel
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, f"nothing listened on port {port}"
            time.sleep(0.1)


def received_until_closed(channel: socket.socket) -> bytes:
    """What the other end sends on ``channel`` until it closes it (or resets it: closing with
    bytes of ours unread does)."""
    received = b""
    try:
        while chunk := channel.recv(4096):
            received += chunk
    except ConnectionResetError:
        pass
    return received


class FFNInThread:
    """A gloo FFN connector of a 1A1F group at ``127.0.0.1:port``, connecting in a thread."""

    def __init__(self, port: int, secret: bytes | None, extra: GlooExtraConfig):
        # imported here: the e2e tiers read this module without importing vLLM in pytest's process
        from afd_models.connectors.gloo import GlooFFNConnector

        self.port = port
        self.connector: GlooFFNConnector | None = None
        self.error: BaseException | None = None
        group = groups(1, 1, port)[0]

        def connect() -> None:
            try:
                self.connector = GlooFFNConnector("127.0.0.1", group, extra, secret=secret)
            except BaseException as exc:  # reported by the test
                self.error = exc

        self.thread = threading.Thread(target=connect, daemon=True)
        self.thread.start()

    def step_channel(self) -> socket.socket:
        """A fresh connection to the FFN worker's listener, once it listens."""
        return connect_when_listening(self.port)

    def join(self) -> GlooFFNConnector:
        self.thread.join(60)
        assert self.error is None, self.error
        assert self.connector is not None
        return self.connector


def hello_of(channel: socket.socket) -> bytes:
    """The FFN side's hello on a fresh ``channel`` (less if it closes the channel first)."""
    from afd_models.connectors.p2p.auth import HELLO

    hello = b""
    while len(hello) < HELLO.size and (chunk := channel.recv(HELLO.size - len(hello))):
        hello += chunk
    return hello


def real_peer_served(ffn: FFNInThread, secret: bytes | None, extra: GlooExtraConfig) -> bool:
    """The real Attention peer connects (with ``secret``), and one step of one layer crosses and
    comes back as the FFN side answered it; both connectors are closed after."""
    import torch

    from afd_models.connectors.gloo import GlooAttentionConnector

    group = groups(1, 1, ffn.port)[0]
    attention = GlooAttentionConnector("127.0.0.1", group, 0, extra, secret=secret)
    connector = ffn.join()
    try:
        attention.set_layers([0])
        hidden = torch.randn(3, 16, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)

        def answer() -> None:
            connector.wait_step(threading.Event())
            connector.send(0, connector.recv(0).hidden_states * 2)

        server = threading.Thread(target=answer)
        server.start()
        attention.send(0, hidden, None)
        exact = torch.equal(attention.recv(0, hidden), hidden * 2)
        server.join(30)
        return exact
    finally:
        attention.close()
        connector.close()


def port_is_free(port: int) -> bool:
    """Whether a new server could listen on ``port`` (as servers do, with SO_REUSEADDR:
    connections of a stopped process lingering in TIME_WAIT do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
        return True


#: one sample line of the Prometheus text format: name, labels, value
_SAMPLE = re.compile(r"^([\w:]+)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metrics(
    server: Server, name: str, timeout_s: float = 30.0
) -> list[tuple[dict[str, str], float]]:
    """The samples of ``name`` in the server's ``/metrics``: each one's labels and value."""
    try:
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=timeout_s) as response:
            text = response.read().decode()
    except OSError as exc:
        raise ServerError(f"GET {server.url}/metrics failed: {exc}") from exc
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) == name:
            labels = dict(_LABEL.findall(match.group(2) or ""))
            samples.append((labels, float(match.group(3))))
    return samples


def metric_value(server: Server, name: str, **labels: str) -> float:
    """The value of the one sample of ``name`` in the server's ``/metrics`` whose labels include
    ``labels``.

    Raises:
        ServerError: no such sample, or more than one.
    """
    samples = metrics(server, name)
    found = [value for have, value in samples if labels.items() <= have.items()]
    if len(found) != 1:
        raise ServerError(f"{len(found)} samples of {name} with {labels} in {samples}")
    return found[0]


def ffn_steps(server: Server) -> list[list[dict[str, Any]]]:
    """Each FFN worker's recent steps (:meth:`afd_models.ffn_server.FFNServer.recent_steps`), one
    list per TP rank; the server must run with VLLM_SERVER_DEV_MODE=1. Attention ranks as ints."""
    return [
        [{**step, "peers": {int(r): n for r, n in step["peers"].items()}} for step in steps]
        for steps in collective_rpc(server, "afd_ffn_steps")
    ]


def _sum_proc_field(server: Server, file: str, key: str) -> int:
    """``key`` (a kB figure) of ``/proc/PID/file`` summed over the server's live processes."""
    total = 0
    for pid in group_members(server):
        try:
            text = Path(f"/proc/{pid}/{file}").read_text()
        except OSError:
            continue  # exited since it was listed
        for line in text.splitlines():
            if line.startswith(key):
                total += int(line.split()[1]) * 1024
    return total


def peak_rss_bytes(server: Server) -> int:
    """The sum of the peak resident memory (VmHWM) of the server's live processes: an upper bound
    of the group's peak, since the processes share library pages and peak at different times."""
    return _sum_proc_field(server, "status", "VmHWM:")


def pss_bytes(server: Server) -> int:
    """The server's memory now, shared pages split between the processes sharing them (PSS)."""
    return _sum_proc_field(server, "smaps_rollup", "Pss:")
