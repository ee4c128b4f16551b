"""The GPU check's modes: how the engines run in each, what the worker's counters must be, and
where the MoE gate runs; with the settings every engine of the check shares."""

from __future__ import annotations

import copy
import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from afd_models.config import Role
from afd_models.launch import Runner, worker_class
from tools.harness.results import Counters

#: the release the GPU bundle carries (``python -m tools.gpu_bundle``); a host with vLLM
#: installed may have any supported release (overlay/pins.toml) whose code was generated
VLLM_VERSION = "0.26.0"
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
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    # the AFD Attention worker refuses vLLM's breakable graph wrapper (it announces no AFD step)
    "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
}
ATTENTION_WORKER = worker_class("cuda", Role.ATTENTION).path
FFN_WORKER = worker_class("cuda", Role.FFN).path
NATIVE_CLASSES = "Worker/GPUModelRunner"
ATTENTION_CLASSES = worker_class("cuda", Role.ATTENTION).classes(Runner.V1)
ATTENTION_CLASSES_V2 = worker_class("cuda", Role.ATTENTION).classes(Runner.V2)
FFN_CLASSES = worker_class("cuda", Role.FFN).classes()
LOOPBACK = "LoopbackAFDConnector"
NCCL = "NcclAFDConnector"
#: seconds an Attention engine of the NCCL pair waits for its FFN peer, and for any transfer
NCCL_CONNECT_TIMEOUT_S = 240
NCCL_TIMEOUT_S = 60
#: seconds an engine process waits for the parent's go-ahead to exit (NCCL pair only)
HOLD_S = 180
EXCHANGE_IN_GRAPH = "n/a (inside the graph)"
#: the tiny model's directory in the work directory
MODEL_DIR = "tiny-v2"
#: seconds an engine is expected to take on an H100 (docs/gpu.md, "Timing"): eager is start-up
#: (interpreter, torch and vLLM imports, about 10 s), building the engine and 4 generates of 3x32
#: tokens; a compiled mode adds Dynamo and Inductor with cold caches and the CUDA-graph captures
EXPECTED_EAGER_S = 30.0
EXPECTED_COMPILED_S = 60.0


class ModelRunner(str, enum.Enum):
    """vLLM's model runner a mode runs on (``VLLM_USE_V2_MODEL_RUNNER``, set for native vLLM and
    AFD alike, so that both run the same runner)."""

    V1 = "v1"
    #: Model Runner V2, vLLM's CUDA default since 0.29; AFD's Attention role runs on it from 0.30
    V2 = "v2"

    @property
    def env_value(self) -> str:
        return "1" if self is ModelRunner.V2 else "0"

    @property
    def attention_classes(self) -> str:
        """The AFD Attention engine's worker and runner classes on this runner."""
        return ATTENTION_CLASSES_V2 if self is ModelRunner.V2 else ATTENTION_CLASSES

    @property
    def since(self) -> str | None:
        """The first vLLM release whose AFD Attention role runs on it (None: every one); the
        same as afd_models.worker_config.MODEL_RUNNER_V2_FROM (the check's parent process imports
        no afd_models; a unit test keeps the two equal)."""
        return "0.30" if self is ModelRunner.V2 else None


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
    #: the model runner of native vLLM and of the AFD Attention engine
    runner: ModelRunner = ModelRunner.V1
    #: seconds one engine of the mode is expected to take on an H100, from start to exit (an
    #: estimate, docs/gpu.md): ``--deadline`` starts no run that would not finish in time
    expected_s: float = EXPECTED_COMPILED_S

    def llm_args(self) -> dict[str, Any]:
        return copy.deepcopy(dict(self.engine_args))


#: the modes on vLLM's V1 runner, in report order. Adding one is one entry here.
MODES_V1: tuple[Mode, ...] = (
    Mode(
        "eager",
        {"enforce_eager": True},
        graphs=Expect.ZERO,
        ubatch_splits=Expect.ZERO,
        compiled=False,
        nccl=True,
        expected_s=EXPECTED_EAGER_S,
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


#: the modes again on Model Runner V2 (``<mode>-v2``), all but DBO: V2 micro-batches only across
#: two or more DP ranks (the AFD workers refuse DBO on V2 with one), and the check's Attention
#: engine has one
MODES_V2: tuple[Mode, ...] = tuple(
    dataclasses.replace(mode, name=f"{mode.name}-v2", runner=ModelRunner.V2)
    for mode in MODES_V1
    if not mode.afd.get("dbo")
)
#: every mode, in report order
MODES = MODES_V1 + MODES_V2
#: the order the check runs the modes in, most valuable evidence first: FULL_DECODE_ONLY (the
#: exchange inside a replayed graph), then piecewise (the exchange between captured pieces, its
#: host latency measured), then eager; Model Runner V2 after V1. The check goes through them
#: once per gate placement, in GATE_ORDER, so a run cut short has each mode once before any twice.
PRIORITY = (
    "full-decode-only",
    "piecewise",
    "eager",
    "dbo",
    "full-decode-only-v2",
    "piecewise-v2",
    "eager-v2",
)


def mode_named(name: str) -> Mode:
    for mode in MODES:
        if mode.name == name:
            return mode
    raise KeyError(name)


#: where the MoE gate runs: the role that computes it (``compute_gate_on_attention``: ATTENTION)
Gate = Role


#: the gate placements in run order: the FFN role computing the gate first
GATE_ORDER = (Gate.FFN, Gate.ATTENTION)


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
