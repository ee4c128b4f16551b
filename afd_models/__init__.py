"""AFD for DeepSeek MoE on vLLM 0.26: the runtime package.

Importing it only checks that the generated code (``afd_models/_generated``, written by
``nox -s regenerate``) is present and fresh; it imports nothing heavy. vLLM selects the pieces by
dotted paths: ``--worker-cls afd_models.workers.AFDAttentionCPUWorker`` and the model classes the
``vllm.general_plugins`` entry point (:func:`afd_models.plugin.register`) registers.
"""

from afd_models._freshness import check_generated_code

check_generated_code()
