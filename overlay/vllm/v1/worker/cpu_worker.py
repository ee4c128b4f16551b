"""AFD edits to vLLM's workers: the CPU worker and the GPU worker it derives from.

Operators select these by dotted path: ``vllm serve MODEL --worker-cls
afd_models.workers.AFDAttentionCPUWorker`` (and ``AFDFFNCPUWorker`` for the FFN engine).

The FFN worker runs under vLLM's own EngineCore, unpatched: it reports no KV cache (EngineCore takes
its attention-free path) and no supported tasks (the API server registers no generation routes),
and serves the Attention role from a background thread started once the engine is initialized.
"""

from vllm.config import VllmConfig
from vllm.tasks import SupportedTask
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, AsyncModelRunnerOutput, ModelRunnerOutput
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.worker_base import CompilationTimes

from afd_models.config import Role
from afd_models.generated_classes import generated_subclass
from afd_models.runner_roles import (
    attention_runner_class,
    build_runner,
    dummy_step_across_restarts,
    ffn_counters,
    ffn_recent_steps,
    ffn_server_of,
    refuse_requests,
    refuse_sampling,
    serve_from_config,
)
from afd_models.worker_config import prepare_worker_config
from codegen.markers import contract, delta, extend, override, subclass

WORKER_BASES = ("CPUWorker", "vllm.v1.worker.gpu_worker:Worker")
INIT_DEVICE_SPAN = delta(
    "decorators",
    upstream="@instrument(span_name='Init device')",
    ours=None,
    base="Worker",
    why="calls super().init_device(), which opens the tracing span",
)
RUNS_NOTHING = delta(
    "decorators",
    upstream="@torch.inference_mode() @with_gpu_sync_check",
    ours=None,
    why="the FFN worker refuses scheduler work; there is no forward to guard",
)

#: How vLLM picks the runner its workers build (``VllmConfig.use_v2_model_runner``). The AFD
#: Attention worker follows that choice where an AFD runner exists for it (Model Runner V2 on
#: CUDA from vLLM 0.30, the V1 runners everywhere) and refuses it elsewhere, naming the setting
#: (afd_models/worker_config.py); the FFN worker keeps its V1-derived runner. A change in that
#: choice must block at the audit, not surprise an operator at start-up.
V1_OR_V2 = "whether vLLM builds Model Runner V1 or V2"
RUNNER_CHOICE = {
    "vllm.config.vllm:VllmConfig.use_v2_model_runner": (
        contract(
            """
            use_v2_model_runner = envs.VLLM_USE_V2_MODEL_RUNNER
            if use_v2_model_runner is not None:
                return use_v2_model_runner
            """,
            id="the-setting-decides",
            selects=V1_OR_V2,
            if_broken="VLLM_USE_V2_MODEL_RUNNER=0, which the AFD workers' refusal names, "
            "would no longer put an engine on the V1 runner they are written for",
        ),
        contract(
            """
            if not HAS_TRITON:
                ...
                return False
            """,
            id="no-triton-keeps-v1",
            selects=V1_OR_V2,
            if_broken="vLLM's CPU platform, which has no Triton, could move onto Model Runner "
            "V2, on which the AFD CPU workers do not run (upstream has Triton-free stand-ins "
            "for V2's kernels in the works)",
        ),
        contract(
            """
            if not self._is_default_v2_model_runner_model():
                return False
            """,
            id="v1-by-default-for-afd",
            selects=V1_OR_V2,
            if_broken="vLLM would pick Model Runner V2 by default for models outside its "
            "list, AFD's architectures among them (vLLM 0.29 did, vllm#53183)",
            when="vllm<0.29",
        ),
        contract(
            """
            unsupported = self._get_v2_model_runner_unsupported_features()
            if unsupported:
                ...
                return False
            return True
            """,
            id="v2-unless-unsupported",
            selects=V1_OR_V2,
            if_broken="vLLM's default runner for AFD's architectures would follow another "
            "rule than V2 unless a feature of the engine is unsupported there",
        ),
    )
}

#: Which model runner vLLM's workers build, from that choice: the AFD workers replace the runner
#: their base built by the AFD runner generated for its class (the Attention worker) or keep the
#: V1 one (the FFN worker sets ``use_v2_model_runner = False`` for that). Selection rules: a new
#: rule (a platform method choosing instead, say) blocks naming the roles it decides for.
RUNNER_SELECTION = {
    "vllm.v1.worker.cpu_worker:CPUWorker.init_device": (
        contract(
            """
            if self.use_v2_model_runner:
                ...
            else:
                ...
                self.model_runner = CPUModelRunner(...)
                ...
            """,
            id="cpu-runner-by-setting",
            selects="the model runner vLLM's CPU worker builds",
            if_broken="vLLM's CPU worker would build its runner by another rule than the V1/V2 "
            "choice: the AFD CPU workers could get a runner no AFD runner is generated for, or "
            "the FFN worker one it cannot keep on V1",
            base="CPUWorker",
        ),
    ),
    "vllm.v1.worker.gpu_worker:Worker.init_device": (
        contract(
            """
            if self.use_v2_model_runner:
                ...
            else:
                ...
                self.model_runner = GPUModelRunnerV1(...)
                ...
            """,
            id="cuda-runner-by-setting",
            selects="the model runner vLLM's CUDA worker builds",
            if_broken="vLLM's CUDA worker would build its runner by another rule than the V1/V2 "
            "choice: the AFD CUDA workers could get a runner no AFD runner is generated for",
            base="Worker",
            when="vllm<0.32",
        ),
    ),
    "vllm.v1.worker.gpu_worker:Worker._make_model_runner": (
        contract(
            """
            if self.use_v2_model_runner:
                ...
                return GPUModelRunnerV2(...)
            """,
            id="cuda-runner-by-setting",
            selects="the model runner vLLM's CUDA worker builds",
            if_broken="vLLM's CUDA worker would build its runner by another rule than the V1/V2 "
            "choice: the AFD CUDA workers could get a runner no AFD runner is generated for",
            base="Worker",
            when="vllm>=0.32",
        ),
    ),
}

#: The KV block size vLLM's CPU platform picks for AFD's CPU configurations: 128, from the config
#: alone, before any model exists. The AFD Attention worker builds its model in its own copy of
#: the config (afd_models/worker_config.py), so a rule that reads the model's attention layers
#: from the engine's config would find none and keep a size the CPU attention backend refuses.
CPU_BLOCK_SIZE = {
    "vllm.platforms.cpu:CpuPlatform.check_and_update_config": (
        contract(
            "cache_config.block_size = 128",
            id="cpu-block-size-from-config",
            if_broken="the CPU platform no longer sets the KV block size from the config; if "
            "it now follows the attention layers, it would not find those the AFD Attention "
            "worker builds in its own config copy, and keep a block size vLLM's CPU attention "
            "refuses",
        ),
    )
}


@subclass(
    bases=WORKER_BASES,
    name="AFDAttention{base}",
    relies_on={**RUNNER_CHOICE, **RUNNER_SELECTION, **CPU_BLOCK_SIZE},
)
class AFDAttentionCPUWorker(CPUWorker):
    """The Attention role: vLLM's worker serving requests with the AFD Attention model."""

    @override
    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
    ):
        config, afd = prepare_worker_config(vllm_config, Role.ATTENTION)
        super().__init__(
            config, local_rank, rank, distributed_init_method, is_driver_worker=is_driver_worker
        )
        # parsed once, here: the runner and the connector take it from the worker
        self.afd_config = afd

    @override(deltas=(INIT_DEVICE_SPAN,))
    def init_device(self):
        super().init_device()
        # vLLM hard-codes its runner in init_device (V1 or Model Runner V2, as it chose); use
        # the AFD runner generated for that class
        runner = attention_runner_class(type(self.model_runner))
        self.model_runner = build_runner(runner, self.vllm_config, self.device, self.afd_config)

    @override
    def execute_dummy_batch(self) -> None:
        # an idle DP rank's step: its model call is held across an FFN restart and voted on with
        # the busy ranks' (the runner's _dummy_run); one given up on has no request to fail
        dummy_step_across_restarts(super().execute_dummy_batch)

    @extend
    def afd_connector_stats(self) -> dict[str, float]:
        """Round trips through the connector (``collective_rpc("afd_connector_stats")``)."""
        return self.model_runner.afd_connector_stats()

    @extend
    def afd_counters(self) -> dict[str, int]:
        """Graph captures and replays, micro-batch splits (``collective_rpc("afd_counters")``)."""
        return self.model_runner.afd_counters()


@subclass(bases=WORKER_BASES, name="AFDFFN{base}", relies_on=RUNNER_SELECTION)
class AFDFFNCPUWorker(CPUWorker):
    """The FFN role: holds the experts, no KV cache, serves the Attention role's steps."""

    @override
    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
    ):
        config, afd = prepare_worker_config(vllm_config, Role.FFN)
        super().__init__(
            config, local_rank, rank, distributed_init_method, is_driver_worker=is_driver_worker
        )
        self.afd_config = afd
        # the FFN worker's own config runs eagerly; the operator's --enforce-eager (on the
        # engine's config) says whether it may replay device graphs for the Attention's replays
        self.afd_device_graphs = not vllm_config.model_config.enforce_eager
        # the FFN role serves steps, never batches: it keeps its runner, derived from the V1
        # runner, whichever runner vLLM picked for the engine (init_device builds from this)
        self.use_v2_model_runner = False

    @override(deltas=(INIT_DEVICE_SPAN,))
    def init_device(self):
        super().init_device()
        runner = generated_subclass("AFDFFNCPUModelRunner", type(self.model_runner))
        self.model_runner = build_runner(runner, self.vllm_config, self.device, self.afd_config)

    @override
    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return {}

    @override
    def get_supported_tasks(self) -> tuple[SupportedTask, ...]:
        return ()

    @override(
        deltas=(
            delta(
                "decorators",
                upstream="@torch.inference_mode()",
                ours=None,
                base="Worker",
                why="nothing is profiled: the FFN role holds no KV cache",
            ),
        )
    )
    def determine_available_memory(self) -> int:
        return 0

    @override(
        deltas=(
            delta(
                "decorators",
                upstream="@instrument(span_name='Allocate KV cache')",
                ours=None,
                why="there is no KV cache to allocate; the FFN server starts here instead",
            ),
        )
    )
    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        serve_from_config(self, kv_cache_config, self.afd_device_graphs)

    @override(
        deltas=(
            delta(
                "decorators",
                upstream="@instrument(span_name='Warmup (GPU)')",
                ours=None,
                base="Worker",
                why="no warm-up: the FFN role computes only when the Attention role sends work",
            ),
        )
    )
    def compile_or_warm_up_model(self) -> CompilationTimes:
        set_random_seed(self.model_config.seed)
        return CompilationTimes(language_model=0.0, encoder=0.0)

    @override(deltas=(RUNS_NOTHING,))
    def execute_model(
        self, scheduler_output: "SchedulerOutput"
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | None:
        refuse_requests(scheduler_output)
        return EMPTY_MODEL_RUNNER_OUTPUT

    @override(deltas=(RUNS_NOTHING,))
    def sample_tokens(
        self, grammar_output: "GrammarOutput | None"
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        refuse_sampling()

    @override
    def execute_dummy_batch(self) -> None:
        return None

    @override
    def check_health(self) -> None:
        super().check_health()
        if (server := ffn_server_of(self)) is not None:
            server.raise_if_failed()

    @extend
    def afd_counters(self) -> dict[str, int]:
        """Graph captures and replays of the FFN graphs (``collective_rpc("afd_counters")``)."""
        return ffn_counters(self)

    @extend
    def afd_ffn_steps(self) -> list[dict[str, object]]:
        """The FFN server's recent steps (``collective_rpc("afd_ffn_steps")``): what each
        Attention peer announced and what this FFN rank computed on."""
        return ffn_recent_steps(self)
