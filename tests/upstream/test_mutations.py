"""Mutate a copy of the real upstream; the generator must report exactly what broke."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from codegen.pipeline import generate, open_context

from .conftest import REPO

DEEPSEEK = "vllm/model_executor/models/deepseek_v2.py"
GPU_WORKER = "vllm/v1/worker/gpu_worker.py"


def mutated(
    upstream_copy: Path, tmp_path: Path, relative: str, change: Callable[[str], str]
) -> Path:
    """A tree equal to the pinned one except ``relative``, changed by ``change``."""
    root = tmp_path / "tree"
    shutil.copytree(upstream_copy, root, copy_function=os.link)
    target = root / relative
    text = change(target.read_text())
    target.unlink()
    target.write_text(text)
    return root


def _once(old: str, new: str) -> Callable[[str], str]:
    def change(text: str) -> str:
        assert text.count(old) >= 1, old
        return text.replace(old, new, 1)

    return change


MUTATIONS = [
    (
        "rename a parameter",
        DEEPSEEK,
        _once(
            '        prefix: str = "",\n        apply_routed_scale_to_output: bool = False,',
            '        name_prefix: str = "",\n        apply_routed_scale_to_output: bool = False,',
        ),
        {"SIG003"},
    ),
    (
        "change a default",
        DEEPSEEK,
        _once(
            '        reduce_results: bool = True,\n        prefix: str = "",\n        apply_routed',
            '        reduce_results: bool = False,\n        prefix: str = "",\n        apply_routed',
        ),
        {"SIG005"},
    ),
    (
        "drop an anchor",
        DEEPSEEK,
        _once("        self.experts = FusedMoE(", "        self.moe_experts = FusedMoE("),
        {"ANC002"},
    ),
    (
        "duplicate an anchor",
        DEEPSEEK,
        _once(
            "        super().__init__()\n        self.tp_size = get_tensor_model_parallel_world_size()",
            "        super().__init__()\n        super().__init__()\n        self.tp_size = get_tensor_model_parallel_world_size()",
        ),
        {"ANC003"},
    ),
    (
        "add a same-named method",
        DEEPSEEK,
        _once(
            "    def forward(\n        self,\n        hidden_states: torch.Tensor,\n        already_sequence_parallel",
            "    def afd_ffn_forward(self):\n        pass\n\n    def forward(\n        self,\n        hidden_states: torch.Tensor,\n        already_sequence_parallel",
        ),
        {"OVL004"},
    ),
    (
        "change a return annotation",
        GPU_WORKER,
        _once(
            "    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:",
            "    def get_kv_cache_spec(self) -> dict:",
        ),
        {"SIG007"},
    ),
    (
        "remove an overridden method",
        GPU_WORKER,
        _once(
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
    root = mutated(upstream_copy, tmp_path, relative, change)
    generation, _ = generate(open_context(REPO, upstream_root=root))
    found = {f.code for f in generation.findings}
    assert found == expected, [f.one_line() for f in generation.findings]
    assert generation.blocked
