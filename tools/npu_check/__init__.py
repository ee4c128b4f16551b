"""Validate an AFD install on an Ascend NPU host (vLLM-Ascend 0.26.0rc1), and report.

    export VLLM_PLUGINS=afd_npu,afd_models,ascend_kv_connector,ascend_model_loader,ascend_service_profiling,ascend_model
    python -m tools.npu_check [--json PATH] [--work-dir DIR] [--engine-timeout S]

Run from the repository root, in the operator's NPU environment (CANN, torch_npu, this checkout
installed with the ``npu`` extra, ``afd_models/_generated`` regenerated there; docs/npu.md). Two
checks, each in fresh interpreters:

1. **runtime origin**: ``python -m codegen check --format json``; with vLLM-Ascend importable it
   applies vLLM-Ascend's platform and worker patches before its runtime checks, so a forked or
   relied-on upstream method or an imported upstream name that vLLM-Ascend replaces is a finding
   (``RT005``). Any block or review finding fails, and so does a run whose runtime checks did not
   run (``RT001``): it would have tested nothing of the NPU runtime.
2. **parity**: a tiny DeepSeek model with one MoE layer, written here with a local tokenizer;
   native vLLM-Ascend (its own platform and ``NPUWorker``) against the AFD Attention NPU worker
   with the in-process ``LoopbackAFDConnector`` (AFD's platform), eager, greedy: the tokens must be
   equal, and the connector must have exchanged.

Exit codes: 0 both checks passed; 2 a check failed; 3 bad usage, a host that cannot run the check
(no torch_npu or vLLM-Ascend, the ``afd_npu`` platform plugin not installed or not selected by
``VLLM_PLUGINS``, no NPU, other versions, stale generated code), or the check itself crashed.

One job per module: :mod:`~tools.npu_check.settings`, :mod:`~tools.npu_check.host` (the plugin
rule, probe and model), :mod:`~tools.npu_check.checks` (the two checks and their verdicts),
:mod:`~tools.npu_check.report`, :mod:`~tools.npu_check.cli`. Only the standard library is imported
in this process; the engine-process handling and engine results are :mod:`tools.harness`'s, and
the processes run ``python -m tools.npu_check.child`` with an internal command (``_probe``,
``_model``, ``_engine``).
"""
