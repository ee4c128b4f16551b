"""Upstream attributes the hand-written runtime reads (beyond the names it imports).

``codegen`` reads this list statically, records each attribute in ``overlay/overlay.lock`` (symbol
use ``read_by_runtime``) and blocks generation if upstream does not define one; ``codegen drift``
reports a rename or removal in a new vLLM version before anything runs. Keep it in step with the
code: an attribute read and not listed here is invisible to the drift checker.
"""

UPSTREAM_FIELDS = (
    "vllm.config.vllm:VllmConfig.additional_config",
    "vllm.config.vllm:VllmConfig.use_v2_model_runner",
    "vllm.config.vllm:VllmConfig.with_hf_config",
    "vllm.config.vllm:VllmConfig.load_config",
    "vllm.config.model:ModelConfig.use_mla",
    "vllm.config.model:ModelConfig.hf_config",
    "vllm.config.model:ModelConfig.model",
    "vllm.config.model:ModelConfig.get_hidden_size",
    "vllm.config.model:ModelConfig.get_vocab_size",
    "vllm.config.model:ModelConfig.dtype",
    "vllm.config.model:ModelConfig.seed",
    "vllm.config.cache:CacheConfig.enable_prefix_caching",
    "vllm.config.cache:CacheConfig.num_gpu_blocks",
    "vllm.config.parallel:ParallelConfig.data_parallel_rank",
    "vllm.config.parallel:ParallelConfig.data_parallel_size",
    "vllm.config.parallel:ParallelConfig.tensor_parallel_size",
    "vllm.v1.kv_cache_interface:KVCacheConfig.kv_cache_groups",
    "vllm.v1.kv_cache_interface:KVCacheConfig.num_blocks",
    "vllm.v1.core.sched.output:SchedulerOutput.total_num_scheduled_tokens",
)
