#!/usr/bin/env python3
"""Check the AFD CUDA runtime against native vLLM 0.26.0 on this GPU host, and report.

    python tools/gpu_check.py                          # vLLM 0.26.0 (CUDA) already importable
    python tools/gpu_check.py --bundle DIR             # install tools/gpu_bundle.py's parts first
    python tools/gpu_check.py --only eager --gate ffn --json out.json

Run from the repository root, with ``afd_models/_generated`` present (``nox -s regenerate``
writes it; carry it with the working tree). For each mode of :data:`MODES` and each gate
placement it runs native vLLM and the AFD Attention worker with the in-process loopback connector
on GPU 0 (the first visible device), every engine in a fresh interpreter, and checks: equal
greedy tokens, the worker's graph and micro-batch counters against the mode (a graph mode whose
graphs never replayed tested nothing: a failure), that the exchange ran, and that the in-process
FFN weights count in vLLM's memory budget. It measures tokens/s of both engines (same prompts,
``max_tokens``, ``ignore_eos``, greedy; timed after one warm-up generate) and the connector's
round trip. With two or more CUDA devices it also runs the two-process NCCL path (FFN engine on
the second device, Attention on the first); with one it says so and skips it (a skip, not a pass).
DBO (``additional_config.afd.dbo``) runs in the NCCL pair only: an in-process FFN half would
compute inside vLLM's micro-batch threads, which vLLM's MoE kernels refuse.

Exit codes: 0 every run that ran passed; 1 a comparison or counter check failed; 2 bad usage, or a
host that cannot run the check (no vLLM and no ``--bundle``, no CUDA device, stale generated code);
3 the script itself crashed.

Only the standard library is imported here; torch and vLLM are imported by the engine processes,
which run this file again with an internal command (``_probe``, ``_model``, ``_engine``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import enum
import importlib.util
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
REPO_ROOT = SCRIPT.parent.parent
FORMAT = "afd-gpu-check/1"
VLLM_VERSION = "0.26.0"

PROMPTS = ("Hello world, the license", "Once upon a time", "The experts of layer")
MAX_TOKENS = 32
#: timed ``generate`` calls after the warm-up one; tokens/s uses their median
TIMED_REPEATS = 3
#: engine arguments every engine gets, native and AFD alike
COMMON_ENGINE_ARGS: Mapping[str, Any] = {
    "dtype": "float32",
    "max_model_len": 256,
    # bounds the CUDA-graph capture sizes (vLLM captures up to 2 x max_num_seqs), so capture is quick
    "max_num_seqs": 8,
    "seed": 0,
    "gpu_memory_utilization": 0.3,
}
#: environment of every engine process
ENGINE_ENV: Mapping[str, str] = {
    "VLLM_MLA_DISABLE": "1",
    # the engine core in the LLM's own process: collective_rpc calls the worker directly
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # AFD's runners derive from vLLM's V1 runner; the native engine uses it too, for comparability
    "VLLM_USE_V2_MODEL_RUNNER": "0",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    # the AFD Attention worker refuses vLLM's breakable graph wrapper (it announces no AFD step)
    "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
}
ATTENTION_WORKER = "afd_models.workers.AFDAttentionWorker"
FFN_WORKER = "afd_models.workers.AFDFFNWorker"
NATIVE_CLASSES = "Worker/GPUModelRunner"
ATTENTION_CLASSES = "AFDAttentionWorker/AFDAttentionGPUModelRunner"
FFN_CLASSES = "AFDFFNWorker/AFDFFNGPUModelRunner"
LOOPBACK = "LoopbackAFDConnector"
NCCL = "NcclAFDConnector"
#: the counters ``collective_rpc("afd_counters")`` returns
COUNTER_KEYS = ("graph_captures", "graph_replays", "ubatch_splits")
#: seconds an Attention engine of the NCCL pair waits for its FFN peer, and for any transfer
NCCL_CONNECT_TIMEOUT_S = 240
NCCL_TIMEOUT_S = 60
#: seconds an engine process waits for the parent's go-ahead to exit (NCCL pair only)
HOLD_S = 180
EXCHANGE_IN_GRAPH = "n/a (inside the graph)"


def log(message: str, script: Path = SCRIPT) -> None:
    """Progress on stderr, tagged with the check script (tools/npu_check.py shares this module)."""
    tag = script.stem.replace("_", "-")
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class UsageError(Exception):
    """Bad arguments, or a host that cannot run the check; the message says what to pass or fix."""


# --------------------------------------------------------------------------- modes


class Expect(str, enum.Enum):
    """What a counter must be after a run of a mode."""

    ZERO = "must be 0"
    POSITIVE = "must be > 0"
    ANY = "reported only"


@dataclass(frozen=True)
class Mode:
    """One way of running the engines; native and AFD get the same engine arguments."""

    #: the name ``--only`` takes
    name: str
    #: ``LLM(...)`` arguments of the mode (JSON values)
    engine_args: Mapping[str, Any]
    #: ``graph_captures`` and ``graph_replays``
    graphs: Expect
    #: ``ubatch_splits``
    ubatch_splits: Expect
    #: Python does not run the exchange at graph replay, so its round trip is not measured
    exchange_in_graph: bool = False
    #: whether the engines compile (else Dynamo is off, so vLLM's lazily compiled helpers run plain)
    compiled: bool = True
    #: also run the two-process NCCL pair in this mode (needs two CUDA devices)
    nccl: bool = False
    #: keys of the AFD Attention engine's ``additional_config.afd`` section in this mode
    afd: Mapping[str, Any] = field(default_factory=dict)
    #: why the loopback pair on one GPU cannot run this mode (it runs in the NCCL pair only)
    no_loopback: str | None = None

    def llm_args(self) -> dict[str, Any]:
        return copy.deepcopy(dict(self.engine_args))


#: every mode, in report order. Adding one is one entry here.
MODES: tuple[Mode, ...] = (
    Mode(
        "eager",
        {"enforce_eager": True},
        graphs=Expect.ZERO,
        ubatch_splits=Expect.ZERO,
        compiled=False,
        nccl=True,
    ),
    # the exchange op splits the graph: it runs eagerly between the captured pieces, so whether
    # the worker counts piecewise captures is the runtime's choice; reported, not required
    Mode(
        "piecewise",
        {"compilation_config": {"cudagraph_mode": "PIECEWISE"}},
        graphs=Expect.ANY,
        ubatch_splits=Expect.ZERO,
    ),
    Mode(
        "full-decode-only",
        {"compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"}},
        graphs=Expect.POSITIVE,
        ubatch_splits=Expect.ZERO,
        exchange_in_graph=True,
        nccl=True,
    ),
    # DBO is the AFD section's (native vLLM takes --enable-dbo only with a DeepEP or NIXL-EP
    # all2all backend, so the native run is the same engine without micro-batches); thresholds
    # low enough that the 3-sequence decode batches and the prompts split
    Mode(
        "dbo",
        {
            "dbo_decode_token_threshold": 2,
            "dbo_prefill_token_threshold": 2,
            "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"},
        },
        graphs=Expect.ANY,
        ubatch_splits=Expect.POSITIVE,
        exchange_in_graph=True,
        nccl=True,
        afd={"dbo": True},
        no_loopback=(
            "an in-process FFN half would compute inside vLLM's micro-batch threads, where "
            "vLLM's MoE kernels refuse to run, so the AFD workers refuse DBO with the loopback "
            "connector"
        ),
    ),
)


def mode_named(name: str) -> Mode:
    for mode in MODES:
        if mode.name == name:
            return mode
    raise KeyError(name)


class Gate(str, enum.Enum):
    """Where the MoE gate runs (``compute_gate_on_attention``)."""

    ATTENTION = "attention"
    FFN = "ffn"

    @property
    def on_attention(self) -> bool:
        return self is Gate.ATTENTION


@dataclass(frozen=True)
class Counters:
    """``collective_rpc("afd_counters")[0]`` of an AFD Attention worker."""

    graph_captures: int
    graph_replays: int
    ubatch_splits: int

    @classmethod
    def from_dict(cls, data: Any) -> Counters:
        """Raises ValueError naming the key that is missing or not an integer."""
        if not isinstance(data, Mapping):
            raise ValueError(f"afd_counters returned {data!r}, expected a dict of {COUNTER_KEYS}")
        values = {}
        for key in COUNTER_KEYS:
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"afd_counters[{key!r}] is {value!r}, expected an integer")
            values[key] = value
        return cls(**values)


def counter_problems(mode: Mode, counters: Counters) -> list[str]:
    """What the counters of a run in ``mode`` break of the mode's rule (empty: none).

    A graph mode whose graphs were never captured or replayed ran eagerly in effect, and a DBO
    run that never split ran without micro-batches: either would pass a token comparison while
    testing nothing of the mode, so each is a failure.
    """
    problems = []
    checks = (
        ("graph_captures", counters.graph_captures, mode.graphs),
        ("graph_replays", counters.graph_replays, mode.graphs),
        ("ubatch_splits", counters.ubatch_splits, mode.ubatch_splits),
    )
    for key, value, expect in checks:
        if expect is Expect.ZERO and value != 0:
            problems.append(f"{key}={value} in mode {mode.name}; it {expect.value}")
        elif expect is Expect.POSITIVE and value <= 0:
            problems.append(
                f"{key}={value} in mode {mode.name}; it {expect.value}: the run did not "
                f"exercise the mode"
            )
    return problems


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class EngineResult:
    """What one engine process did; ``ok`` is False when it failed before writing its result."""

    name: str
    ok: bool
    #: why it failed: the end of its log
    error: str = ""
    #: ``worker class/runner class``
    classes: str = ""
    #: greedy tokens per prompt, of the warm-up generate
    tokens: tuple[tuple[int, ...], ...] = ()
    #: tokens generated by one timed generate (all prompts)
    tokens_per_run: int = 0
    #: seconds of each timed generate
    timed_s: tuple[float, ...] = ()
    #: seconds from process start to a ready LLM
    startup_s: float = 0.0
    #: seconds the process ran, seen by the parent
    wall_s: float = 0.0
    #: ``afd_counters`` (AFD Attention only)
    counters: Counters | None = None
    #: why ``afd_counters`` could not be read
    counters_error: str = ""
    #: ``afd_connector_stats`` after the timed runs (AFD Attention only)
    connector_stats: Mapping[str, float] | None = None
    #: mean round trip of the exchanges during the timed runs (host clock)
    exchange_latency_s: float | None = None
    #: the weights vLLM budgets and the in-process FFN half's bytes (loopback only)
    budgeted_bytes: int | None = None
    in_process_bytes: int | None = None
    #: steps the FFN server recorded (FFN engine of the NCCL pair only)
    ffn_steps: int | None = None
    #: what building vLLM's runner once more costs (``seconds``, ``allocated_bytes``) or why it
    #: could not be measured (``error``): the AFD worker builds it and replaces it (AFD Attention)
    runner_cost: Mapping[str, Any] | None = None
    #: the process's log file
    log: str = ""

    @property
    def tokens_per_s(self) -> float | None:
        if not self.timed_s or self.tokens_per_run <= 0:
            return None
        return self.tokens_per_run / statistics.median(self.timed_s)

    @classmethod
    def from_child(cls, name: str, data: Mapping[str, Any], **parent: Any) -> EngineResult:
        counters = data.get("counters")
        counters_error = str(data.get("counters_error", ""))
        parsed = None
        if counters is not None:
            try:
                parsed = Counters.from_dict(counters)
            except ValueError as exc:
                counters_error = str(exc)
        return cls(
            name=name,
            ok=True,
            classes=str(data.get("classes", "")),
            tokens=tuple(tuple(int(t) for t in seq) for seq in data.get("tokens", ())),
            tokens_per_run=int(data.get("tokens_per_run", 0)),
            timed_s=tuple(float(s) for s in data.get("timed_s", ())),
            startup_s=float(data.get("startup_s", 0.0)),
            counters=parsed,
            counters_error=counters_error,
            connector_stats=data.get("connector_stats"),
            exchange_latency_s=data.get("exchange_latency_s"),
            budgeted_bytes=data.get("budgeted_bytes"),
            in_process_bytes=data.get("in_process_bytes"),
            ffn_steps=data.get("ffn_steps"),
            runner_cost=data.get("runner_cost"),
            **parent,
        )

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["tokens_per_s"] = self.tokens_per_s
        return data


@dataclass(frozen=True)
class PairResult:
    """One AFD engine (or pair) against the native engine of the same mode."""

    mode: str
    gate: Gate
    connector: str
    afd: EngineResult
    native: EngineResult
    #: every check that failed, one sentence each; empty: passed
    problems: tuple[str, ...]
    #: the FFN engine (NCCL pair only)
    ffn: EngineResult | None = None

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def tokens_equal(self) -> bool:
        return self.afd.ok and self.native.ok and self.afd.tokens == self.native.tokens

    @property
    def ratio(self) -> float | None:
        afd, native = self.afd.tokens_per_s, self.native.tokens_per_s
        return afd / native if afd is not None and native else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "gate": self.gate.value,
            "connector": self.connector,
            "passed": self.passed,
            "problems": list(self.problems),
            "tokens_equal": self.tokens_equal,
            "afd_tokens_per_s": self.afd.tokens_per_s,
            "native_tokens_per_s": self.native.tokens_per_s,
            "ratio": self.ratio,
            "counters": None if self.afd.counters is None else vars(self.afd.counters),
            "exchange_latency_s": self.afd.exchange_latency_s,
            "afd": self.afd.as_dict(),
            "native": self.native.as_dict(),
            "ffn": None if self.ffn is None else self.ffn.as_dict(),
        }


def _first_difference(afd: Sequence[Sequence[int]], native: Sequence[Sequence[int]]) -> str:
    if len(afd) != len(native):
        return f"{len(afd)} outputs vs {len(native)}"
    for index, (ours, theirs) in enumerate(zip(afd, native, strict=True)):
        if list(ours) != list(theirs):
            at = next(
                (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                min(len(ours), len(theirs)),
            )
            return (
                f"prompt {index} differs from token {at}: AFD {list(ours)} vs native {list(theirs)}"
            )
    return "equal"


def evaluate_pair(
    mode: Mode,
    gate: Gate,
    connector: str,
    afd: EngineResult,
    native: EngineResult,
    ffn: EngineResult | None = None,
) -> PairResult:
    """Every check of an AFD run against its native run; the problems make the verdict."""
    problems = []
    if not native.ok:
        problems.append(f"the native engine failed: {native.error}")
    elif native.classes != NATIVE_CLASSES:
        problems.append(f"the native engine ran {native.classes}, expected {NATIVE_CLASSES}")
    if ffn is not None and not ffn.ok:
        problems.append(f"the FFN engine failed: {ffn.error}")
    elif ffn is not None and ffn.classes != FFN_CLASSES:
        problems.append(f"the FFN engine ran {ffn.classes}, expected {FFN_CLASSES}")
    if not afd.ok:
        problems.append(f"the AFD engine failed: {afd.error}")
        return PairResult(mode.name, gate, connector, afd, native, tuple(problems), ffn)
    if afd.classes != ATTENTION_CLASSES:
        problems.append(f"the AFD engine ran {afd.classes}, expected {ATTENTION_CLASSES}")
    if native.ok and afd.tokens != native.tokens:
        problems.append(f"greedy tokens differ: {_first_difference(afd.tokens, native.tokens)}")
    short = [i for i, seq in enumerate(afd.tokens) if len(seq) != MAX_TOKENS]
    if not afd.tokens or short:
        problems.append(
            f"AFD outputs {short or 'all'} do not hold {MAX_TOKENS} tokens (ignore_eos)"
        )
    if afd.counters is None:
        problems.append(f"afd_counters could not be read: {afd.counters_error or 'no value'}")
    else:
        problems.extend(counter_problems(mode, afd.counters))
    stats = afd.connector_stats or {}
    if not stats.get("exchanges") or not stats.get("steps"):
        problems.append(f"the connector exchanged nothing: afd_connector_stats {dict(stats)}")
    if connector == LOOPBACK:
        ffn_bytes, budgeted = afd.in_process_bytes, afd.budgeted_bytes
        if ffn_bytes is None or budgeted is None:
            problems.append(
                "the weight budget could not be read (the runner's model_memory_usage and the "
                f"connector's in_process_weight_bytes()); see {afd.log}"
            )
        elif not ffn_bytes or budgeted < ffn_bytes:
            problems.append(
                f"vLLM budgets {budgeted} bytes of weights, less than the in-process FFN half's "
                f"{ffn_bytes}: the KV cache would take the FFN's memory"
            )
    if ffn is not None and ffn.ok:
        if not ffn.ffn_steps:
            problems.append(f"the FFN engine recorded {ffn.ffn_steps} steps")
        if ffn.counters is None:
            problems.append(
                f"FFN afd_counters could not be read: {ffn.counters_error or 'no value'}"
            )
        else:
            problems.extend(f"FFN {p}" for p in counter_problems(mode, ffn.counters))
    return PairResult(mode.name, gate, connector, afd, native, tuple(problems), ffn)


# --------------------------------------------------------------------------- report


class ModeStatus(str, enum.Enum):
    RAN = "ran"
    #: the mode runs in the NCCL pair only (its runs are the NCCL pair's)
    NCCL_ONLY = "NCCL pair only"
    NOT_SELECTED = "not selected"


class NcclStatus(str, enum.Enum):
    RAN = "ran"
    SKIPPED = "skipped"


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
    reason: str = ""
    runs: tuple[PairResult, ...] = ()


@dataclass(frozen=True)
class NcclReport:
    status: NcclStatus
    reason: str = ""
    runs: tuple[PairResult, ...] = ()


@dataclass(frozen=True)
class Report:
    date: str
    host: HostInfo
    modes: tuple[ModeReport, ...]
    nccl: NcclReport
    work_dir: str

    def runs(self) -> list[PairResult]:
        return [run for mode in self.modes for run in mode.runs] + list(self.nccl.runs)

    def exit_code(self) -> int:
        """0 when every run that ran passed (and one ran), else 1."""
        runs = self.runs()
        return 0 if runs and all(run.passed for run in runs) else 1

    def summary(self) -> str:
        runs = self.runs()
        passed = sum(run.passed for run in runs)
        parts = [f"{passed} passed", f"{len(runs) - passed} failed"]
        if self.nccl.status is NcclStatus.SKIPPED:
            nccl_only = [m.mode.name for m in self.modes if m.status is ModeStatus.NCCL_ONLY]
            if nccl_only:
                parts.append(f"not run (NCCL pair only): {', '.join(nccl_only)}")
            parts.append(f"skipped: NCCL pair ({self.nccl.reason})")
        return f"gpu_check: {'; '.join(parts)}; exit {self.exit_code()}"

    def as_dict(self) -> dict[str, Any]:
        modes = []
        for report in self.modes:
            entry: dict[str, Any] = {"mode": report.mode.name, "status": report.status.value}
            if report.status is ModeStatus.RAN:
                entry["engine_args"] = report.mode.llm_args()
                entry["runs"] = [run.as_dict() for run in report.runs]
            else:
                entry["reason"] = report.reason
            modes.append(entry)
        return {
            "format": FORMAT,
            "date": self.date,
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
            "exit_code": self.exit_code(),
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
    rows = []
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


def _table(mode: Mode, runs: Sequence[PairResult]) -> list[str]:
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
        lines.append(f"\n== {mode.name} ({json.dumps(mode.llm_args())}), loopback connector")
        lines += _table(mode, entry.runs)
    nccl = report.nccl
    if nccl.status is NcclStatus.SKIPPED:
        lines.append(f"\n== NCCL pair (two processes): SKIPPED: {nccl.reason}")
    for name in sorted({run.mode for run in nccl.runs}):
        mode = mode_named(name)
        lines.append(f"\n== NCCL pair, {name}: FFN engine on the 2nd device, Attention on the 1st")
        lines += _table(mode, [run for run in nccl.runs if run.mode == name])
    lines += ["", f"logs: {report.work_dir}", report.summary()]
    return "\n".join(lines)


def write_json(report: Report, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    partial.replace(path)


# --------------------------------------------------------------------------- engine processes


@dataclass(frozen=True)
class EngineSpec:
    """What an engine process builds and runs (written as JSON for it)."""

    name: str
    model: str
    #: ``LLM(...)`` arguments: the common ones, the mode's, the worker and AFD section
    llm_args: Mapping[str, Any]
    #: serve as the FFN role until told to stop on stdin, instead of generating
    ffn_role: bool = False
    #: read the AFD Attention worker's counters, connector stats and weight budget
    afd_attention: bool = False
    #: after writing the result, wait until this file exists before exiting (NCCL pair)
    hold_path: str | None = None
    prompts: tuple[str, ...] = PROMPTS
    max_tokens: int = MAX_TOKENS
    repeats: int = TIMED_REPEATS


@dataclass(frozen=True)
class Setup:
    """Everything the runs share."""

    work_dir: Path
    model: Path
    #: environment of every engine before per-run changes (PYTHONPATH with the repo and bundle)
    env: Mapping[str, str]
    host: HostInfo
    engine_timeout_s: float = 300.0


def visible_device_ids(cuda_visible_devices: str | None, count: int) -> tuple[str, ...]:
    """The ``CUDA_VISIBLE_DEVICES`` entry naming each of the ``count`` visible devices."""
    if cuda_visible_devices is None or not cuda_visible_devices.strip():
        return tuple(str(i) for i in range(count))
    return tuple(part.strip() for part in cuda_visible_devices.split(",") if part.strip())[:count]


def run_env(setup: Setup, mode: Mode, device_id: str) -> dict[str, str]:
    env = {**setup.env, "CUDA_VISIBLE_DEVICES": device_id}
    env["VLLM_CACHE_ROOT"] = str(setup.work_dir / "vllm-cache")
    if mode.compiled:
        env.pop("TORCHDYNAMO_DISABLE", None)
    else:
        env["TORCHDYNAMO_DISABLE"] = "1"
    return env


def _spawn(
    command: str,
    path: Path,
    env: Mapping[str, str],
    log_path: Path,
    stdin: int | None = None,
    script: Path = SCRIPT,
) -> subprocess.Popen[bytes]:
    """``script``'s internal ``command`` in a fresh interpreter, in a session of its own."""
    with log_path.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(script), command, str(path)],
            env=dict(env),
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            start_new_session=True,
        )


def _kill(process: subprocess.Popen[bytes]) -> None:
    """Kill the process and whatever it started that is still running (its own session, also
    after the process itself exited: vLLM's compile workers, say)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait(30)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_internal(
    command: str,
    arg: Path,
    env: Mapping[str, str],
    log_path: Path,
    timeout_s: float,
    script: Path = SCRIPT,
) -> int:
    """Run an internal command of ``script`` in a fresh interpreter; its exit status (-1: killed
    after ``timeout_s``)."""
    process = _spawn(command, arg, env, log_path, script=script)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        _kill(process)
        return -1


class _Engine:
    """One engine process: spec and result files, log, start time."""

    def __init__(self, spec: EngineSpec, directory: Path, script: Path = SCRIPT):
        directory.mkdir(parents=True, exist_ok=True)
        self.spec = spec
        #: the check script whose ``_engine`` command runs the engine
        self.script = script
        self.spec_path = directory / f"{spec.name}.spec.json"
        self.result_path = directory / f"{spec.name}.result.json"
        self.log_path = directory / f"{spec.name}.log"
        self.result_path.unlink(missing_ok=True)
        payload = {**dataclasses.asdict(spec), "result_path": str(self.result_path)}
        self.spec_path.write_text(json.dumps(payload, indent=2))
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self, env: Mapping[str, str], stdin: int | None = None) -> None:
        pinned = ", ".join(f"{k}={v}" for k, v in env.items() if k.endswith("_VISIBLE_DEVICES"))
        log(f"start {self.spec.name} ({pinned or 'all devices'}), log {self.log_path}", self.script)
        self.started = time.monotonic()
        self.process = _spawn("_engine", self.spec_path, env, self.log_path, stdin, self.script)

    def has_result(self) -> bool:
        return self.result_path.exists()

    def result(self, timed_out: bool = False) -> EngineResult:
        wall = time.monotonic() - self.started
        name, log_text = self.spec.name, str(self.log_path)
        if self.has_result():
            data = json.loads(self.result_path.read_text())
            result = EngineResult.from_child(name, data, wall_s=wall, log=log_text)
            rate = _number(result.tokens_per_s, ",.1f")
            log(
                f"{name}: done in {wall:.1f} s (start-up {result.startup_s:.1f} s, {rate} tok/s)",
                self.script,
            )
            return result
        returncode = None if self.process is None else self.process.returncode
        why = f"timed out after {wall:.0f} s" if timed_out else f"exited with {returncode}"
        log(f"{name}: FAILED, {why}; log {self.log_path}", self.script)
        error = f"{why} without a result; end of {self.log_path}:\n{_tail(self.log_path)}"
        return EngineResult(name, ok=False, error=error, wall_s=wall, log=log_text)


def run_engine(
    spec: EngineSpec,
    env: Mapping[str, str],
    directory: Path,
    timeout_s: float,
    script: Path = SCRIPT,
) -> EngineResult:
    """Run one engine (``script``'s ``_engine`` command) in a fresh interpreter, bounded by
    ``timeout_s``; its spec, result and log go to ``directory``."""
    engine = _Engine(spec, directory, script)
    engine.start(env)
    assert engine.process is not None
    timed_out = False
    try:
        engine.process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill(engine.process)
    return engine.result(timed_out and not engine.has_result())


def _llm_args(
    mode: Mode, worker_cls: str | None = None, afd: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    args = {**COMMON_ENGINE_ARGS, **mode.llm_args()}
    if worker_cls is not None:
        args["worker_cls"] = worker_cls
    if afd is not None:
        args["additional_config"] = {"afd": dict(afd)}
    return args


def run_native(mode: Mode, setup: Setup) -> EngineResult:
    """Native vLLM in ``mode`` on the first visible device."""
    spec = EngineSpec(f"native-{mode.name}", str(setup.model), _llm_args(mode))
    env = run_env(setup, mode, setup.host.device_ids[0])
    return run_engine(spec, env, setup.work_dir / "engines", setup.engine_timeout_s)


def run_pair(
    mode: Mode, gate: Gate, setup: Setup, native: EngineResult | None = None
) -> PairResult:
    """The AFD Attention worker with the loopback connector against native vLLM, in ``mode``.

    ``native`` is a native result of the same mode to reuse (it does not depend on the gate).
    """
    if mode.no_loopback is not None:
        raise ValueError(f"mode {mode.name} runs in the NCCL pair only: {mode.no_loopback}")
    if native is None:
        native = run_native(mode, setup)
    afd = {
        "role": "attention",
        "connector": LOOPBACK,
        "compute_gate_on_attention": gate.on_attention,
    }
    spec = EngineSpec(
        f"afd-{mode.name}-gate-on-{gate.value}",
        str(setup.model),
        _llm_args(mode, ATTENTION_WORKER, afd),
        afd_attention=True,
    )
    env = run_env(setup, mode, setup.host.device_ids[0])
    result = run_engine(spec, env, setup.work_dir / "engines", setup.engine_timeout_s)
    return evaluate_pair(mode, gate, LOOPBACK, result, native)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_nccl_pair(mode: Mode, gate: Gate, setup: Setup, native: EngineResult) -> PairResult:
    """An FFN engine on the second device and an Attention engine on the first, over NCCL."""
    if len(setup.host.device_ids) < 2:
        raise ValueError("the NCCL pair needs two CUDA devices")
    section = {
        "connector": NCCL,
        "port": free_port(),
        "compute_gate_on_attention": gate.on_attention,
        "connector_extra_config": {
            "connect_timeout_s": NCCL_CONNECT_TIMEOUT_S,
            "timeout_s": NCCL_TIMEOUT_S,
        },
    }
    tag = f"nccl-{mode.name}-gate-on-{gate.value}"
    directory = setup.work_dir / "engines"
    hold = directory / f"{tag}.exit"
    hold.unlink(missing_ok=True)
    ffn_args = _llm_args(mode, FFN_WORKER, {**section, "role": "ffn"})
    ffn_args["enable_prefix_caching"] = False
    ffn = _Engine(EngineSpec(f"{tag}-ffn", str(setup.model), ffn_args, ffn_role=True), directory)
    attention = _Engine(
        EngineSpec(
            f"{tag}-attention",
            str(setup.model),
            _llm_args(mode, ATTENTION_WORKER, {**section, **mode.afd, "role": "attention"}),
            afd_attention=True,
            hold_path=str(hold),
        ),
        directory,
    )
    ffn.start(run_env(setup, mode, setup.host.device_ids[1]), stdin=subprocess.PIPE)
    attention.start(run_env(setup, mode, setup.host.device_ids[0]))
    assert ffn.process is not None and attention.process is not None
    deadline = time.monotonic() + setup.engine_timeout_s
    # until the Attention engine has its result, or one side died, or the deadline passed
    while not attention.has_result() and time.monotonic() < deadline:
        if attention.process.poll() is not None or ffn.process.poll() is not None:
            break
        time.sleep(0.5)
    attention_timed_out = not attention.has_result() and time.monotonic() >= deadline
    ffn_timed_out = False
    if not attention.has_result():
        # it died or timed out, or its FFN peer is gone; an FFN engine still waiting for it to
        # connect would not read stdin
        _kill(attention.process)
        ffn_timed_out = ffn.process.poll() is None and attention_timed_out
        _kill(ffn.process)
    else:
        # the FFN engine reads its steps and exits before the Attention engine does, which it
        # would otherwise notice as a vanished peer
        try:
            assert ffn.process.stdin is not None
            ffn.process.stdin.write(b"stop\n")
            ffn.process.stdin.close()
        except OSError:
            pass
        try:
            ffn.process.wait(120)
        except subprocess.TimeoutExpired:
            ffn_timed_out = True
        _kill(ffn.process)
    hold.touch()
    try:
        attention.process.wait(60)
    except subprocess.TimeoutExpired:
        pass
    _kill(attention.process)
    ffn_result = ffn.result(ffn_timed_out and not ffn.has_result())
    attention_result = attention.result(attention_timed_out)
    return evaluate_pair(mode, gate, NCCL, attention_result, native, ffn=ffn_result)


# --------------------------------------------------------------------------- engine side
# These run in the engine processes (``python tools/gpu_check.py _engine SPEC``), never here.


def _worker_classes(wrapper: Any) -> str:
    # a callable gets vLLM's WorkerWrapperBase, which holds the worker
    worker = getattr(wrapper, "worker", wrapper)
    return f"{type(worker).__name__}/{type(worker.model_runner).__name__}"


def _weight_budget(worker: Any) -> tuple[int, int]:
    runner = worker.model_runner
    return int(runner.model_memory_usage), int(runner.afd_connector.in_process_weight_bytes())


def _runner_cost(wrapper: Any) -> dict[str, float]:
    """Build vLLM's runner once more, as the AFD worker's ``init_device`` does before replacing it."""
    import torch

    worker = getattr(wrapper, "worker", wrapper)
    upstream = type(worker.model_runner).__mro__[1]  # the vLLM runner the AFD one derives from
    torch.cuda.synchronize(worker.device)
    before = torch.cuda.memory_allocated(worker.device)
    start = time.perf_counter()
    runner = upstream(worker.vllm_config, worker.device)
    torch.cuda.synchronize(worker.device)
    seconds = time.perf_counter() - start
    allocated = torch.cuda.memory_allocated(worker.device) - before
    del runner
    return {"seconds": seconds, "allocated_bytes": allocated}


def _write_result(path: Path, data: Mapping[str, Any]) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(data))
    partial.replace(path)


def _shutdown(llm: Any) -> None:
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()


def _exchange_latency(before: Mapping[str, float], after: Mapping[str, float]) -> float | None:
    """Mean round trip of the exchanges between two ``afd_connector_stats`` readings."""
    count = after["exchanges"] - before["exchanges"]
    if count <= 0:
        return None
    total = after["mean_round_trip_s"] * after["exchanges"]
    total -= before["mean_round_trip_s"] * before["exchanges"]
    return total / count


def _read_counters(llm: Any, result: dict[str, Any]) -> None:
    try:
        result["counters"] = llm.collective_rpc("afd_counters")[0]
    except Exception as exc:  # reported as a failed check, with the tokens still compared
        result["counters_error"] = f"{type(exc).__name__}: {exc}"


def engine_main(spec_path: Path) -> int:
    """Build the spec's LLM, generate (or serve as FFN), write the result file."""
    began = time.monotonic()
    payload = json.loads(spec_path.read_text())
    result_path = Path(payload.pop("result_path"))
    spec = EngineSpec(**{**payload, "prompts": tuple(payload["prompts"])})
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        raise RuntimeError(f"vLLM's platform is {type(current_platform).__name__}, not CUDA")
    if "worker_cls" in spec.llm_args:
        # the AFD architectures, in case this checkout is not installed (no entry point)
        from afd_models.plugin import register

        register()
    llm = LLM(model=spec.model, **spec.llm_args)
    result: dict[str, Any] = {
        "startup_s": time.monotonic() - began,
        "classes": llm.collective_rpc(_worker_classes)[0],
    }
    if spec.ffn_role:
        print("AFD gpu_check: FFN engine ready", flush=True)
        sys.stdin.readline()
        result["ffn_steps"] = len(llm.collective_rpc("afd_ffn_steps")[0])
        _read_counters(llm, result)
        _write_result(result_path, result)
        _shutdown(llm)
        return 0
    if spec.afd_attention and spec.llm_args["additional_config"]["afd"]["connector"] == LOOPBACK:
        try:
            result["budgeted_bytes"], result["in_process_bytes"] = llm.collective_rpc(
                _weight_budget
            )[0]
        except Exception as exc:  # reported as a failed check
            print(f"AFD gpu_check: weight budget unreadable: {exc!r}", flush=True)
    params = SamplingParams(temperature=0.0, max_tokens=spec.max_tokens, ignore_eos=True)
    prompts = list(spec.prompts)
    first = llm.generate(prompts, params, use_tqdm=False)
    result["tokens"] = [list(output.outputs[0].token_ids) for output in first]
    before = llm.collective_rpc("afd_connector_stats")[0] if spec.afd_attention else None
    timed, outputs = [], first
    for _ in range(spec.repeats):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        timed.append(time.perf_counter() - start)
    result["timed_s"] = timed
    result["tokens_per_run"] = sum(len(output.outputs[0].token_ids) for output in outputs)
    if spec.afd_attention:
        after = llm.collective_rpc("afd_connector_stats")[0]
        result["connector_stats"] = after
        result["exchange_latency_s"] = _exchange_latency(before, after)
        _read_counters(llm, result)
        try:  # last: a measurement, never a check
            result["runner_cost"] = llm.collective_rpc(_runner_cost)[0]
        except Exception as exc:
            result["runner_cost"] = {"error": f"{type(exc).__name__}: {exc}"}
    _write_result(result_path, result)
    if spec.hold_path is not None:
        deadline = time.monotonic() + HOLD_S
        while not Path(spec.hold_path).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    _shutdown(llm)
    return 0


def probe_main(out: Path) -> int:
    """Versions, devices, and whether vLLM and afd_models import; written as JSON to ``out``."""
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    info["cuda"] = torch.version.cuda
    available = torch.cuda.is_available()
    info["devices"] = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if available
        else []
    )
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except Exception as exc:
        info["vllm_error"] = f"{type(exc).__name__}: {exc}"
    try:
        from afd_models._freshness import check_generated_code

        check_generated_code()
    except Exception as exc:
        info["afd_models_error"] = f"{type(exc).__name__}: {exc}"
    _write_result(out, info)
    return 0


def model_main(out: Path) -> int:
    """The float32 tiny DeepSeek-V2 with widened margins (as the compiled-mode e2e tests use)."""
    from afd_models.testing.tiny_models import write_tiny_model

    write_tiny_model(out, "v2", seed=0, dtype="float32", margin_scale=50.0)
    return 0


INTERNAL_COMMANDS = {"_engine": engine_main, "_probe": probe_main, "_model": model_main}


# --------------------------------------------------------------------------- set-up


def default_target() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "vllm-afd-overlay" / f"gpu-bundle-py{sys.version_info[0]}.{sys.version_info[1]}"


def load_gpu_bundle() -> Any:
    """tools/gpu_bundle.py as a module (it is a script next to this one, not a package)."""
    path = SCRIPT.with_name("gpu_bundle.py")
    spec = importlib.util.spec_from_file_location("gpu_bundle", path)
    if not path.is_file() or spec is None or spec.loader is None:
        raise UsageError(f"{path} is missing: copy the whole tools/ directory")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install_bundle(parts: Path, target: Path) -> None:
    """Install vLLM from the bundle's parts into ``target`` with ``gpu_bundle.install`` (standard
    library and the host's pip, offline; a rerun with the same bundle does nothing)."""
    bundle = load_gpu_bundle()
    try:
        bundle.install(parts, target=target)
    except bundle.BundleError as exc:
        raise UsageError(f"the bundle in {parts} cannot be installed: {exc}") from exc


def base_env(extra_paths: Sequence[Path] = ()) -> dict[str, str]:
    """The engines' environment: this one, :data:`ENGINE_ENV`, and the repository (and a bundle
    target) first on ``PYTHONPATH``."""
    env = {**os.environ, **ENGINE_ENV}
    paths = [str(p) for p in (*extra_paths, REPO_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, os.environ.get("PYTHONPATH")]))
    for path in extra_paths:
        if (path / "bin").is_dir():
            env["PATH"] = os.pathsep.join([str(path / "bin"), env.get("PATH", "")])
    return env


def probe(env: Mapping[str, str], work_dir: Path) -> HostInfo:
    """What the engines' interpreter sees. Raises UsageError when it cannot run the check."""
    out = work_dir / "probe.json"
    log_path = work_dir / "probe.log"
    log("probe: torch, CUDA devices, vLLM, afd_models")
    if run_internal("_probe", out, env, log_path, 300) != 0 or not out.exists():
        raise UsageError(
            f"the probe failed (`import torch`?); end of {log_path}:\n{_tail(log_path)}"
        )
    info = json.loads(out.read_text())
    if not info["devices"]:
        raise UsageError(
            f"torch {info['torch']} sees no CUDA device (CUDA_VISIBLE_DEVICES="
            f"{env.get('CUDA_VISIBLE_DEVICES', 'unset')}): run this on a GPU host"
        )
    if "vllm_error" in info:
        raise UsageError(
            f"`import vllm` fails in the engines' environment: {info['vllm_error']}; pass --bundle "
            "DIR (parts from `python tools/gpu_bundle.py build`)"
        )
    if info["vllm"].split("+")[0] != VLLM_VERSION:
        raise UsageError(
            f"vLLM {info['vllm']} found, this checks vLLM {VLLM_VERSION}: pass --bundle DIR"
        )
    if "afd_models_error" in info:
        raise UsageError(
            f"the generated code is not usable: {info['afd_models_error']} (afd_models/_generated is a "
            "build artifact: carry it with the working tree, or run `nox -s regenerate`)"
        )
    devices = tuple(info["devices"])
    ids = visible_device_ids(env.get("CUDA_VISIBLE_DEVICES"), len(devices))
    return HostInfo(info["python"], info["torch"], info["cuda"], info["vllm"], devices, ids)


def prepare(work_dir: Path, env: Mapping[str, str], engine_timeout_s: float = 300.0) -> Setup:
    """Probe the host and write the tiny model. Raises UsageError when the host cannot run it."""
    work_dir = work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    host = probe(env, work_dir)
    log(f"{len(host.devices)} CUDA device(s): {', '.join(host.devices)}; vLLM {host.vllm}")
    model = work_dir / "tiny-v2"
    log_path = work_dir / "model.log"
    if run_internal("_model", model, env, log_path, 300) != 0:
        raise RuntimeError(f"writing the tiny model failed; end of {log_path}:\n{_tail(log_path)}")
    log(f"tiny DeepSeek-V2 model in {model}")
    return Setup(work_dir, model, env, host, engine_timeout_s)


# --------------------------------------------------------------------------- CLI


@dataclass(frozen=True)
class Options:
    modes: tuple[Mode, ...]
    gates: tuple[Gate, ...]
    bundle: Path | None = None
    target: Path | None = None
    json_path: Path | None = None
    work_dir: Path | None = None
    engine_timeout_s: float = 300.0
    nccl: bool = True


def build_parser() -> argparse.ArgumentParser:
    runnable = ", ".join(m.name for m in MODES)
    parser = argparse.ArgumentParser(
        prog="gpu_check.py",
        description=__doc__.split("\n\n")[0],
        epilog=f"Modes: {runnable}; in the NCCL pair only: "
        + ", ".join(m.name for m in MODES if m.no_loopback)
        + ". Exit codes: 0 passed, 1 a check failed, 2 bad usage or unusable host, 3 crash.",
    )
    parser.add_argument(
        "--bundle",
        type=Path,
        metavar="DIR",
        help="parts from `gpu_bundle.py build`: install vLLM from them first",
    )
    parser.add_argument(
        "--target",
        type=Path,
        metavar="DIR",
        help=f"where --bundle installs (default: {default_target()})",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="MODE",
        help=f"run only this mode (repeatable): {runnable}",
    )
    parser.add_argument(
        "--gate",
        metavar="WHERE",
        help="run only this gate placement: attention or ffn (default: both)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the report as JSON")
    parser.add_argument(
        "--work-dir",
        type=Path,
        metavar="DIR",
        help="model, logs and caches (default: a new temporary directory)",
    )
    parser.add_argument(
        "--engine-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds one engine may take (default: %(default)s)",
    )
    parser.add_argument("--skip-nccl", action="store_true", help="do not run the two-GPU NCCL pair")
    return parser


def options_from(args: argparse.Namespace) -> Options:
    """Validate the arguments. Raises UsageError naming the bad value and the allowed ones."""
    allowed = ", ".join(m.name for m in MODES)
    chosen = []
    for name in args.only or [m.name for m in MODES]:
        mode = next((m for m in MODES if m.name == name), None)
        if mode is None:
            raise UsageError(f"--only {name!r} is not a mode; allowed: {allowed}")
        if mode not in chosen:
            chosen.append(mode)
    gates = tuple(Gate)
    if args.gate is not None:
        if args.gate not in {g.value for g in Gate}:
            raise UsageError(
                f"--gate {args.gate!r} is not a gate placement; allowed: attention, ffn"
            )
        gates = (Gate(args.gate),)
    if args.engine_timeout <= 0:
        raise UsageError(
            f"--engine-timeout {args.engine_timeout} is not allowed; allowed: seconds > 0"
        )
    if args.bundle is not None and not (args.bundle / "manifest.json").is_file():
        raise UsageError(
            f"--bundle {args.bundle} has no manifest.json: pass the directory of the parts"
        )
    ordered = tuple(m for m in MODES if m in chosen)
    return Options(
        modes=ordered,
        gates=gates,
        bundle=args.bundle,
        target=args.target,
        json_path=args.json,
        work_dir=args.work_dir,
        engine_timeout_s=args.engine_timeout,
        nccl=not args.skip_nccl,
    )


def vllm_importable() -> bool:
    """Whether this interpreter finds vLLM (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def resolve_env(
    options: Options, vllm_found: bool, install: Callable[[Path, Path], None] = install_bundle
) -> dict[str, str]:
    """The engines' environment; installs the bundle (with ``install``) when one is given.
    Raises UsageError when vLLM is missing and no bundle is given."""
    if options.bundle is None:
        if not vllm_found:
            raise UsageError(
                f"vLLM is not importable by {sys.executable}: pass --bundle DIR (the parts of "
                "`python tools/gpu_bundle.py build`), or run with a Python that has vLLM "
                f"{VLLM_VERSION} (CUDA build)"
            )
        return base_env()
    target = options.target or default_target()
    log(f"installing the bundle {options.bundle} into {target}")
    install(options.bundle, target)
    return base_env([target])


def check(options: Options, setup: Setup, runner: Any = None) -> Report:
    """Run every selected mode and gate (and the NCCL pair when two devices are visible).

    ``runner`` provides ``run_native``, ``run_pair`` and ``run_nccl_pair`` (this module by
    default; the unit tests pass fakes).
    """
    runner = runner or sys.modules[__name__]
    nccl_modes = [m for m in options.modes if m.nccl]
    nccl_skipped: str | None = None
    if not options.nccl:
        nccl_skipped = "--skip-nccl"
    elif len(setup.host.device_ids) < 2:
        nccl_skipped = (
            f"needs two CUDA devices, found {len(setup.host.device_ids)}: NCCL cannot put two "
            "ranks of one communicator on one GPU"
        )
    elif not nccl_modes:
        runs_it = ", ".join(m.name for m in MODES if m.nccl)
        nccl_skipped = f"no selected mode runs it ({runs_it} do)"
    reports, natives = [], {}
    for mode in MODES:
        if mode not in options.modes:
            reports.append(ModeReport(mode, ModeStatus.NOT_SELECTED, "left out by --only"))
            continue
        if mode.no_loopback is not None:
            # the native run serves the NCCL pair, when it runs
            if nccl_skipped is None:
                natives[mode.name] = runner.run_native(mode, setup)
            reason = mode.no_loopback + (
                f"; the NCCL pair is skipped: {nccl_skipped}" if nccl_skipped else ""
            )
            reports.append(ModeReport(mode, ModeStatus.NCCL_ONLY, reason))
            continue
        natives[mode.name] = runner.run_native(mode, setup)
        runs = [runner.run_pair(mode, gate, setup, natives[mode.name]) for gate in options.gates]
        for run in runs:
            log(f"{mode.name}, gate on {run.gate.value}: {'PASS' if run.passed else 'FAIL'}")
        reports.append(ModeReport(mode, ModeStatus.RAN, runs=tuple(runs)))
    if nccl_skipped is not None:
        nccl = NcclReport(NcclStatus.SKIPPED, nccl_skipped)
    else:
        runs = [
            runner.run_nccl_pair(mode, gate, setup, natives[mode.name])
            for mode in nccl_modes
            for gate in options.gates
        ]
        nccl = NcclReport(NcclStatus.RAN, runs=tuple(runs))
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return Report(date, setup.host, tuple(reports), nccl, str(setup.work_dir))


@dataclass(frozen=True)
class Host:
    """What the check asks of the machine; the unit tests pass fakes."""

    #: whether this interpreter finds vLLM
    vllm_importable: Callable[[], bool] = vllm_importable
    #: install a bundle's parts into a target directory
    install: Callable[[Path, Path], None] = install_bundle
    #: probe the host and write the model (:func:`prepare`)
    prepare: Callable[[Path, Mapping[str, str], float], Setup] = prepare
    #: runs the engines (``run_native``, ``run_pair``, ``run_nccl_pair``); None: this module
    runner: Any = None


def run(options: Options, host: Host) -> int:
    """The whole check for validated options; its exit code."""
    began = time.monotonic()
    env = resolve_env(options, host.vllm_importable(), host.install)
    work_dir = options.work_dir or Path(tempfile.mkdtemp(prefix="afd-gpu-check-"))
    setup = host.prepare(work_dir, env, options.engine_timeout_s)
    report = check(options, setup, host.runner)
    print(render(report), flush=True)
    if options.json_path is not None:
        write_json(report, options.json_path)
        log(f"JSON report in {options.json_path}")
    log(f"whole check: {time.monotonic() - began:.0f} s")
    return report.exit_code()


def guarded(prog: str, check: Callable[[], int]) -> int:
    """``check()``'s exit code; a UsageError is 2 with its message, any other exception 3."""
    try:
        return check()
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except Exception:  # a crash is never a pass, nor a check failure
        traceback.print_exc()
        print(f"{prog}: internal error: the check itself crashed (exit 3)", file=sys.stderr)
        return 3


def main(argv: list[str] | None = None, host: Host | None = None) -> int:
    """0 passed, 1 a check failed, 2 bad usage or unusable host, 3 the script crashed."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in INTERNAL_COMMANDS:
        return INTERNAL_COMMANDS[argv[0]](Path(argv[1]))
    args = build_parser().parse_args(argv)  # exits 2 on a malformed command line, 0 for --help
    return guarded(SCRIPT.name, lambda: run(options_from(args), host or Host()))


def _engine_process_exit(entry: Callable[[], int] = main) -> None:
    """Engine processes end here: flush, and exit without interpreter teardown (vLLM's helper
    threads and pools can hang it); an exception is exit 1 with its traceback."""
    try:
        code = entry()
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] and sys.argv[1] in INTERNAL_COMMANDS:
        _engine_process_exit()
    sys.exit(main())
