"""Each rule that lowers a drift finding's severity, against mutations of the real pinned upstream
that it must not hide: the harmless change is info, the real break next to it still blocks."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

from codegen.drift_run import run_drift
from codegen.findings import Finding

from .conftest import REPO, changed_tree, once

DEEPSEEK = "vllm/model_executor/models/deepseek_v2.py"
GPU_WORKER = "vllm/v1/worker/gpu_worker.py"
MOE_FORWARD = "vllm.model_executor.models.deepseek_v2:DeepseekV2MoE.forward"
DECODER_INIT = "afd_models._generated.vllm.model_executor.models.deepseek_v2:AFDDeepseekV2DecoderLayer.__init__"
FUSED_MOE = "vllm.model_executor.layers.fused_moe.layer:FusedMoE"
FUSED_MOE_FILES = (
    "vllm/model_executor/layers/fused_moe/layer.py",
    "vllm/model_executor/layers/fused_moe/__init__.py",
    DEEPSEEK,
)


def drift(
    upstream_copy: Path, tmp_path: Path, changes: dict[str, Callable[[str], str]]
) -> list[Finding]:
    """Drift from the pin to a copy of it with ``changes`` applied (file -> text rewrite)."""
    root = changed_tree(upstream_copy, tmp_path, changes)
    return run_drift(REPO, "0.26.0", to_root=root).findings


def alarms(findings: list[Finding]) -> set[tuple[str, str, str]]:
    return {(f.code, f.severity.value, f.symbol) for f in findings if f.severity.value != "info"}


def by_code(findings: list[Finding], code: str) -> dict[str, Finding]:
    return {f.symbol: f for f in findings if f.code == code}


# --- contracts: a relied-on body change that keeps them is info; breaking one blocks ---------------

GATE_CALL = "            router_logits, _ = self.gate(hidden_states)\n"
INTERNAL_CALL = "hidden_states=hidden_states, router_logits=hidden_states\n"
CONTRACT = f"{MOE_FORWARD}#internal-router-gets-hidden-states"


def test_relied_on_change_that_keeps_contracts_is_info(upstream_copy: Path, tmp_path: Path) -> None:
    """A change in the branch AFD's experts never take (the external router's) keeps the contract."""
    findings = drift(
        upstream_copy,
        tmp_path,
        {
            DEEPSEEK: once(
                GATE_CALL, GATE_CALL + "            router_logits = router_logits.float()\n"
            )
        },
    )
    assert alarms(findings) == set()
    changed = by_code(findings, "DRF021")[MOE_FORWARD]
    assert (
        changed.severity.value == "info" and "internal-router-gets-hidden-states" in changed.message
    )


def test_breaking_a_contract_blocks(upstream_copy: Path, tmp_path: Path) -> None:
    """The experts handed something other than the hidden states: blocks, saying what AFD would
    do wrong."""
    findings = drift(
        upstream_copy,
        tmp_path,
        {
            DEEPSEEK: once(
                INTERNAL_CALL, "hidden_states=hidden_states, router_logits=hidden_states.float()\n"
            )
        },
    )
    assert alarms(findings) == {("DRF070", "block", CONTRACT)}
    broken = by_code(findings, "DRF070")[CONTRACT]
    assert "handed the hidden states to route" in broken.message and broken.target is not None


def test_contract_matching_elsewhere_is_review(upstream_copy: Path, tmp_path: Path) -> None:
    check = (
        "                if is_pp_missing_parameter(name, self):\n                    continue\n"
    )
    findings = drift(upstream_copy, tmp_path, {DEEPSEEK: once(check * 1, "")})
    assert alarms(findings) == {
        (
            "DRF071",
            "review",
            "vllm.model_executor.models.deepseek_v2:DeepseekV2Model.load_weights#skips-missing-layers",
        )
    }


SCHEDULER = "vllm/v1/core/sched/scheduler.py"
UPDATE_FROM_OUTPUT = "vllm.v1.core.sched.scheduler:Scheduler.update_from_output"


def test_breaking_a_contract_of_a_body_an_override_runs_through_super_blocks(
    upstream_copy: Path, tmp_path: Path
) -> None:
    """The AFD scheduler's override hands upstream's body the requests of a failed step in the
    set it finishes with an error: upstream no longer finishing that set blocks, although a body
    our overrides extend through super() is otherwise only info."""
    findings = drift(
        upstream_copy,
        tmp_path,
        {
            SCHEDULER: once(
                "error_req_ids = set(self.grammar_compile_error_reqs)",
                "error_req_ids = set()",
            )
        },
    )
    contract = f"{UPDATE_FROM_OUTPUT}#error-requests-collected"
    assert alarms(findings) == {("DRF070", "block", contract)}
    assert "clients would wait for tokens" in by_code(findings, "DRF070")[contract].message


# --- an override that never calls super(): only the signature matters ----------------------------


def test_replaced_body_is_info_but_its_signature_still_blocks(
    upstream_copy: Path, tmp_path: Path
) -> None:
    header = "    def compile_or_warm_up_model(self) -> CompilationTimes:\n"
    body_only = drift(
        upstream_copy,
        tmp_path / "body",
        {GPU_WORKER: once(header, header + "        self.warmed = True\n")},
    )
    worker = "vllm.v1.worker.gpu_worker:Worker.compile_or_warm_up_model"
    assert alarms(body_only) == set()
    assert "never call super()" in by_code(body_only, "DRF020")[worker].message
    signature = drift(
        upstream_copy,
        tmp_path / "signature",
        {
            GPU_WORKER: once(
                header,
                "    def compile_or_warm_up_model(self, sizes: list[int]) -> CompilationTimes:\n",
            )
        },
    )
    assert ("DRF010", "block", worker) in alarms(signature)


# --- a fork: cosmetic changes outside the anchors are info, real ones review --------------------

NORMS = '        self.routed_scaling_factor = getattr(config, "routed_scaling_factor", 1.0)\n\n    def forward(\n        self,\n        positions'


def test_cosmetic_fork_change_is_info(upstream_copy: Path, tmp_path: Path) -> None:
    findings = drift(
        upstream_copy,
        tmp_path,
        {DEEPSEEK: once(NORMS, "        scale: float\n        # the scale\n" + NORMS)},
    )
    assert alarms(findings) == set()
    assert by_code(findings, "DRF032")[DECODER_INIT].severity.value == "info"


def test_real_fork_change_is_review_with_the_generated_diff(
    upstream_copy: Path, tmp_path: Path
) -> None:
    findings = drift(
        upstream_copy,
        tmp_path,
        {DEEPSEEK: once(NORMS, "        self.probe = torch.nn.Linear(1, 1)\n" + NORMS)},
    )
    assert alarms(findings) == {("DRF032", "review", DECODER_INIT)}
    details = by_code(findings, "DRF032")[DECODER_INIT].details
    generated = details[details.index("generated method:") :]
    assert any(line == "+    self.probe = torch.nn.Linear(1, 1)" for line in generated), generated


# --- renames: a successor is linked; a symbol with none is still gone --------------------------


def _rename(new: str) -> dict[str, Callable[[str], str]]:
    return {path: lambda text: re.sub(r"\bFusedMoE\b", new, text) for path in FUSED_MOE_FILES}


def test_rename_is_linked_to_its_successor(upstream_copy: Path, tmp_path: Path) -> None:
    findings = drift(upstream_copy, tmp_path, _rename("MoELayerFactory"))
    (renamed,) = by_code(findings, "DRF003").values()
    assert renamed.symbol == FUSED_MOE and renamed.severity.value == "block"
    assert "FusedMoE -> MoELayerFactory (same signature" in renamed.message
    assert not by_code(findings, "DRF030") and not by_code(findings, "DRF001")


def test_removal_without_successor_still_blocks(upstream_copy: Path, tmp_path: Path) -> None:
    changes = _rename("MoELayerFactory")
    layer = FUSED_MOE_FILES[0]
    renamed = changes[layer]
    changes[layer] = lambda text: re.sub(
        r"def MoELayerFactory\((.|\n)*?\n(?=def |class )",
        "def MoELayerFactory(config):\n    return config\n\n\n",
        renamed(text),
        count=1,
    )
    findings = drift(upstream_copy, tmp_path, changes)
    assert by_code(findings, "DRF001")[FUSED_MOE].severity.value == "block"
    assert not by_code(findings, "DRF003")
    # the edits capture the factory's name, so they still anchor on the calls of the new one:
    # the removal alone blocks
    assert not by_code(findings, "DRF030")


# --- members of imported classes a forked body calls are recorded -------------------------------


def test_class_member_a_fork_calls_is_recorded(upstream_copy: Path, tmp_path: Path) -> None:
    """The forked MoE ``__init__`` calls ``rocm_aiter_ops.is_fused_moe_enabled()``: a new required
    parameter there is reported, as info, since the fork's call is vLLM's own and comes with the
    new body; its removal blocks."""
    method = "    def is_fused_moe_enabled(cls) -> bool:\n"
    called = "vllm._aiter_ops:rocm_aiter_ops.is_fused_moe_enabled"
    changed = drift(
        upstream_copy,
        tmp_path / "signature",
        {
            "vllm/_aiter_ops.py": once(
                method, "    def is_fused_moe_enabled(cls, device) -> bool:\n"
            )
        },
    )
    [added] = [f for f in changed if f.code == "DRF022" and f.symbol == called]
    assert added.severity.value == "info" and "regeneration takes their new calls" in added.message
    assert not {a for a in alarms(changed) if a[2] == called}
    removed = drift(
        upstream_copy,
        tmp_path / "removed",
        {"vllm/_aiter_ops.py": once(method, "    def fused_moe_enabled(cls) -> bool:\n")},
    )
    assert any(
        code in ("DRF001", "DRF003") and s == called and sev == "block"
        for code, sev, s in alarms(removed)
    )


# --- a callee's signature: a parameter every old call still binds is info -----------------------

WORKSPACE = "vllm/v1/worker/workspace.py"
WORKSPACE_PARAMS = "    device: torch.device, num_ubatches: int | None = None\n"
#: called by the NPU worker's fork of vLLM-Ascend's init_device: (self.device, num_ubatches)
INIT_WORKSPACE = "vllm.v1.worker.workspace:init_workspace_manager"


def test_a_callee_parameter_old_calls_still_bind_is_info(
    upstream_copy: Path, tmp_path: Path
) -> None:
    """vLLM 0.28's new trailing ``num_lanes: int = 1``: info, since the NPU worker's fork (from
    vLLM-Ascend, which stays at its pin) still binds. The same parameter before ``num_ubatches``
    would take the fork's second positional argument, and one without a default would fail the
    call: both block at the fork (DRF023), the signature change itself stays info."""

    def callee(params: str, where: str) -> list[Finding]:
        changes = {WORKSPACE: once(WORKSPACE_PARAMS, params)}
        return [
            f for f in drift(upstream_copy, tmp_path / where, changes) if f.symbol == INIT_WORKSPACE
        ]

    def codes(findings: list[Finding]) -> set[tuple[str, str]]:
        return {(f.code, f.severity.value) for f in findings}

    appended = callee(
        "    device: torch.device, num_ubatches: int | None = None, num_lanes: int = 1\n", "end"
    )
    assert codes(appended) == {("DRF022", "info")}
    assert "param added 'num_lanes'" in appended[0].message and "still bind" in appended[0].message
    inserted = callee(
        "    device: torch.device, num_lanes: int = 1, num_ubatches: int | None = None\n", "mid"
    )
    assert codes(inserted) == {("DRF022", "info"), ("DRF023", "block")}
    shifted = [f for f in inserted if f.code == "DRF023"]  # one per fork of init_device
    assert all("as 'num_lanes', not 'num_ubatches'" in f.message for f in shifted)
    assert {str(f.ours).rsplit(":", 1)[0] for f in shifted} == {
        "overlay/vllm_ascend/worker/worker.py"
    }
    required = callee(
        "    device: torch.device, num_ubatches: int | None = None, *, num_lanes: int\n", "req"
    )
    assert codes(required) == {("DRF022", "info"), ("DRF023", "block")}


# --- a signature change the overlay already declares for the new release is info; another blocks --

QWEN3_MOE = "vllm/model_executor/models/qwen3_moe.py"
QWEN3_MOE_BLOCK = "vllm.model_executor.models.qwen3_moe:Qwen3MoeSparseMoeBlock.__init__"
QWEN3_MOE_BLOCK_INIT = """class Qwen3MoeSparseMoeBlock(nn.Module):
    def __init__(
        self,
        vllm_config: VllmConfig,
        prefix: str = "",
    ):
"""


def test_a_signature_change_the_overlay_does_not_declare_still_blocks(
    upstream_copy: Path, tmp_path: Path
) -> None:
    """The parameter 0.28 adds is declared for 0.28 (test_drift.py: info there); on this copy of
    0.26.0 the overlay's 0.26 deltas declare it absent upstream, so adding it, or any other
    parameter, is no change the overlay handles: both stay alarms on the forked constructor."""
    for added in ("is_fused_checkpoint_transposed", "other_flag"):
        findings = drift(
            upstream_copy,
            tmp_path / added,
            {
                QWEN3_MOE: once(
                    QWEN3_MOE_BLOCK_INIT,
                    QWEN3_MOE_BLOCK_INIT.replace(
                        '        prefix: str = "",\n',
                        f'        prefix: str = "",\n        {added}: bool = False,\n',
                    ),
                )
            },
        )
        changed = [f for f in findings if f.symbol == QWEN3_MOE_BLOCK and f.code == "DRF010"]
        assert changed and all(f.severity.value != "info" for f in changed), [
            f.one_line() for f in findings if f.symbol == QWEN3_MOE_BLOCK
        ]


# --- members limited by when=, and classes that only inherit a changed method -------------------

UBATCH = "vllm/v1/worker/gpu_ubatch_wrapper.py"
GPU_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
SM_CONTROL = "vllm.v1.worker.gpu_ubatch_wrapper:UBatchWrapper._create_sm_control_context"
PADDING = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._determine_batch_execution_and_padding"


def test_what_a_release_limited_member_or_an_inheriting_class_uses_is_info_there() -> None:
    """vLLM 0.32 (as 0.30) has no ``_create_sm_control_context``, which only the wrapper's
    override limited to ``vllm<0.30`` uses; and gives ``use_cascade_attn`` a default, which the
    Attention runners' override declares for 0.32 while the FFN runners only inherit the method.
    Both are info there (the breaks next to them: the test below). From the primary, which has
    the method: the default base, 0.30.0, has it no longer."""
    findings = run_drift(REPO, "0.32.0", from_version="0.26.0").findings
    removed = by_code(findings, "DRF001")[SM_CONTROL]
    assert removed.severity.value == "info"
    assert "each is limited by its when= to other releases" in removed.message
    default = by_code(findings, "DRF015")[PADDING]
    assert default.severity.value == "info" and "already matches" in default.message
    assert "AFDFFNCPUModelRunner" in default.message  # an inheriting user, ignored


def test_the_same_changes_on_a_release_whose_members_use_them_block(
    upstream_copy: Path, tmp_path: Path
) -> None:
    """The same removal on a release whose override of the method applies, and a parameter the
    declaring override does not have: both block."""
    findings = drift(
        upstream_copy,
        tmp_path,
        {
            UBATCH: lambda text: text.replace("_create_sm_control_context", "_make_sm_control"),
            GPU_RUNNER: once("        use_cascade_attn: bool,\n", "        use_cascade: bool,\n"),
        },
    )
    for symbol in (SM_CONTROL, PADDING):
        blocks = [f for f in findings if f.symbol == symbol and f.severity.value == "block"]
        assert blocks, [f.one_line() for f in findings if f.symbol == symbol]


# --- a decision outside AFD's classes: which runner vLLM builds (relies_on "module:Class.method") -

CONFIG = "vllm/config/vllm.py"
RUNNER_CHOICE = "vllm.config.vllm:VllmConfig.use_v2_model_runner"
WORKERS = ("AFDAttentionCPUWorker", "AFDAttentionWorker")


def test_vllm_choosing_model_runner_v2_by_default_blocks_until_the_overlay_absorbs_it(
    upstream_copy: Path, tmp_path: Path
) -> None:
    """vLLM 0.29 made Model Runner V2 the default for every model on CUDA, AFD's architectures
    included. On a release the contract covers (the pinned one, mutated the same way), the change
    blocks, naming both Attention workers. On 0.30, which the overlay serves with its V2 runner
    and where the contract's ``when="vllm<0.29"`` says it stops holding, the real change is info,
    from the nearest base and from the primary alike; the choice's other contracts hold there."""
    check = "        if not self._is_default_v2_model_runner_model():\n            return False\n"
    contract = f"{RUNNER_CHOICE}#v1-by-default-for-afd"
    mutated = drift(upstream_copy, tmp_path, {CONFIG: once(check, "")})
    assert alarms(mutated) == {("DRF072", "block", contract)}
    broken = by_code(mutated, "DRF072")[contract]
    assert "vllm#53183" in broken.message and all(w in broken.message for w in WORKERS)
    # a selection rule names the roles it decides for
    assert "the Attention role on cpu, the Attention role on cuda" in broken.message
    for base in (None, "0.26.0"):
        findings = run_drift(REPO, "0.30.0", from_version=base).findings
        assert {f.symbol for f in findings if f.code == "DRF072"} == {contract}
        absorbed = by_code(findings, "DRF072")[contract]
        assert absorbed.severity.value == "info"
        assert "its when= limits it to other releases" in absorbed.message
        changed = by_code(findings, "DRF021")[RUNNER_CHOICE]
        assert changed.severity.value == "info" and "no-triton-keeps-v1" in changed.message


def test_the_cpu_platform_moving_onto_model_runner_v2_blocks(
    upstream_copy: Path, tmp_path: Path
) -> None:
    """Upstream is writing Triton-free stand-ins for V2's kernels: once vLLM stops keeping an
    engine without Triton on V1, the CPU platform could pick V2, where the AFD CPU workers do not
    run. That blocks at the audit; rewording the warning it logs is info."""
    warning = '"Model Runner V2 requires Triton; using the V1 model runner instead."'
    reworded = drift(
        upstream_copy, tmp_path / "reworded", {CONFIG: once(warning, '"V1: no Triton."')}
    )
    assert alarms(reworded) == set()
    checked = "        if not HAS_TRITON:\n            logger.warning_once(\n"
    unchecked = "        if False:\n            logger.warning_once(\n"
    dropped = drift(upstream_copy, tmp_path / "dropped", {CONFIG: once(checked, unchecked)})
    contract = f"{RUNNER_CHOICE}#no-triton-keeps-v1"
    assert alarms(dropped) == {("DRF072", "block", contract)}
    assert "CPU platform" in by_code(dropped, "DRF072")[contract].message


# --- bases: only a class AFD derives from feels its MRO -------------------------------------------


def test_new_bases_of_a_class_afd_only_constructs_are_info(
    upstream_copy: Path, tmp_path: Path
) -> None:
    """The runtime constructs ``LLM`` (verify): a mixin dropped from its bases is info; the same
    change to a class AFD derives from (``DeepseekV2MoE``) is a review."""
    llm = "class LLM(BeamSearchOfflineMixin, PoolingOfflineMixin, OfflineInferenceMixin):\n"
    moe = "class DeepseekV2MoE(nn.Module):\n"
    findings = drift(
        upstream_copy,
        tmp_path,
        {
            "vllm/entrypoints/llm.py": once(
                llm, "class LLM(PoolingOfflineMixin, OfflineInferenceMixin):\n"
            ),
            DEEPSEEK: once(moe, "class DeepseekV2MoE(nn.Module, object):\n"),
        },
    )
    bases = {f.symbol: f.severity.value for f in findings if f.code == "DRF041"}
    assert bases["vllm.entrypoints.llm:LLM"] == "info"
    assert bases["vllm.model_executor.models.deepseek_v2:DeepseekV2MoE"] == "review"


# --- issue 55's noise rules, each against the real break it must not hide ----------------------

UTILS = "vllm/model_executor/models/utils.py"
FACTORY = "make_empty_intermediate_tensors_factory"


def _without_function(text: str, name: str) -> tuple[str, str]:
    """``text`` without the top-level function ``name``, and that function's source."""
    [node] = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name]
    lines = text.splitlines(keepends=True)
    source = "".join(lines[node.lineno - 1 : node.end_lineno])
    return "".join(lines[: node.lineno - 1] + lines[node.end_lineno :]), source


def test_the_noise_rules_hide_no_real_break(upstream_copy: Path, tmp_path: Path) -> None:
    """A name only old forked bodies used is info, and so is a name that moved where the forked
    bodies' module now imports it from (vLLM 0.34's real cases: test_drift_v1_removal.py). Their
    real breaks here block: a name a forked body still calls, renamed without that call, and a
    name moved to a module the forked bodies' module does not import it from."""
    moved: dict[str, str] = {}

    def cut(text: str) -> str:
        rest, moved["source"] = _without_function(text, FACTORY)
        return rest

    root = changed_tree(
        upstream_copy,
        tmp_path,
        {
            DEEPSEEK: once("\ndef _get_moe_router_dtype(\n", "\ndef _moe_router_dtype(\n"),
            UTILS: cut,
        },
    )
    (root / "vllm/model_executor/models/tensors_factory.py").write_text(moved["source"])
    findings = run_drift(REPO, "0.26.0", to_root=root).findings
    renamed = by_code(findings, "DRF003")[
        "vllm.model_executor.models.deepseek_v2:_get_moe_router_dtype"
    ]
    assert renamed.severity.value == "block"
    assert "no forked body uses it" not in renamed.message
    relocated = by_code(findings, "DRF002")[f"vllm.model_executor.models.utils:{FACTORY}"]
    assert relocated.severity.value == "block"
    assert relocated.new == f"vllm.model_executor.models.tensors_factory:{FACTORY}"
    assert "regeneration follows" not in relocated.message


CPU_WORKER = "vllm/v1/worker/cpu_worker.py"
RUNNER_LINE = (
    '            self.model_runner = CPUModelRunner(self.vllm_config, torch.device("cpu"))\n'
)


def test_a_body_that_picks_the_runner_is_never_called_safe(
    upstream_copy: Path, tmp_path: Path
) -> None:
    """The CPU worker's ``init_device`` decides which runner AFD's CPU workers get: a harmless
    change there is info, saying that it decides the class and that its selection rule holds
    (never "the change reaches us"); a new rule picking the runner blocks (DRF072), naming the
    roles it decides for."""
    logged = drift(
        upstream_copy,
        tmp_path / "logged",
        {CPU_WORKER: once(RUNNER_LINE, RUNNER_LINE + '            logger.info("V1")\n')},
    )
    body = by_code(logged, "DRF020") | by_code(logged, "DRF021")
    changed = body["vllm.v1.worker.cpu_worker:CPUWorker.init_device"]
    assert changed.severity.value == "info" and "decides which class AFD gets" in changed.message
    assert "reaches us" not in changed.message
    assert not [f for f in logged if f.code == "DRF072"]
    picked = drift(
        upstream_copy,
        tmp_path / "picked",
        {
            CPU_WORKER: once(
                "        if self.use_v2_model_runner:\n            from",
                "        if current_platform.picks_v2():\n            from",
            )
        },
    )
    rule = "vllm.v1.worker.cpu_worker:CPUWorker.init_device#cpu-runner-by-setting"
    assert alarms(picked) >= {("DRF072", "block", rule)}
    assert (
        "the Attention role on cpu, the FFN role on cpu" in by_code(picked, "DRF072")[rule].message
    )
