"""Process groups on this machine: start one, wait until it is ready, signal and stop it.

Every engine the operator commands, the demo, the benchmarks, the checks and the tests start runs
in a process group of its own (a new session), so that stopping it stops what it started too:
vLLM's EngineCore, its workers, Inductor's compile workers. This is the one module that starts
or signals a process group (``tests/unit/test_import_graph.py`` holds every other module to it).
Every wait has a deadline and says what it waits for. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: seconds a group may take to go after SIGKILL
KILL_TIMEOUT_S = 15.0


class SupervisorError(RuntimeError):
    """A process group did not start, get ready or stop in time; the message says which."""


@dataclass
class Group:
    """One process group: the process that leads it (started here), or only its id (a group
    another command started and recorded, such as ``deploy up --detach``)."""

    name: str
    #: the group's id: its leader's pid
    pgid: int
    #: where its output goes
    log: Path
    #: the leader, when this process started it
    process: subprocess.Popen[bytes] | None = None
    started: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        """The leader runs (a started group), or any member does (an attached one)."""
        if self.process is not None:
            return self.process.poll() is None
        return bool(members(self.pgid))

    @property
    def returncode(self) -> int | None:
        """The leader's exit code once it ended (None while it runs, or for an attached group)."""
        return None if self.process is None else self.process.poll()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def launch(
    name: str,
    argv: Sequence[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdin: int | None = subprocess.DEVNULL,
    stdout: Path | None = None,
) -> Group:
    """Run ``argv`` as the leader of a new process group, its output in ``log`` (its standard
    output in ``stdout`` instead, when given); ``env`` is the whole environment (None: this
    process's)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as files:
        errors = files.enter_context(log.open("wb"))
        output = errors if stdout is None else files.enter_context(stdout.open("wb"))
        process = subprocess.Popen(
            list(argv),
            stdin=stdin,
            stdout=output,
            stderr=errors if stdout is not None else subprocess.STDOUT,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    return Group(name, process.pid, log, process)


def attach(name: str, pgid: int, log: Path) -> Group:
    """A group another command started, known by its id (``deploy up --detach`` records them)."""
    return Group(name, pgid, log)


def members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``, from /proc (Linux).

    Zombies are left out: a container's init may reap orphans late, and a zombie runs nothing.
    """
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def send(group: Group, sig: signal.Signals) -> bool:
    """Send ``sig`` to every process of the group; False when none was left."""
    try:
        os.killpg(group.pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id was reused by another user's processes: ours are gone
        return False
    return True


def _gone(group: Group, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` until the leader (reaped, when started here) and every member
    are gone."""
    deadline = time.monotonic() + timeout_s
    if group.process is not None:
        try:
            group.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
    while members(group.pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def kill(group: Group) -> None:
    """SIGKILL everything in the group and wait until it is gone.

    Raises:
        SupervisorError: something of the group survived SIGKILL for :data:`KILL_TIMEOUT_S`.
    """
    send(group, signal.SIGKILL)
    if not _gone(group, KILL_TIMEOUT_S):
        raise SupervisorError(
            f"{group.name} (process group {group.pgid}): processes {members(group.pgid)} "
            "survived SIGKILL"
        )


def stop(group: Group, timeout_s: float = 30.0, sig: signal.Signals = signal.SIGTERM) -> int | None:
    """``sig`` (SIGTERM: a graceful stop) to the group, then SIGKILL to what is left after
    ``timeout_s``; the leader's exit code (None for an attached group)."""
    if send(group, sig):
        _gone(group, timeout_s)
    kill(group)
    return group.returncode


def wait_ready(
    groups: Sequence[Group],
    is_ready: Callable[[Group], bool],
    timeout_s: float,
    *,
    what: str = "ready",
    on_ready: Callable[[Group], None] | None = None,
    progress: Callable[[str], None] | None = None,
    progress_every_s: float = 30.0,
    stop_event: threading.Event | None = None,
) -> None:
    """Until ``is_ready`` holds for every group; raise when one exits first, when ``stop_event``
    is set, or at the deadline (naming the groups still waited for and the end of the first
    one's log). ``on_ready`` hears of each group as it gets ready, ``progress`` every
    ``progress_every_s`` names those still starting.

    Raises:
        SupervisorError: as above.
    """
    began = time.monotonic()
    deadline, next_progress = began + timeout_s, began + progress_every_s
    pending = list(groups)
    while pending:
        if stop_event is not None and stop_event.is_set():
            raise SupervisorError(f"stopped while waiting for {_names(pending)} to be {what}")
        for group in list(pending):
            if not group.alive():
                raise SupervisorError(
                    f"{group.name} exited with {group.returncode} while starting:\n"
                    f"{group.log_tail()}"
                )
            if is_ready(group):
                pending.remove(group)
                if on_ready is not None:
                    on_ready(group)
        now = time.monotonic()
        if pending and now > deadline:
            raise SupervisorError(
                f"{_names(pending)} not {what} within {timeout_s:.0f} s; the last lines of "
                f"{pending[0].name}'s log:\n{pending[0].log_tail()}"
            )
        if pending and progress is not None and now >= next_progress:
            progress(f"waiting for {_names(pending)} to be {what} ({now - began:.0f} s)")
            next_progress = now + progress_every_s
        if pending:
            if stop_event is not None:
                stop_event.wait(0.5)
            else:
                time.sleep(0.5)


def _names(groups: Sequence[Group]) -> str:
    return ", ".join(g.name for g in groups)
