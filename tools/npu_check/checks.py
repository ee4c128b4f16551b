"""The NPU check's two checks and their verdicts: the runtime origin (``codegen check`` with
vLLM-Ascend's patches applied) and parity (native vLLM-Ascend against the AFD NPU worker)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from afd_models import supervisor
from tools.harness.processes import REPO_ROOT, kill, run_engine, tail
from tools.harness.results import MAX_TOKENS, EngineResult, EngineSpec, first_difference
from tools.npu_check.host import CHILDREN, Setup
from tools.npu_check.settings import (
    ATTENTION_WORKER,
    CODEGEN_COMMAND,
    CODEGEN_TIMEOUT_S,
    ENGINE_ARGS,
    LOOPBACK,
    MODEL_OVERRIDES,
    NATIVE_CLASSES,
    NATIVE_PLUGINS,
    RUNTIME_UNAVAILABLE,
)


@dataclass(frozen=True)
class CheckResult:
    """One check; ``problems`` empty: passed."""

    name: str
    #: what it ran, for the report
    what: str
    problems: tuple[str, ...]
    #: check-specific results for the JSON report
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "passed": self.passed}


ORIGIN = "runtime origin"
PARITY = "parity"


def origin_problems(returncode: int, stdout: str) -> tuple[list[str], str]:
    """The problems of a ``codegen check --format json`` run, and its summary line."""
    try:
        report = json.loads(stdout)
        findings, summary = report["findings"], report["summary"]
    except (ValueError, KeyError, TypeError):
        return [f"codegen check wrote no JSON report (exit {returncode})"], ""
    problems = [
        f"{f['code']} {f['severity']} {f['symbol']}: {f['message']}"
        for f in findings
        if f["severity"] in ("block", "review")
    ]
    problems += [
        f"{f['code']} {f['symbol']}: {f['message']}: RT005 was not checked"
        for f in findings
        if f["kind"] == RUNTIME_UNAVAILABLE
    ]
    if returncode != 0 and not problems:
        problems.append(f"codegen check exited {returncode} ({summary})")
    return problems, summary


def run_origin_check(setup: Setup) -> CheckResult:
    """``python -m codegen check`` in the operator's environment, bounded by
    :data:`CODEGEN_TIMEOUT_S`; its JSON on stdout, its progress in a log."""
    command = [sys.executable, *CODEGEN_COMMAND]
    out, log_path = setup.work_dir / "codegen-check.json", setup.work_dir / "codegen-check.log"
    CHILDREN.log(f"runtime origin: {' '.join(command[1:])}, log {log_path}")
    group = supervisor.launch(
        "codegen check", command, log_path, env=setup.env, cwd=REPO_ROOT, stdout=out
    )
    assert group.process is not None
    try:
        returncode = group.process.wait(CODEGEN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill(group)
        problem = f"python -m codegen check did not finish within {CODEGEN_TIMEOUT_S} s"
        return CheckResult(ORIGIN, "python -m codegen check", (f"{problem}; see {log_path}",))
    problems, summary = origin_problems(returncode, out.read_text(errors="replace"))
    if problems and not summary:
        problems.append(f"end of {log_path}:\n{tail(log_path)}")
    details = {
        "exit_code": returncode,
        "summary": summary,
        "report": str(out),
        "log": str(log_path),
    }
    return CheckResult(ORIGIN, "python -m codegen check", tuple(problems), details)


def parity_problems(afd: EngineResult, native: EngineResult) -> list[str]:
    """Every check of the AFD run against the native one (empty: passed)."""
    problems = []
    if not native.ok:
        problems.append(f"the native engine failed: {native.error}")
    elif native.classes != NATIVE_CLASSES:
        problems.append(f"the native engine ran {native.classes}, expected {NATIVE_CLASSES}")
    if not afd.ok:
        return [*problems, f"the AFD engine failed: {afd.error}"]
    worker = ATTENTION_WORKER.name
    if afd.classes.partition("/")[0] != worker:
        problems.append(f"the AFD engine ran {afd.classes}, expected the worker {worker}")
    if native.ok and afd.tokens != native.tokens:
        difference = first_difference(afd.tokens, native.tokens)
        problems.append(f"greedy tokens differ: {difference}")
    short = [i for i, seq in enumerate(afd.tokens) if len(seq) != MAX_TOKENS]
    if not afd.tokens or short:
        problems.append(
            f"AFD outputs {short or 'all'} do not hold {MAX_TOKENS} tokens (ignore_eos)"
        )
    stats = afd.connector_stats or {}
    if not stats.get("exchanges") or not stats.get("steps"):
        problems.append(
            f"the connector exchanged nothing: afd_connector_stats {dict(stats)} (see {afd.log})"
        )
    return problems


def run_parity(setup: Setup) -> CheckResult:
    """Native vLLM-Ascend, then the AFD Attention worker with the loopback connector."""
    device = {"ASCEND_RT_VISIBLE_DEVICES": setup.host.device_ids[0]}
    directory = setup.work_dir / "engines"
    native = run_engine(
        EngineSpec("native", str(setup.model), dict(ENGINE_ARGS)),
        {**setup.env, **device, "VLLM_PLUGINS": NATIVE_PLUGINS},
        directory,
        setup.engine_timeout_s,
        CHILDREN,
    )
    afd_args = {
        **ENGINE_ARGS,
        "worker_cls": ATTENTION_WORKER.path,
        "additional_config": {"afd": {"role": ATTENTION_WORKER.role.value, "connector": LOOPBACK}},
    }
    afd = run_engine(
        EngineSpec("afd-loopback", str(setup.model), afd_args, afd_attention=True),
        {**setup.env, **device},
        directory,
        setup.engine_timeout_s,
        CHILDREN,
    )
    details = {
        "engine_args": dict(ENGINE_ARGS),
        "model_overrides": dict(MODEL_OVERRIDES),
        "afd": afd.as_dict(),
        "native": native.as_dict(),
    }
    what = (
        f"native vLLM-Ascend vs {ATTENTION_WORKER.path} + {LOOPBACK}, one MoE layer, eager, greedy"
    )
    return CheckResult(PARITY, what, tuple(parity_problems(afd, native)), details)
