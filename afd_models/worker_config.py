"""What an AFD worker checks and changes in its own copy of the engine config, before anything is built.

Every engine refusal of the AFD runtime lives here: the flags checked when the worker starts
(:func:`prepare_worker_config`) and the restart settings checked when it connects
(:func:`check_restart`, :func:`check_failed_steps`). What each connector can do comes from its
row of the connector table (:mod:`afd_models.connectors.specs`).

* the AFD section must be valid and name this worker's role;
* the model must be an architecture with an AFD model (DeepSeek, Qwen3-MoE); the worker asks
  vLLM for the AFD architecture (``AFDDeepseekV2ForCausalLM``, ``AFDQwen3MoeForCausalLM`` ...)
  through ``VllmConfig.with_hf_config``, a public vLLM API returning a new config, so the engine's
  own config and every non-AFD engine keep vLLM's classes;
* MLA cannot run on the CPU platform: say ``VLLM_MLA_DISABLE=1`` instead of failing deep inside;
* the connector must move this platform's tensors (gloo CPU ones, NCCL CUDA ones);
* engine flags the AFD runtime cannot serve are refused here, each naming its flag
  (:func:`refuse_unsupported`), instead of failing after the weights are loaded: among them
  ``--data-parallel-size`` > 1 on the FFN role (the loopback connector on the FFN role is refused
  earlier, when the AFD section is parsed);
* the Attention worker's config copy lists the exchange op in ``compilation_config.splitting_ops``,
  so vLLM's piecewise compilation splits the graph at every exchange, and with
  ``additional_config.afd.dbo`` it has vLLM's DBO switched on (:func:`with_dbo`);
* the FFN worker's vLLM compiles nothing (it calls its layers per step, never the compiled
  forward; AFD compiles each layer on the CPU platform, gate on FFN, unless ``--enforce-eager``) and
  reserves no KV-cache memory (it holds no KV cache), so it starts without a memory flag on a
  machine the CPU backend's default reservation would not fit twice;
* the FFN role holds no KV cache; vLLM's scheduler then needs prefix caching off
  (``--no-enable-prefix-caching``), which only the engine command line can set: refused without.

:func:`refuse_unsupported` and :func:`check_restart` read only plain attributes (vLLM's
environment and the scheduler are imported where they are needed), so this module imports
without vLLM.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from afd_models.config import (
    AFD_KEY,
    AFDConfig,
    AFDConfigError,
    Role,
    check_connector_platform,
    require_afd_config,
)
from afd_models.connectors.specs import CONNECTORS, SPECS
from afd_models.log import get_logger
from afd_models.plugin import afd_architecture, model_platform
from afd_models.release_order import release_key
from afd_models.topology import ffn_rank_of_attention

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = get_logger(__name__)

#: CUDA-graph modes that never capture the exchange: it runs eagerly between captured pieces
CUDA_GRAPH_MODES_WITHOUT_EXCHANGE = ("NONE", "PIECEWISE")


def prepare_worker_config(vllm_config: VllmConfig, role: Role) -> tuple[VllmConfig, AFDConfig]:
    """Validate the engine config for an AFD worker of ``role``; a copy that builds the AFD model.

    Raises:
        AFDConfigError: the AFD section, the model or an engine flag is not usable for this role.
    """
    afd = require_afd_config(vllm_config.additional_config, role=role)
    model_config = vllm_config.model_config
    architectures = list(getattr(model_config.hf_config, "architectures", None) or [])
    if len(architectures) != 1:
        raise AFDConfigError(
            f"model {model_config.model!r}: expected one architecture, got {architectures}"
        )
    from vllm import __version__ as vllm_version
    from vllm import envs
    from vllm.platforms import current_platform

    try:
        target = afd_architecture(
            architectures[0],
            vllm_version,
            model_platform(current_platform.device_type, is_rocm=current_platform.is_rocm()),
            tensor_parallel_size=vllm_config.parallel_config.tensor_parallel_size,
        )
    except ValueError as exc:
        raise AFDConfigError(f"model {model_config.model!r}: {exc}") from exc
    if model_config.use_mla and current_platform.is_cpu():
        raise AFDConfigError(
            f"model {model_config.model!r} uses MLA, which vLLM's CPU platform cannot run; set VLLM_MLA_DISABLE=1"
        )
    check_connector_platform(afd, current_platform.device_type)
    refuse_unsupported(
        vllm_config,
        afd,
        breakable_cudagraphs=envs.VLLM_USE_BREAKABLE_CUDAGRAPH,
        is_cuda=current_platform.is_cuda(),
    )
    config = vllm_config.with_hf_config(model_config.hf_config, architectures=[target])
    if role is Role.ATTENTION:
        config = replace(config, compilation_config=_with_exchange_splitting(config))
        if afd.dbo:
            with_dbo(config)
        check_model_runner(
            RunnerChoice(
                engine_v2=vllm_config.use_v2_model_runner,
                worker_v2=config.use_v2_model_runner,
                requested=envs.VLLM_USE_V2_MODEL_RUNNER,
                vllm_version=vllm_version,
                is_cuda=current_platform.is_cuda(),
                dbo=afd.dbo,
                data_parallel_size=vllm_config.parallel_config.data_parallel_size,
            )
        )
        compilation = config.compilation_config
        logger.info(
            "AFD attention worker: compilation mode %s, CUDA graphs %s, splitting ops %s",
            compilation.mode.name,
            compilation.cudagraph_mode.name,
            compilation.splitting_ops,
        )
    else:
        config = ffn_worker_config(
            config, current_platform.device_type, afd.compute_gate_on_attention
        )
        logger.info(
            "AFD ffn worker: computes its layers per received step, %s; no KV cache reserved",
            "each compiled by Inductor" if compiles_ffn_layers(config) else "eagerly",
        )
    return config, afd


def with_dbo(vllm_config: VllmConfig) -> None:
    """Switch vLLM's DBO on in a worker's own config copy (``vllm_config``, made for it).

    Set after the copy is made, as vLLM's ``--enable-dbo`` would be, but without the engine-wide
    check that asks for a DeepEP all2all backend: the Attention engine runs no experts, and every
    reader of these settings (the runner's micro-batch wrapper and split decision, the worker's
    workspaces) is on the worker side. Cascade attention goes off, as vLLM does for DBO.
    """
    parallel = copy.copy(vllm_config.parallel_config)
    parallel.enable_dbo = True
    model_config = copy.copy(vllm_config.model_config)
    model_config.disable_cascade_attn = True
    vllm_config.parallel_config = parallel
    vllm_config.model_config = model_config


#: vLLM's ``custom_ops`` entry that selects every op's plain-torch implementation
PLAIN_TORCH_OPS = "none"


#: the platforms whose FFN role compiles its layers (afd_models.ffn_compile) unless the engine has
#: ``--enforce-eager``: the CPU one. On CUDA the FFN graphs capture its decode steps, and a layer's
#: first compilation would fall inside a capture; vLLM-Ascend compiles through its own backend.
COMPILED_FFN_DEVICES = frozenset({"cpu"})


def ffn_worker_config(
    vllm_config: VllmConfig, device_type: str, gate_on_attention: bool
) -> VllmConfig:
    """An FFN-role config: no KV-cache reservation, and vLLM itself compiles nothing.

    The FFN role calls its layers one by one per received step, never the compiled model
    forward, so vLLM runs it as with ``--enforce-eager`` and its compilation settings start over.
    The kernels depend on the engine: with ``--enforce-eager`` (or on a platform not in
    :data:`COMPILED_FFN_DEVICES`, or with the gate on Attention, whose router logits the FFN
    role's warm-up cannot make up before the first step) vLLM's eager ones; otherwise the
    plain-torch implementations, which vLLM's compiled mode selects too, for Inductor to fuse
    when AFD compiles each layer (:func:`compiles_ffn_layers`).
    """
    from vllm.config import CompilationConfig

    compiled = (
        not vllm_config.model_config.enforce_eager
        and device_type in COMPILED_FFN_DEVICES
        and not gate_on_attention
    )
    model_config = copy.copy(vllm_config.model_config)
    model_config.enforce_eager = True
    # vLLM 0.32 marks the model config of a with_hf_config() copy (each worker's) as a view whose
    # VllmConfig.__post_init__ returns at once; the FFN config's fresh compilation settings must
    # be resolved by it (eager, custom ops on), as on earlier releases, so this copy is no view
    if getattr(model_config, "is_submodel_config", False):
        model_config.is_submodel_config = False
    return replace(
        vllm_config,
        model_config=model_config,
        compilation_config=CompilationConfig(custom_ops=[PLAIN_TORCH_OPS] if compiled else []),
        cache_config=replace(vllm_config.cache_config, kv_cache_memory_bytes=0),
    )


def compiles_ffn_layers(ffn_config: VllmConfig) -> bool:
    """Whether the FFN role computes its layers compiled: its config (:func:`ffn_worker_config`)
    selected the plain-torch implementations, which only a compiled engine's FFN config does."""
    return list(ffn_config.compilation_config.custom_ops) == [PLAIN_TORCH_OPS]


def _with_exchange_splitting(vllm_config: VllmConfig) -> Any:
    """A copy of the compilation config whose splitting ops include the AFD exchange."""
    from afd_models.ops import SPLITTING_OPS

    compilation = copy.deepcopy(vllm_config.compilation_config)
    ops = list(compilation.splitting_ops or [])
    compilation.splitting_ops = ops + [op for op in SPLITTING_OPS if op not in ops]
    return compilation


#: the first release whose Model Runner V2 the AFD Attention role runs on (CUDA): V2 has its own
#: micro-batch runner there, and it is vLLM's CUDA default (since 0.29)
MODEL_RUNNER_V2_FROM = "0.30"


@dataclass(frozen=True)
class RunnerChoice:
    """Which runner vLLM picks for an Attention engine (``VllmConfig.use_v2_model_runner``)."""

    #: vLLM's choice on the engine's config, which its scheduler follows
    engine_v2: bool
    #: vLLM's choice on the worker's own copy (AFD's DBO on), which picks the runner it builds
    worker_v2: bool
    #: ``VLLM_USE_V2_MODEL_RUNNER`` (None: unset, vLLM chose by itself)
    requested: bool | None
    vllm_version: str
    is_cuda: bool
    dbo: bool
    data_parallel_size: int


def check_model_runner(choice: RunnerChoice) -> None:
    """Follow vLLM's runner choice for the Attention role where an AFD runner exists for it: the
    V1 runners everywhere, Model Runner V2 on CUDA from vLLM 0.30. The FFN role keeps its own
    V1-derived runner under either choice and is not checked.

    Raises:
        AFDConfigError: no AFD runner for vLLM's choice, a worker that would run another runner
            than its engine's scheduler expects, or DBO on V2 with one DP rank.
    """
    if not choice.engine_v2 and not choice.worker_v2:
        return
    version = choice.vllm_version
    if not choice.is_cuda or release_key(version) < release_key(MODEL_RUNNER_V2_FROM):
        if choice.requested is False:  # vLLM overrides the setting for a feature that needs V2
            why = f"vLLM {version} chose Model Runner V2 although VLLM_USE_V2_MODEL_RUNNER=0"
            way_out = "switch off the engine feature that requires Model Runner V2"
        else:
            why = (
                "VLLM_USE_V2_MODEL_RUNNER=1 asks for Model Runner V2"
                if choice.requested
                else f"vLLM {version} chose Model Runner V2 by default (on CUDA since vLLM 0.29)"
            )
            way_out = "set VLLM_USE_V2_MODEL_RUNNER=0"
        where = "CUDA" if choice.is_cuda else "this platform"
        raise AFDConfigError(
            f"{why}, but the AFD Attention role runs on Model Runner V2 only on CUDA from vLLM "
            f"{MODEL_RUNNER_V2_FROM} (not on {where} with vLLM {version}); its runners here "
            f"derive from vLLM's V1 runner: {way_out}"
        )
    if choice.engine_v2 != choice.worker_v2:
        v2, v1 = "Model Runner V2", "the V1 runner"
        on, off = (v2, v1) if choice.engine_v2 else (v1, v2)
        cause = (
            f" (additional_config.{AFD_KEY}.dbo=true: vLLM {version} runs DBO on Model Runner "
            "V2 only when VLLM_USE_V2_MODEL_RUNNER is set)"
            if choice.dbo
            else ""
        )
        raise AFDConfigError(
            f"vLLM {version} schedules this engine for {on} but would build {off} for its AFD "
            f"Attention worker{cause}; allowed: VLLM_USE_V2_MODEL_RUNNER=1 or "
            "VLLM_USE_V2_MODEL_RUNNER=0, which both follow"
            + (" (DBO on V2 needs --data-parallel-size >= 2)" if choice.dbo else "")
        )
    if choice.dbo and choice.data_parallel_size < 2:
        raise AFDConfigError(
            f"additional_config.{AFD_KEY}.dbo=true with --data-parallel-size="
            f"{choice.data_parallel_size} on Model Runner V2: V2 micro-batches only across more "
            "than one DP rank (vLLM's maybe_build_ubatch_runner); allowed: "
            "--data-parallel-size >= 2, or VLLM_USE_V2_MODEL_RUNNER=0 (the V1 runner, on which "
            "the AFD Attention runner splits one DP rank alone)"
        )


def refuse_unsupported(
    vllm_config: Any, afd: AFDConfig, *, breakable_cudagraphs: bool = False, is_cuda: bool = False
) -> None:
    """Raise for the first engine flag this role's AFD runtime cannot serve.

    Raises:
        AFDConfigError: naming the flag, its value and what to use instead.
    """
    parallel = vllm_config.parallel_config
    role = afd.role.value
    spec = CONNECTORS[afd.connector]
    if spec.not_served is not None:
        served = sorted(
            other.name
            for other in SPECS
            if other.not_served is None and set(other.platforms) & set(spec.platforms)
        )
        raise AFDConfigError(
            f"additional_config.{AFD_KEY}.connector={afd.connector!r} is not served by the AFD "
            f"workers yet ({spec.not_served}); allowed on {' and '.join(spec.platforms)}: "
            f"{', '.join(served)}"
        )
    if parallel.pipeline_parallel_size > 1:
        raise AFDConfigError(
            f"--pipeline-parallel-size={parallel.pipeline_parallel_size} is not supported with AFD "
            f"({role} role): the AFD split already takes the pipeline's place; allowed: 1. Scale with "
            "--data-parallel-size or more engines, and additional_config.afd.num_*_ranks"
        )
    if afd.is_ffn and parallel.data_parallel_size > 1:
        # vLLM DP would shard the experts over the FFN engine's ranks and gather every rank's
        # tokens in each MoE layer: a collective all FFN ranks must enter together, while each
        # serves only its own peers' steps (and the CPU platform has no all_gatherv for it).
        raise AFDConfigError(
            f"--data-parallel-size={parallel.data_parallel_size} is not supported on the AFD FFN "
            "role: its DP ranks would have to enter every MoE layer's collective together, but "
            "each serves its own Attention peers' steps; allowed: 1. Start one FFN engine per FFN "
            "rank, each with its own additional_config.afd.rank_offset"
        )
    if parallel.enable_dbo or parallel.ubatch_size > 1:
        # vLLM accepts these flags only with a DeepEP or NIXL all2all backend, which has nothing
        # to do with the AFD exchange; the AFD section switches DBO on in the worker's own config
        raise AFDConfigError(
            f"--enable-dbo={parallel.enable_dbo} / --ubatch-size={parallel.ubatch_size} is not "
            f"supported with AFD ({role} role); allowed: no --enable-dbo and --ubatch-size 1, and "
            f"for micro-batch overlap of the exchange additional_config.afd.dbo=true on the "
            "Attention engine (thresholds from --dbo-decode-token-threshold and "
            "--dbo-prefill-token-threshold)"
        )
    if afd.dbo and not is_cuda:
        raise AFDConfigError(
            f"additional_config.{AFD_KEY}.dbo=true is not supported on this platform: vLLM runs "
            "micro-batches on CUDA streams only; allowed: dbo false (or left out)"
        )
    if parallel.enable_eplb:
        raise AFDConfigError(
            f"--enable-eplb is not supported with AFD ({role} role): the Attention role holds no "
            "experts to rebalance and the FFN role runs no scheduler steps to drive it; allowed: "
            "leave --enable-eplb off"
        )
    if vllm_config.speculative_config is not None:
        method = getattr(vllm_config.speculative_config, "method", None)
        raise AFDConfigError(
            f"--speculative-config (method {method!r}) is not supported with AFD ({role} role): the "
            "draft model's layers have no FFN peer; allowed: no --speculative-config"
        )
    if vllm_config.lora_config is not None:
        raise AFDConfigError(
            f"--enable-lora is not supported with AFD ({role} role): adapters are applied per "
            "request, and the FFN role sees no requests, so adapter weights of its layers would be "
            "skipped silently; allowed: no --enable-lora"
        )
    if afd.is_ffn and vllm_config.cache_config.enable_prefix_caching:
        raise AFDConfigError(
            "the FFN role holds no KV cache, so vLLM's scheduler needs prefix caching off: "
            "add --no-enable-prefix-caching to the FFN engine"
        )
    mode_name = vllm_config.compilation_config.cudagraph_mode.name
    if afd.is_attention and breakable_cudagraphs and mode_name != "NONE":
        # vLLM then wraps the model in its breakable wrapper, which announces no AFD step
        raise AFDConfigError(
            f"VLLM_USE_BREAKABLE_CUDAGRAPH=1 with cudagraph_mode={mode_name} is not supported by "
            "the AFD Attention worker: its graph replays would not be announced to the FFN role; "
            "allowed: VLLM_USE_BREAKABLE_CUDAGRAPH unset or 0"
        )
    if (
        afd.is_attention
        and mode_name not in CUDA_GRAPH_MODES_WITHOUT_EXCHANGE
        and not spec.graph_capturable
    ):
        raise AFDConfigError(
            f"--compilation-config cudagraph_mode={mode_name} is not supported by the AFD Attention "
            f"worker with {afd.connector}: a full CUDA graph would capture the exchange, which this "
            f"connector cannot run inside a graph; allowed: {' or '.join(CUDA_GRAPH_MODES_WITHOUT_EXCHANGE)}, "
            """e.g. --compilation-config '{"cudagraph_mode": "PIECEWISE"}', or --enforce-eager"""
        )


def check_restart(vllm_config: VllmConfig, afd: AFDConfig) -> None:
    """Refuse ``peer_restart_timeout_s`` where a step cannot simply run again: an Attention engine
    whose DP ranks send their steps to several FFN ranks (the engine's ranks decide a lost step
    together, afd_models/step_vote.py, so all of them would wait for an FFN rank that did not
    restart), a KV-transfer connector (its per-layer saves would repeat), or, on the Attention
    role, an engine that could not fail a step (:func:`check_failed_steps`) or a held step
    longer than the multiprocess executor waits for (``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``)."""
    restart = afd.peer_restart_timeout_s
    if not restart:
        return
    key = f"additional_config.afd.peer_restart_timeout_s={restart:g}"
    parallel = vllm_config.parallel_config
    dp = parallel.data_parallel_size
    if afd.is_attention and dp > 1:
        served = sorted(
            {
                ffn_rank_of_attention(
                    afd.rank_offset + rank, afd.num_attention_ranks, afd.num_ffn_ranks
                )
                for rank in range(dp)
            }
        )
        if len(served) > 1:
            raise AFDConfigError(
                f"{key} with --data-parallel-size={dp} is not allowed here: this engine's DP "
                f"ranks send their steps to FFN ranks {served}, and its ranks decide a lost step "
                "together, so all of them would wait for an FFN rank that did not restart; "
                "allowed: an Attention engine whose DP ranks share one FFN rank (num_ffn_ranks=1, "
                "or one Attention engine per FFN rank), or peer_restart_timeout_s=0"
            )
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        raise AFDConfigError(
            f"{key} with --kv-transfer-config is not allowed: a step run again would save its "
            "layers' KV cache through the KV connector twice; allowed: one of them"
        )
    if afd.is_ffn:  # the FFN server waits in a thread of its own, never inside a step
        return
    check_failed_steps(vllm_config, key)
    from vllm import envs

    timeout_s = afd.connector_extra_config.timeout_s
    # noticing the loss, forming the data plane again, and a retry that fails again
    held_s = restart + 3 * timeout_s
    limit = envs.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS
    if parallel.distributed_executor_backend == "mp" and held_s >= limit:
        raise AFDConfigError(
            f"{key} with connector_extra_config.timeout_s={timeout_s:g} is not allowed with "
            f"--distributed-executor-backend mp: a held step may take peer_restart_timeout_s + "
            f"3 * timeout_s = {held_s:g} s, and the executor gives a step "
            f"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS={limit} s; allowed: peer_restart_timeout_s + "
            f"3 * timeout_s < {limit} (or raise that variable)"
        )


def check_failed_steps(vllm_config: VllmConfig, key: str) -> None:
    """Refuse an Attention engine that could not fail a step's requests and stay up once no FFN
    engine came back in time: that needs the AFD scheduler, which finishes them, and a
    synchronous engine core, which hands it the failed step unsampled."""
    # generated code: imported where a restart is configured, not by every connector user
    from afd_models.scheduler import SCHEDULER_CLS, AFDScheduler

    scheduler = vllm_config.scheduler_config
    if scheduler.async_scheduling:
        raise AFDConfigError(
            f"{key} with --async-scheduling is not allowed: the engine samples every step, "
            "so the requests of a step whose FFN engine did not come back would get no error "
            "finish; allowed: --no-async-scheduling, or peer_restart_timeout_s=0"
        )
    chosen = scheduler.get_scheduler_cls()
    if not (isinstance(chosen, type) and issubclass(chosen, AFDScheduler)):
        name = f"{chosen.__module__}.{chosen.__qualname__}"
        if scheduler.scheduler_cls is None:
            name += " (vLLM's default)"
        raise AFDConfigError(
            f"{key} with --scheduler-cls {name} is not allowed: once no FFN engine came back "
            "within the timeout, the requests of the step are failed by the AFD scheduler "
            f"(and the engine stays up); allowed: --scheduler-cls {SCHEDULER_CLS}, or "
            "peer_restart_timeout_s=0"
        )
