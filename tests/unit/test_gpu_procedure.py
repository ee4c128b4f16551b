"""docs/gpu.md's procedure, its commands run exactly as written: the build against a prepared
wheel cache (no network), and the host command in a directory standing in for the GPU host, with
stand-ins for torch's CUDA and vLLM's engine (tests/unit/gpu_fakes.py), stopped from outside
during its second mode."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from afd_models import supervisor
from tools.gpu_bundle import build
from tools.gpu_bundle.manifest import (
    DEFAULT_PLATFORM,
    DEFAULT_PYTHON_VERSION,
    MIB,
    TORCH_VERSION,
    VLLM_VERSION,
    BundleSpec,
    HostDist,
    Plan,
    ResolvedWheel,
)
from tools.gpu_check.modes import MODEL_DIR
from tools.harness.processes import REPO_ROOT

from .gpu_fakes import FAKE_TORCH, FAKE_VLLM, tiny_wheel, write_packages

GPU_DOC = REPO_ROOT / "docs" / "gpu.md"
ANY_BLOCK = re.compile(r"```bash\n(.*?)\n```", re.S)
#: where the doc puts the parts and the check's work directory, relative to the checkout
PARTS = Path(".afd-work/gpu-parts")
WORK = Path(".afd-work/gpu-check")


def doc_blocks() -> dict[str, str]:
    """The marked command blocks of docs/gpu.md; every bash block of the page is one of them."""
    from tests.e2e_cpu.test_documented_launch import documented_blocks  # imports afd_models.cli

    blocks = documented_blocks(GPU_DOC, ("build", "host"))
    assert sorted(ANY_BLOCK.findall(GPU_DOC.read_text())) == sorted(blocks.values())
    return blocks


def start_block(block: str, cwd: Path, env: dict[str, str]) -> supervisor.Group:
    """``block`` in bash, in ``cwd``, with this interpreter as ``python`` and this checkout on
    ``PYTHONPATH`` (as running it from the checkout's root would have it), in a process group of
    its own; its output in ``cwd/block.log``."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return supervisor.launch(
        "host command",
        ["bash", "-c", block],
        cwd / "block.log",
        env={**os.environ, **env, "PATH": path, "PYTHONPATH": python_path},
        cwd=cwd,
    )


def _wait_for(condition: Any, group: supervisor.Group, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert group.alive(), f"exited {group.returncode}:\n{group.log_tail(60)}"
        assert time.monotonic() < deadline, f"still waiting after {timeout} s:\n{group.log_tail()}"
        time.sleep(0.2)


def test_the_host_command_keeps_every_finished_mode_when_stopped(tmp_path: Path) -> None:
    """The doc's host command on a stand-in host: it refuses nothing, installs the parts with
    pip, runs full-decode-only with the gate on the FFN role first and writes the JSON report;
    stopped (SIGTERM) while the second mode (piecewise) runs, the report holds the first,
    finished, and the check stopped that mode's engine."""
    host = tmp_path / "host"
    parts = host / PARTS
    wheel = tiny_wheel(tmp_path / "wheels", "vllm", VLLM_VERSION, dict(FAKE_VLLM))
    spec = BundleSpec(
        VLLM_VERSION,
        TORCH_VERSION,
        f"{sys.version_info[0]}.{sys.version_info[1]}",
        f"manylinux_2_17_{platform.machine()}",
    )
    build.pack_bundle([(wheel, tmp_path / "wheels" / wheel.filename)], parts, spec, part_bytes=4096)
    assert len(list(parts.glob("bundle.part*"))) > 2  # the parts arrive one transfer each
    # the model an earlier run left: the stand-in torch cannot build one
    (host / WORK / MODEL_DIR).mkdir(parents=True)
    out, engine_pid = tmp_path / "out", tmp_path / "engine.pid"
    out.mkdir()
    env = {
        "OUT": str(out),
        "PYTHONPATH": str(write_packages(tmp_path / "host-site", FAKE_TORCH)),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "CUDA_VISIBLE_DEVICES": "0",
        "FAKE_VLLM_HANG": "PIECEWISE",
        "FAKE_VLLM_PID": str(engine_pid),
    }
    group = start_block(doc_blocks()["host"], host, env)
    engine_left: list[int] = []
    try:
        _wait_for(engine_pid.exists, group, 120)
        report = json.loads((out / "gpu-check.json").read_text())
    finally:
        supervisor.stop(group, 60)  # SIGTERM, as when the host's session ends
        if engine_pid.exists():  # the engine runs in a group of its own, the check stops it
            engine = int(engine_pid.read_text())
            engine_left = supervisor.members(engine)
            supervisor.kill(supervisor.attach("engine", engine, host / "block.log"))
    assert engine_left == [], "the stopped check left its engine running"
    log = (host / "block.log").read_text()
    assert "parts verified" in log and "installing 1 wheels into" in log
    assert report["finished"] is False and report["deadline_s"] == 540
    modes = {entry["mode"]: entry for entry in report["modes"]}
    (run,) = modes["full-decode-only"]["runs"]
    assert run["gate"] == "ffn" and run["passed"] and run["tokens_equal"]
    assert run["counters"]["graph_captures"] > 0 and run["counters"]["graph_replays"] > 0
    assert run["afd_tokens_per_s"] > 0 and run["native_tokens_per_s"] > 0
    assert modes["piecewise"]["status"] == modes["eager"]["status"] == "not run yet"
    assert report["nccl"]["status"] == "skipped"


def _seed_cache(cache: Path, spec: BundleSpec) -> None:
    """A resolution of ``spec`` and its wheels, as a first build would leave them."""
    key = cache / "gpu-bundle" / spec.key
    vllm_files = {
        "vllm/__init__.py": "",
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "fa2" * 100_000,
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": "fa3",
    }
    infos = [
        tiny_wheel(key / "wheels", "vllm", VLLM_VERSION, vllm_files),
        tiny_wheel(key / "wheels", "flashinfer-python", "0.6.14"),
        tiny_wheel(key / "wheels", "tilelang", "0.1.9"),
    ]
    plan = Plan(
        tuple(
            ResolvedWheel(w.name, w.version, w.filename, f"file:///{w.filename}", w.sha256)
            for w in infos
        ),
        (HostDist("torch", TORCH_VERSION),),
    )
    data = json.dumps(build._plan_to_json(plan, spec))
    (key / "resolution.json").write_text(data)


def test_the_build_command_makes_parts_that_fit_a_transfer(tmp_path: Path) -> None:
    """The doc's build command, from a cache a first build left (so no network): the parts
    hold what the check imports, drop the rest with its size, strip FlashAttention 2 from the
    vllm wheel, and each is at most 48 MiB."""
    checkout, cache = tmp_path / "checkout", tmp_path / "cache"
    checkout.mkdir()
    spec = BundleSpec(VLLM_VERSION, TORCH_VERSION, DEFAULT_PYTHON_VERSION, DEFAULT_PLATFORM)
    _seed_cache(cache, spec)
    group = start_block(doc_blocks()["build"], checkout, {"AFD_CACHE_DIR": str(cache)})
    assert group.process is not None and group.process.wait(120) == 0, group.log_tail(60)
    manifest = json.loads((checkout / PARTS / "manifest.json").read_text())
    assert [w["name"] for w in manifest["wheels"]] == ["flashinfer-python", "vllm"]
    assert [(d["name"], d["size"] > 0) for d in manifest["dropped"]] == [("tilelang", True)]
    (stripped,) = manifest["stripped"]
    assert stripped["pattern"].startswith("vllm/vllm_flash_attn/_vllm_fa2_C")
    vllm = next(w for w in manifest["wheels"] if w["name"] == "vllm")
    assert vllm["stripped_from"] and vllm["stripped_from"] != vllm["sha256"]
    assert all(0 < part["size"] <= 48 * MIB for part in manifest["parts"])


@pytest.mark.parametrize("name", ["build", "host"])
def test_the_doc_runs_from_the_checkout_root(name: str) -> None:
    """Both commands name paths relative to the checkout, under .afd-work (ignored by git, so a
    part does not ride along in every transfer)."""
    block = doc_blocks()[name]
    assert block.startswith("python -m tools.gpu_") and str(PARTS) in block
    ignored = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "check-ignore", "-q", str(PARTS / "bundle.part000")],
        timeout=30,
    )
    assert ignored.returncode == 0
