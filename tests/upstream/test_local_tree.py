"""A locally patched upstream tree at the pinned version: `check` names the recorded symbols it changes."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from codegen.cli import main
from codegen.generate import PINS_PATH
from codegen.sources import from_cache, load_pins

from .conftest import REPO, changed_tree, once
from .test_mutations import DEEPSEEK, GPU_WORKER

MODEL_FORWARD = "vllm.model_executor.models.deepseek_v2:DeepseekV2Model.forward"
DUMMY_BATCH = "vllm.v1.worker.gpu_worker:Worker.execute_dummy_batch"


def _check(root: Path) -> tuple[int, list[str]]:
    """``python -m codegen check --no-runtime --upstream-root ROOT``: exit code and output lines."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["--repo", str(REPO), "check", "--no-runtime", "--upstream-root", str(root)])
    return code, out.getvalue().splitlines()


def _lines(output: list[str], code: str, symbol: str) -> list[str]:
    return [line for line in output if f" {code} {symbol}: " in line]


def _drift(output: list[str]) -> list[str]:
    return [line for line in output if line.split()[1:2] and line.split()[1].startswith("DRF")]


def test_patched_bodies_and_signatures_are_named(upstream_copy: Path, tmp_path: Path) -> None:
    root = changed_tree(
        upstream_copy,
        tmp_path,
        {
            DEEPSEEK: once(
                "        if get_pp_group().is_first_rank:\n            if inputs_embeds is not None:",
                "        positions = positions.clone()\n"
                "        if get_pp_group().is_first_rank:\n            if inputs_embeds is not None:",
            ),
            GPU_WORKER: once(
                "    def execute_dummy_batch(self) -> None:",
                "    def execute_dummy_batch(self, num_tokens: int = 1) -> None:",
            ),
        },
    )

    code, output = _check(root)

    assert code == 2, output
    for path in (DEEPSEEK, GPU_WORKER):
        (hashes,) = _lines(output, "UPS002", path)
        assert "1 recorded symbol(s) changed" in hashes, hashes
    (body,) = _lines(output, "DRF021", MODEL_FORWARD)
    assert "the checked tree vs the pinned release 0.26.0: body changed" in body, body
    (signature,) = _lines(output, "DRF010", DUMMY_BATCH)
    assert "param added 'num_tokens'" in signature, signature
    assert sorted(_drift(output)) == sorted([body, signature]), output


def test_unused_code_changes_no_recorded_symbol(upstream_copy: Path, tmp_path: Path) -> None:
    root = changed_tree(
        upstream_copy,
        tmp_path,
        {
            DEEPSEEK: once(
                "    if scale <= 1:\n        return 1.0", "    if scale <= 1.0:\n        return 1.0"
            )
        },
    )

    code, output = _check(root)

    assert code == 2, output
    (hashes,) = _lines(output, "UPS002", DEEPSEEK)
    assert "no recorded symbol changed (only code AFD does not use)" in hashes, hashes
    assert not _drift(output), output


def test_pinned_release_unavailable_is_said(
    upstream_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = changed_tree(
        upstream_copy, tmp_path, {DEEPSEEK: once("    if scale <= 1:", "    if scale < 1:")}
    )
    # a cache without vLLM's pinned release; vLLM-Ascend's source stays available
    ascend = from_cache(load_pins(REPO / PINS_PATH)["vllm_ascend"], "0.26.0rc1", quiet=True)
    cache = tmp_path / "vllm-cache-missing"
    (cache / "sources").mkdir(parents=True)
    (cache / "sources" / ascend.root.name).symlink_to(ascend.root)
    monkeypatch.setenv("AFD_CACHE_DIR", str(cache))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")  # nothing listens there

    code, output = _check(root)

    assert code == 2, output
    (hashes,) = _lines(output, "UPS002", DEEPSEEK)
    assert "the pinned release is not available to compare symbols with" in hashes, hashes
