"""``python -m afd_models.cli.verify``: AFD computes exactly what native vLLM computes, for a
DeepSeek or Qwen3-MoE config of yours.

One module per job: :mod:`.validate` refuses what cannot be verified on the CPU platform,
:mod:`.shrink` makes a big config small with the same routing structure, :mod:`.capture` runs
vLLM (natively, or as the AFD Attention model behind the loopback connector) in a subprocess and
records every decoder layer's output, :mod:`.compare` measures the differences, and :mod:`.run`
is the command that strings them together and prints the verdict. The package imports
nothing, so ``python -m afd_models.cli.verify.capture`` runs its module once.
"""
