"""Drift findings name the place in this repository they concern (``Finding.ours``), and SARIF
puts them there; a lost anchor names the new upstream code nearest to where it was."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from codegen.drift_run import DriftRun, run_drift
from codegen.report import as_sarif

from .conftest import REPO, changed_tree, once

SCHEMA = REPO / "tests/unit/golden/sarif-schema-2.1.0.json"
DEEPSEEK = "afd_models._generated.vllm.model_executor.models.deepseek_v2"
DEEPSEEK_OVERLAY = "overlay/vllm/model_executor/models/deepseek_v2.py"


@pytest.fixture(scope="module")
def upgrade() -> DriftRun:
    """The next release after the window, from the newest supported one."""
    return run_drift(REPO, "0.33.0", from_version="0.32.0")


def _line(path: str, line: int) -> str:
    return (REPO / path).read_text().splitlines()[line - 1]


def test_every_finding_is_located_in_this_repository(upgrade: DriftRun) -> None:
    """Each finding of a real upgrade has a file of ours, at a line (the lock's entry at worst);
    a contract lands on its declaration, a fork or override on its ``def``."""
    assert upgrade.findings
    for finding in upgrade.findings:
        assert finding.ours is not None, finding.one_line()
        assert (REPO / finding.ours.path).is_file(), finding.verbose()
        assert finding.ours.line > 0, finding.verbose()
    by_symbol = {f.symbol: f for f in upgrade.findings}
    contract = by_symbol[
        "vllm.v1.core.sched.scheduler:Scheduler.update_from_output#error-requests-collected"
    ]
    assert contract.ours is not None
    assert 'id="error-requests-collected"' in _line(contract.ours.path, contract.ours.line)
    forked = by_symbol[
        "afd_models._generated.vllm.v1.worker.gpu.cudagraph_utils:AFDModelCudaGraphManager.capture"
    ]
    assert forked.ours is not None and "def capture(" in _line(forked.ours.path, forked.ours.line)


def test_sarif_of_a_real_upgrade_is_valid_and_ours(upgrade: DriftRun) -> None:
    """The SARIF of a real upgrade validates against the official schema, and every artifact is
    a file of this repository (upstream places are in the messages)."""
    document = json.loads(as_sarif(upgrade.findings, upgrade.new_version))
    jsonschema.Draft4Validator(json.loads(SCHEMA.read_text())).validate(document)
    results = document["runs"][0]["results"]
    assert len(results) == len(upgrade.findings)
    for result in results:
        (location,) = result["locations"]
        uri = location["physicalLocation"]["artifactLocation"]["uri"]
        assert (REPO / uri).is_file(), result
    assert any("(upstream before vllm/" in r["message"]["text"] for r in results)


def test_a_lost_anchor_names_the_nearest_code_and_a_new_anchor(
    upstream_copy: Path, tmp_path: Path
) -> None:
    """vLLM renaming the attribute an edit anchors on loses the anchor: the finding is on the
    edit's declaration, and shows the renamed statement, at its line, as the anchor to paste."""
    path = "vllm/model_executor/models/deepseek_v2.py"
    root = changed_tree(
        upstream_copy,
        tmp_path,
        {
            path: once(
                "        self.self_attn = attn_cls(\n", "        self.attention = attn_cls(\n"
            )
        },
    )
    findings = run_drift(REPO, "0.26.0", to_root=root).findings
    symbol = f"{DEEPSEEK}:AFDDeepseekV2DecoderLayer.__init__#attention-on-attention-role"
    (lost,) = [f for f in findings if f.code == "DRF030" and f.symbol == symbol]
    line = (root / path).read_text().splitlines().index("        self.attention = attn_cls(") + 1
    assert f"the nearest code is at {path}:{line}: self.attention = attn_cls(" in lost.message
    nearest, proposed = lost.details[-2:]
    assert nearest.startswith(f"nearest in 0.26.0 at {path}:{line} (")
    assert proposed.startswith("    proposed anchor: 'self.attention = attn_cls(\\n")
    assert lost.ours is not None and lost.ours.path == DEEPSEEK_OVERLAY
    assert 'id="attention-on-attention-role"' in _line(lost.ours.path, lost.ours.line)
