"""The deployment spec (afd_models.deploy.spec) and the commands it gives each engine
(afd_models.deploy.commands): every engine derived, each bad spec refused with one error naming
the key, the value and what is allowed, before anything starts."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from afd_models import supervisor
from afd_models.config import Role
from afd_models.deploy import spec as spec_module
from afd_models.deploy.commands import deployment_commands
from afd_models.deploy.spec import Platform, SpecError, load_spec, parse_spec


def _spec_of_docstring() -> str:
    """The example spec in afd_models/deploy/spec.py's docstring, as a file would hold it."""
    doc = spec_module.__doc__ or ""
    block = doc.split("::\n", 1)[1]
    return "\n".join(line[4:] for line in block.splitlines()) + "\n"


def test_the_documented_spec_gives_3a2f_with_its_flags(tmp_path: Path) -> None:
    path = tmp_path / "deploy.toml"
    path.write_text(_spec_of_docstring())
    deployment = load_spec(path)
    assert deployment.platform is Platform.CPU and deployment.dtype == "bfloat16"
    assert [(e.name, e.rank_offset, e.dp, e.api_port, e.binding) for e in deployment.engines] == [
        ("ffn0", 0, 1, 8100, "12-13"),
        ("ffn1", 1, 1, 8101, "14-15"),
        ("attention0", 0, 2, 8000, "0-3|4-7"),
        ("attention1", 2, 1, 8001, "8-11"),
    ]
    commands = {c.engine.name: c for c in deployment_commands(deployment)}
    ffn1, second = commands["ffn1"], commands["attention1"]
    afd = json.loads(ffn1.argv[ffn1.argv.index("--additional-config") + 1])
    assert afd == {
        "afd": {
            "compute_gate_on_attention": False,
            "num_attention_ranks": 3,
            "num_ffn_ranks": 2,
            "port": 29650,
            "rank_offset": 1,
            "role": "ffn",
        }
    }
    assert "--no-enable-prefix-caching" in ffn1.argv
    assert ffn1.env == {"VLLM_MLA_DISABLE": "1", "VLLM_CPU_OMP_THREADS_BIND": "14-15"}
    first = commands["attention0"]
    assert first.argv[:3] == ("vllm", "serve", "/models/DeepSeek-V2-Lite-Chat")
    assert first.argv[first.argv.index("--data-parallel-size") + 1] == "2"
    assert first.argv[first.argv.index("--worker-cls") + 1] == (
        "afd_models.workers.AFDAttentionCPUWorker"
    )
    assert first.argv[-2:] == ("--kv-cache-memory-bytes", "4G")
    assert "--no-enable-prefix-caching" not in first.argv
    assert "--data-parallel-size" not in second.argv
    assert first.shell().startswith(
        "VLLM_MLA_DISABLE=1 VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND='0-3|4-7' vllm serve "
    )
    assert {e.config.role for e in deployment.engines} == {Role.ATTENTION, Role.FFN}


MINIMAL: dict[str, Any] = {"model": "/m", "attention": {}, "ffn": {}}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": ""}, "model='' is not allowed; allowed: a non-empty string"),
        (
            {"dtype": "int4"},
            "dtype='int4' is not allowed; allowed: auto, bfloat16, float16, float32",
        ),
        ({"platform": "tpu"}, "platform='tpu' is not allowed; allowed: cpu, cuda"),
        (
            {"tensor_parallel_size": 0},
            "tensor_parallel_size=0 is not allowed; allowed: an integer >= 1",
        ),
        ({"nodes": 2}, "nodes is not a spec key; allowed: model, dtype, platform"),
        (
            {"afd": {"rank_offset": 1}},
            "afd.rank_offset=1 is not allowed: the spec sets role, rank_offset",
        ),
        ({"afd": {"port": 99999}}, "ffn.ranks=1, ffn engine 0: afd.port=99999 is not allowed"),
        ({"afd": {"shared_memory": True}}, "has unknown key(s) ['shared_memory']"),
        (
            {"attention": {"engines": []}},
            "attention.engines=[] is not allowed; allowed: a non-empty list",
        ),
        ({"attention": {"engines": [1, 0]}}, "attention.engines=[1, 0] is not allowed"),
        (
            {"attention": {"engines": [1, 2]}, "ffn": {"ranks": 2}},
            "attention.engines=[1, 2], attention engine 0: FFN rank 0 of 3A2F serves attention ranks [0, 1]",
        ),
        (
            {"ffn": {"ranks": 2}},
            "ffn.ranks=2, ffn engine 0: afd.num_attention_ranks=1 with afd.num_ffn_ranks=2 is not allowed",
        ),
        (
            {"attention": {"devices": ["0"]}},
            "attention.devices is not allowed with platform='cpu'; allowed: attention.cpus",
        ),
        (
            {"attention": {"cpus": ["0", "1"]}},
            "attention.cpus=['0', '1'] is not allowed; allowed: one non-empty string per engine (1)",
        ),
        ({"attention": {"api_port": 8100}}, "attention0 and ffn0 would both use port 8100"),
        (
            {"tensor_parallel_size": 2, "afd": {"port": 65535}},
            "afd.port=65535 with 1 FFN ranks x TP size 2 needs ports 65535..65536; allowed: "
            "1..65535 (tensor_parallel_size=2)",
        ),
        (
            {"tensor_parallel_size": 2, "afd": {"port": 8099}},
            "ffn0 and the FFN ranks' rendezvous (afd.port=8099, 2 ports) would both use port 8100",
        ),
        (
            {"attention": {"api_port": 65535, "engines": [1, 1]}, "ffn": {"ranks": 2}},
            "attention.api_port=65535 is not allowed with 2 engines",
        ),
        ({"ffn": {"args": "--x"}}, "ffn.args='--x' is not allowed; allowed: a list of strings"),
        ({"ffn": {"gpus": 1}}, "ffn.gpus is not a spec key; allowed in ffn: ranks, api_port"),
        (
            {"ffn": {"env": {"X": 1}}},
            "ffn.env={'X': 1} is not allowed; allowed: a table of variables and their values as "
            "strings",
        ),
        (
            {"attention": {"env": {"PROMETHEUS_MULTIPROC_DIR": "/tmp/p"}}},
            "attention.env.PROMETHEUS_MULTIPROC_DIR='/tmp/p' is not allowed: deploy gives each "
            "engine a directory of its own",
        ),
        (
            {"kubernetes": {"name": "d", "image": "i", "model_claim": "m", "nodes_per_engine": 2}},
            "kubernetes.nodes_per_engine=2 is not allowed: an engine spanning nodes (vLLM's "
            "multi-node tensor or pipeline parallel) needs a LeaderWorkerSet, which deploy k8s "
            "does not render; allowed: 1",
        ),
        (
            {
                "kubernetes": {
                    "name": "d",
                    "image": "i",
                    "model_claim": "m",
                    "nodes_per_engine": True,
                }
            },
            "kubernetes.nodes_per_engine=True is not allowed",
        ),
    ],
)
def test_a_bad_spec_gets_one_error_naming_it(change: dict[str, Any], message: str) -> None:
    data = {**MINIMAL, **change}
    with pytest.raises(SpecError) as raised:
        parse_spec(data)
    assert message in str(raised.value), raised.value


def test_a_spec_file_that_is_not_toml_or_not_there_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=re.escape(f"{tmp_path / 'none.toml'}: cannot be read")):
        load_spec(tmp_path / "none.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("model = \n")
    with pytest.raises(SpecError, match=re.escape("broken.toml: not TOML")):
        load_spec(broken)
    missing = tmp_path / "missing.toml"
    missing.write_text('model = "/m"\n[ffn]\n')
    with pytest.raises(SpecError, match=re.escape("missing.toml: attention is required")):
        load_spec(missing)


@pytest.mark.parametrize("command", ["check", "up"])
def test_deploy_refuses_a_spec_the_workers_would_refuse_before_anything_starts(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A bad key, and an FFN rank on a non-loopback address without the shared secret (the
    workers' secure default): one error each, exit 3 (the project's usage-error code), and no
    engine started (no log directory)."""
    from afd_models.deploy.__main__ import main

    monkeypatch.delenv("AFD_AUTH_TOKEN", raising=False)
    logs = tmp_path / "logs"
    bad = tmp_path / "bad.toml"
    bad.write_text('model = "/m"\n[attention]\nengines = [0]\n[ffn]\n')
    assert main([command, str(bad), "--log-dir", str(logs)]) == 3
    assert "bad.toml: attention.engines=[0] is not allowed" in capsys.readouterr().err
    exposed = tmp_path / "exposed.toml"
    exposed.write_text('model = "/m"\n[afd]\nffn_hosts = ["10.0.0.7"]\n[attention]\n[ffn]\n')
    assert main([command, str(exposed), "--log-dir", str(logs)]) == 3
    err = capsys.readouterr().err
    assert "exposed.toml: " in err and "AFD_AUTH_TOKEN" in err, err
    assert not logs.exists()


def test_up_refuses_a_log_directory_a_detached_deployment_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second ``up`` there would overwrite the first one's record, leaving ``down`` nothing
    to stop: exit 3, naming the file and the way out, and nothing started."""
    from afd_models.deploy.__main__ import main

    spec = tmp_path / "pair.toml"
    spec.write_text('model = "/m"\n[attention]\n[ffn]\n')
    logs = tmp_path / "logs"
    logs.mkdir()
    record = '{"ffn0": {"process_group": 1}}\n'
    (logs / "deployment.json").write_text(record)
    assert main(["up", str(spec), "--log-dir", str(logs)]) == 3
    out = capsys.readouterr().out
    assert f"{logs / 'deployment.json'} exists" in out and "deploy down SPEC" in out, out
    assert sorted(p.name for p in logs.iterdir()) == ["deployment.json"]
    assert (logs / "deployment.json").read_text() == record


def test_down_stops_what_is_recorded_and_refuses_a_record_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A live process group is stopped and the record removed; a record that is not ``up``'s
    is refused by name (exit 3) and kept."""
    from afd_models.deploy.__main__ import main

    spec = tmp_path / "pair.toml"
    spec.write_text('model = "/m"\n[attention]\n[ffn]\n')
    logs = tmp_path / "logs"
    logs.mkdir()
    engine = supervisor.launch(
        "ffn0", [sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "ffn0.log"
    )
    try:
        state = {"ffn0": {"process_group": engine.pgid, "host": "127.0.0.1", "port": 1, "log": ""}}
        (logs / "deployment.json").write_text(json.dumps(state))
        assert main(["down", str(spec), "--log-dir", str(logs)]) == 0
        assert engine.process is not None and engine.process.wait(10) is not None
        assert not supervisor.members(engine.pgid)
        assert not (logs / "deployment.json").exists()
    finally:
        supervisor.kill(engine)
    (logs / "deployment.json").write_text('["not", "a", "record"]')
    assert main(["down", str(spec), "--log-dir", str(logs)]) == 3
    assert "deployment.json is not what `up` writes" in capsys.readouterr().out
    assert (logs / "deployment.json").exists()


def test_the_deployment_guides_commands_run_as_written() -> None:
    """docs/deployment.md's `check` and `k8s` blocks, each in its own shell from the checkout
    root (its `up` block serves the tiny pair: tests/e2e_cpu/test_documented_launch.py)."""
    from tests.e2e_cpu.test_documented_launch import ROOT, documented_blocks, run_block

    blocks = documented_blocks(ROOT / "docs" / "deployment.md", ("deploy_check", "deploy_k8s"))
    checked = run_block(blocks["deploy_check"], timeout_s=120)
    assert checked.returncode == 0, checked.stderr[-2000:]
    lines = checked.stdout.splitlines()
    assert len(lines) == 4 and all(
        " vllm serve /models/DeepSeek-V2-Lite-Chat " in line for line in lines
    )
    written = ROOT / "afd-demo.yaml"  # where the block writes, in the checkout
    assert not written.exists(), f"{written} is in the way; remove it to run this test"
    try:
        rendered = run_block(blocks["deploy_k8s"], timeout_s=120)
        assert rendered.returncode == 0, rendered.stderr[-2000:]
        text = written.read_text()
    finally:
        written.unlink(missing_ok=True)
    assert text.count("kind: StatefulSet") == 3 and "name: demo-ffn" in text
