"""GPU tier: the generated CUDA worker and runner (``AFDAttentionWorker`` on vLLM's GPU ``Worker``,
``AFDAttentionGPUModelRunner`` on ``GPUModelRunner``) inside vLLM's engine on a CUDA device, with
the FFN half in-process behind the loopback connector, against the native model.

The runs are tools.gpu_check's (the same checks as a command, for a GPU host without pytest):
each engine in a fresh interpreter, for every mode the runtime supports (eager, piecewise CUDA
graphs, FULL_DECODE_ONLY, on vLLM's V1 runner and, with vLLM 0.30+, on Model Runner V2) and both
gate placements. Greedy tokens must equal native vLLM's, and
the worker's counters must fit the mode: a FULL_DECODE_ONLY run that never captured and replayed
a graph fails, an eager run captures none. With two CUDA devices the two-process NCCL pair (FFN
engine on the second) runs too, DBO among its modes (the loopback connector refuses DBO); with one
it is skipped with the reason.

Needs a CUDA device and a supported vLLM's CUDA build (0.26.0 from the ``gpu`` extra); skipped
elsewhere with the reason (tests/conftest.py).
"""

from __future__ import annotations

import pytest

from tools.gpu_check import host, modes, plan, runs
from tools.gpu_check.modes import Gate, Mode
from tools.gpu_check.runs import Setup
from tools.gpu_check.verdict import PairResult
from tools.harness.results import EngineResult

MODES = [mode.name for mode in modes.MODES if mode.no_loopback is None]
NCCL_MODES = [mode.name for mode in modes.MODES if mode.nccl]
GATES = pytest.mark.parametrize("gate", list(Gate), ids=[f"gate-on-{gate.value}" for gate in Gate])


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    """The probed host and the tiny model, shared by every run of this module."""
    return host.prepare(tmp_path_factory.mktemp("gpu-check"), host.base_env())


@pytest.fixture(scope="module")
def natives() -> dict[str, EngineResult]:
    """Native results by mode: native vLLM does not depend on the gate placement, so it runs
    once per mode."""
    return {}


def _native(mode: Mode, setup: Setup, natives: dict[str, EngineResult]) -> EngineResult:
    if mode.name not in natives:
        natives[mode.name] = runs.run_native(mode, setup)
    native = natives[mode.name]
    assert native.ok, native.error
    return native


def _mode_for_host(name: str, setup: Setup) -> Mode:
    """The mode named ``name``; a Model Runner V2 mode is skipped on a vLLM older than 0.30."""
    mode = modes.mode_named(name)
    too_old = plan.needs_newer_vllm(mode, setup.host.vllm)
    if too_old:
        pytest.skip(too_old)
    return mode


def _assert_passed(pair: PairResult, mode: Mode) -> None:
    assert pair.afd.ok, pair.afd.error
    assert pair.tokens_equal, pair.problems
    assert pair.afd.counters is not None, pair.afd.counters_error
    assert modes.counter_problems(mode, pair.afd.counters) == []
    assert pair.problems == ()


@pytest.mark.parametrize("mode_name", MODES)
@GATES
def test_loopback_equals_native_and_counters_fit_the_mode(
    mode_name: str,
    gate: Gate,
    setup: Setup,
    natives: dict[str, EngineResult],
) -> None:
    """Greedy tokens equal native vLLM's in the mode; the graph counters show the mode ran."""
    mode = _mode_for_host(mode_name, setup)
    pair = runs.run_pair(mode, gate, setup, _native(mode, setup, natives))
    _assert_passed(pair, mode)


@pytest.mark.parametrize("mode_name", NCCL_MODES)
@GATES
def test_nccl_pair_equals_native(
    mode_name: str,
    gate: Gate,
    setup: Setup,
    natives: dict[str, EngineResult],
) -> None:
    """FFN engine on the second device, Attention on the first, over NCCL: native's tokens."""
    if len(setup.host.device_ids) < 2:
        pytest.skip(
            f"the NCCL pair needs two CUDA devices, found {len(setup.host.device_ids)}: NCCL "
            "cannot put two ranks of one communicator on one GPU"
        )
    mode = _mode_for_host(mode_name, setup)
    pair = runs.run_nccl_pair(mode, gate, setup, _native(mode, setup, natives))
    assert pair.ffn is not None and pair.ffn.ok, pair.ffn
    _assert_passed(pair, mode)
