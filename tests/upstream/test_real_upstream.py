"""Generation and checks against the real pinned vLLM 0.26.0 source."""

from __future__ import annotations

from pathlib import Path

from codegen.checks.suite import compare_generated, compare_lock
from codegen.index import UpstreamIndex
from codegen.lock import SymbolUse
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
    used = [(info.name.partition(".")[0], info.path) for info in index.loaded()]
    assert {package for package, _ in used} == {"vllm", "vllm_ascend"}
    for package, relative in used:
        assert (cached.sources[package].root / relative).read_bytes() == (
            pinned.sources[package].root / relative
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
    assert generation.lock is not None
    forward = generation.lock.symbols[
        "vllm.model_executor.models.deepseek_v2:DeepseekV2MoE.forward"
    ]
    body = forward.description.body
    assert SymbolUse.INHERITED_RELIED_ON in forward.uses and body is not None and len(body) == 64
    fork = generation.lock.classes[
        "afd_models._generated.vllm.model_executor.models.deepseek_v2:AFDAttentionDeepseekV2MoE"
    ]
    anchors = fork.members["__init__"].anchors
    assert anchors is not None and anchors["remote-experts"].lines == (362,)
    assert str(SymbolRef.parse(fork.base)) == "vllm.model_executor.models.deepseek_v2:DeepseekV2MoE"


def test_paths_are_repo_relative(pinned: Context) -> None:
    generation, _ = generate(pinned)
    assert all(not Path(p).is_absolute() for p in generation.files)


def test_vllm_ascends_replacement_of_a_relied_on_forward_keeps_its_contracts() -> None:
    """vLLM-Ascend's worker patch replaces DeepseekV2Model.forward, which the AFD model relies on;
    on an NPU host the runtime check evaluates the contracts on the replacement (RT005 info when
    they hold). They do hold in 0.26.0rc1's replacement, read here from its source release."""
    import ast

    from codegen.contracts import evaluate_source
    from codegen.overlay import load_overlay

    pin = Pin("vllm_ascend", "0.26.0rc1", (Distribution("vllm-ascend", "sdist"),))
    path = (
        from_cache(pin, "0.26.0rc1", quiet=True).package_dir / "patch/worker/patch_deepseek_v2.py"
    )
    text = path.read_text()
    patched = next(
        node
        for node in ast.parse(text).body
        if isinstance(node, ast.FunctionDef) and node.name == "_patched_forward"
    )
    assert "DeepseekV2Model.forward = _patched_forward" in text
    source = "\n".join(text.splitlines()[patched.lineno - 1 : patched.end_lineno]) + "\n"
    overlay = load_overlay(REPO, Path("overlay/vllm/model_executor/models/deepseek_v2.py"))
    model = next(c for c in overlay.classes if c.name == "AFDDeepseekV2Model")
    matches = evaluate_source(source, model.relies_on["forward"])
    assert [(m.contract.id, len(m.lines)) for m in matches] == [
        ("every-layer-in-order", 1),
        ("embedding-on-first-rank-only", 1),
    ]
