"""Starting and stopping a deployment's engines on this machine: ``deploy up`` and ``deploy down``
(afd_models/deploy/__main__.py), and the e2e tests' launcher of whole topologies.

Each engine runs in a process group of its own (:mod:`afd_models.supervisor`, through
:func:`afd_models.cli.serve.launch`), its log and its Prometheus directory in the log directory;
the process groups are recorded there for ``down`` (:func:`recorded_servers`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

from afd_models import supervisor
from afd_models.cli import serve
from afd_models.commandline import ExitCode
from afd_models.config import Role, shared_secret
from afd_models.deploy.commands import Command, deployment_commands
from afd_models.deploy.spec import Deployment

#: what ``up`` records for ``down``, in the log directory
STATE_FILE = "deployment.json"
#: seconds between two lines naming the engines still starting
PROGRESS_EVERY_S = 30.0


def say(message: str) -> None:
    print(f"[deploy {time.strftime('%H:%M:%S')}] {message}", flush=True)


def default_log_dir(spec: Path) -> Path:
    return Path(f"afd-deploy-{spec.stem}")


def health_host(host: str) -> str:
    """Where this machine reaches an API server listening on ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "::") else host


def check_secrets(deployment: Deployment) -> None:
    """Refuse, before any engine starts, a deployment whose workers would refuse their shared
    secret: none where an FFN rank listens beyond loopback, or a file they cannot use.

    Raises:
        AFDConfigError: the first engine's workers' own message.
    """
    for engine in deployment.engines:
        shared_secret(engine.config, {**os.environ, **engine.env})


def up(deployment: Deployment, log_dir: Path, timeout_s: float, detach: bool) -> int:
    """Start every engine, FFN engines first, wait until each answers ``/health``, and serve
    until Ctrl-C or SIGTERM, or until an engine exits (then stop the rest); with ``detach``,
    return once all are up and leave them running for :func:`down`."""
    check_secrets(deployment)
    if (log_dir / STATE_FILE).exists():
        raise serve.ServerError(
            f"{log_dir / STATE_FILE} exists: engines `up --detach` started with this log "
            f"directory may still run; stop them with `python -m afd_models.deploy down SPEC "
            f"--log-dir {log_dir}`, or give another --log-dir"
        )
    commands = deployment_commands(deployment, serve.vllm_command())
    servers: list[serve.Server] = []
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        for command in commands:
            servers.append(start_engine(command, log_dir))
        _record(log_dir, servers)
        _wait_ready(servers, timeout_s, stop)
        for server, command in zip(servers, commands, strict=True):
            if command.engine.role is Role.ATTENTION:
                say(f"send requests to {server.url}/v1/ ({command.engine.name})")
        say(f"logs: {log_dir.resolve()}")
        if detach:
            servers = []  # left running: `down` stops them
            return ExitCode.CLEAN
        say("serving; Ctrl-C stops every engine")
        while not stop.wait(1.0):
            ended = [s for s in servers if not s.alive()]
            if ended:
                say(f"{ended[0].name} exited with {ended[0].group.returncode}: stopping the rest")
                print(ended[0].log_tail(), flush=True)
                return ExitCode.ERROR
        return ExitCode.CLEAN
    finally:
        # our handlers stay while the engines stop: a second Ctrl-C must not cut that short
        survivors = []
        for server in reversed(servers):
            say(f"stopping {server.name}")
            try:
                serve.stop(server)
            except serve.ServerError as exc:
                say(f"{exc}")
                survivors.append(server.name)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if survivors:  # the state file stays, naming their process groups
            raise serve.ServerError(f"{', '.join(survivors)} could not be stopped")
        if servers:
            (log_dir / STATE_FILE).unlink(missing_ok=True)


def start_engine(command: Command, log_dir: Path, name: str | None = None) -> serve.Server:
    """Start one engine of the deployment as ``up`` does: its own process group, a fresh
    Prometheus directory, its log in ``log_dir`` (as ``name``: the engine's by default, another
    for an engine started again beside the first one's log)."""
    engine = command.engine
    # AFD's series per engine (vLLM's multiprocess metrics mix engines sharing a directory)
    prometheus = log_dir / "prometheus" / engine.name
    shutil.rmtree(prometheus, ignore_errors=True)
    prometheus.mkdir(parents=True)
    server = serve.launch(
        name or engine.name,
        command.argv,
        {**command.env, "PROMETHEUS_MULTIPROC_DIR": str(prometheus)},
        engine.api_port,
        log_dir,
        host=health_host(engine.host),
    )
    say(f"started {server.name} (process group {server.group.pgid}): {command.shell()}")
    return server


def _record(log_dir: Path, servers: list[serve.Server]) -> None:
    state = {
        s.name: {"process_group": s.group.pgid, "host": s.host, "port": s.port, "log": str(s.log)}
        for s in servers
    }
    (log_dir / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")


def recorded_servers(log_dir: Path) -> dict[str, serve.Server]:
    """The engines ``up --detach`` recorded in ``log_dir``, by name, in the order it started them.

    Raises:
        FileNotFoundError: no record in ``log_dir``.
        ValueError: the record is not what ``up`` writes.
    """
    state = json.loads((log_dir / STATE_FILE).read_text())
    try:
        return {
            name: serve.Server(
                supervisor.attach(name, int(entry["process_group"]), Path(entry["log"])),
                int(entry["port"]),
                str(entry["host"]),
            )
            for name, entry in state.items()
        }
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"{exc!r}") from exc


def _wait_ready(servers: list[serve.Server], timeout_s: float, stop: threading.Event) -> None:
    by_group = {id(server.group): server for server in servers}

    def ready(group: supervisor.Group) -> None:
        server = by_group[id(group)]
        say(f"{server.name} ready at {server.url} after {time.monotonic() - server.started:.0f} s")

    supervisor.wait_ready(
        [server.group for server in servers],
        lambda group: serve.health(by_group[id(group)]) == 200,
        timeout_s,
        what="ready (/health; --timeout-s)",
        on_ready=ready,
        progress=say,
        progress_every_s=PROGRESS_EVERY_S,
        stop_event=stop,
    )


def down(log_dir: Path, timeout_s: float = 30.0) -> int:
    state_file = log_dir / STATE_FILE
    if not state_file.exists():
        say(f"nothing to stop: no {STATE_FILE} in {log_dir} (was `up --detach` run with it?)")
        return ExitCode.ERROR
    try:
        servers = recorded_servers(log_dir)
    except ValueError as exc:
        say(f"{state_file} is not what `up` writes ({exc}); stop its engines by hand")
        return ExitCode.ERROR
    survivors = []
    for server in reversed(servers.values()):
        say(f"stopping {server.name} (process group {server.group.pgid})")
        try:
            supervisor.stop(server.group, timeout_s)
        except supervisor.SupervisorError as exc:
            say(f"{exc}")
            survivors.append(server.name)
    if survivors:  # the state file stays for another try
        say(f"{', '.join(survivors)} could not be stopped")
        return ExitCode.ERROR
    state_file.unlink()
    return ExitCode.CLEAN
