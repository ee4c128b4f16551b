"""The NPU install check (tools.npu_check): arguments, host requirements, verdicts, report,
exit codes, and its processes with fake ``torch``/``torch_npu``/``vllm``/``vllm_ascend`` packages;
no NPU needed."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

from afd_models.config import Role
from afd_models.launch import worker_class
from tools.harness.cli import UsageError
from tools.harness.processes import REPO_ROOT
from tools.harness.results import MAX_TOKENS, PROMPTS, EngineResult
from tools.npu_check import checks, cli, settings
from tools.npu_check.checks import CheckResult
from tools.npu_check.cli import Host
from tools.npu_check.host import HostInfo, Setup, host_info, plugins_problem, probe

#: the command as documented, run from the repository root
COMMAND = [sys.executable, "-m", "tools.npu_check"]
TOKENS = tuple(tuple(range(i, i + MAX_TOKENS)) for i in range(len(PROMPTS)))
HOST = HostInfo(
    "3.11.9",
    "2.10.0",
    "2.10.0.post2",
    "0.26.0",
    "0.26.0rc1",
    "afd_models.platform.AFDNPUPlatform",
    ("Ascend910B3",),
    ("0",),
)
GOOD_PROBE = {
    "python": "3.11.9",
    "torch": "2.10.0",
    "torch_npu": "2.10.0.post2",
    "vllm": "0.26.0",
    "vllm_ascend": "0.26.0rc1",
    "platform": "afd_models.platform.AFDNPUPlatform",
    "afd_platform": True,
    "devices": ["Ascend910B3", "Ascend910B3"],
}


def _native(**changes: Any) -> EngineResult:
    base = EngineResult("native", ok=True, classes=settings.NATIVE_CLASSES, tokens=TOKENS)
    return dataclasses.replace(base, **changes)


def _afd(**changes: Any) -> EngineResult:
    """An AFD result that passes every parity check."""
    base = EngineResult(
        "afd-loopback",
        ok=True,
        classes="AFDAttentionNPUWorker/AFDAttentionNPUModelRunner",
        tokens=TOKENS,
        connector_stats={"steps": 33, "exchanges": 33, "mean_round_trip_s": 1e-4},
    )
    return dataclasses.replace(base, **changes)


def _unreachable(*args: Any) -> Any:
    raise AssertionError(f"called with {args}: validation should have stopped the check first")


#: a host where the NPU stack is present and AFD's platform selected
READY = Host(
    find_spec=lambda name: object(),
    platform_plugins=lambda: {"ascend", "afd_npu"},
    environ=lambda: {"VLLM_PLUGINS": settings.AFD_PLUGINS, "PYTHONPATH": "/elsewhere"},
    prepare=_unreachable,
)
#: a host on which nothing may be reached: argument errors must stop the check before it
UNREACHABLE = Host(_unreachable, _unreachable, _unreachable, _unreachable)


def _main(argv: list[str], capsys: pytest.CaptureFixture[str], host: Host) -> tuple[int, str, str]:
    code = cli.main(argv, host)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --------------------------------------------------------------------------- command line


def test_help_exits_0_and_imports_only_the_standard_library(tmp_path: Path) -> None:
    """``--help`` works as a command, names the options and the VLLM_PLUGINS to set, and imports
    neither torch nor vLLM (``-X importtime`` lists every module imported): of afd_models only its
    standard-library modules, such as the exit codes."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *COMMAND[1:], "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    for text in ("--json", "--work-dir", "--engine-timeout", "VLLM_PLUGINS=afd_npu,afd_models,"):
        assert text in result.stdout.replace("\n", "")
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()}
    assert {"argparse", "tools.harness.processes"} <= imported  # the listing is real
    assert "afd_models.commandline" in imported
    heavy = {name for name in imported if name.split(".")[0] in {"torch", "vllm"}}
    assert heavy == set()


@pytest.mark.skipif(
    importlib.util.find_spec("torch_npu") is not None, reason="this host has torch_npu"
)
def test_this_host_cannot_run_it_exit_3_saying_what_to_install(tmp_path: Path) -> None:
    """Here (no torch_npu, no vLLM-Ascend) the check exits 3 before starting anything, naming
    what is missing and what to install."""
    result = subprocess.run(
        [*COMMAND, "--work-dir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 3, result.stderr
    assert "torch_npu" in result.stderr and "not importable" in result.stderr
    assert 'pip install -e ".[npu,codegen]"' in result.stderr and "CANN" in result.stderr
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--engine-timeout", "0"], "--engine-timeout 0.0 is not allowed; allowed: seconds > 0"),
        (["--engine-timeout", "nan"], "--engine-timeout nan is not allowed"),
        (["--json", "."], "--json . is a directory; allowed: a file path"),
    ],
    ids=["zero-timeout", "nan-timeout", "json-directory"],
)
def test_bad_arguments_exit_3_before_anything_runs(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _main(argv, capsys, UNREACHABLE)
    assert code == 3
    assert expected in err


def test_unknown_option_exits_3() -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["--only", "parity"], UNREACHABLE)
    assert caught.value.code == 3


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        (
            dataclasses.replace(READY, find_spec=lambda name: None),
            ["torch_npu and vllm_ascend not importable", "CANN", 'pip install -e ".[npu,codegen]"'],
        ),
        (
            dataclasses.replace(
                READY, find_spec=lambda name: None if name == "vllm_ascend" else object()
            ),
            ["vllm_ascend not importable"],
        ),
        (
            dataclasses.replace(READY, platform_plugins=lambda: {"ascend"}),
            ["'afd_npu' vllm.platform_plugins entry point is not installed", "pip install -e"],
        ),
        (
            dataclasses.replace(READY, environ=dict),
            ["VLLM_PLUGINS is not set", f"export VLLM_PLUGINS={settings.AFD_PLUGINS}"],
        ),
    ],
    ids=["no-npu-stack", "no-vllm-ascend", "no-entry-point", "plugins-unset"],
)
def test_a_host_that_cannot_run_it_exits_3_saying_what_is_missing(
    host: Host, expected: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked in order, before the probe: the NPU stack, the entry point, VLLM_PLUGINS."""
    code, _, err = _main([], capsys, host)
    assert code == 3
    for text in expected:
        assert text in err


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (settings.AFD_PLUGINS, None),
        (settings.AFD_PLUGINS + ",my_plugin", None),
        (None, "is not set"),
        ("ascend," + settings.AFD_PLUGINS, "names 'ascend', vLLM-Ascend's platform plugin"),
        (settings.NATIVE_PLUGINS, "names 'ascend'"),
        (
            "afd_npu,ascend_kv_connector,ascend_model_loader",
            "lacks afd_models, ascend_service_profiling",
        ),
        (settings.AFD_PLUGINS.replace(",", ", "), "lacks afd_models, ascend_kv_connector"),
    ],
    ids=["documented", "an-extra-one", "unset", "with-ascend", "native", "missing", "spaces"],
)
def test_vllm_plugins_rule(value: str | None, expected: str | None) -> None:
    """AFD's platform and general plugin and vLLM-Ascend's four general plugins, never vLLM-Ascend's
    platform plugin; split at commas as vLLM splits it."""
    problem = plugins_problem(value)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem


def test_the_environment_puts_the_repo_first_and_runs_the_v1_runner() -> None:
    env = cli.resolve_env(READY)
    assert env["PYTHONPATH"].split(":") == [str(REPO_ROOT), "/elsewhere"]
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["VLLM_PLUGINS"] == settings.AFD_PLUGINS


def test_the_native_engine_runs_vllm_ascend_as_shipped() -> None:
    """The native baseline selects vLLM-Ascend's own platform and nothing of AFD."""
    names = settings.NATIVE_PLUGINS.split(",")
    assert names[0] == settings.ASCEND_PLATFORM_PLUGIN
    assert set(names[1:]) == set(settings.ASCEND_GENERAL_PLUGINS)
    assert settings.PLATFORM_PLUGIN not in names and settings.GENERAL_PLUGIN not in names


# --------------------------------------------------------------------------- what the probe found


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"devices": []}, "sees no NPU"),
        ({"vllm": "0.27.0"}, "vLLM 0.27.0 found, this checks vLLM 0.26.0"),
        ({"vllm_ascend": "0.23.0.post1"}, "vLLM-Ascend 0.23.0.post1 found, this checks"),
        ({"afd_models_error": "GeneratedCodeError: stale"}, "python -m codegen regenerate"),
        ({"worker_error": "AttributeError: no"}, "AFDAttentionNPUWorker does not import"),
        (
            {"afd_platform": False, "platform": "vllm_ascend.platform.NPUPlatform"},
            "selected the platform vllm_ascend.platform.NPUPlatform, not AFD's",
        ),
    ],
    ids=["no-npu", "other-vllm", "other-vllm-ascend", "stale", "no-worker", "ascend-platform"],
)
def test_probe_findings_that_refuse_the_host(changes: dict[str, Any], expected: str) -> None:
    with pytest.raises(UsageError) as caught:
        host_info({**GOOD_PROBE, **changes}, None)
    assert expected in str(caught.value)


def test_probe_findings_pin_by_the_operators_visible_devices() -> None:
    host = host_info({**GOOD_PROBE, "vllm": "0.26.0+ascend"}, "4,6")
    assert host.device_ids == ("4", "6") and host.vllm == "0.26.0+ascend"
    assert host_info(GOOD_PROBE, None).device_ids == ("0", "1")


# --------------------------------------------------------------------------- verdicts


def _finding(severity: str, code: str = "RT005", kind: str = "runtime_replaced") -> dict[str, Any]:
    return {"code": code, "kind": kind, "severity": severity, "symbol": "S", "message": "m"}


def _codegen_json(*findings: dict[str, Any]) -> str:
    return json.dumps({"findings": list(findings), "summary": "x block, y review, z info"})


@pytest.mark.parametrize(
    ("returncode", "stdout", "expected"),
    [
        (0, _codegen_json(_finding("info", "GEN001", "note")), []),
        (2, _codegen_json(_finding("block"), _finding("info")), ["RT005 block S: m"]),
        (1, _codegen_json(_finding("review", "RT003")), ["RT003 review S: m"]),
        (
            0,
            _codegen_json(_finding("info", "RT001", "runtime_unavailable")),
            ["RT001 S: m: RT005 was not checked"],
        ),
        (3, "", ["codegen check wrote no JSON report (exit 3)"]),
        (3, _codegen_json(), ["codegen check exited 3 (x block, y review, z info)"]),
    ],
    ids=["clean", "block", "review", "runtime-skipped", "crashed", "exit-without-finding"],
)
def test_runtime_origin_verdict(returncode: int, stdout: str, expected: list[str]) -> None:
    """Any block or review finding fails, as do skipped runtime checks and a failed tool."""
    problems, _ = checks.origin_problems(returncode, stdout)
    assert problems == expected


def test_a_good_parity_run_passes() -> None:
    assert checks.parity_problems(_afd(), _native()) == []


@pytest.mark.parametrize(
    ("afd", "native", "expected"),
    [
        (_afd(tokens=((9,) * 32, *TOKENS[1:])), _native(), "prompt 0 differs from token 0"),
        (_afd(tokens=TOKENS[:2]), _native(), "greedy tokens differ: 2 outputs vs 3"),
        (_afd(ok=False, error="exited with 1"), _native(), "the AFD engine failed: exited"),
        (_afd(), _native(ok=False, error="timed out"), "the native engine failed: timed out"),
        (_afd(), _native(classes="AFDNPUWorker/X"), "native engine ran AFDNPUWorker/X"),
        (_afd(classes="NPUWorker/NPUModelRunner"), _native(), "expected the worker AFDAttention"),
        (_afd(connector_stats=None), _native(), "the connector exchanged nothing"),
        (_afd(connector_stats={"steps": 3, "exchanges": 0}), _native(), "exchanged nothing"),
        (_afd(tokens=tuple(t[:5] for t in TOKENS)), _native(), "do not hold 32 tokens"),
    ],
    ids=[
        "tokens-differ",
        "fewer-outputs",
        "afd-failed",
        "native-failed",
        "native-ran-another-worker",
        "afd-ran-the-native-worker",
        "stats-unread",
        "no-exchange",
        "short-output",
    ],
)
def test_a_broken_parity_run_fails_with_the_reason(
    afd: EngineResult, native: EngineResult, expected: str
) -> None:
    problems = checks.parity_problems(afd, native)
    assert any(expected in problem for problem in problems), problems


# --------------------------------------------------------------------------- report and exit codes


class FakeRunner:
    """Stands in for the checks' processes; records what ran."""

    def __init__(self, origin: tuple[str, ...] = (), parity: tuple[str, ...] = ()):
        self.origin, self.parity, self.ran = origin, parity, []

    def run_origin_check(self, setup: Setup) -> CheckResult:
        self.ran.append("origin")
        details = {"summary": "0 block, 0 review, 3 info"}
        return CheckResult(checks.ORIGIN, "python -m codegen check", self.origin, details)

    def run_parity(self, setup: Setup) -> CheckResult:
        self.ran.append("parity")
        return CheckResult(checks.PARITY, "native vs AFD", self.parity, {"tokens": [[1]]})


def _ready(runner: FakeRunner) -> Host:
    def prepare(work_dir: Path, env: Any, timeout_s: float) -> Setup:
        assert env["VLLM_PLUGINS"] == settings.AFD_PLUGINS
        return Setup(work_dir, work_dir / "model", env, HOST, timeout_s)

    return dataclasses.replace(READY, prepare=prepare, runner=runner)


@pytest.mark.parametrize(
    ("runner", "exit_code", "summary"),
    [
        (FakeRunner(), 0, "npu_check: 2 passed, 0 failed; exit 0"),
        (FakeRunner(origin=("RT005 block S: m",)), 2, "npu_check: 1 passed, 1 failed; exit 2"),
        (FakeRunner(parity=("greedy tokens differ",)), 2, "npu_check: 1 passed, 1 failed; exit 2"),
    ],
    ids=["passed", "origin-failed", "parity-failed"],
)
def test_main_runs_both_checks_prints_and_writes_the_report(
    runner: FakeRunner,
    exit_code: int,
    summary: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Both checks run even when the first fails; the exit code is the report's verdict."""
    path = tmp_path / "out" / "npu.json"
    argv = ["--json", str(path), "--work-dir", str(tmp_path)]
    code, out, _ = _main(argv, capsys, _ready(runner))
    assert code == exit_code and runner.ran == ["origin", "parity"]
    assert out.splitlines()[-1] == summary
    for problem in (*runner.origin, *runner.parity):
        assert f"  {problem}" in out
    assert out.count("FAIL") == (exit_code == 2) and "findings: 0 block, 0 review" in out
    data = json.loads(path.read_text())
    assert data["format"] == "afd-npu-check/1" and data["exit_code"] == exit_code
    assert data["host"]["vllm_ascend"] == "0.26.0rc1" and data["host"]["devices"] == ["Ascend910B3"]
    assert [(c["name"], c["passed"]) for c in data["checks"]] == [
        ("runtime origin", not runner.origin),
        ("parity", not runner.parity),
    ]
    assert data["checks"][1]["details"] == {"tokens": [[1]]}


def test_a_crash_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An exception in the check itself is exit 3 with its traceback, never 0 or 2."""

    def crash(*args: Any) -> Setup:
        raise RuntimeError("a bug in the check")

    host = dataclasses.replace(READY, prepare=crash)
    code, _, err = _main(["--work-dir", str(tmp_path)], capsys, host)
    assert code == 3
    assert "RuntimeError: a bug in the check" in err
    assert "python -m tools.npu_check: internal error" in err


# --------------------------------------------------------------------------- processes, with fakes

FAKES = {
    "torch/__init__.py": """
import os

__version__ = "2.10.0"


class npu:
    @staticmethod
    def device_count():
        return int(os.environ["FAKE_NPUS"])

    @staticmethod
    def get_device_name(index):
        return f"Fake Ascend {index}"
""",
    "torch_npu/__init__.py": '__version__ = "2.10.0.post2"\n',
    "vllm_ascend/__init__.py": "",
    "vllm_ascend/platform.py": "class NPUPlatform:\n    pass\n",
    # vLLM activates AFD's platform only when VLLM_PLUGINS selects it
    "vllm/platforms/__init__.py": """
import os

from vllm_ascend.platform import NPUPlatform


class AFDNPUPlatform(NPUPlatform):
    pass


selected = "afd_npu" in os.environ.get("VLLM_PLUGINS", "").split(",")
current_platform = AFDNPUPlatform() if selected else NPUPlatform()
""",
    "vllm/__init__.py": """
import os
from types import SimpleNamespace


class NPUModelRunner:
    pass


class AFDAttentionNPUModelRunner:
    pass


class NPUWorker:
    model_runner = NPUModelRunner()


class AFDAttentionNPUWorker:
    model_runner = AFDAttentionNPUModelRunner()


class SamplingParams:
    def __init__(self, temperature, max_tokens, ignore_eos):
        self.max_tokens = max_tokens


class LLM:
    def __init__(self, model, **kwargs):
        self.afd = "worker_cls" in kwargs
        self.worker = AFDAttentionNPUWorker() if self.afd else NPUWorker()

    def collective_rpc(self, method):
        if callable(method):
            return [method(self.worker)]
        assert method == "afd_connector_stats" and self.afd
        return [{"steps": 33, "exchanges": 33, "mean_round_trip_s": 1e-4}]

    def generate(self, prompts, params, use_tqdm):
        shift = int(os.environ.get("FAKE_AFD_SHIFT", "0")) if self.afd else 0
        return [
            SimpleNamespace(outputs=[SimpleNamespace(token_ids=[i + j + shift for j in range(params.max_tokens)])])
            for i, _ in enumerate(prompts)
        ]
""",
    # the fake workers stand in front of the checkout's package, whose standard-library modules
    # (the exit codes the tools share) the checks import as they are
    "afd_models/__init__.py": f"__path__.append({str(REPO_ROOT / 'afd_models')!r})\n",
    "afd_models/workers.py": "AFDAttentionNPUWorker = object\n",
}


def _dist_info(root: Path, name: str, version: str) -> None:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.fixture
def fake_env(tmp_path: Path) -> dict[str, str]:
    """The checks' environment with fake packages (and dist-info for their versions) only."""
    fakes = tmp_path / "fakes"
    for relative, source in FAKES.items():
        (fakes / relative).parent.mkdir(parents=True, exist_ok=True)
        (fakes / relative).write_text(source)
    _dist_info(fakes, "vllm", "0.26.0")
    _dist_info(fakes, "vllm_ascend", "0.26.0rc1")
    return {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(fakes),
        "VLLM_PLUGINS": settings.AFD_PLUGINS,
        "FAKE_NPUS": "2",
    }


def test_probe_reads_the_host(fake_env: dict[str, str], tmp_path: Path) -> None:
    """In a fresh interpreter: versions, NPUs by name and by the operator's visible devices, and
    the platform vLLM selected under the operator's VLLM_PLUGINS."""
    env = {**fake_env, "ASCEND_RT_VISIBLE_DEVICES": "4,6"}
    host = probe(env, tmp_path)
    assert host.devices == ("Fake Ascend 0", "Fake Ascend 1") and host.device_ids == ("4", "6")
    assert (host.torch_npu, host.vllm, host.vllm_ascend) == ("2.10.0.post2", "0.26.0", "0.26.0rc1")
    assert host.platform == "vllm.platforms.AFDNPUPlatform"


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"VLLM_PLUGINS": settings.NATIVE_PLUGINS}, "selected the platform vllm_ascend.platform"),
        ({"FAKE_NPUS": "0"}, "sees no NPU"),
        ({"PYTHONPATH": "/nowhere"}, "the probe failed"),
    ],
    ids=["ascend-platform", "no-npu", "no-torch"],
)
def test_probe_refuses_a_host_that_cannot_run_the_check(
    fake_env: dict[str, str], tmp_path: Path, changes: dict[str, str], expected: str
) -> None:
    with pytest.raises(UsageError) as caught:
        probe({**fake_env, **changes}, tmp_path)
    assert expected in str(caught.value)


def _setup(tmp_path: Path, env: dict[str, str]) -> Setup:
    return Setup(tmp_path, tmp_path / "model", env, HOST, engine_timeout_s=60)


def test_parity_runs_native_vllm_ascend_and_the_afd_worker(
    fake_env: dict[str, str], tmp_path: Path
) -> None:
    """Two engine processes: the native one on vLLM-Ascend's platform with NPUWorker, the AFD one
    on AFD's with the AFD worker and the loopback connector; equal tokens pass."""
    result = checks.run_parity(_setup(tmp_path, fake_env))
    assert result.passed, result.problems
    assert result.details["native"]["classes"] == "NPUWorker/NPUModelRunner"
    assert result.details["afd"]["tokens"] == TOKENS
    spec = json.loads((tmp_path / "engines" / "afd-loopback.spec.json").read_text())
    assert spec["llm_args"]["worker_cls"] == "afd_models.workers.AFDAttentionNPUWorker"
    assert spec["llm_args"]["additional_config"] == {
        "afd": {"role": "attention", "connector": "LoopbackAFDConnector"}
    }
    assert spec["llm_args"]["enforce_eager"] is True


def test_parity_fails_on_a_token_difference(fake_env: dict[str, str], tmp_path: Path) -> None:
    result = checks.run_parity(_setup(tmp_path, {**fake_env, "FAKE_AFD_SHIFT": "1"}))
    assert not result.passed
    assert "greedy tokens differ: prompt 0 differs from token 0" in result.problems[0]


def test_an_afd_engine_on_vllm_ascends_platform_refuses_to_run(
    fake_env: dict[str, str], tmp_path: Path
) -> None:
    """Without AFD's platform the AFD engine stops before building the LLM, saying why."""
    env = {**fake_env, "VLLM_PLUGINS": settings.NATIVE_PLUGINS}
    result = checks.run_parity(_setup(tmp_path, env))
    assert not result.passed
    assert "the AFD engine failed: exited with 3" in result.problems[0]
    assert "this run needs AFD's subclass of vllm_ascend.platform.NPUPlatform" in result.problems[0]


# --------------------------------------------------------------------------- docs/npu.md

ROOT = Path(__file__).resolve().parents[2]
NPU_DOC = ROOT / "docs" / "npu.md"
#: the doc's command blocks, each run exactly as written by tests/npu/test_npu_recipe.py
RECIPE_BLOCKS = ("install", "check", "nox_check", "ffn", "attention", "request")
MARKED_BLOCK = re.compile(r"<!-- doc-test: (\w+) -->\n```bash\n(.*?)\n```", re.S)
ANY_BLOCK = re.compile(r"```bash\n(.*?)\n```", re.S)
EXPORT = re.compile(r"^export VLLM_PLUGINS=(\S+)$", re.M)


def recipe_blocks() -> dict[str, str]:
    """The marked command blocks of docs/npu.md by name (all of :data:`RECIPE_BLOCKS`)."""
    found = MARKED_BLOCK.findall(NPU_DOC.read_text())
    names = [name for name, _ in found]
    assert sorted(names) == sorted(RECIPE_BLOCKS), (
        f"doc-test blocks {names}, expected {RECIPE_BLOCKS}"
    )
    return dict(found)


def serve_args(block: str) -> list[str]:
    """The ``vllm serve`` arguments of a block (its backslash-continued command, shell-split)."""
    command = block.replace("\\\n", " ")
    line = next(line for line in command.splitlines() if " vllm serve " in line)
    return shlex.split(line.split(" vllm serve ", 1)[1])


def flag(args: list[str], name: str) -> str:
    assert args.count(name) == 1, f"{name} appears {args.count(name)} times in {args}"
    return args[args.index(name) + 1]


def pyproject_entry_points(group: str) -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(data["project"].get("entry-points", {}).get(group, {}))


def test_every_command_block_of_the_doc_is_run_by_the_recipe_test() -> None:
    """Unmarked blocks only repeat a line the marked ones run (the VLLM_PLUGINS export)."""
    blocks = recipe_blocks()
    for block in ANY_BLOCK.findall(NPU_DOC.read_text()):
        if block in blocks.values():
            continue
        for line in block.splitlines():
            assert all(line in blocks[name] for name in ("check", "nox_check", "ffn", "attention"))


def test_the_doc_selects_the_plugins_this_repo_installs() -> None:
    """Every VLLM_PLUGINS in the doc is the list npu_check requires; its AFD names are the entry
    points pyproject.toml declares, the platform one under vllm.platform_plugins."""
    exports = EXPORT.findall(NPU_DOC.read_text())
    assert len(exports) == 5 and set(exports) == {settings.AFD_PLUGINS}
    names = settings.AFD_PLUGINS.split(",")
    assert plugins_problem(settings.AFD_PLUGINS) is None
    ours = [name for name in names if name not in settings.ASCEND_GENERAL_PLUGINS]
    assert pyproject_entry_points("vllm.platform_plugins") == {settings.PLATFORM_PLUGIN}
    assert set(ours) == {settings.PLATFORM_PLUGIN} | pyproject_entry_points("vllm.general_plugins")
    from afd_models.platforms import NPU_PLUGINS  # the list AFD's NPU platform names

    assert names == list(NPU_PLUGINS)


def test_the_doc_names_the_workers_this_repo_exports() -> None:
    """The --worker-cls paths are the NPU workers of the worker-class table
    (``afd_models.launch``, read without importing vLLM), one per role; the Attention one is what
    npu_check runs."""
    blocks = recipe_blocks()
    workers = {
        role: flag(serve_args(blocks[role]), "--worker-cls") for role in ("ffn", "attention")
    }
    assert workers == {
        "ffn": "afd_models.workers.AFDFFNNPUWorker",
        "attention": settings.ATTENTION_WORKER.path,
    }
    assert workers == {role.value: worker_class("npu", role).path for role in Role}


def test_the_doc_launches_2a1f_with_camp2p_on_npu() -> None:
    """Both AFD sections parse as NPU configs (afd_models.config), use CAMP2P and agree; the
    Attention engine's DP ranks are the deployment's Attention ranks; the roles differ in HTTP
    port and NPUs, and the request goes to the Attention server for the served model."""
    from afd_models.config import Role, check_connector_platform, parse_afd_config

    blocks = recipe_blocks()
    configs, args = {}, {}
    for role in ("ffn", "attention"):
        args[role] = serve_args(blocks[role])
        section = json.loads(flag(args[role], "--additional-config"))
        assert set(section) == {"afd"}
        configs[role] = parse_afd_config(section["afd"], platform="npu")
        check_connector_platform(configs[role], "npu")
        assert configs[role].role is Role(role)
        assert configs[role].connector == "CAMP2PAFDConnector"
    ffn, attention = configs["ffn"], configs["attention"]
    assert (ffn.num_attention_ranks, ffn.num_ffn_ranks, ffn.port) == (
        attention.num_attention_ranks,
        attention.num_ffn_ranks,
        attention.port,
    )
    assert (attention.num_attention_ranks, attention.num_ffn_ranks) == (2, 1)
    assert int(flag(args["attention"], "--data-parallel-size")) == attention.num_attention_ranks
    assert "--no-enable-prefix-caching" in args["ffn"]
    model = {args[role][0] for role in args}
    assert len(model) == 1
    assert flag(args["ffn"], "--max-model-len") == flag(args["attention"], "--max-model-len")
    assert flag(args["ffn"], "--port") != flag(args["attention"], "--port")
    devices = {role: re.search(r"ASCEND_RT_VISIBLE_DEVICES=(\S+)", blocks[role]) for role in args}
    used = [set(match.group(1).split(",")) for match in devices.values() if match]
    assert len(used) == 2 and not used[0] & used[1] and len(used[1]) == 2
    request = blocks["request"]
    assert f"127.0.0.1:{flag(args['attention'], '--port')}/v1/completions" in request
    body = json.loads(re.search(r"-d '(.*)'", request).group(1))
    assert body["model"] == model.pop()


def test_the_doc_runs_the_check_and_its_nox_session() -> None:
    """The check block runs the command; the nox block a session of noxfile.py that runs it with
    nox's own interpreter and passes the arguments through."""
    blocks = recipe_blocks()
    assert "\npython -m tools.npu_check --json " in blocks["check"]
    assert "python -m nox -s npu-check -- --json " in blocks["nox_check"]
    noxfile = (ROOT / "noxfile.py").read_text()
    session = noxfile[noxfile.index('@nox.session(name="npu-check"') :]
    assert 'venv_backend="none", default=False' in session.splitlines()[0]
    assert 'session.run(sys.executable, "-m", "tools.npu_check", *session.posargs' in session


def test_the_user_guide_links_the_npu_recipe() -> None:
    guide = (ROOT / "docs" / "user-guide.md").read_text()
    assert "](npu.md)" in guide
