"""The worker classes operators name on the command line (``vllm serve ... --worker-cls <path>``).

==============================================  ==============================================
``afd_models.workers.AFDAttentionCPUWorker``    Attention role on vLLM's CPU platform
``afd_models.workers.AFDFFNCPUWorker``          FFN role on vLLM's CPU platform
``afd_models.workers.AFDAttentionWorker``       Attention role, CUDA worker (generated and checked; see docs)
``afd_models.workers.AFDFFNWorker``             FFN role, CUDA worker (generated and checked; see docs)
``afd_models.workers.AFDAttentionNPUWorker``    Attention role, vLLM-Ascend's NPU worker (see docs/npu.md)
``afd_models.workers.AFDFFNNPUWorker``          FFN role, vLLM-Ascend's NPU worker (see docs/npu.md)
==============================================  ==============================================

They are generated from ``overlay/vllm/v1/worker/cpu_worker.py`` and
``overlay/vllm_ascend/worker/worker.py``; this module only serves them, by the worker-class
table (:data:`afd_models.launch.WORKER_CLASSES`), each imported when first named (the NPU workers
import vLLM-Ascend, which needs an Ascend host).
"""

import importlib
from typing import Any

from afd_models.freshness import check_generated_code
from afd_models.launch import named

# before the first generated import: a checkout with no generated code, or a stale one, fails here
# with the command that fixes it (the generated registry repeats the check for every other path)
check_generated_code()


def __getattr__(name: str) -> Any:
    row = named(name)
    if row is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, cls = row.generated.partition(":")
    return getattr(importlib.import_module(module), cls)
