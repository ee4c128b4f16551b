"""What an operator's install does, end to end.

* **A wheel.** docs/user-guide.md's wheel commands, run as written in a fresh clone with a fresh
  venv's ``pip`` first on ``PATH`` (the ``wheel_venv`` fixture, conftest.py), build a wheel that
  carries its generated code and install it there. On every release, its workers come from the
  wheel, generated for the installed vLLM. test_serve_pair.py serves the pair from that venv.
* **A stale checkout.** With an overlay edited after generation, loading vLLM's plugins logs
  nothing from this project and still registers the AFD names; a plain ``vllm serve`` serves;
  an AFD worker fails at start with the command that fixes it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from afd_models.cli import serve
from afd_models.freshness import installed_vllm
from tests.checkout import REPO, tracked_copy
from tests.e2e_cpu.conftest import WheelVenv
from tests.engine import run_python

PROMPT = "Hello world, the license"
START_TIMEOUT_S = 600
OVERLAY = "overlay/vllm/model_executor/models/deepseek_v2.py"
#: what vLLM logs when a general plugin raises while it loads
PLUGIN_FAILED = "Failed to load plugin"


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


@pytest.fixture(scope="module")
def stale_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkout with its generated code, then an overlay edited (a `git pull` that touched one)."""
    root = tracked_copy(tmp_path_factory.mktemp("stale") / "checkout")
    shutil.copytree(REPO / "afd_models" / "_generated", root / "afd_models" / "_generated")
    with (root / OVERLAY).open("a") as overlay:
        overlay.write("\n# edited after generation\n")
    return root


# plugin loading is vLLM's and the same on every release; the wheel tests run on each
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
        assert len(serve.complete(plain, PROMPT, 4)) == 4
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
