"""The drift checker on real upgrades (0.26.0 -> 0.27.0 / 0.28.0), its exit codes, and mutation testing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codegen.cli import main
from codegen.drift_cli import run_drift
from codegen.mutations import run as run_mutations
from codegen.mutations import summarize

from .conftest import REPO

DEEPSEEK = "afd_models._generated.vllm.model_executor.models.deepseek_v2"


@pytest.fixture(scope="module", params=["0.27.0", "0.28.0"])
def upgrade(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return run_drift(REPO, request.param)


def _by(findings, code):  # type: ignore[no-untyped-def]
    return {f.symbol: f for f in findings if f.code == code}


def test_fused_moe_rename_blocks_both_moe_forks(upgrade) -> None:  # type: ignore[no-untyped-def]
    """vLLM renamed ``FusedMoE`` (now ``FusedMoEFactory`` in deepseek_v2.py): the name we import is
    gone and the two anchors on ``FusedMoE(...)`` are lost; all three block."""
    removed = _by(upgrade.findings, "DRF001")
    assert removed["vllm.model_executor.layers.fused_moe.layer:FusedMoE"].severity.value == "block"
    lost = _by(upgrade.findings, "DRF030")
    assert set(lost) == {
        f"{DEEPSEEK}:AFDAttentionDeepseekV2MoE.__init__#remote-experts",
        f"{DEEPSEEK}:AFDFFNDeepseekV2MoE.__init__#external-router-on-gate-placement",
    }
    assert all(f.severity.value == "block" for f in lost.values())


def test_gate_moved_out_of_moe_forward_in_0_28() -> None:
    """0.28 no longer runs the gate in the inherited ``DeepseekV2MoE.forward``: gate-on-Attention
    relies on that forward, so it is a review finding carrying the diff."""
    run = run_drift(REPO, "0.28.0")
    changed = _by(run.findings, "DRF021")[
        "vllm.model_executor.models.deepseek_v2:DeepseekV2MoE.forward"
    ]
    assert changed.severity.value == "review" and "AFD relies on it" in changed.message
    assert any(
        line.startswith("-") and "self.gate(hidden_states)" in line for line in changed.details
    )


def test_unchanged_version_is_clean() -> None:
    """Comparing the pinned version with itself finds nothing."""
    assert run_drift(REPO, "0.26.0").findings == []


def test_formats_and_exit_codes(tmp_path: Path) -> None:
    """Exit 2 with blocking findings; JSON and SARIF come from the same findings."""
    assert (
        main(["drift", "--to", "0.28.0", "--format", "json", "--out", str(tmp_path / "d.json")])
        == 2
    )
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["counts"]["by_severity"]["block"] >= 3 and all(
        {"code", "severity", "symbol", "message"} <= set(f) for f in data["findings"]
    )
    assert (
        main(["drift", "--to", "0.28.0", "--format", "sarif", "--out", str(tmp_path / "d.sarif")])
        == 2
    )
    sarif = json.loads((tmp_path / "d.sarif").read_text())
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["results"]
    assert main(["drift", "--to", "0.26.0", "--out", str(tmp_path / "same.md")]) == 0


def test_internal_error_exits_3(tmp_path: Path) -> None:
    """An unknown version (nothing to download) is a tool error: exit 3, never 0."""
    assert main(["drift", "--to", "0.0.0-nonexistent", "--out", str(tmp_path / "x.md")]) == 3


def test_audit_writes_report_and_leaves_overlay_alone(tmp_path: Path) -> None:
    """audit writes Markdown and JSON, with a work list and the dry-run result; overlay and lock are untouched."""
    lock = (REPO / "overlay/overlay.lock").read_text()
    assert main(["audit", "--to", "0.28.0", "--out", str(tmp_path)]) == 2
    text = (tmp_path / "audit.md").read_text()
    assert "## Work list" in text and "- [ ] **block** `DRF030`" in text
    assert "dry-run regeneration against 0.28.0: **blocked**" in text
    assert json.loads((tmp_path / "audit.json").read_text())["regeneration"]["blocked"] is True
    assert (REPO / "overlay/overlay.lock").read_text() == lock


def test_mutations_are_detected() -> None:
    """Random single edits to a copy of the real upstream: every one touching a recorded symbol is
    reported, none touching an unrecorded one is."""
    report = summarize(run_mutations(count=10, seed=7))
    assert report["score"] == 1.0, report["misses"]
