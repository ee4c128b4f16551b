"""The commands of docs/npu.md, run exactly as written on an Ascend NPU host.

Like tests/e2e_cpu/test_documented_launch.py for the CPU recipe: each marked block in its own
shell from the checkout root, with this test's environment less every ``VLLM_*`` /
``TORCHDYNAMO_*`` variable (the blocks set ``VLLM_PLUGINS`` themselves). ``install``, ``check``
and ``nox_check`` run to completion; ``ffn`` and ``attention`` run in the background, as in their
own terminals, until their ``--port`` answers ``/health``; ``request`` must print a completion.
Everything started is stopped by process group. The serving recipe needs three NPUs and
DeepSeek-V2-Lite (downloaded by ``vllm serve`` as written, or in the Hugging Face cache).
Skipped elsewhere by the npu tier's requirement (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import probes
from tests.unit.test_npu_check import recipe_blocks

#: where the documented check blocks write their JSON report
REPORT = Path("/tmp/npu-check.json")
#: NPUs the serving recipe pins (ASCEND_RT_VISIBLE_DEVICES 0,1 and 2)
RECIPE_NPUS = 3


def _npu_count() -> int:
    result = subprocess.run(
        [sys.executable, "-c", "import torch, torch_npu; print(torch.npu.device_count())"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return int(result.stdout.split()[-1])


def test_install_block_installs_and_regenerates() -> None:
    # imported here, not at collection on every host: afd_models needs its generated code
    from tests.e2e_cpu.test_documented_launch import run_block

    result = run_block(recipe_blocks()["install"], timeout_s=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.parametrize("name", ["check", "nox_check"])
def test_install_check_passes(name: str) -> None:
    """The check, by the script and by its nox session, passes both checks on this host."""
    from tests.e2e_cpu.test_documented_launch import run_block

    REPORT.unlink(missing_ok=True)
    result = run_block(recipe_blocks()[name], timeout_s=3000)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    report = json.loads(REPORT.read_text())
    assert report["format"] == "afd-npu-check/1" and report["exit_code"] == 0
    assert [(c["name"], c["passed"]) for c in report["checks"]] == [
        ("runtime origin", True),
        ("parity", True),
    ]


def test_recipe_serves_a_completion(tmp_path_factory: pytest.TempPathFactory) -> None:
    from afd_models.cli import serve
    from tests.e2e_cpu.test_documented_launch import documented_port, run_block, start_block

    count = _npu_count()
    if count < RECIPE_NPUS:
        pytest.skip(f"the 2A1F recipe pins {RECIPE_NPUS} NPUs, this host has {count}")
    blocks = recipe_blocks()
    ports = [documented_port(blocks[name]) for name in ("ffn", "attention")] + [29650]
    busy = [port for port in ports if not probes.port_is_free(port)]
    assert not busy, f"the documented ports {busy} are in use; free them to run this test"
    logs = tmp_path_factory.mktemp("npu-recipe")
    servers = [
        start_block(name, blocks[name], documented_port(blocks[name]), logs)
        for name in ("ffn", "attention")
    ]
    try:
        serve.wait_ready(servers, timeout_s=3600)
        answer = run_block(blocks["request"], timeout_s=300)
        assert answer.returncode == 0, answer.stderr
        body = json.loads(answer.stdout)
        choice = body["choices"][0]
        assert choice["text"] and choice["finish_reason"] in ("length", "stop"), body
        assert 1 <= body["usage"]["completion_tokens"] <= 16, body
    finally:
        for server in servers:
            serve.stop(server)
    assert not any(serve.group_alive(server) for server in servers)
