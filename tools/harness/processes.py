"""Engine processes seen from the parent: each a fresh interpreter in a session of its own, running
one internal command of a check's child module, bounded in time and killed with whatever it
started."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from afd_models import supervisor
from tools.harness.cli import log
from tools.harness.results import EngineResult, EngineSpec

#: the checkout, whose ``tools`` package every child imports
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Children:
    """How one check starts its processes."""

    #: the module ``python -m`` runs in each child, with an internal command and a path
    module: str
    #: the tag of the check's progress lines
    tag: str

    def log(self, message: str) -> None:
        log(self.tag, message)


def visible_device_ids(visible_devices: str | None, count: int) -> tuple[str, ...]:
    """The ``*_VISIBLE_DEVICES`` entry naming each of the ``count`` visible devices."""
    if visible_devices is None or not visible_devices.strip():
        return tuple(str(i) for i in range(count))
    return tuple(part.strip() for part in visible_devices.split(",") if part.strip())[:count]


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the checkout on ``PYTHONPATH`` (last, unless it names it already): a child
    imports its module from this checkout, and the environment's own entries (the checkout first
    in a real run, fake packages first in the unit tests) decide everything else. Entries are
    made absolute here: the child runs in another directory (:func:`spawn`)."""
    paths = [str(Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in paths:
        paths.append(str(REPO_ROOT))
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


def spawn(
    children: Children,
    command: str,
    path: Path,
    env: Mapping[str, str],
    log_path: Path,
    stdin: int | None = None,
) -> supervisor.Group:
    """``python -m <children.module> command path`` in a fresh interpreter, in a process group of
    its own, run in the directory of its log (``-m`` puts that first on ``sys.path``, not the
    checkout, so ``PYTHONPATH`` orders the imports), its output in ``log_path``."""
    return supervisor.launch(
        f"{children.tag} {command}",
        [sys.executable, "-m", children.module, command, str(path)],
        log_path,
        env=child_env(env),
        cwd=log_path.parent,
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
    )


def kill(group: supervisor.Group) -> None:
    """Kill the process and whatever it started that is still running (its own group, also
    after the process itself exited: vLLM's compile workers, say); a check goes on even when
    something survived, naming it."""
    try:
        supervisor.kill(group)
    except supervisor.SupervisorError as exc:
        log("harness", str(exc))


def tail(path: Path, lines: int = 40) -> str:
    """The end of a log file."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_internal(
    children: Children,
    command: str,
    arg: Path,
    env: Mapping[str, str],
    log_path: Path,
    timeout_s: float,
) -> int:
    """Run an internal command in a fresh interpreter; its exit status (-1: killed after
    ``timeout_s``)."""
    group = spawn(children, command, arg, env, log_path)
    assert group.process is not None
    try:
        return group.process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        kill(group)
        return -1


class EngineProcess:
    """One engine process: spec and result files, log, start time."""

    def __init__(self, spec: EngineSpec, directory: Path, children: Children):
        directory.mkdir(parents=True, exist_ok=True)
        self.spec = spec
        #: the check whose ``_engine`` command runs the engine
        self.children = children
        self.spec_path = directory / f"{spec.name}.spec.json"
        self.result_path = directory / f"{spec.name}.result.json"
        self.log_path = directory / f"{spec.name}.log"
        self.result_path.unlink(missing_ok=True)
        payload = {**dataclasses.asdict(spec), "result_path": str(self.result_path)}
        self.spec_path.write_text(json.dumps(payload, indent=2))
        self.group: supervisor.Group | None = None
        self.started = 0.0

    def start(self, env: Mapping[str, str], stdin: int | None = None) -> supervisor.Group:
        pinned = ", ".join(f"{k}={v}" for k, v in env.items() if k.endswith("_VISIBLE_DEVICES"))
        self.children.log(
            f"start {self.spec.name} ({pinned or 'all devices'}), log {self.log_path}"
        )
        self.started = time.monotonic()
        self.group = spawn(self.children, "_engine", self.spec_path, env, self.log_path, stdin)
        return self.group

    def has_result(self) -> bool:
        return self.result_path.exists()

    def result(self, timed_out: bool = False) -> EngineResult:
        wall = time.monotonic() - self.started
        name, log_text = self.spec.name, str(self.log_path)
        if self.has_result():
            data = json.loads(self.result_path.read_text())
            result = EngineResult.from_child(name, data, wall_s=wall, log=log_text)
            rate = "-" if result.tokens_per_s is None else f"{result.tokens_per_s:,.1f}"
            self.children.log(
                f"{name}: done in {wall:.1f} s (start-up {result.startup_s:.1f} s, {rate} tok/s)"
            )
            return result
        returncode = None if self.group is None else self.group.returncode
        why = f"timed out after {wall:.0f} s" if timed_out else f"exited with {returncode}"
        self.children.log(f"{name}: FAILED, {why}; log {self.log_path}")
        error = f"{why} without a result; end of {self.log_path}:\n{tail(self.log_path)}"
        return EngineResult(name, ok=False, error=error, wall_s=wall, log=log_text)


def run_engine(
    spec: EngineSpec,
    env: Mapping[str, str],
    directory: Path,
    timeout_s: float,
    children: Children,
) -> EngineResult:
    """Run one engine (the ``_engine`` command of ``children``) in a fresh interpreter, bounded by
    ``timeout_s``; its spec, result and log go to ``directory``."""
    engine = EngineProcess(spec, directory, children)
    group = engine.start(env)
    assert group.process is not None
    timed_out = False
    try:
        group.process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:  # also when the command itself is stopped: no engine is left holding a device
        kill(group)
    return engine.result(timed_out and not engine.has_result())
