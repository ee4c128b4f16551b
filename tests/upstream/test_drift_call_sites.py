"""AFD's own call sites and attribute reads, tracked through real pinned upstream: a change that
breaks how hand-written code calls, constructs or reads an upstream member blocks, naming the site
in this repository; one every call still binds is info."""

from __future__ import annotations

from pathlib import Path

from codegen.findings import Finding, Severity
from codegen.lock import Place, SiteKind, SymbolUse
from codegen.pipeline import generate, open_context

from .conftest import REPO, once
from .test_drift_rules import alarms, drift

RUNNER = "vllm/v1/worker/gpu_model_runner.py"
UNIFORM = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._is_uniform_decode"
UTILS = "vllm/model_executor/models/utils.py"
MISSING_LAYER = "vllm.model_executor.models.utils:PPMissingLayer"
LAYER_IDX = "vllm.model_executor.models.deepseek_v2:DeepseekV2DecoderLayer.layer_idx"
OVERLAY_RUNNER = "overlay/vllm/v1/worker/cpu_model_runner.py"
#: the overlay member that calls ``_is_uniform_decode``, as the lock records its place
UNIFORM_CALLER = Place(
    OVERLAY_RUNNER, "AFDAttentionCPUModelRunner._determine_batch_execution_and_padding"
)
PLAN = "afd_models/models/plan.py"


def line_of(path: str, text: str) -> str:
    """``path:line`` of the one line of ``path`` holding ``text``, as a finding names it."""
    lines = (REPO / path).read_text().splitlines()
    [line] = [n for n, found in enumerate(lines, 1) if text in found]
    return f"{path}:{line}"


def uniform_call_site() -> str:
    """Where the overlay's runner calls ``_is_uniform_decode`` (its one call, found in the text)."""
    return line_of(OVERLAY_RUNNER, "self._is_uniform_decode(")


def blocks(findings: list[Finding], code: str, symbol: str) -> list[Finding]:
    return [
        f
        for f in findings
        if f.code == code and f.symbol == symbol and f.severity is Severity.BLOCK
    ]


def test_the_lock_records_how_afd_calls_constructs_and_reads() -> None:
    lock = generate(open_context(REPO, quiet=True))[0].lock
    assert lock is not None
    call = lock.symbols[UNIFORM]
    assert SymbolUse.CALLED_BY_AFD in call.uses
    # one function of the overlay (not a line: moving code rewrites no lock), once per class
    # generated from it (the CPU and GPU runners)
    assert {(s.at, s.how, s.positional) for s in call.sites} == {(UNIFORM_CALLER, SiteKind.CALL, 0)}
    assert len({s.by for s in call.sites}) == 2
    assert "num_reqs" in call.sites[0].keywords
    constructed = lock.symbols[MISSING_LAYER]
    assert Place(PLAN, "_missing") in {s.at for s in constructed.sites}
    read = lock.symbols[LAYER_IDX]
    assert read.uses == {SymbolUse.READ_BY_AFD} and read.kind.value == "instance_attribute"
    assert {s.how for s in read.sites} == {SiteKind.READ}


def test_a_renamed_keyword_at_an_afd_call_site_blocks(upstream_copy: Path, tmp_path: Path) -> None:
    findings = drift(
        upstream_copy,
        tmp_path,
        {
            RUNNER: once(
                "        num_reqs: int,\n        force", "        num_requests: int,\n        force"
            )
        },
    )
    [found] = blocks(findings, "DRF023", UNIFORM)
    assert found.ours is not None and str(found.ours) == uniform_call_site()
    assert "'num_reqs'" in found.message


def test_a_new_keyword_defaulted_parameter_every_call_binds_is_info(
    upstream_copy: Path, tmp_path: Path
) -> None:
    findings = drift(
        upstream_copy,
        tmp_path,
        {
            RUNNER: once(
                "        force_uniform_decode: bool | None = None,\n    ) -> bool:",
                "        force_uniform_decode: bool | None = None,\n        strict: bool = False,\n    ) -> bool:",
            )
        },
    )
    assert not {a for a in alarms(findings) if a[2] == UNIFORM}
    added = [f for f in findings if f.symbol == UNIFORM and f.code == "DRF010"]
    assert added and "still bind" in added[0].message


def test_a_constructor_gaining_a_required_parameter_blocks(
    upstream_copy: Path, tmp_path: Path
) -> None:
    findings = drift(
        upstream_copy,
        tmp_path,
        {
            UTILS: once(
                "    def __init__(self, *args, **kwargs):\n",
                "    def __init__(self, owner, *args, **kwargs):\n",
            )
        },
    )
    found = blocks(findings, "DRF023", MISSING_LAYER)
    # the line the call is on now, looked up from the function the lock records
    assert line_of(PLAN, "return PPMissingLayer()") in {str(f.ours) for f in found}
    assert all("'owner'" in f.message for f in found)


def test_a_renamed_attribute_afd_reads_blocks(upstream_copy: Path, tmp_path: Path) -> None:
    findings = drift(
        upstream_copy,
        tmp_path,
        {
            "vllm/model_executor/models/deepseek_v2.py": once(
                "        self.layer_idx = layer_idx\n", "        self.layer_index = layer_idx\n"
            )
        },
    )
    [gone] = blocks(findings, "DRF001", LAYER_IDX)
    assert (
        gone.ours is not None
        and gone.ours.path == "overlay/vllm/model_executor/models/deepseek_v2.py"
    )


def test_an_attribute_only_an_overridden_method_also_sets_counts_as_gone(
    upstream_copy: Path, tmp_path: Path
) -> None:
    """``CPUWorker.init_device`` sets ``self.device`` and never hands on to ``Worker.init_device``,
    which sets it too: renaming it in the CPU worker leaves only ``WorkerBase.__init__``'s
    ``self.device = None`` for AFD's CPU workers to read. A review naming the setter left."""
    findings = drift(
        upstream_copy,
        tmp_path,
        {
            "vllm/v1/worker/cpu_worker.py": once(
                '        self.device = torch.device("cpu")\n',
                '        self.cpu_device = torch.device("cpu")\n',
            )
        },
    )
    [gone] = [f for f in findings if f.symbol == "vllm.v1.worker.cpu_worker:CPUWorker.device"]
    assert (gone.code, gone.severity) == ("DRF001", Severity.REVIEW)
    assert "only WorkerBase does" in gone.message and "worker_base.py:88" in gone.message
    assert gone.ours is not None and gone.ours.path == "overlay/vllm/v1/worker/cpu_worker.py"


def test_a_parameter_annotation_of_what_afd_calls_is_info_a_lost_parameter_is_not(
    upstream_copy: Path, tmp_path: Path
) -> None:
    """The runtime reads ``VllmConfig.with_hf_config``: a new spelling of a parameter's type
    (0.32's ``PreTrainedConfig``) is info, a parameter removed beside it stays an alarm."""
    findings = drift(
        upstream_copy,
        tmp_path,
        {
            "vllm/config/vllm.py": once(
                "        hf_config: PretrainedConfig,\n"
                "        architectures: list[str] | None = None,\n",
                '        hf_config: "PreTrainedConfig",\n',
            )
        },
    )
    mine = {
        (f.code, f.severity.value)
        for f in findings
        if f.symbol == "vllm.config.vllm:VllmConfig.with_hf_config"
    }
    assert ("DRF016", "info") in mine and ("DRF011", "review") in mine
