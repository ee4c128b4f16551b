"""Start, query and stop ``vllm serve`` processes on 127.0.0.1: the demo, benchmarks and e2e tests use this.

Every server runs in its own process group, so stopping it stops its EngineCore and workers too;
every wait has a deadline; a server that dies while starting raises with the tail of its log.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


class ServerError(RuntimeError):
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
    """One ``vllm serve`` process group."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)
    #: where its API server answers
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.process.poll() is None


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
    """Run ``argv`` in a process group of its own, with ``env`` over this process's environment,
    its output in ``log_dir/<name>.log``; the server answers on ``host:port``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            cwd=cwd,
            start_new_session=True,
        )
    return Server(name, port, process, log, host=host)


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
    deadline = time.monotonic() + timeout_s
    pending = list(servers)
    while pending:
        for server in list(pending):
            if not server.alive():
                raise ServerError(
                    f"{server.name} exited with {server.process.returncode} while starting:\n{server.log_tail()}"
                )
            if health(server) == 200:
                pending.remove(server)
                if progress:
                    print(
                        f"[serve] {server.name} ready on :{server.port} after {time.monotonic() - server.started:.0f} s",
                        flush=True,
                    )
        if pending and time.monotonic() > deadline:
            names = ", ".join(s.name for s in pending)
            raise ServerError(
                f"{names} not ready within {timeout_s:.0f} s:\n{pending[0].log_tail()}"
            )
        time.sleep(0.5)


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
    if server.alive():
        try:
            os.killpg(server.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            server.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
    kill_group(server)
    return server.process.returncode


def kill_group(server: Server, timeout_s: float = 15.0) -> None:
    """SIGKILL everything left in the server's process group and wait until it is gone."""
    try:
        os.killpg(server.process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout_s
    try:
        server.process.wait(timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise ServerError(
            f"{server.name} (pid {server.process.pid}) did not die after SIGKILL"
        ) from exc
    while group_members(server):
        if time.monotonic() > deadline:
            raise ServerError(f"{server.name}: processes {group_members(server)} survived SIGKILL")
        time.sleep(0.1)


def group_members(server: Server) -> list[int]:
    """Live (non-zombie) processes of the server's process group (:func:`process_group_members`)."""
    return process_group_members(server.process.pid)


def process_group_members(group: int) -> list[int]:
    """Live (non-zombie) processes of process group ``group``, from /proc (Linux).

    Zombies are left out: a container's init may reap orphans late, and a zombie runs nothing.
    """
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        state, pgid = fields[0], int(fields[2])
        if pgid == group and state != "Z":
            members.append(int(stat.parent.name))
    return members


def group_alive(server: Server) -> bool:
    """Whether any process of the server's group is still running."""
    return bool(group_members(server))
