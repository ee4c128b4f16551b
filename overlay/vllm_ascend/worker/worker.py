"""AFD edits to vLLM-Ascend's NPU worker (``vllm_ascend/worker/worker.py``): both roles on an Ascend
NPU, with the same behaviour as the CPU and CUDA workers (``overlay/vllm/v1/worker/cpu_worker.py``).

Operators select these by dotted path: ``--worker-cls afd_models.workers.AFDAttentionNPUWorker``
(and ``AFDFFNNPUWorker``), with the AFD platform selected (``VLLM_PLUGINS``, see docs/npu.md).
vLLM-Ascend's ``init_device`` builds its MRv1 ``NPUModelRunner`` in place; the fork builds the
AFD runner generated for it instead, so no throwaway runner (whose constructor sets process-wide
NPU state) is ever built. The Attention worker refuses vLLM-Ascend's Model Runner V2 with the
engine config; the FFN worker builds its MRv1-derived runner under either choice.
"""

from vllm.config import VllmConfig
from vllm.tasks import SupportedTask
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, AsyncModelRunnerOutput, ModelRunnerOutput
from vllm.v1.worker.worker_base import CompilationTimes
from vllm_ascend.worker.model_runner_v1 import NPUModelRunner  # noqa: F401 (edit code)
from vllm_ascend.worker.worker import NPUWorker

from afd_models.config import Role
from afd_models.force_load_balance import with_balanced_moe
from afd_models.generated_classes import generated_subclass  # noqa: F401 (edit code)
from afd_models.platforms import require_afd_npu_platform
from afd_models.runner_roles import (
    build_runner,  # noqa: F401 (edit code)
    ffn_counters,
    ffn_recent_steps,
    ffn_server_of,
    refuse_requests,
    refuse_sampling,
    serve_from_config,
)
from afd_models.worker_config import prepare_worker_config
from codegen.markers import delta, extend, fork, override, replace, subclass

RUNS_NOTHING = delta(
    "decorators",
    upstream="@torch.inference_mode()",
    ours=None,
    why="the FFN worker refuses scheduler work; there is no forward to guard",
)


ATTENTION_RUNNER = replace(
    "if self.use_v2_model_runner:\n    $...V2\nelse:\n    self.model_runner = NPUModelRunner(self.vllm_config, self.device)",
    "runner = generated_subclass('AFDAttentionNPUModelRunner', NPUModelRunner)\n"
    "self.model_runner = build_runner(runner, self.vllm_config, self.device, self.afd_config)",
    id="afd-runner",
    why="the worker hard-codes its runner; the AFD one is built instead (the Attention worker "
    "refuses Model Runner V2 off CUDA with the engine config)",
)
FFN_RUNNER = replace(
    "if self.use_v2_model_runner:\n    $...V2\nelse:\n    self.model_runner = NPUModelRunner(self.vllm_config, self.device)",
    "runner = generated_subclass('AFDFFNNPUModelRunner', NPUModelRunner)\n"
    "self.model_runner = build_runner(runner, self.vllm_config, self.device, self.afd_config)",
    id="afd-runner",
    why="the worker hard-codes its runner; the AFD FFN one, derived from MRv1, is built whichever "
    "runner vLLM-Ascend picked (the FFN role serves steps, never batches)",
)


@subclass(name="AFDAttention{base}")
class AFDAttentionNPUWorker(NPUWorker):
    """The Attention role: vLLM-Ascend's worker serving requests with the AFD Attention model."""

    @override
    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
        **kwargs,
    ):
        require_afd_npu_platform()
        config, afd = prepare_worker_config(vllm_config, Role.ATTENTION)
        super().__init__(
            config,
            local_rank,
            rank,
            distributed_init_method,
            is_driver_worker=is_driver_worker,
            **kwargs,
        )
        # parsed once, here: the runner and the connector take it from the worker
        self.afd_config = afd

    @fork(ATTENTION_RUNNER)
    def init_device(self): ...

    @extend
    def afd_connector_stats(self) -> dict[str, float]:
        """Round trips through the connector (``collective_rpc("afd_connector_stats")``)."""
        return self.model_runner.afd_connector_stats()

    @extend
    def afd_counters(self) -> dict[str, int]:
        """Graph captures and replays (``collective_rpc("afd_counters")``)."""
        return self.model_runner.afd_counters()


@subclass(name="AFDFFN{base}")
class AFDFFNNPUWorker(NPUWorker):
    """The FFN role: holds the experts, no KV cache, serves the Attention role's steps."""

    @override
    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
        **kwargs,
    ):
        require_afd_npu_platform()
        config, afd = prepare_worker_config(vllm_config, Role.FFN)
        config = with_balanced_moe(config, afd)
        super().__init__(
            config,
            local_rank,
            rank,
            distributed_init_method,
            is_driver_worker=is_driver_worker,
            **kwargs,
        )
        self.afd_config = afd
        # as on CPU and CUDA: the operator's --enforce-eager says whether the FFN role may
        # replay ACL graphs for the Attention's replays
        self.afd_device_graphs = not vllm_config.model_config.enforce_eager

    @fork(FFN_RUNNER)
    def init_device(self): ...

    @override
    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return {}

    @override
    def get_supported_tasks(self) -> "tuple[SupportedTask, ...]":
        return ()

    @override(
        deltas=(
            delta(
                "decorators",
                upstream="@torch.inference_mode()",
                ours=None,
                why="nothing is profiled: the FFN role holds no KV cache",
            ),
        )
    )
    def determine_available_memory(self) -> int:
        return 0

    @override
    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        serve_from_config(self, kv_cache_config, self.afd_device_graphs)

    @override
    def compile_or_warm_up_model(self) -> CompilationTimes:
        set_random_seed(self.model_config.seed)
        return CompilationTimes(language_model=0.0, encoder=0.0)

    @override
    def execute_model(
        self,
        scheduler_output: "SchedulerOutput",
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | None:
        refuse_requests(scheduler_output)
        return EMPTY_MODEL_RUNNER_OUTPUT

    @override(deltas=(RUNS_NOTHING,))
    def sample_tokens(
        self, grammar_output: "GrammarOutput"
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
        """The FFN server's recent steps (``collective_rpc("afd_ffn_steps")``)."""
        return ffn_recent_steps(self)
