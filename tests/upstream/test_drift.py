"""The drift checker on real upgrades (vLLM 0.26.0 -> 0.27.0 / 0.28.0, vLLM-Ascend 0.23.0 ->
0.26.0rc1), its exit codes, and mutation testing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codegen.cli import main
from codegen.drift_cli import UnknownPackage, drift_markdown, run_drift
from codegen.findings import summary
from codegen.mutations import run as run_mutations

from .conftest import REPO

DEEPSEEK = "afd_models._generated.vllm.model_executor.models.deepseek_v2"


@pytest.fixture(scope="module", params=["0.27.0", "0.28.0"])
def upgrade(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return run_drift(REPO, request.param)


def _by(findings, code):  # type: ignore[no-untyped-def]
    return {f.symbol: f for f in findings if f.code == code}


#: Every block and review finding of the real upgrades, each one a change AFD needs (the reading is
#: in docs/maintainers.md). A new false alarm, or a lost true one, fails here.
NEEDED = {
    "0.27.0": {("DRF003", "vllm.model_executor.layers.fused_moe.layer:FusedMoE")},
    "0.28.0": {
        ("DRF003", "vllm.model_executor.layers.fused_moe.layer:FusedMoE"),
        (
            "DRF070",
            "vllm.model_executor.models.deepseek_v2:DeepseekV2MoE.forward#gate-runs-for-external-router",
        ),
        (
            "DRF070",
            "vllm.model_executor.models.deepseek_v2:DeepseekV2MoE.forward#experts-get-router-logits",
        ),
    },
}


def test_alarms_are_the_needed_changes(upgrade) -> None:  # type: ignore[no-untyped-def]
    """Block and review findings are exactly the changes AFD needs: no false alarm on either release."""
    alarms = {(f.code, f.symbol) for f in upgrade.findings if f.severity.value != "info"}
    assert alarms == NEEDED[upgrade.new_version], sorted(alarms)


def test_fused_moe_rename_is_one_linked_finding(upgrade) -> None:  # type: ignore[no-untyped-def]
    """vLLM renamed ``FusedMoE`` to ``FusedMoEFactory`` (same function, new optional parameters): one
    blocking finding naming the successor, with both forked call sites and their re-anchored edits,
    instead of "gone" plus two lost anchors."""
    (renamed,) = [f for f in upgrade.findings if f.code == "DRF003"]
    assert renamed.severity.value == "block"
    assert "FusedMoE -> FusedMoEFactory" in renamed.message
    assert renamed.new == "vllm.model_executor.layers.fused_moe.layer:FusedMoEFactory"
    assert "new optional parameter(s): activation_situ_beta" in renamed.message
    sites = [line for line in renamed.details if not line.startswith(" ")]
    assert [s.split(" at ")[0].rsplit(":", 1)[1] for s in sites] == [
        "AFDAttentionDeepseekV2MoE.__init__#remote-experts",
        "AFDFFNDeepseekV2MoE.__init__#external-router-on-gate-placement",
    ]
    assert all("vllm/model_executor/models/deepseek_v2.py:" in s for s in sites)
    proposed = [line.strip() for line in renamed.details if line.startswith(" ")]
    assert proposed[0].startswith("proposed: replace('self.experts = FusedMoEFactory(...)'")
    assert "FusedMoEFactory($...BEFORE, gate=None if plan.gate_on_attention" in proposed[1]
    assert not [
        f
        for f in upgrade.findings
        if f.code in ("DRF001", "DRF030") and "FusedMoE" in f.symbol + f.message
    ]


def test_gate_moved_out_of_moe_forward_in_0_28() -> None:
    """0.28 no longer runs the gate in the inherited ``DeepseekV2MoE.forward``: with the gate on
    Attention the proxy would get hidden states as router logits. Both contracts that say so block,
    naming the contract, the old code and what AFD would do wrong."""
    run = run_drift(REPO, "0.28.0")
    broken = _by(run.findings, "DRF070")
    gate = broken[
        "vllm.model_executor.models.deepseek_v2:DeepseekV2MoE.forward#gate-runs-for-external-router"
    ]
    assert gate.severity.value == "block"
    assert "contract 'gate-runs-for-external-router' no longer holds" in gate.message
    assert "hidden states where router logits belong" in gate.message
    assert "relied on by AFDAttentionDeepseekV2MoE" in gate.message
    assert any("router_logits, _ = self.gate(hidden_states)" in line for line in gate.details)
    assert any(line.startswith("-") and "self.gate(hidden_states)" in line for line in gate.details)
    # the FFN role's contract on the same forward still holds: not reported
    assert not any("internal-router-gets-hidden-states" in symbol for symbol in broken)


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


# --- vLLM-Ascend: `--package vllm_ascend` compares its releases, vLLM stays at its pin ---------------

ASCEND_OLD, ASCEND_PIN = "0.23.0", "0.26.0rc1"
W8A8 = "afd_models._generated.vllm_ascend.quantization.methods.w8a8_dynamic"
#: Every block and review finding of vLLM-Ascend 0.23.0 -> 0.26.0rc1 (the reading is in
#: docs/reports/drift-vllm_ascend-0.23.0-to-0.26.0rc1.reading.md).
ASCEND_ALARMS = {
    ("DRF001", "block", "vllm_ascend.flash_common3_context:get_flash_common3_context"),
    ("DRF022", "review", "vllm_ascend.ops.fused_moe.moe_runtime_args:build_fused_experts_input"),
    ("DRF032", "review", f"{W8A8}:AFDAscendW8A8DynamicFusedMoEMethod.apply"),
    (
        "DRF032",
        "review",
        "afd_models._generated.vllm_ascend.quantization.modelslim_config:AFDAscendModelSlimConfig.get_quant_method",
    ),
}


@pytest.fixture(scope="module")
def ascend_upgrade():  # type: ignore[no-untyped-def]
    return run_drift(REPO, ASCEND_PIN, package="vllm_ascend", from_version=ASCEND_OLD)


def test_package_choice_moves_only_that_package() -> None:
    """``package="vllm_ascend"``: ``--to`` is a vLLM-Ascend version, vLLM stays at its pin; the
    pinned release against itself finds nothing."""
    run = run_drift(REPO, ASCEND_PIN, package="vllm_ascend")
    assert (run.package, run.old_version, run.new_version) == (
        "vllm_ascend",
        ASCEND_PIN,
        ASCEND_PIN,
    )
    assert run.new_index.sources["vllm"].version == "0.26.0"
    assert run.new_index.sources["vllm_ascend"].version == ASCEND_PIN
    assert "ascend" in run.origins["to"] and run.findings == []


def test_unknown_package_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A package pins.toml does not declare: exit 2 before any source is looked up (the version
    does not exist: looking it up would be exit 3), naming the value and the allowed packages."""
    out = tmp_path / "x.md"
    assert main(["drift", "--package", "vllm-ascend", "--to", "0.0.0-none", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "--package 'vllm-ascend' is not pinned" in error
    assert "allowed: vllm, vllm_ascend" in error and not out.exists()
    with pytest.raises(UnknownPackage, match="allowed: vllm, vllm_ascend"):
        run_drift(REPO, "0.0.0-none", package="torch")


def test_ascend_release_drift_reads_both_sdists(ascend_upgrade) -> None:  # type: ignore[no-untyped-def]
    """vLLM-Ascend 0.23.0 -> 0.26.0rc1 from their PyPI sdists: the alarms are the pinned list, every
    finding is about vLLM-Ascend (vLLM is the pinned 0.26.0 on both sides) and the known changes
    are classified: a fork's callee gained parameters, a worker helper lost one."""
    run = ascend_upgrade
    assert (
        "vllm_ascend-0.23.0.tar.gz" in run.origins["from"]
        or "vllm-ascend-0.23.0" in run.origins["from"]
    )
    assert run.old_index.sources["vllm_ascend"].version == ASCEND_OLD
    assert (
        run.old_index.sources["vllm"].version == run.new_index.sources["vllm"].version == "0.26.0"
    )
    alarms = {
        (f.code, f.severity.value, f.symbol) for f in run.findings if f.severity.value != "info"
    }
    assert alarms == ASCEND_ALARMS, sorted(alarms)
    assert all("vllm_ascend" in f.symbol for f in run.findings), [
        f.symbol for f in run.findings if "vllm_ascend" not in f.symbol
    ]
    callee = [f.new for f in run.findings if f.code == "DRF022"]
    assert any("swiglu_alpha" in (new or "") for new in callee)
    lost = _by(run.findings, "DRF011")
    full_graph = (
        "vllm_ascend.worker.model_runner_v1:NPUModelRunner._update_full_graph_params_if_needed"
    )
    assert "'positions'" in lost[full_graph].message and lost[full_graph].severity.value == "info"


def test_ascend_report_formats(tmp_path: Path, ascend_upgrade) -> None:  # type: ignore[no-untyped-def]
    """The CLI writes the vLLM-Ascend report: JSON names the package and both versions, Markdown
    the command that made it; blocking findings exit 2."""
    argv = ["drift", "--package", "vllm_ascend", "--from", ASCEND_OLD, "--to", ASCEND_PIN]
    assert main([*argv, "--format", "json", "--out", str(tmp_path / "d.json")]) == 2
    data = json.loads((tmp_path / "d.json").read_text())
    assert (data["package"], data["from"], data["to"]) == ("vllm_ascend", ASCEND_OLD, ASCEND_PIN)
    assert data["summary"] == summary(ascend_upgrade.findings)
    text = drift_markdown(ascend_upgrade)
    assert text.startswith(f"# Drift: vLLM-Ascend {ASCEND_OLD} -> {ASCEND_PIN}\n")
    command = f"python -m codegen drift --package vllm_ascend --from {ASCEND_OLD} --to {ASCEND_PIN}"
    assert f"`{command}`" in text


def test_audit_writes_report_and_leaves_overlay_alone(tmp_path: Path) -> None:
    """audit writes Markdown and JSON, with a work list and the dry-run result; overlay and lock are untouched."""
    lock = (REPO / "overlay/overlay.lock").read_text()
    assert main(["audit", "--to", "0.28.0", "--out", str(tmp_path)]) == 2
    text = (tmp_path / "audit.md").read_text()
    assert "## Work list" in text and "- [ ] **block** `DRF003`" in text
    assert "    - `proposed: replace('self.experts = FusedMoEFactory(...)'" in text
    assert "dry-run regeneration against 0.28.0: **blocked**" in text
    assert json.loads((tmp_path / "audit.json").read_text())["regeneration"]["blocked"] is True
    assert (REPO / "overlay/overlay.lock").read_text() == lock


def test_mutations_are_detected() -> None:
    """Single edits to a copy of the real upstream: each one of a recorded symbol gets the finding
    code that names the break; each one of a function the lock does not record, in an upstream
    file it tracks, gets no finding at all."""
    plan = [
        ("rename_param", True),
        ("change_body", True),
        ("delete_anchor", True),
        ("break_contract", True),
        ("rename_param", False),
        ("change_body", False),
    ]
    outcomes = run_mutations(count=len(plan), seed=7, plan=plan)
    assert [(o.mutation.operator, o.mutation.used) for o in outcomes] == plan
    for outcome in outcomes:
        mutation = outcome.mutation
        where = f"{mutation.operator} on {mutation.symbol} ({mutation.path}:{mutation.start})"
        if mutation.expected is None:
            assert outcome.codes == (), f"{where}: expected no finding, got {outcome.codes}"
        else:
            assert mutation.expected in outcome.codes, (
                f"{where}: expected {mutation.expected}, got {outcome.codes}"
            )
    lock = json.loads((REPO / "overlay/overlay.lock").read_text())
    assert any(
        not o.mutation.used
        and o.mutation.path in lock["upstream"]["vllm"]["files"]
        and o.mutation.symbol not in lock["symbols"]
        for o in outcomes
    )
