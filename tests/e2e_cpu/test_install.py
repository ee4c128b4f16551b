"""What an operator's install does, end to end.

* **A wheel.** docs/user-guide.md's wheel commands, run as written in a fresh clone with a fresh
  venv's ``pip`` first on ``PATH``, build a wheel that carries its generated code and install it
  there. The venv sees vLLM through a ``.pth`` line naming the CPU env's packages, not this
  checkout. On every release, its workers come from the wheel, generated for the installed vLLM,
  and the AFD pair served from that venv with eager engines takes concurrent requests that cross
  the connector together (several sequences per step); SIGTERM stops both roles with exit code
  0, leaving no process or port behind.
* **A stale checkout.** With an overlay edited after generation, loading vLLM's plugins logs
  nothing from this project and still registers the AFD names; a plain ``vllm serve`` serves;
  an AFD worker fails at start with the command that fixes it.
"""

from __future__ import annotations

import json
import os
import shutil
import sysconfig
import venv
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from afd_models.cli import serve
from afd_models.freshness import installed_vllm
from afd_models.generated_registry import registry_data
from tests import probes
from tests.checkout import REPO, tracked_copy
from tests.e2e_cpu.test_documented_launch import GUIDE, documented_blocks, run_block
from tests.engine import run_python

PROMPTS = ["Hello world, the license", "The quick brown fox", "Numbers like 0 1 2", "Experts"]
MAX_TOKENS = 24
START_TIMEOUT_S = 600
OVERLAY = "overlay/vllm/model_executor/models/deepseek_v2.py"
#: what vLLM logs when a general plugin raises while it loads
PLUGIN_FAILED = "Failed to load plugin"


@dataclass(frozen=True)
class WheelVenv:
    #: the fresh venv, with the wheel installed and vLLM beside it
    root: Path
    #: its python
    python: str
    #: the fresh clone the wheel was built in
    clone: Path


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WheelVenv]:
    """The documented wheel commands run in a fresh clone, with a fresh venv's pip first on PATH."""
    root = tmp_path_factory.mktemp("wheel")
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=True)
    packages = Path(sysconfig.get_paths(vars={"base": str(env_dir)})["purelib"])
    (packages / "cpu-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # the wheel is for the installed vLLM: the primary needs no setting, another release names
    # itself (pip reads PIP_CONFIG_SETTINGS as --config-settings)
    release = installed_vllm()
    shell = {
        "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(env_dir),
        **({} if release == _primary() else {"PIP_CONFIG_SETTINGS": f"vllm={release}"}),
    }
    clone = tracked_copy(root / "clone")
    built = run_block(documented_blocks(GUIDE, ("wheel",))["wheel"], 600, cwd=clone, env=shell)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    yield WheelVenv(env_dir, str(env_dir / "bin" / "python"), clone)
    shutil.rmtree(env_dir, ignore_errors=True)


def _primary() -> str:
    return str(registry_data(REPO)["SUPPORTED"]["vllm"][0])


@pytest.mark.every_release
def test_wheel_carries_code_generated_for_the_installed_vllm(wheel_venv: WheelVenv) -> None:
    """On every supported release (one other than the primary named with ``-C vllm=``), the
    venv's AFD workers import from the wheel, pass their freshness check against the lock the
    wheel carries, and were generated for the installed vLLM; the build left the clone alone."""
    where = run_python(
        """
        import afd_models.workers, afd_models._generated as generated
        print(afd_models.workers.__file__, generated.UPSTREAM["vllm"], generated.LOCK)
        """,
        dict(os.environ),
        python=wheel_venv.python,
        cwd=wheel_venv.root,
    )
    assert where.returncode == 0, where.stderr[-3000:]
    module, generated_for, lock = where.stdout.splitlines()[-1].split()
    assert Path(module).is_relative_to(wheel_venv.root), module  # not this checkout's
    assert generated_for == installed_vllm()
    assert (Path(module).parent / "_generated" / Path(lock).name).is_file()
    assert not (wheel_venv.clone / "afd_models" / "_generated").exists()


@pytest.mark.every_release
def test_wheel_serves_batched_requests_and_stops_cleanly(
    wheel_venv: WheelVenv, model: Path, logs: Path, tmp_path: Path
) -> None:
    """On every release, eager: both roles run the wheel's code; requests batch through the
    connector; SIGTERM stops both roles with exit code 0. (Stopping the Attention role first also ends the FFN engine, which
    then reports its peer gone: see test_serve_pair.py.)"""
    afd = {"port": serve.free_port(), "connector_extra_config": {"timeout_s": 10}}
    from_wheel = {"python": wheel_venv.python, "cwd": tmp_path, "eager": True}
    ffn = serve.start_ffn(
        "ffn-wheel", model, serve.free_port(), logs, afd, cpu=serve.cpu(1), **from_wheel
    )
    attention = serve.start_attention(
        "attention-wheel",
        model,
        serve.free_port(),
        logs,
        afd,
        cpu=serve.cpu(0),
        env={"VLLM_SERVER_DEV_MODE": "1"},
        **from_wheel,
    )
    try:
        serve.wait_ready([ffn, attention], START_TIMEOUT_S)
        before = serve.connector_stats(attention)["steps"]
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            outputs = list(pool.map(lambda p: serve.complete(attention, p, MAX_TOKENS), PROMPTS))
        assert [len(tokens) for tokens in outputs] == [MAX_TOKENS] * len(PROMPTS)
        steps = serve.connector_stats(attention)["steps"] - before
        assert MAX_TOKENS <= steps < len(PROMPTS) * MAX_TOKENS  # sequences shared steps
    finally:
        ffn_code = serve.stop(ffn)  # FFN first: the Attention role notices nothing while idle
        attention_code = serve.stop(attention)
    assert (attention_code, ffn_code) == (0, 0)
    assert not serve.group_alive(attention) and not serve.group_alive(ffn)
    assert probes.port_is_free(afd["port"])
    assert "AFD FFN server: stopped after" in ffn.log.read_text(errors="replace")
    assert not serve.ran_compiled(attention)


@pytest.fixture(scope="module")
def stale_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkout with its generated code, then an overlay edited (a `git pull` that touched one)."""
    root = tracked_copy(tmp_path_factory.mktemp("stale") / "checkout")
    shutil.copytree(REPO / "afd_models" / "_generated", root / "afd_models" / "_generated")
    with (root / OVERLAY).open("a") as overlay:
        overlay.write("\n# edited after generation\n")
    return root


# plugin loading is vLLM's and the same on every release; the wheel test runs on each
def test_stale_checkout_leaves_plain_vllm_alone_and_stops_afd_workers(
    stale_checkout: Path, model: Path, logs: Path
) -> None:
    env = {"PYTHONPATH": str(stale_checkout)}
    probe = run_python(
        """
        import json, afd_models
        from vllm import ModelRegistry
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        afd = sorted(a for a in ModelRegistry.get_supported_archs() if a.startswith("AFD"))
        print(json.dumps([afd_models.__file__, afd]))
        """,
        {**os.environ, **env},
        cwd=stale_checkout,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    module, registered = json.loads(probe.stdout.splitlines()[-1])
    assert Path(module).is_relative_to(stale_checkout), module
    assert "AFDDeepseekV2ForCausalLM" in registered, registered
    assert PLUGIN_FAILED not in probe.stderr and "Traceback" not in probe.stderr, probe.stderr

    plain = serve.start("plain-stale", model, serve.free_port(), logs, env=env, eager=True)
    try:
        serve.wait_ready([plain], START_TIMEOUT_S)
        assert len(serve.complete(plain, PROMPTS[0], 4)) == 4
        # read before the stop: vLLM's own shutdown may log a traceback of its engine client
        log = plain.log.read_text(errors="replace")
    finally:
        serve.stop(plain)
    assert PLUGIN_FAILED not in log and "Traceback" not in log, log[-3000:]

    afd = {"port": serve.free_port(), "connector_extra_config": {"connect_timeout_s": 30}}
    attention = serve.start_attention(
        "attention-stale", model, serve.free_port(), logs, afd, env=env, eager=True
    )
    try:
        with pytest.raises(serve.ServerError, match="exited with"):
            serve.wait_ready([attention], START_TIMEOUT_S)
    finally:
        serve.stop(attention)
    log = attention.log.read_text(errors="replace")
    assert f"{OVERLAY} changed since the code was generated" in log, attention.log_tail()
    assert "nox -s regenerate" in log, attention.log_tail()
    assert not serve.group_alive(attention) and not serve.group_alive(plain)
