"""Mutate a copy of the real upstream; the generator must report exactly what broke."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from codegen.pipeline import generate, open_context

from .conftest import REPO, changed_tree, once

DEEPSEEK = "vllm/model_executor/models/deepseek_v2.py"
GPU_WORKER = "vllm/v1/worker/gpu_worker.py"


MUTATIONS = [
    (
        "rename a parameter",
        DEEPSEEK,
        once(
            '        prefix: str = "",\n        apply_routed_scale_to_output: bool = False,',
            '        name_prefix: str = "",\n        apply_routed_scale_to_output: bool = False,',
        ),
        {"SIG003"},
    ),
    (
        "change a default",
        DEEPSEEK,
        once(
            '        reduce_results: bool = True,\n        prefix: str = "",\n        apply_routed',
            '        reduce_results: bool = False,\n        prefix: str = "",\n        apply_routed',
        ),
        {"SIG005"},
    ),
    (
        "drop an anchor",
        DEEPSEEK,
        once("        self.experts = FusedMoE(", "        self.moe_experts = FusedMoE("),
        {"ANC002"},
    ),
    (
        "duplicate an anchor",
        DEEPSEEK,
        once(
            "        super().__init__()\n        self.tp_size = get_tensor_model_parallel_world_size()",
            "        super().__init__()\n        super().__init__()\n        self.tp_size = get_tensor_model_parallel_world_size()",
        ),
        {"ANC003"},
    ),
    (
        "add a same-named method",
        DEEPSEEK,
        once(
            "    def forward(\n        self,\n        hidden_states: torch.Tensor,\n        already_sequence_parallel",
            "    def afd_ffn_forward(self):\n        pass\n\n    def forward(\n        self,\n        hidden_states: torch.Tensor,\n        already_sequence_parallel",
        ),
        {"OVL004"},
    ),
    (
        "change a return annotation",
        GPU_WORKER,
        once(
            "    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:",
            "    def get_kv_cache_spec(self) -> dict:",
        ),
        {"SIG007"},
    ),
    (
        "remove an overridden method",
        GPU_WORKER,
        once(
            "    def execute_dummy_batch(self) -> None:",
            "    def execute_dummy_batch_v2(self) -> None:",
        ),
        {"OVL003"},
    ),
]


@pytest.mark.parametrize(
    ("what", "relative", "change", "expected"), MUTATIONS, ids=[m[0] for m in MUTATIONS]
)
def test_mutation_is_reported(
    what: str,
    relative: str,
    change: Callable[[str], str],
    expected: set[str],
    upstream_copy: Path,
    tmp_path: Path,
) -> None:
    """Each upstream mutation yields its finding code and nothing unrelated."""
    root = changed_tree(upstream_copy, tmp_path, {relative: change})
    generation, _ = generate(open_context(REPO, upstream_root=root))
    found = {f.code for f in generation.findings}
    assert found == expected, [f.one_line() for f in generation.findings]
    assert generation.blocked
