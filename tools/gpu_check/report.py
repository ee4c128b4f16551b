"""The GPU check's report: what ran or why not, per mode and for the NCCL pair; the readable table
and the JSON."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from afd_models.commandline import ExitCode
from tools.gpu_check.modes import COMMON_ENGINE_ARGS, EXCHANGE_IN_GRAPH, Mode, mode_named
from tools.gpu_check.verdict import PairResult
from tools.harness.results import MAX_TOKENS, PROMPTS, TIMED_REPEATS

FORMAT = "afd-gpu-check/1"


class ModeStatus(str, enum.Enum):
    RAN = "ran"
    #: the mode runs in the NCCL pair only (its runs are the NCCL pair's)
    NCCL_ONLY = "NCCL pair only"
    NOT_SELECTED = "not selected"
    #: the host's vLLM is older than the mode's runner needs
    NEEDS_NEWER_VLLM = "needs a newer vLLM"
    #: not reached yet: only in a report written while the check runs
    PENDING = "not run yet"
    #: its runs would not have finished before ``--deadline``
    DEADLINE = "left out by --deadline"


class NcclStatus(str, enum.Enum):
    RAN = "ran"
    SKIPPED = "skipped"
    #: not reached yet: only in a report written while the check runs
    PENDING = "not run yet"


@dataclass(frozen=True)
class HostInfo:
    """What the probe process found (the engines' interpreter and environment)."""

    python: str
    torch: str
    cuda: str | None
    vllm: str
    #: ``torch.cuda.get_device_name(i)`` of each visible device
    devices: tuple[str, ...]
    #: the ``CUDA_VISIBLE_DEVICES`` entry of each visible device
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class ModeReport:
    mode: Mode
    status: ModeStatus
    #: why it did not run; for a mode that ran, the gate placements ``--deadline`` left out
    reason: str = ""
    #: in run order
    runs: tuple[PairResult, ...] = ()


@dataclass(frozen=True)
class NcclReport:
    status: NcclStatus
    #: why it was skipped, or the runs ``--deadline`` left out
    reason: str = ""
    runs: tuple[PairResult, ...] = ()


@dataclass(frozen=True)
class Report:
    date: str
    host: HostInfo
    #: every mode, in run priority (``modes.PRIORITY``)
    modes: tuple[ModeReport, ...]
    nccl: NcclReport
    work_dir: str
    #: False in the reports written while the check runs (a run cut off leaves the last one)
    finished: bool = True
    #: seconds since the command started, when the report was made
    elapsed_s: float = 0.0
    #: ``--deadline``, None without one
    deadline_s: float | None = None

    def runs(self) -> list[PairResult]:
        return [run for mode in self.modes for run in mode.runs] + list(self.nccl.runs)

    def exit_code(self) -> ExitCode:
        """CLEAN when every run that ran passed (and one ran), else BLOCK."""
        runs = self.runs()
        return ExitCode.CLEAN if runs and all(run.passed for run in runs) else ExitCode.BLOCK

    def summary(self) -> str:
        runs = self.runs()
        passed = sum(run.passed for run in runs)
        parts = [f"{passed} passed", f"{len(runs) - passed} failed"]
        older = [m.mode.name for m in self.modes if m.status is ModeStatus.NEEDS_NEWER_VLLM]
        if older:
            parts.append(f"not run (vLLM {self.host.vllm} too old): {', '.join(older)}")
        late = [m.mode.name for m in self.modes if m.status is ModeStatus.DEADLINE]
        late += [f"{m.mode.name} ({m.reason})" for m in self.modes if m.runs and m.reason]
        if self.nccl.status is NcclStatus.RAN and self.nccl.reason:
            late.append(f"NCCL pair ({self.nccl.reason})")
        if late:
            parts.append(f"left out by --deadline: {', '.join(late)}")
        if self.nccl.status is NcclStatus.SKIPPED:
            nccl_only = [m.mode.name for m in self.modes if m.status is ModeStatus.NCCL_ONLY]
            if nccl_only:
                parts.append(f"not run (NCCL pair only): {', '.join(nccl_only)}")
            parts.append(f"skipped: NCCL pair ({self.nccl.reason})")
        return f"gpu_check: {'; '.join(parts)}; exit {self.exit_code():d}"

    def as_dict(self) -> dict[str, Any]:
        modes = []
        for report in self.modes:
            entry: dict[str, Any] = {
                "mode": report.mode.name,
                "model_runner": report.mode.runner.value,
                "status": report.status.value,
                "expected_engine_s": report.mode.expected_s,
            }
            if report.status is ModeStatus.RAN:
                entry["engine_args"] = report.mode.llm_args()
                entry["runs"] = [run.as_dict() for run in report.runs]
            if report.status is not ModeStatus.RAN or report.reason:
                entry["reason"] = report.reason
            modes.append(entry)
        return {
            "format": FORMAT,
            "date": self.date,
            "finished": self.finished,
            "elapsed_s": round(self.elapsed_s, 1),
            "deadline_s": self.deadline_s,
            "versions": {
                "python": self.host.python,
                "torch": self.host.torch,
                "cuda": self.host.cuda,
                "vllm": self.host.vllm,
            },
            "device": {
                "name": self.host.devices[0] if self.host.devices else None,
                "count": len(self.host.devices),
                "all": list(self.host.devices),
            },
            "settings": {
                "prompts": list(PROMPTS),
                "max_tokens": MAX_TOKENS,
                "timed_repeats": TIMED_REPEATS,
                **COMMON_ENGINE_ARGS,
            },
            "modes": modes,
            "nccl": {
                "status": self.nccl.status.value,
                "reason": self.nccl.reason,
                "runs": [run.as_dict() for run in self.nccl.runs],
            },
            "work_dir": self.work_dir,
            "passed": sum(run.passed for run in self.runs()),
            "failed": sum(not run.passed for run in self.runs()),
            "exit_code": int(self.exit_code()),
        }


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def latency_text(mode: Mode, run: PairResult) -> str:
    if mode.exchange_in_graph:
        return EXCHANGE_IN_GRAPH
    latency = run.afd.exchange_latency_s
    return "-" if latency is None else f"{latency * 1e6:.1f} us"


COLUMNS = (
    "gate",
    "tokens",
    "AFD tok/s",
    "native tok/s",
    "ratio",
    "captures/replays",
    "ubatch splits",
    "exchange latency",
    "result",
)


def _rows(mode: Mode, runs: Sequence[PairResult]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for run in runs:
        counters = run.afd.counters
        rows.append(
            (
                run.gate.value,
                "equal" if run.tokens_equal else "DIFFER",
                _number(run.afd.tokens_per_s, ",.1f"),
                _number(run.native.tokens_per_s, ",.1f"),
                _number(run.ratio, ".2f"),
                "-" if counters is None else f"{counters.graph_captures}/{counters.graph_replays}",
                "-" if counters is None else str(counters.ubatch_splits),
                latency_text(mode, run),
                "PASS" if run.passed else "FAIL",
            )
        )
    return rows


def table(mode: Mode, runs: Sequence[PairResult]) -> list[str]:
    rows = [COLUMNS, *_rows(mode, runs)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
    ]
    for run in runs:
        lines += [f"    {run.gate.value}: {problem}" for problem in run.problems]
        cost = run.afd.runner_cost
        if cost is not None:
            lines.append(
                f"    {run.gate.value}: vLLM's runner, which the AFD worker builds and replaces: "
                + (
                    f"{cost['seconds'] * 1e3:.1f} ms, {cost['allocated_bytes'] / 2**20:.1f} MiB "
                    "allocated on the device"
                    if "error" not in cost
                    else f"not measured ({cost['error']})"
                )
            )
    return lines


def render(report: Report) -> str:
    """The readable report."""
    host = report.host
    lines = [
        f"AFD GPU check, {report.date}",
        f"  device: {', '.join(host.devices) or 'none'}; torch {host.torch} (CUDA {host.cuda}), "
        f"vLLM {host.vllm}, Python {host.python}",
        f"  {len(PROMPTS)} prompts x {MAX_TOKENS} tokens, greedy, ignore_eos; tok/s: median of "
        f"{TIMED_REPEATS} timed generates after a warm-up; exchange latency: host time from a "
        "layer's send to its receive",
    ]
    for entry in report.modes:
        mode = entry.mode
        if entry.status is not ModeStatus.RAN:
            lines.append(f"\n== {mode.name}: {entry.status.value}: {entry.reason}")
            continue
        lines.append(
            f"\n== {mode.name} ({json.dumps(mode.llm_args())}), model runner {mode.runner.value}, "
            "loopback connector"
        )
        lines += table(mode, entry.runs)
        if entry.reason:
            lines.append(f"    left out by --deadline: {entry.reason}")
    nccl = report.nccl
    if nccl.status is NcclStatus.SKIPPED:
        lines.append(f"\n== NCCL pair (two processes): SKIPPED: {nccl.reason}")
    elif nccl.reason:
        lines.append(f"\n== NCCL pair (two processes): left out by --deadline: {nccl.reason}")
    for name in sorted({run.mode for run in nccl.runs}):
        mode = mode_named(name)
        lines.append(f"\n== NCCL pair, {name}: FFN engine on the 2nd device, Attention on the 1st")
        lines += table(mode, [run for run in nccl.runs if run.mode == name])
    lines += ["", f"logs: {report.work_dir}", report.summary()]
    return "\n".join(lines)
