"""The check's runs in order, most valuable first, within a deadline, with a report after each.

The order (:func:`run_order`): the modes by :data:`~tools.gpu_check.modes.PRIORITY` with the gate
on the FFN role, then again with the gate on attention; the NCCL pair (two devices) last, in the
same order. A mode's native engine runs once, before its first AFD run. Before each run the
check asks whether it is expected to finish before ``--deadline`` (the mode's ``expected_s`` per
engine still to run) and leaves it out if not; a run that started is never cut. After each run
``on_progress`` gets the report so far, so a check stopped from outside leaves every finished run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol

from afd_models.release_order import release_key
from tools.gpu_check import runs
from tools.gpu_check.modes import GATE_ORDER, MODES, PRIORITY, Gate, Mode
from tools.gpu_check.report import ModeReport, ModeStatus, NcclReport, NcclStatus, Report
from tools.gpu_check.runs import CHILDREN, Setup
from tools.gpu_check.verdict import PairResult
from tools.harness.results import EngineResult


class Runner(Protocol):
    """What runs the engines: :mod:`tools.gpu_check.runs`, or the unit tests' fakes."""

    def run_native(self, mode: Mode, setup: Setup) -> EngineResult: ...

    def run_pair(
        self, mode: Mode, gate: Gate, setup: Setup, native: EngineResult
    ) -> PairResult: ...

    def run_nccl_pair(
        self, mode: Mode, gate: Gate, setup: Setup, native: EngineResult
    ) -> PairResult: ...


@dataclass(frozen=True)
class Step:
    """One AFD run: a mode and a gate placement."""

    mode: Mode
    gate: Gate

    def expected_s(self, native_done: bool) -> float:
        """Seconds on an H100: the AFD engine, and the native one if it has not run yet (the
        two engines of an NCCL pair run at once)."""
        return self.mode.expected_s * (1 if native_done else 2)

    def label(self) -> str:
        return f"{self.mode.name}, gate on {self.gate.value}"


def run_order(modes: Sequence[Mode], gates: Sequence[Gate]) -> tuple[Step, ...]:
    """``modes`` by priority, once per gate of ``gates`` in :data:`GATE_ORDER`."""
    ordered = sorted(modes, key=lambda mode: PRIORITY.index(mode.name))
    return tuple(Step(mode, gate) for gate in GATE_ORDER if gate in gates for mode in ordered)


@dataclass(frozen=True)
class Deadline:
    """``--deadline``: seconds from the command's start; None: no deadline."""

    seconds: float | None
    #: ``clock()`` when the command started
    started: float
    clock: Callable[[], float] = time.monotonic

    def elapsed(self) -> float:
        return self.clock() - self.started

    def left(self) -> float | None:
        return None if self.seconds is None else self.seconds - self.elapsed()

    def fits(self, expected_s: float) -> bool:
        left = self.left()
        return left is None or expected_s <= left

    def why_not(self, expected_s: float) -> str:
        return f"expected {expected_s:.0f} s, {self.left() or 0:.0f} s left"


def needs_newer_vllm(mode: Mode, vllm_version: str) -> str | None:
    """Why ``mode`` cannot run with the host's vLLM (its runner came later), None if it can."""
    since = mode.runner.since
    if since is None or release_key(vllm_version) >= release_key(since):
        return None
    return (
        f"the AFD Attention role runs on Model Runner {mode.runner.value.upper()} from vLLM "
        f"{since}; this host has vLLM {vllm_version}"
    )


def _joined(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def check(
    modes: Sequence[Mode],
    gates: Sequence[Gate],
    setup: Setup,
    *,
    nccl: bool = True,
    deadline: Deadline | None = None,
    runner: Runner | None = None,
    on_progress: Callable[[Report], None] = lambda report: None,
) -> Report:
    """Run the selected ``modes`` and ``gates`` in :func:`run_order` (and the NCCL pair when
    ``nccl`` and two devices are visible) within ``deadline``; the final report.

    ``runner`` runs the engines (:mod:`tools.gpu_check.runs` by default; the unit tests pass
    fakes); ``on_progress`` gets the report after each run.
    """
    engines: Runner = runs if runner is None else runner
    deadline = deadline or Deadline(None, time.monotonic())
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    too_old = {m.name: why for m in modes if (why := needs_newer_vllm(m, setup.host.vllm))}
    nccl_modes = [m for m in modes if m.nccl and m.name not in too_old]
    nccl_skipped = ""
    if not nccl:
        nccl_skipped = "--skip-nccl"
    elif len(setup.host.device_ids) < 2:
        nccl_skipped = (
            f"needs two CUDA devices, found {len(setup.host.device_ids)}: NCCL cannot put two "
            "ranks of one communicator on one GPU"
        )
    elif not nccl_modes:
        runs_it = ", ".join(m.name for m in MODES if m.nccl)
        nccl_skipped = f"no selected mode runs it ({runs_it} do)"
    entries: dict[str, ModeReport] = {}
    for mode in MODES:
        if mode not in modes:
            entries[mode.name] = ModeReport(mode, ModeStatus.NOT_SELECTED, "left out by --only")
        elif mode.name in too_old:
            entries[mode.name] = ModeReport(mode, ModeStatus.NEEDS_NEWER_VLLM, too_old[mode.name])
        elif mode.no_loopback is not None:
            skipped = f"the NCCL pair is skipped: {nccl_skipped}" if nccl_skipped else ""
            reason = _joined(mode.no_loopback, skipped)
            entries[mode.name] = ModeReport(mode, ModeStatus.NCCL_ONLY, reason)
        else:
            entries[mode.name] = ModeReport(mode, ModeStatus.PENDING)
    nccl_report = (
        NcclReport(NcclStatus.SKIPPED, nccl_skipped)
        if nccl_skipped
        else NcclReport(NcclStatus.PENDING)
    )

    def report(finished: bool = False) -> Report:
        ordered = tuple(entries[name] for name in PRIORITY)  # the most valuable first
        return Report(
            date,
            setup.host,
            ordered,
            nccl_report,
            str(setup.work_dir),
            finished=finished,
            elapsed_s=deadline.elapsed(),
            deadline_s=deadline.seconds,
        )

    natives: dict[str, EngineResult] = {}

    def native(mode: Mode) -> EngineResult:
        if mode.name not in natives:
            natives[mode.name] = engines.run_native(mode, setup)
        return natives[mode.name]

    loopback = [m for m in modes if entries[m.name].status is ModeStatus.PENDING]
    for step in run_order(loopback, gates):
        entry = entries[step.mode.name]
        expected = step.expected_s(step.mode.name in natives)
        if not deadline.fits(expected):
            why = deadline.why_not(expected)
            CHILDREN.log(f"left out by --deadline: {step.label()}: {why}")
            status = ModeStatus.RAN if entry.runs else ModeStatus.DEADLINE
            reason = _joined(entry.reason, f"gate on {step.gate.value}: {why}")
            entries[step.mode.name] = dataclasses.replace(entry, status=status, reason=reason)
            continue
        pair = engines.run_pair(step.mode, step.gate, setup, native(step.mode))
        CHILDREN.log(f"{step.label()}: {'PASS' if pair.passed else 'FAIL'}")
        entries[step.mode.name] = dataclasses.replace(
            entry, status=ModeStatus.RAN, runs=(*entry.runs, pair)
        )
        on_progress(report())
    if not nccl_skipped:
        done: list[PairResult] = []
        late = ""
        for step in run_order(nccl_modes, gates):
            expected = step.expected_s(step.mode.name in natives)
            if not deadline.fits(expected):
                late = _joined(late, f"{step.label()}: {deadline.why_not(expected)}")
                continue
            done.append(engines.run_nccl_pair(step.mode, step.gate, setup, native(step.mode)))
            nccl_report = NcclReport(NcclStatus.PENDING, late, tuple(done))
            on_progress(report())
        nccl_report = (
            NcclReport(NcclStatus.RAN, late, tuple(done))
            if done
            else NcclReport(NcclStatus.SKIPPED, f"left out by --deadline: {late}")
        )
    return report(finished=True)
