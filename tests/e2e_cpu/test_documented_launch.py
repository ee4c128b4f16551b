"""The launch commands of docs/user-guide.md and README.md, run exactly as written.

The docs mark each command block with ``<!-- doc-test: NAME -->``; the README shows the same
blocks as the user guide (checked here), so they run once. Like a user who followed the guide:
from the checkout root, in vLLM's default compiled mode, each block in its own shell, with this
test's environment less every ``VLLM_*`` / ``TORCHDYNAMO_*`` variable (a user's shell has none of
the test harness's settings). ``model`` runs to completion; ``ffn`` and ``attention`` run in the
background, as in their own terminals, until the port named by their ``--port`` answers
``/health``; ``request`` must print a completion. Then docs/deployment.md's ``deploy_up`` block
serves the same pair from one spec, answers the same request, and stops every engine on Ctrl-C.
Everything started is stopped by process group.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from afd_models import supervisor
from afd_models.cli import serve
from tests import probes

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "user-guide.md"
DEPLOYMENT_GUIDE = ROOT / "docs" / "deployment.md"
README = ROOT / "README.md"
MARKED_BLOCK = re.compile(r"<!-- doc-test: (\w+) -->\n```bash\n(.*?)\n```", re.S)
BLOCKS = ("model", "ffn", "attention", "request")
#: the user guide's other doc-test blocks, and the test that runs each
OTHER_BLOCKS = {"wheel": "tests/e2e_cpu/conftest.py", "secret": "tests/unit/test_config.py"}
#: where the documented model command writes the tiny model
MODEL_DIR = Path("/tmp/afd-tiny")
#: ports the documented commands use: Attention, FFN, the connector's rendezvous
DOCUMENTED_PORTS = (8000, 8001, 29650)


def documented_blocks(path: Path, names: tuple[str, ...] = BLOCKS) -> dict[str, str]:
    """The doc-test blocks ``names`` of ``path``; each must be there once."""
    found = MARKED_BLOCK.findall(path.read_text())
    for name in names:
        count = sum(found_name == name for found_name, _ in found)
        assert count == 1, (
            f"{path.name}: doc-test block {name!r} appears {count} times, expected once"
        )
    return {name: script for name, script in found if name in names}


def user_shell_env() -> dict[str, str]:
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("VLLM_", "TORCHDYNAMO_"))
    }


def run_block(
    script: str, timeout_s: float, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A documented block run to completion in its own shell, as a user pastes it (``env``:
    variables the user's shell would have on top of this test's, such as an activated venv's)."""
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        env={**user_shell_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def start_block(name: str, script: str, port: int, logs: Path) -> serve.Server:
    """A documented block started in its own shell and process group, as in its own terminal."""
    group = supervisor.launch(
        name, ["bash", "-c", script], logs / f"{name}.log", env=user_shell_env(), cwd=ROOT
    )
    return serve.Server(group, port)


def documented_port(script: str) -> int:
    match = re.search(r"--port (\d+)", script)
    assert match, f"no --port in the documented command:\n{script}"
    return int(match.group(1))


def test_readme_shows_the_user_guide_commands() -> None:
    assert documented_blocks(README) == documented_blocks(GUIDE)


def test_every_doc_test_block_of_the_user_guide_is_run() -> None:
    names = [name for name, _ in MARKED_BLOCK.findall(GUIDE.read_text())]
    assert sorted(names) == sorted([*BLOCKS, *OTHER_BLOCKS])
    for name, test in OTHER_BLOCKS.items():
        assert f'documented_blocks(GUIDE, ("{name}",))' in (ROOT / test).read_text(), test
    # docs/deployment.md's: `deploy_up` below, the others in tests/unit/test_deploy_spec.py
    deployment = [name for name, _ in MARKED_BLOCK.findall(DEPLOYMENT_GUIDE.read_text())]
    assert sorted(deployment) == ["deploy_check", "deploy_k8s", "deploy_up"]


# the commands are the same on every supported release (`tools/cpu_env.py path` names the env the
# generated code is for); test_serve_pair.py serves each release in compiled mode
def test_documented_launch_serves_a_completion_in_compiled_mode(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    blocks = documented_blocks(GUIDE)
    busy = [port for port in DOCUMENTED_PORTS if not probes.port_is_free(port)]
    assert not busy, (
        f"the documented ports {busy} are in use on this machine; free them to run this test"
    )
    logs = tmp_path_factory.mktemp("documented-launch")
    model_existed = MODEL_DIR.exists()

    made = run_block(blocks["model"], timeout_s=300)
    assert made.returncode == 0, made.stderr[-3000:]
    assert (MODEL_DIR / "config.json").is_file() and (MODEL_DIR / "model.safetensors").is_file()

    try:
        servers = [
            start_block(name, blocks[name], documented_port(blocks[name]), logs)
            for name in ("ffn", "attention")
        ]
        try:
            serve.wait_ready(servers, timeout_s=600)
            _assert_completion(run_block(blocks["request"], timeout_s=120))
            ffn, attention = servers
            assert serve.ran_compiled(attention), attention.log_tail()
            # without a restart window, a dead FFN engine fails the next request clearly, within
            # the connector's timeout (60 s by default)
            serve.kill_group(ffn)
            started = time.monotonic()
            request = {"model": str(MODEL_DIR), "prompt": "x", "max_tokens": 4}
            status, body = serve.post(attention, "/v1/completions", request, 120)
            assert status != 200, body
            assert time.monotonic() - started < 60 + 30
            assert "AFD gloo connector" in attention.log.read_text(errors="replace")
        finally:
            for server in servers:
                serve.stop(server)
        assert not any(serve.group_alive(server) for server in servers)
        _deployment_guides_pair_serves(blocks["request"], logs)
    finally:
        if not model_existed:
            shutil.rmtree(MODEL_DIR, ignore_errors=True)


def _assert_completion(answer: subprocess.CompletedProcess[str]) -> None:
    assert answer.returncode == 0, answer.stderr
    body = json.loads(answer.stdout)
    choice = body["choices"][0]
    assert choice["text"] and choice["finish_reason"] in ("length", "stop"), body
    assert 1 <= body["usage"]["completion_tokens"] <= 16, body


def _deployment_guides_pair_serves(request: str, logs: Path) -> None:
    """docs/deployment.md's `up` block: the same pair from one spec, answering the same request,
    then Ctrl-C (SIGINT to its process group, as a terminal sends it) stops every engine."""
    (up_block,) = documented_blocks(DEPLOYMENT_GUIDE, ("deploy_up",)).values()
    log_dir = ROOT / "afd-deploy-tiny-1a1f"  # up's default, in the directory it runs in
    assert not log_dir.exists(), f"{log_dir} is in the way; remove it to run this test"
    up = start_block("deploy-up", up_block, 8000, logs)
    try:
        try:
            serve.wait_ready([up], timeout_s=600)
            # up itself is ready once it says so (it may not have seen /health answer yet)
            deadline = time.monotonic() + 60
            while "serving; Ctrl-C stops every engine" not in up.log_tail(400):
                assert up.alive() and time.monotonic() < deadline, up.log_tail(400)
                time.sleep(0.5)
            _assert_completion(run_block(request, timeout_s=120))
            engines = json.loads((log_dir / "deployment.json").read_text())
            assert list(engines) == ["ffn0", "attention0"], engines
        finally:
            supervisor.send(up.group, signal.SIGINT)  # Ctrl-C in its terminal
            try:
                assert up.group.process is not None
                code = up.group.process.wait(120)  # two engines' stops, 45 s at most each
            finally:
                serve.stop(up)
        output = up.log.read_text(errors="replace")
        assert code == 0, output[-3000:]
        assert "send requests to http://127.0.0.1:8000/v1/ (attention0)" in output, output[-3000:]
        assert output.index("stopping attention0") < output.index("stopping ffn0"), output[-3000:]
        groups = [entry["process_group"] for entry in engines.values()]
        assert not any(supervisor.members(group) for group in groups)
        assert not (log_dir / "deployment.json").exists()
    finally:
        if log_dir.exists():  # its logs go with the test's: a failed run must not block the next
            shutil.copytree(log_dir, logs / log_dir.name, dirs_exist_ok=True)
            shutil.rmtree(log_dir)
