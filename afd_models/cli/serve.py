"""Start, query and stop ``vllm serve`` processes on 127.0.0.1: the demo, benchmarks and e2e tests use this.

Every server is a process group of :mod:`afd_models.supervisor`, so stopping it stops its
EngineCore and workers too; every wait has a deadline; a server that dies while starting raises
with the tail of its log.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from afd_models import supervisor
from afd_models.config import Role
from afd_models.launch import ROLE_ARGS, worker_class

#: environment every server gets (CPU platform, a 1 GiB KV cache, no hub, no usage stats)
SERVER_ENV = {
    "VLLM_MLA_DISABLE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
#: the name every server answers to (``model`` in requests)
SERVED_MODEL_NAME = "tiny"
#: engine flags shared by the AFD pair and the baseline, so their outputs are comparable; vLLM's
#: default compilation unless a server is started with ``eager=True``
COMMON_ARGS = (
    "--max-model-len",
    "512",
    "--max-num-batched-tokens",
    "512",
    "--max-num-seqs",
    "16",
    "--served-model-name",
    SERVED_MODEL_NAME,
)


class ServerError(supervisor.SupervisorError):
    """A server failed to start, answer or stop in time."""


def cpu(slot: int) -> str:
    """A CPU id for ``VLLM_CPU_OMP_THREADS_BIND``: the ``slot``-th allowed CPU, wrapping around."""
    allowed = sorted(os.sched_getaffinity(0))
    return str(allowed[slot % len(allowed)])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Server:
    """One ``vllm serve`` process group, and where its API server answers."""

    group: supervisor.Group
    port: int
    host: str = "127.0.0.1"

    @property
    def name(self) -> str:
        return self.group.name

    @property
    def log(self) -> Path:
        return self.group.log

    @property
    def started(self) -> float:
        return self.group.started

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        return self.group.log_tail(lines)

    def alive(self) -> bool:
        return self.group.alive()


def vllm_command(python: str | None = None) -> list[str]:
    """``vllm`` of this interpreter's environment, or vLLM's CLI run by ``python`` (an environment
    that imports vLLM without having its ``vllm`` script, such as a venv over another's packages)."""
    if python is not None:
        return [python, "-m", "vllm.entrypoints.cli.main"]
    return [str(Path(sys.executable).with_name("vllm"))]


def start(
    name: str,
    model: Path,
    port: int,
    log_dir: Path,
    *,
    dtype: str = "float32",
    afd: Mapping[str, Any] | None = None,
    worker_cls: str | None = None,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cpu: str | None = None,
    eager: bool = False,
    python: str | None = None,
    cwd: Path | None = None,
) -> Server:
    """Launch ``vllm serve`` in the background; ``afd`` is the ``additional_config["afd"]`` section.

    The server runs in vLLM's default (compiled) mode, or with ``--enforce-eager`` if ``eager``;
    with ``python``, vLLM's CLI runs on that interpreter (:func:`vllm_command`; ``python -m``
    puts ``cwd`` first on the import path, so run it where no other ``afd_models`` lies).
    """
    args = [
        *vllm_command(python),
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        *COMMON_ARGS,
    ]
    if eager:
        args.append("--enforce-eager")
    if worker_cls:
        args += ["--worker-cls", worker_cls]
    if afd is not None:
        args += ["--additional-config", json.dumps({"afd": dict(afd)})]
    args += list(extra)
    full_env = {**SERVER_ENV, **(env or {})}
    if cpu is not None:
        full_env["VLLM_CPU_OMP_THREADS_BIND"] = cpu
    return launch(name, args, full_env, port, log_dir, cwd=cwd)


def launch(
    name: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    port: int,
    log_dir: Path,
    *,
    cwd: Path | None = None,
    host: str = "127.0.0.1",
) -> Server:
    """Run ``argv`` as a process group of its own, with ``env`` over this process's environment,
    its output in ``log_dir/<name>.log``; the server answers on ``host:port``."""
    group = supervisor.launch(
        name, argv, log_dir / f"{name}.log", env={**os.environ, **env}, cwd=cwd
    )
    return Server(group, port, host)


def start_ffn(
    name: str, model: Path, port: int, log_dir: Path, afd: Mapping[str, Any], **kwargs: Any
) -> Server:
    """The FFN role: its worker, and the flags it needs (the deployment commands', docs/user-guide.md)."""
    return _start_role(Role.FFN, name, model, port, log_dir, afd, **kwargs)


def start_attention(
    name: str, model: Path, port: int, log_dir: Path, afd: Mapping[str, Any], **kwargs: Any
) -> Server:
    """The Attention role: its worker, and the flags it needs (as :func:`start_ffn`)."""
    return _start_role(Role.ATTENTION, name, model, port, log_dir, afd, **kwargs)


def _start_role(
    role: Role,
    name: str,
    model: Path,
    port: int,
    log_dir: Path,
    afd: Mapping[str, Any],
    **kwargs: Any,
) -> Server:
    # the worker and flags `python -m afd_models.deploy` gives the role's engines
    extra = (*ROLE_ARGS[role], *kwargs.pop("extra", ()))
    return start(
        name,
        model,
        port,
        log_dir,
        afd={**afd, "role": role.value},
        worker_cls=worker_class("cpu", role).path,
        extra=extra,
        **kwargs,
    )


def wait_ready(servers: Sequence[Server], timeout_s: float = 300.0, progress: bool = False) -> None:
    """Until every server answers ``/health`` with 200; raise if one exits or the deadline passes."""
    by_group = {id(server.group): server for server in servers}

    def answers(group: supervisor.Group) -> bool:
        return health(by_group[id(group)]) == 200

    def ready(group: supervisor.Group) -> None:
        server = by_group[id(group)]
        print(
            f"[serve] {server.name} ready on :{server.port} after "
            f"{time.monotonic() - server.started:.0f} s",
            flush=True,
        )

    try:
        supervisor.wait_ready(
            [server.group for server in servers],
            answers,
            timeout_s,
            what="ready (/health)",
            on_ready=ready if progress else None,
        )
    except supervisor.SupervisorError as exc:
        raise ServerError(str(exc)) from exc


#: what vLLM logs when a model runs compiled: it saved the compiled forward, or loaded one from its cache
COMPILED_MARKERS = ("saved AOT compiled function", "Directly load AOT compilation")


def ran_compiled(server: Server) -> bool:
    """Whether the server compiled its model (or loaded it compiled from vLLM's cache)."""
    log = server.log.read_text(errors="replace")
    return any(marker in log for marker in COMPILED_MARKERS)


def health(server: Server, timeout_s: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(f"{server.url}/health", timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def post(
    server: Server, path: str, body: Mapping[str, Any], timeout_s: float = 120.0
) -> tuple[int, dict[str, Any]]:
    """POST JSON; returns (status, decoded body). Network errors raise ServerError."""
    request = urllib.request.Request(
        f"{server.url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return int(response.status), json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        text = exc.read() or b"{}"
        try:
            return int(exc.code), json.loads(text)
        except json.JSONDecodeError:
            return int(exc.code), {"error": text.decode(errors="replace")}
    except OSError as exc:
        raise ServerError(f"{server.name}: {path} failed: {exc}") from exc


def complete(server: Server, prompt: str, max_tokens: int, timeout_s: float = 120.0) -> list[int]:
    """Greedy completion token ids; raises ServerError on any non-200 answer."""
    status, body = post(
        server,
        "/v1/completions",
        {
            "model": SERVED_MODEL_NAME,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
        timeout_s,
    )
    if status != 200:
        raise ServerError(f"{server.name}: completion answered {status}: {body}")
    return list(body["choices"][0]["token_ids"])


def collective_rpc(server: Server, method: str) -> list[Any]:
    """Each worker's answer to ``method`` (the server must run with VLLM_SERVER_DEV_MODE=1; with
    vLLM data parallel, the workers of the first DP rank only)."""
    status, body = post(server, "/collective_rpc", {"method": method}, 30)
    if status != 200:
        raise ServerError(
            f"{server.name}: /collective_rpc {method} answered {status} (is VLLM_SERVER_DEV_MODE=1 set?): {body}"
        )
    results: list[Any] = body["results"]
    return results


def connector_stats(server: Server) -> dict[str, float]:
    """The Attention worker's connector statistics (the server must run with VLLM_SERVER_DEV_MODE=1)."""
    stats: dict[str, float] = collective_rpc(server, "afd_connector_stats")[0]
    return stats


@dataclass(frozen=True)
class Exchanges:
    """The Attention worker's exchanges between two readings of :func:`connector_stats`."""

    count: int
    mean_round_trip_s: float
    #: of the round trip, the time the Attention side waited for the answer (the FFN side's
    #: work and the transport); the rest is the Attention side's connector code
    mean_wait_s: float
    mean_bytes_sent: float


def exchanges_between(before: Mapping[str, float], after: Mapping[str, float]) -> Exchanges:
    """What the connector exchanged between ``before`` and ``after`` (its statistics are totals
    since it connected); raises ServerError when it exchanged nothing."""
    count = int(after["exchanges"] - before["exchanges"])
    if count <= 0:
        raise ServerError(
            f"the Attention worker exchanged no layer between two readings of its connector "
            f"statistics ({before} then {after})"
        )

    def mean(key: str) -> float:
        return (after[key] * after["exchanges"] - before[key] * before["exchanges"]) / count

    return Exchanges(
        count,
        mean("mean_round_trip_s"),
        mean("mean_wait_s"),
        (after["bytes_sent"] - before["bytes_sent"]) / count,
    )


def stop(server: Server, timeout_s: float = 30.0) -> int | None:
    """SIGTERM the server's process group, wait, then SIGKILL what is left; the server's exit code."""
    try:
        return supervisor.stop(server.group, timeout_s)
    except supervisor.SupervisorError as exc:
        raise ServerError(str(exc)) from exc


def kill_group(server: Server) -> None:
    """SIGKILL everything in the server's process group and wait until it is gone."""
    try:
        supervisor.kill(server.group)
    except supervisor.SupervisorError as exc:
        raise ServerError(str(exc)) from exc


def group_members(server: Server) -> list[int]:
    """Live (non-zombie) processes of the server's process group."""
    return supervisor.members(server.group.pgid)


def group_alive(server: Server) -> bool:
    """Whether any process of the server's group is still running."""
    return bool(group_members(server))
