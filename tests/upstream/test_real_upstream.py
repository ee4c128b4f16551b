"""Generation and checks against the real pinned vLLM 0.26.0 source."""

from __future__ import annotations

from pathlib import Path

from codegen.checks.suite import compare_generated, compare_lock
from codegen.index import UpstreamIndex
from codegen.model import SymbolRef
from codegen.pipeline import Context, generate, open_context
from codegen.sources import Distribution, Pin, from_cache

from .conftest import REPO


def test_generation_is_clean_and_locked(pinned: Context) -> None:
    """The overlay generates against vLLM 0.26.0 with no finding, and the committed lock matches."""
    generation, _ = generate(pinned)
    assert [f.one_line() for f in generation.findings] == []
    assert compare_lock(REPO, generation) == []
    assert [
        f.one_line() for f in compare_generated(REPO, generation) if f.severity.value != "info"
    ] == []


def test_installed_and_downloaded_sources_agree(pinned: Context) -> None:
    """The wheel in the download cache holds the same upstream files as the installed distribution."""
    cached = open_context(REPO, use_installed=False, quiet=True)
    generation, index = generate(pinned)
    used = [info.path for info in index.loaded()]
    for relative in used:
        assert (cached.sources["vllm"].root / relative).read_bytes() == (
            pinned.sources["vllm"].root / relative
        ).read_bytes()
    again, _ = generate(cached)
    assert again.files == generation.files


def test_source_only_release_is_read_from_its_sdist() -> None:
    """vLLM-Ascend publishes only sources: its sdist is downloaded and read, never built."""
    pin = Pin("vllm_ascend", "0.26.0rc1", (Distribution("vllm-ascend", "sdist"),))
    source = from_cache(pin, "0.26.0rc1", quiet=True)
    assert (source.package_dir / "__init__.py").exists()
    assert not list(source.root.rglob("*.so"))
    index = UpstreamIndex({"vllm_ascend": source})
    worker = index.resolve("vllm_ascend.worker.worker", "NPUWorker")
    assert worker is not None and index.is_indexed_class(worker)


def test_lock_records_what_the_overlay_relies_on(pinned: Context) -> None:
    """The lock has the inherited forward of the Attention MoE, marked relied on, with its fingerprint."""
    generation, _ = generate(pinned)
    forward = generation.lock["symbols"][
        "vllm.model_executor.models.deepseek_v2:DeepseekV2MoE.forward"
    ]
    assert "relied_on" in forward["roles"] and len(forward["body"]) == 64
    fork = generation.lock["classes"][
        "afd_models._generated.vllm.model_executor.models.deepseek_v2:AFDAttentionDeepseekV2MoE"
    ]
    assert fork["members"]["__init__"]["anchors"]["remote-experts"]["lines"] == [362]
    assert (
        str(SymbolRef.parse(fork["base"])) == "vllm.model_executor.models.deepseek_v2:DeepseekV2MoE"
    )


def test_paths_are_repo_relative(pinned: Context) -> None:
    generation, _ = generate(pinned)
    assert all(not Path(p).is_absolute() for p in generation.files)
