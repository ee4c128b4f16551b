"""The drift checker on real upgrades (vLLM 0.26.0 -> 0.27.0 / 0.28.0, vLLM-Ascend 0.23.0 ->
0.26.0rc1), its exit codes, and mutation testing."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from benchmarks.mutations import OPERATORS, Mutator
from benchmarks.mutations import run as run_mutations
from codegen.cli import main
from codegen.drift_run import DriftRun, UnknownPackage, drift_markdown, run_drift
from codegen.findings import summary
from codegen.pipeline import generate, open_context

from .conftest import REPO

DEEPSEEK = "afd_models._generated.vllm.model_executor.models.deepseek_v2"
QWEN3 = "afd_models._generated.vllm.model_executor.models.qwen3_moe"


@pytest.fixture(scope="module", params=["0.27.0", "0.28.0"])
def upgrade(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return run_drift(REPO, request.param)


def _by(findings, code):  # type: ignore[no-untyped-def]
    return {f.symbol: f for f in findings if f.code == code}


#: Every block and review finding of the real upgrades (the reading is in docs/maintainers.md).
#: Both releases are covered by the overlay's edits, whose captures take the renamed factory
#: (a region changed only by that rename is no alarm); 0.28 also changed the MoE ``__init__``
#: outside the edits (vLLM dropped ``self.ep_rank`` and the physical expert range, which AFD
#: never reads), and regeneration carries that into both MoE forks; Qwen3-MoE's MoE forks pass
#: the new ``is_fused_checkpoint_transposed`` to the factory, inside the call the experts' edits
#: anchor on (DRF033), its decoder layer passes it on (outside the edits), and its causal LM ties
#: the lm_head through ``tie_weights`` inside the code the ``lm-head-on-attention-role`` wrap
#: anchors on (DRF033). Both releases also changed the body of ``_dummy_run`` (0.27 added
#: ``randomize_inputs``), which the Attention runners fork to hold an idle rank's model call
#: across restarts (DRF032). A new alarm, or a lost one, fails here.
RUNNER = "afd_models._generated.vllm.v1.worker.cpu_model_runner"
DUMMY_RUN = {
    ("DRF032", "review", f"{RUNNER}:AFDAttentionCPUModelRunner._dummy_run"),
    ("DRF032", "review", f"{RUNNER}:AFDAttentionGPUModelRunner._dummy_run"),
}
ALARMS = {
    "0.27.0": DUMMY_RUN,
    "0.28.0": DUMMY_RUN
    | {
        ("DRF032", "review", f"{DEEPSEEK}:AFDAttentionDeepseekV2MoE.__init__"),
        ("DRF032", "review", f"{DEEPSEEK}:AFDFFNDeepseekV2MoE.__init__"),
        ("DRF033", "review", f"{QWEN3}:AFDAttentionQwen3MoeSparseMoeBlock.__init__"),
        ("DRF033", "review", f"{QWEN3}:AFDFFNQwen3MoeSparseMoeBlock.__init__"),
        ("DRF032", "review", f"{QWEN3}:AFDQwen3MoeDecoderLayer.__init__"),
        ("DRF033", "review", f"{QWEN3}:AFDQwen3MoeForCausalLM.__init__"),
    },
}


def test_alarms_are_known(upgrade) -> None:  # type: ignore[no-untyped-def]
    """Block and review findings are exactly the known ones: no block on either release."""
    alarms = {
        (f.code, f.severity.value, f.symbol) for f in upgrade.findings if f.severity.value != "info"
    }
    assert alarms == ALARMS[upgrade.new_version], sorted(alarms)
    moe = _by(upgrade.findings, "DRF032")[f"{DEEPSEEK}:AFDFFNDeepseekV2MoE.__init__"]
    removed = any(
        line.startswith("-") and "self.ep_rank = get_ep_group().rank_in_group" in line
        for line in moe.details
    )
    # 0.27 changed only the factory's name there, which the 0.27+ edits anchor on
    assert removed == (upgrade.new_version == "0.28.0"), moe.message
    assert (moe.severity.value == "info") == (upgrade.new_version == "0.27.0")


def test_fused_moe_rename_handled_by_the_release_edits(upgrade) -> None:  # type: ignore[no-untyped-def]
    """vLLM renamed ``FusedMoE`` to ``FusedMoEFactory`` in 0.27. The overlay's edits for 0.27 and
    later anchor on the new name, so no forked body uses the old one there: one info finding
    naming the successor, and no lost anchor. (Without those edits the same rename blocks with
    the call sites and re-anchored edits: tests/upstream/test_drift_rules.py.)"""
    (renamed,) = [f for f in upgrade.findings if f.code == "DRF003"]
    assert renamed.severity.value == "info"
    assert "FusedMoE -> FusedMoEFactory" in renamed.message
    assert "no forked body uses it on the new release" in renamed.message
    assert renamed.new == "vllm.model_executor.layers.fused_moe.layer:FusedMoEFactory"
    assert not [
        f
        for f in upgrade.findings
        if f.code in ("DRF001", "DRF030", "DRF033") and "FusedMoE" in f.symbol + f.message
    ]


def test_moe_forward_contract_holds_on_0_28() -> None:
    """0.28 moved the gate into the MoE runner: ``DeepseekV2MoE.forward`` always hands the experts
    the hidden states. The one contract AFD keeps on it holds (the Attention proxy runs the gate
    itself), so the changed body is info for both roles' classes."""
    run = run_drift(REPO, "0.28.0")
    assert not _by(run.findings, "DRF070")
    forward = _by(run.findings, "DRF021")[
        "vllm.model_executor.models.deepseek_v2:DeepseekV2MoE.forward"
    ]
    assert forward.severity.value == "info"
    assert "internal-router-gets-hidden-states" in forward.message


def test_signature_change_the_overlay_declares_is_info(upgrade) -> None:  # type: ignore[no-untyped-def]
    """0.28 added ``is_fused_checkpoint_transposed`` to two forked Qwen3-MoE constructors; the
    overlay's signatures have it, declared as added before 0.28 (``when=``), so on 0.28 the change
    is info, saying so; 0.27 has no such change."""
    added = {
        f.symbol: f
        for f in upgrade.findings
        if f.code == "DRF010" and "qwen3_moe" in f.symbol and "is_fused_checkpoint" in f.message
    }
    if upgrade.new_version == "0.27.0":
        assert added == {}
        return
    assert sorted(added) == [
        "vllm.model_executor.models.qwen3_moe:Qwen3MoeDecoderLayer.__init__",
        "vllm.model_executor.models.qwen3_moe:Qwen3MoeSparseMoeBlock.__init__",
    ]
    for finding in added.values():
        assert finding.severity.value == "info"
        assert "with its deltas for 0.28.0, already matches" in finding.message


def test_unchanged_version_is_clean() -> None:
    """Comparing the pinned version with itself finds nothing."""
    assert run_drift(REPO, "0.26.0").findings == []


def test_formats_and_exit_codes(tmp_path: Path) -> None:
    """Exit 1 with review findings and none blocking; JSON and SARIF come from the same findings."""
    assert (
        main(["drift", "--to", "0.28.0", "--format", "json", "--out", str(tmp_path / "d.json")])
        == 1
    )
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["counts"]["by_severity"]["review"] == 8 and all(
        {"code", "severity", "symbol", "message"} <= set(f) for f in data["findings"]
    )
    assert (
        main(["drift", "--to", "0.28.0", "--format", "sarif", "--out", str(tmp_path / "d.sarif")])
        == 1
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
#: docs/reports/drift-vllm_ascend-0.23.0-to-0.26.0rc1.reading.md; ``build_fused_experts_input``'s
#: new annotation and defaulted parameters are info since a call binds them as before).
ASCEND_ALARMS = {
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
    """A package pins.toml does not declare: a usage error, exit 3, before any source is looked
    up (the version does not exist: looking it up would fail otherwise), naming the value and the
    allowed packages."""
    out = tmp_path / "x.md"
    assert main(["drift", "--package", "vllm-ascend", "--to", "0.0.0-none", "--out", str(out)]) == 3
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
    assert run.origins["from"] == "source archive vllm-ascend 0.23.0"
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
    # a name only the 0.23 fork body imported, which the 0.26rc1 body no longer uses: info
    dropped = _by(run.findings, "DRF001")[
        "vllm_ascend.flash_common3_context:get_flash_common3_context"
    ]
    assert dropped.severity.value == "info"
    assert "no forked body uses it on the new release" in dropped.message
    callee = [f.new for f in run.findings if f.code == "DRF022"]
    assert any("swiglu_alpha" in (new or "") for new in callee)
    lost = _by(run.findings, "DRF011")
    full_graph = (
        "vllm_ascend.worker.model_runner_v1:NPUModelRunner._update_full_graph_params_if_needed"
    )
    assert "'positions'" in lost[full_graph].message and lost[full_graph].severity.value == "info"


def test_ascend_report_formats(tmp_path: Path, ascend_upgrade) -> None:  # type: ignore[no-untyped-def]
    """The CLI writes the vLLM-Ascend report: JSON names the package and both versions, Markdown
    the command that made it; review findings (and none blocking) exit 1."""
    argv = ["drift", "--package", "vllm_ascend", "--from", ASCEND_OLD, "--to", ASCEND_PIN]
    assert main([*argv, "--format", "json", "--out", str(tmp_path / "d.json")]) == 1
    data = json.loads((tmp_path / "d.json").read_text())
    assert (data["package"], data["from"], data["to"]) == ("vllm_ascend", ASCEND_OLD, ASCEND_PIN)
    assert data["summary"] == summary(ascend_upgrade.findings)
    text = drift_markdown(ascend_upgrade)
    assert text.startswith(f"# Drift: vLLM-Ascend {ASCEND_OLD} -> {ASCEND_PIN}\n")
    command = f"python -m codegen drift --package vllm_ascend --from {ASCEND_OLD} --to {ASCEND_PIN}"
    assert f"`{command}`" in text


@pytest.mark.parametrize(
    ("old", "command"),
    [
        ("0.32.0", "python -m codegen drift --to 0.33.0"),
        ("0.26.0", "python -m codegen drift --from 0.26.0 --to 0.33.0"),
    ],
)
def test_a_vllm_report_names_from_where_it_is_not_the_default(old: str, command: str) -> None:
    """A report of vLLM from another release than the default base names --from, so that its
    command makes it again; the intro says which base and why."""
    origins = {"from": "CPU wheel", "to": "CUDA source archive"}
    run = DriftRun(old, "0.33.0", "vllm", [], None, None, 1.0, origins, "0.32.0", "why")  # type: ignore[arg-type]
    text = drift_markdown(run)
    assert f"Generated by `{command}` in" in text and f"\nBase {old}: why.\n" in text


def test_drift_defaults_to_the_newest_supported_release_below_the_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --from, drift to 0.33.0 compares with 0.32.0, the newest supported release (the
    overlay already handles the older ones); the report and stderr say which base and why, and
    the report's command makes it again. --from still wins."""
    out = tmp_path / "d.md"
    main(["drift", "--to", "0.33.0", "--out", str(out)])
    why = "the newest supported release below 0.33.0 (overlay/pins.toml)"
    assert f"base vllm 0.32.0: {why}" in capsys.readouterr().err
    text = out.read_text()
    assert text.startswith("# Drift: vLLM 0.32.0 -> 0.33.0\n")
    assert "`python -m codegen drift --to 0.33.0`" in text and f"Base 0.32.0: {why}." in text
    run = run_drift(REPO, "0.30.0", from_version="0.26.0")
    assert (run.old_version, run.default_from, run.base_reason) == (
        "0.26.0",
        "0.28.0",
        "given by --from",
    )
    assert "`python -m codegen drift --from 0.26.0 --to 0.30.0`" in drift_markdown(run)


def test_audit_writes_report_and_leaves_overlay_alone(tmp_path: Path) -> None:
    """audit writes Markdown and JSON, with a work list and the dry-run result; overlay, pins and
    locks are untouched. 0.33.0, the release after the window, compared with 0.32.0 (the newest
    supported release), blocks: its scheduler no longer collects the requests the AFD scheduler
    relies on (docs/reports/audit-0.26.0-to-0.33.0)."""
    before = {p: (REPO / p).read_text() for p in ("overlay/overlay.lock", "overlay/pins.toml")}
    assert main(["audit", "--to", "0.33.0", "--out", str(tmp_path)]) == 2
    text = (tmp_path / "audit.md").read_text()
    assert "## Work list" in text and "- [ ] **block** `DRF070`" in text
    assert "update_from_output#error-requests-collected: contract" in text
    assert "dry-run regeneration against 0.33.0: **blocked**" in text
    assert "- base 0.32.0: the newest supported release below 0.33.0" in text
    assert "Made by `python -m codegen audit --to 0.33.0` (" in text  # the default base: no --from
    data = json.loads((tmp_path / "audit.json").read_text())
    assert data["regeneration"]["blocked"] is True and data["from"] == "0.32.0"
    assert {p: (REPO / p).read_text() for p in before} == before


def test_mutations_change_only_vllm_source() -> None:
    """The lock also records vLLM-Ascend's symbols (the NPU classes' bases and relied-on methods);
    mutations change a copy of vLLM's tree only, so every operator draws from vLLM's files."""
    context = open_context(REPO, quiet=True)
    generation, _ = generate(context)
    assert generation.lock is not None
    files = {entry.description.file or "" for entry in generation.lock.symbols.values()}
    assert any(f.startswith("vllm_ascend/") for f in files)
    mutator = Mutator(context, generation.lock, random.Random(0))
    for operator in OPERATORS:
        for _ in range(30):
            mutation = mutator.make(operator)
            assert mutation is None or mutation.path.startswith("vllm/"), (operator, mutation)


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
        ("change_rule", True),
        ("rename_keyword", True),
        ("require_param", True),
        ("rename_attribute", True),
        ("rename_attribute", False),
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
