"""The one process supervisor (``afd_models.supervisor``): groups started, waited for, signalled
and stopped with whatever they started; and no other module starting or signalling a process
group."""

from __future__ import annotations

import ast
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from afd_models import supervisor

REPO = Path(__file__).resolve().parents[2]
#: a leader that starts a child of its own (in its group) and prints the child's pid, then waits
LEADER_WITH_CHILD = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)
#: names whose use starts or signals a process group
GROUP_CALLS = frozenset({"killpg", "setsid", "setpgid", "setpgrp"})
GROUP_KEYWORDS = frozenset({"start_new_session", "preexec_fn", "process_group"})


def _leader(tmp_path: Path, code: str = LEADER_WITH_CHILD) -> supervisor.Group:
    return supervisor.launch("leader", [sys.executable, "-c", code], tmp_path / "leader.log")


def _child_pid(group: supervisor.Group) -> int:
    deadline = time.monotonic() + 60
    while not group.log.read_text().strip():
        assert time.monotonic() < deadline, "the leader never printed its child's pid"
        time.sleep(0.05)
    return int(group.log.read_text().split()[0])


def test_stop_ends_the_leader_and_what_it_started(tmp_path: Path) -> None:
    """SIGTERM reaches every member; the leader's exit code comes back; nothing is left."""
    group = _leader(tmp_path)
    child = _child_pid(group)
    assert group.alive() and child in supervisor.members(group.pgid)
    assert supervisor.stop(group, timeout_s=10) == -signal.SIGTERM
    assert not group.alive() and supervisor.members(group.pgid) == []


def test_an_attached_group_is_alive_while_a_member_runs_and_stops_the_same(
    tmp_path: Path,
) -> None:
    """A group known only by its id (``deploy up --detach``'s record): alive while any member
    runs, stopped whole, its exit code unknown."""
    started = _leader(tmp_path)
    _child_pid(started)
    attached = supervisor.attach("recorded", started.pgid, started.log)
    assert attached.alive() and attached.returncode is None
    assert supervisor.stop(attached, timeout_s=10) is None
    assert not attached.alive()
    assert started.process is not None and started.process.wait(10) == -signal.SIGTERM


def test_kill_ends_a_group_that_ignores_sigterm(tmp_path: Path) -> None:
    """A leader that ignores SIGTERM is killed after the stop's timeout."""
    stubborn = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint(1, flush=True)\ntime.sleep(600)\n"
    group = _leader(tmp_path, stubborn)
    _child_pid(group)
    began = time.monotonic()
    assert supervisor.stop(group, timeout_s=1) == -signal.SIGKILL
    assert time.monotonic() - began < 10 and not supervisor.members(group.pgid)


def test_wait_ready_names_a_group_that_exits_while_starting(tmp_path: Path) -> None:
    group = _leader(tmp_path, "print('broken config', flush=True); raise SystemExit(3)")
    with pytest.raises(supervisor.SupervisorError, match="leader exited with 3 while starting"):
        supervisor.wait_ready([group], lambda _: False, timeout_s=60)
    assert "broken config" in group.log_tail()


def test_wait_ready_reports_progress_and_names_what_it_still_waits_for(tmp_path: Path) -> None:
    """Progress lines name the groups still starting; the deadline's error names them and what
    was waited for."""
    group = _leader(tmp_path)
    lines: list[str] = []
    try:
        with pytest.raises(
            supervisor.SupervisorError, match=r"leader not ready \(health\) within 2 s"
        ):
            supervisor.wait_ready(
                [group],
                lambda _: False,
                timeout_s=2,
                what="ready (health)",
                progress=lines.append,
                progress_every_s=0.6,
            )
    finally:
        supervisor.kill(group)
    assert lines and all("waiting for leader to be ready (health)" in line for line in lines)


def test_wait_ready_returns_once_each_is_ready_and_stops_on_request(tmp_path: Path) -> None:
    group = _leader(tmp_path)
    ready: list[str] = []
    try:
        supervisor.wait_ready(
            [group],
            lambda g: bool(g.log_tail().strip()),
            60,
            on_ready=lambda g: ready.append(g.name),
        )
        assert ready == ["leader"]
        stop = threading.Event()
        stop.set()
        with pytest.raises(supervisor.SupervisorError, match="stopped while waiting for leader"):
            supervisor.wait_ready([group], lambda _: False, 60, stop_event=stop)
    finally:
        supervisor.kill(group)


def _group_uses(path: Path) -> list[str]:
    """Where ``path`` starts or signals a process group: ``os.killpg`` and friends, or
    ``start_new_session=`` and friends on a call."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in GROUP_CALLS:
            found.append(f"{node.lineno}: {node.attr}")
        elif isinstance(node, ast.Name) and node.id in GROUP_CALLS:
            found.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.keyword) and node.arg in GROUP_KEYWORDS:
            found.append(f"{node.value.lineno}: {node.arg}=")
    return found


def test_no_other_module_starts_or_signals_a_process_group() -> None:
    """The runtime, the tools, the benchmarks, the tests and the noxfile go through
    ``afd_models.supervisor``."""
    sources = [REPO / "noxfile.py"]
    for top in ("afd_models", "codegen", "tools", "benchmarks", "tests"):
        sources += [p for p in (REPO / top).rglob("*.py") if "_generated" not in p.parts]
    found = [
        f"{path.relative_to(REPO)}:{use}"
        for path in sorted(sources)
        if path != REPO / "afd_models" / "supervisor.py"
        for use in _group_uses(path)
    ]
    assert not found, "process groups outside afd_models/supervisor.py:\n" + "\n".join(found)


def test_the_rule_sees_each_kind_of_use(tmp_path: Path) -> None:
    """Each spelling the rule looks for is found (the rule itself can fail)."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os, subprocess\nfrom os import killpg\n"
        "os.killpg(1, 9)\nkillpg(1, 9)\nos.setsid()\n"
        "subprocess.Popen(['x'], start_new_session=True)\n"
        "subprocess.Popen(['x'], preexec_fn=os.setpgrp)\n"
    )
    assert len(_group_uses(sample)) == 6, _group_uses(sample)
