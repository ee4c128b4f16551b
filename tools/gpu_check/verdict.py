"""The verdict of one AFD run (loopback) or pair (NCCL) against the native run of its mode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tools.gpu_check.modes import (
    FFN_CLASSES,
    LOOPBACK,
    NATIVE_CLASSES,
    Gate,
    Mode,
    counter_problems,
)
from tools.harness.results import MAX_TOKENS, EngineResult, first_difference


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
    expected = mode.runner.attention_classes
    if afd.classes != expected:
        problems.append(f"the AFD engine ran {afd.classes}, expected {expected}")
    if native.ok and afd.tokens != native.tokens:
        problems.append(f"greedy tokens differ: {first_difference(afd.tokens, native.tokens)}")
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
