"""Commands an operator runs on one machine to try and check AFD, apart from the runtime.

    python -m afd_models.cli.tiny_models OUT_DIR     # a tiny random DeepSeek / Qwen3-MoE model
    python -m afd_models.cli.verify --hf-config ...  # AFD equals native vLLM for a config
    python -m afd_models.cli.demo                    # an AFD pair next to plain vLLM on the CPU

with the libraries they are built on, which benchmarks and tests use too: :mod:`.serve` (``vllm
serve`` processes on 127.0.0.1), :mod:`.gloo_bench` (the connector's round trip against raw gloo
and TCP) and :mod:`.hf_config` (what an HF config says about its model). The runtime (workers,
connectors, models) never imports this package.
"""
