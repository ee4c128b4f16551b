"""The worker classes operators name on the command line (``vllm serve ... --worker-cls <path>``).

=====================================  ==================================================
``afd_models.workers.AFDAttentionCPUWorker``  Attention role on vLLM's CPU platform
``afd_models.workers.AFDFFNCPUWorker``        FFN role on vLLM's CPU platform
``afd_models.workers.AFDAttentionWorker``     Attention role, CUDA worker (generated and checked; see docs)
``afd_models.workers.AFDFFNWorker``           FFN role, CUDA worker (generated and checked; see docs)
=====================================  ==================================================

They are generated from ``overlay/vllm/v1/worker/cpu_worker.py``; this module only names them.
"""

from afd_models._generated.vllm.v1.worker.cpu_worker import (
    AFDAttentionCPUWorker,
    AFDAttentionWorker,
    AFDFFNCPUWorker,
    AFDFFNWorker,
)

__all__ = ["AFDAttentionCPUWorker", "AFDAttentionWorker", "AFDFFNCPUWorker", "AFDFFNWorker"]
