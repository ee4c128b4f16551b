"""vLLM on the CPU platform (the primary release, or another supported one) runs a tiny DeepSeek-V2
model built by the tests."""

from __future__ import annotations

import json
from pathlib import Path

from tests.engine import run_python


def test_vllm_imports_on_the_cpu_platform(vllm_env: dict[str, str]) -> None:
    """The installed vLLM is a supported release, the one the generated code is for, and resolves
    the CPU platform."""
    result = run_python(
        """
        import json, vllm
        from vllm.platforms import current_platform
        print(json.dumps([vllm.__version__, type(current_platform).__name__, current_platform.is_cpu()]))
        """,
        vllm_env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    from afd_models._generated import SUPPORTED, UPSTREAM

    version, platform, is_cpu = json.loads(result.stdout.splitlines()[-1])
    assert version.split("+")[0] == UPSTREAM["vllm"] and UPSTREAM["vllm"] in SUPPORTED["vllm"]
    assert (platform, is_cpu) == ("CpuPlatform", True)


def test_tiny_deepseek_v2_generates(tiny_v2: Path, vllm_env: dict[str, str]) -> None:
    """The tiny model loads through vLLM's real loader and greedy decoding is reproducible."""
    result = run_python(
        f"""
        import json
        from vllm import LLM, SamplingParams
        llm = LLM(model={str(tiny_v2)!r}, dtype="bfloat16", max_model_len=256, enforce_eager=True, seed=0,
                  max_num_batched_tokens=256, max_num_seqs=4)
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        first = llm.generate(["Hello world, the license"], params, use_tqdm=False)[0].outputs[0].token_ids
        again = llm.generate(["Hello world, the license"], params, use_tqdm=False)[0].outputs[0].token_ids
        arch = llm.llm_engine.model_config.hf_config.architectures
        print(json.dumps([list(first), list(again), arch]))
        """,
        vllm_env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    first, again, arch = json.loads(result.stdout.splitlines()[-1])
    assert len(first) == 12 and first == again
    assert arch == ["DeepseekV2ForCausalLM"]
