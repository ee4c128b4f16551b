"""What starts an AFD engine of each role: its worker class and the flags the role needs.

An AFD engine is ``vllm serve MODEL --worker-cls <path> --additional-config '{"afd": ...}'`` plus
its role's flags (:data:`ROLE_ARGS`). :data:`WORKER_CLASSES` is the one table of the worker
classes, one frozen row per platform and role: the path operators name, the class generated for
it, and the AFD model runners it builds, per vLLM runner where they differ. The deployment
commands, the GPU and NPU checks, ``verify``, the benchmarks and :mod:`afd_models.workers` (which
serves the paths) read it; no other code spells a worker's path (``tests/unit/test_launch.py``
checks that, and that every class it names is generated for the supported releases).

Standard library only: the tools' parent processes and the operator commands read it without
vLLM.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from afd_models.config import Role

#: the module whose attributes ``--worker-cls`` names (it serves this table's classes)
WORKERS_MODULE = "afd_models.workers"
#: where the generated worker and runner classes live
_VLLM_WORKER = "afd_models._generated.vllm.v1.worker"
_ASCEND_WORKER = "afd_models._generated.vllm_ascend.worker"

#: flags each role's engines get (docs/user-guide.md, "Flags the roles need"): SIGTERM stops the
#: FFN loop and closes the connector gracefully, and the FFN worker reports no KV cache, which
#: vLLM's scheduler runs only without prefix caching
SHUTDOWN_ARGS = ("--shutdown-timeout", "5")
ROLE_ARGS: Mapping[Role, tuple[str, ...]] = MappingProxyType(
    {
        Role.ATTENTION: SHUTDOWN_ARGS,
        Role.FFN: ("--no-enable-prefix-caching", *SHUTDOWN_ARGS),
    }
)


class Runner(enum.Enum):
    """vLLM's model runner an engine runs (``VllmConfig.use_v2_model_runner``), which the AFD
    Attention worker follows where an AFD runner exists for it."""

    #: the V1 runners: ``GPUModelRunner`` and the CPU and NPU runners derived from it
    V1 = "v1"
    #: Model Runner V2 (``vllm.v1.worker.gpu.model_runner``): the Attention role on CUDA, from
    #: vLLM 0.30 (``afd_models.worker_config.MODEL_RUNNER_V2_FROM``)
    V2 = "v2"


@dataclass(frozen=True, kw_only=True)
class WorkerClass:
    """One AFD worker class: a row of the worker-class table."""

    #: vLLM's platform it runs on (``current_platform.device_type``)
    platform: str
    #: the role of its engine
    role: Role
    #: the generated class, ``module:Class``
    generated: str
    #: the generated AFD model runner it builds, ``module:Class``, by the runner vLLM chose
    runners: Mapping[Runner, str]

    @property
    def name(self) -> str:
        """The class name, as an engine reports it."""
        return self.generated.rpartition(":")[2]

    @property
    def path(self) -> str:
        """What ``--worker-cls`` names: the class as :mod:`afd_models.workers` serves it."""
        return f"{WORKERS_MODULE}.{self.name}"

    def classes(self, runner: Runner = Runner.V1) -> str:
        """``Worker/Runner``: the class names of an engine of this worker on ``runner`` (what the
        GPU and NPU checks expect an engine to report)."""
        return f"{self.name}/{self.runners[runner].rpartition(':')[2]}"


def _runners(module: str, v1: str, v2: str | None = None) -> Mapping[Runner, str]:
    found = {Runner.V1: f"{module}:{v1}"}
    if v2 is not None:
        found[Runner.V2] = v2
    return MappingProxyType(found)


#: every AFD worker class, one row per platform and role
WORKER_CLASSES: tuple[WorkerClass, ...] = (
    WorkerClass(
        platform="cpu",
        role=Role.ATTENTION,
        generated=f"{_VLLM_WORKER}.cpu_worker:AFDAttentionCPUWorker",
        runners=_runners(f"{_VLLM_WORKER}.cpu_model_runner", "AFDAttentionCPUModelRunner"),
    ),
    WorkerClass(
        platform="cpu",
        role=Role.FFN,
        generated=f"{_VLLM_WORKER}.cpu_worker:AFDFFNCPUWorker",
        runners=_runners(f"{_VLLM_WORKER}.cpu_model_runner", "AFDFFNCPUModelRunner"),
    ),
    WorkerClass(
        platform="cuda",
        role=Role.ATTENTION,
        generated=f"{_VLLM_WORKER}.cpu_worker:AFDAttentionWorker",
        runners=_runners(
            f"{_VLLM_WORKER}.cpu_model_runner",
            "AFDAttentionGPUModelRunner",
            f"{_VLLM_WORKER}.gpu.model_runner:AFDAttentionGPUModelRunnerV2",
        ),
    ),
    WorkerClass(
        platform="cuda",
        role=Role.FFN,
        generated=f"{_VLLM_WORKER}.cpu_worker:AFDFFNWorker",
        runners=_runners(f"{_VLLM_WORKER}.cpu_model_runner", "AFDFFNGPUModelRunner"),
    ),
    WorkerClass(
        platform="npu",
        role=Role.ATTENTION,
        generated=f"{_ASCEND_WORKER}.worker:AFDAttentionNPUWorker",
        runners=_runners(f"{_ASCEND_WORKER}.model_runner_v1", "AFDAttentionNPUModelRunner"),
    ),
    WorkerClass(
        platform="npu",
        role=Role.FFN,
        generated=f"{_ASCEND_WORKER}.worker:AFDFFNNPUWorker",
        runners=_runners(f"{_ASCEND_WORKER}.model_runner_v1", "AFDFFNNPUModelRunner"),
    ),
)


def worker_class(platform: str, role: Role) -> WorkerClass:
    """The worker class of ``role`` on ``platform``.

    Raises:
        LookupError: no AFD worker for that platform, naming the platforms that have one.
    """
    for row in WORKER_CLASSES:
        if row.platform == platform and row.role is role:
            return row
    platforms = sorted({row.platform for row in WORKER_CLASSES})
    raise LookupError(
        f"no AFD {role.value} worker on platform {platform!r}; allowed: {', '.join(platforms)}"
    )


def named(name: str) -> WorkerClass | None:
    """The worker class called ``name`` (an attribute of :mod:`afd_models.workers`), if any."""
    return next((row for row in WORKER_CLASSES if row.name == name), None)
