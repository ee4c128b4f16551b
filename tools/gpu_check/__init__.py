"""Check the AFD CUDA runtime against native vLLM on this GPU host, and report.

    python -m tools.gpu_check                          # a supported vLLM (CUDA) importable
    python -m tools.gpu_check --bundle DIR --deadline 480 --json out.json  # the procedure
    python -m tools.gpu_check --only eager --gate ffn --json out.json

Run from the repository root, with ``afd_models/_generated`` present (``nox -s regenerate``
writes it; carry it with the working tree); docs/gpu.md is the whole procedure for a host
without vLLM. For each mode of :data:`~tools.gpu_check.modes.MODES` and each gate placement,
most valuable first (:mod:`~tools.gpu_check.plan`: ``full-decode-only``, then ``piecewise``,
then the rest, the gate on the FFN role before the gate on attention), it runs native vLLM and
the AFD Attention worker with the in-process loopback connector on GPU 0 (the first visible
device), every engine in a fresh interpreter, and checks: equal
greedy tokens, the worker's graph and micro-batch counters against the mode (a graph mode whose
graphs never replayed tested nothing: a failure), that the exchange ran, and that the in-process
FFN weights count in vLLM's memory budget. It measures tokens/s of both engines (same prompts,
``max_tokens``, ``ignore_eos``, greedy; timed after one warm-up generate) and the connector's
round trip. With two or more CUDA devices it also runs the two-process NCCL path (FFN engine on
the second device, Attention on the first); with one it says so and skips it (a skip, not a pass).
DBO (``additional_config.afd.dbo``) runs in the NCCL pair only: an in-process FFN half would
compute inside vLLM's micro-batch threads, which vLLM's MoE kernels refuse.

Every mode runs on vLLM's V1 runner, and again on Model Runner V2 (``<mode>-v2``, native and AFD
both with ``VLLM_USE_V2_MODEL_RUNNER=1``) where the host's vLLM is 0.30 or later; on an older
one those modes are reported as not run, naming the release. DBO has no V2 mode: V2
micro-batches only across two or more DP ranks, which the check's Attention engine does not
have. The bundle carries vLLM 0.26.0 (torch 2.11); a host with another supported release
installed runs that one, with the generated code of that release.

Exit codes: 0 every run that ran passed; 2 a comparison or counter check failed; 3 bad usage, a
host that cannot run the check (no vLLM and no ``--bundle``, no CUDA device, stale generated
code), or the check itself crashed.

The JSON report is written after every run, so a check cut off keeps what finished, and
``--deadline`` starts no run that is not expected to finish in time.

One job per module: :mod:`~tools.gpu_check.modes` (the mode table, the run priority and the
counter rule), :mod:`~tools.gpu_check.plan` (the order, the deadline, the report after each
run), :mod:`~tools.gpu_check.verdict` (a run against its native run),
:mod:`~tools.gpu_check.report` (text and JSON), :mod:`~tools.gpu_check.runs` (the engine runs),
:mod:`~tools.gpu_check.host` (environment, probe, model), :mod:`~tools.gpu_check.cli`. Only the standard library is imported
in this process; torch and vLLM are imported by the engine processes,
``python -m tools.gpu_check.child`` with an internal command (``_probe``, ``_model``, ``_engine``).
"""
