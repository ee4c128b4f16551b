"""The GPU check's pure parts (tools.gpu_check): argument validation, the counter rule, the
verdict of a run, the report and its JSON, exit codes; no vLLM, torch or GPU needed."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from afd_models.worker_config import MODEL_RUNNER_V2_FROM
from tools.gpu_bundle.install import install as bundle_install
from tools.gpu_bundle.manifest import BundleError
from tools.gpu_check import child, cli, modes, plan, runs, verdict
from tools.gpu_check import host as gpu_host
from tools.gpu_check import report as gpu_report
from tools.gpu_check.child import exchange_latency
from tools.gpu_check.modes import Gate
from tools.gpu_check.report import HostInfo, ModeStatus, NcclStatus
from tools.gpu_check.runs import CHILDREN, Setup
from tools.gpu_check.verdict import PairResult
from tools.harness.child import worker_classes
from tools.harness.cli import UsageError, write_json
from tools.harness.processes import REPO_ROOT, EngineProcess, child_env, visible_device_ids
from tools.harness.results import MAX_TOKENS, PROMPTS, Counters, EngineResult, EngineSpec

from .gpu_fakes import FAKE_TORCH, FAKE_VLLM, write_packages

#: the command as documented, run from the repository root
COMMAND = [sys.executable, "-m", "tools.gpu_check"]
EAGER = modes.mode_named("eager")
PIECEWISE = modes.mode_named("piecewise")
FULL = modes.mode_named("full-decode-only")
TOKENS = tuple(tuple(range(i, i + MAX_TOKENS)) for i in range(len(PROMPTS)))
ONE_GPU = HostInfo("3.12.3", "2.11.0+cu128", "12.8", "0.26.0", ("NVIDIA H200",), ("0",))
#: every mode, in table order: the V1 runner's, then Model Runner V2's (no DBO there)
EVERY_MODE = (
    "eager",
    "piecewise",
    "full-decode-only",
    "dbo",
    "eager-v2",
    "piecewise-v2",
    "full-decode-only-v2",
)
TWO_GPUS = dataclasses.replace(ONE_GPU, devices=("NVIDIA H200",) * 2, device_ids=("0", "1"))


def _native(**changes: Any) -> EngineResult:
    base = EngineResult(
        "native",
        ok=True,
        classes=modes.NATIVE_CLASSES,
        tokens=TOKENS,
        tokens_per_run=96,
        timed_s=(0.5, 0.4, 0.6),
    )
    return dataclasses.replace(base, **changes)


def _counters(mode: modes.Mode, replays_per_capture: int) -> Counters:
    """Counters that fit ``mode``: graphs and splits where it needs them, none where it must not."""
    graphs = 4 if mode.graphs is modes.Expect.POSITIVE else 0
    splits = 3 if mode.ubatch_splits is modes.Expect.POSITIVE else 0
    return Counters(graphs, graphs * replays_per_capture, splits)


def _afd(mode: modes.Mode = EAGER, **changes: Any) -> EngineResult:
    """An AFD result that passes every check of ``mode``."""
    base = EngineResult(
        "afd",
        ok=True,
        classes=mode.runner.attention_classes,
        tokens=TOKENS,
        tokens_per_run=96,
        timed_s=(1.0, 0.8, 1.2),
        counters=_counters(mode, 10),
        connector_stats={"steps": 40, "exchanges": 120, "mean_round_trip_s": 1e-4, "bytes_sent": 9},
        exchange_latency_s=1.25e-4,
        budgeted_bytes=2_000_000,
        in_process_bytes=1_000_000,
    )
    return dataclasses.replace(base, **changes)


def _ffn(mode: modes.Mode = EAGER, **changes: Any) -> EngineResult:
    base = EngineResult(
        "ffn",
        ok=True,
        classes=modes.FFN_CLASSES,
        counters=_counters(mode, 1),
        ffn_steps=40,
    )
    return dataclasses.replace(base, **changes)


def _main(
    argv: list[str], capsys: pytest.CaptureFixture[str], host: cli.Host | None = None
) -> tuple[int, str]:
    code = cli.main(argv, host)
    return code, capsys.readouterr().err


def _unreachable(*args: Any) -> Any:
    raise AssertionError(f"called with {args}: validation should have stopped the check first")


#: a host on which nothing may be reached: argument errors must stop the check before it
UNREACHABLE = cli.Host(_unreachable, _unreachable, _unreachable, None)


# --------------------------------------------------------------------------- command line


def test_help_exits_0_via_subprocess() -> None:
    """``--help`` works as a command and lists the options an operator needs."""
    result = subprocess.run(
        [*COMMAND, "--help"], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )
    assert result.returncode == 0, result.stderr
    for option in ("--bundle", "--only", "--gate", "--json", "--deadline", "full-decode-only"):
        assert option in result.stdout
    text = " ".join(result.stdout.split())
    assert (
        "Order: the modes full-decode-only, piecewise, eager (then dbo and the -v2 modes where "
        "they run) with the gate on the FFN role, then the same with the gate on attention"
    ) in text
    assert "no run starts that is not expected to end within S seconds of the command's start" in (
        text
    )
    assert (
        "written as JSON after every run (atomically) to --json, default WORK_DIR/report.json"
        in (text)
    )


def test_help_imports_only_the_standard_library(tmp_path: Path) -> None:
    """Running ``--help`` imports neither torch nor vLLM (``-X importtime`` lists every module the
    interpreter imports): of afd_models only its standard-library modules, such as the exit codes."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *COMMAND[1:], "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()}
    assert "argparse" in imported  # the listing is real
    heavy = {name for name in imported if name.split(".")[0] in {"torch", "vllm"}}
    assert heavy == set()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--only", "bogus"], ["'bogus'", "allowed: eager, piecewise, full-decode-only, dbo"]),
        (["--gate", "both-ways"], ["'both-ways'", "allowed: attention, ffn"]),
        (["--engine-timeout", "0"], ["--engine-timeout 0.0", "seconds > 0"]),
        (
            ["--deadline", "100"],
            [
                "--deadline 100 leaves no time for the first run (full-decode-only, gate on ffn: "
                "a native and an AFD engine, expected 120 s",
                "allowed: seconds >= 120",
            ],
        ),
        (
            ["--deadline", "50", "--only", "eager", "--gate", "attention"],
            ["(eager, gate on attention: a native and an AFD engine, expected 60 s", ">= 60"],
        ),
        (["--deadline", "nan"], ["--deadline nan leaves no time"]),
    ],
    ids=[
        "unknown-mode",
        "unknown-gate",
        "zero-timeout",
        "short-deadline",
        "short-for-eager",
        "nan",
    ],
)
def test_bad_arguments_exit_3_naming_the_value_and_the_allowed_ones(
    argv: list[str], expected: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad value exits 3 (usage) before anything runs, with the value and what is allowed."""
    code, err = _main(argv, capsys, UNREACHABLE)
    assert code == 3
    for text in expected:
        assert text in err


def test_a_malformed_command_line_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown option or a missing value is a usage error: exit 3, not argparse's 2."""
    for argv in (["--no-such-option"], ["--gate"]):
        with pytest.raises(SystemExit) as caught:
            cli.main(argv, UNREACHABLE)
        assert caught.value.code == 3
        assert "python -m tools.gpu_check: error:" in capsys.readouterr().err


def test_bundle_without_manifest_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--bundle must name the directory holding the parts and manifest.json."""
    code, err = _main(["--bundle", str(tmp_path)], capsys, UNREACHABLE)
    assert code == 3
    assert "manifest.json" in err


def test_a_json_path_it_cannot_write_exits_3_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--json`` in a missing directory (say ``"$OUT"`` unset) is refused at once, not after the
    first run, whose report it would lose."""
    missing = tmp_path / "no-such-dir" / "gpu-check.json"
    code, err = _main(["--json", str(missing)], capsys, UNREACHABLE)
    assert code == 3
    assert f"--json {missing}:" in err and "allowed: a path in a writable directory" in err


def test_no_vllm_and_no_bundle_exits_3_saying_what_to_pass(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without vLLM and without --bundle the check says to pass --bundle."""
    host = dataclasses.replace(UNREACHABLE, vllm_importable=lambda: False)
    code, err = _main(["--only", "eager"], capsys, host)
    assert code == 3
    assert "vLLM is not importable" in err and "--bundle DIR" in err


def test_a_crash_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An exception in the check itself is exit 3 with its traceback, never 0 or 2."""

    def crash(*args: Any) -> Setup:
        raise RuntimeError("a bug in the check")

    host = cli.Host(lambda: True, _unreachable, crash, None)
    code, err = _main(["--work-dir", str(tmp_path)], capsys, host)
    assert code == 3
    assert "RuntimeError: a bug in the check" in err and "internal error" in err


def test_only_and_gate_select_in_table_order() -> None:
    """--only is repeatable, deduplicated and kept in table order; --gate picks one placement."""
    args = cli.build_parser().parse_args(
        ["--only", "full-decode-only", "--only", "eager", "--only", "eager", "--gate", "ffn"]
    )
    options = cli.options_from(args)
    assert [m.name for m in options.modes] == ["eager", "full-decode-only"]
    assert options.gates == (Gate.FFN,)
    default = cli.options_from(cli.build_parser().parse_args([]))
    assert [m.name for m in default.modes] == list(EVERY_MODE)
    assert default.gates == (Gate.ATTENTION, Gate.FFN)


def test_dbo_runs_in_the_nccl_pair_only_from_the_afd_section() -> None:
    """DBO is switched on by the Attention engine's AFD section, never by --enable-dbo (which
    native vLLM takes only with a DeepEP all2all backend); it must split, and the loopback pair
    refuses it with the reason."""
    dbo = modes.mode_named("dbo")
    assert dbo.afd == {"dbo": True} and "enable_dbo" not in dbo.engine_args
    assert dbo.nccl and dbo.ubatch_splits is modes.Expect.POSITIVE
    with pytest.raises(ValueError, match="runs in the NCCL pair only: an in-process FFN half"):
        runs.run_pair(dbo, Gate.FFN, Setup(Path("/nowhere"), Path("/nowhere"), {}, ONE_GPU))


def test_resolve_env_puts_the_bundle_target_and_repo_first(tmp_path: Path) -> None:
    """With --bundle, the bundle's install target, then the repository, lead PYTHONPATH."""
    installed: list[tuple[Path, Path]] = []
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "manifest.json").write_text("{}")
    args = cli.build_parser().parse_args(
        ["--bundle", str(tmp_path / "parts"), "--target", str(tmp_path / "site")]
    )
    env = cli.resolve_env(cli.options_from(args), False, lambda p, t: installed.append((p, t)))
    assert installed == [(tmp_path / "parts", tmp_path / "site")]
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert paths[:2] == [str(tmp_path / "site"), str(REPO_ROOT)]


def test_gpu_bundle_exposes_the_install_the_check_calls() -> None:
    """tools.gpu_bundle has ``install(parts, *, target)`` and ``BundleError``."""
    assert issubclass(BundleError, Exception)
    parameters = list(inspect.signature(bundle_install).parameters.values())
    assert parameters[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD  # the parts directory
    target = next(p for p in parameters if p.name == "target")
    assert target.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@pytest.mark.parametrize(
    ("value", "count", "expected"),
    [
        (None, 2, ("0", "1")),
        ("", 1, ("0",)),
        ("3,5", 2, ("3", "5")),
        ("GPU-a, GPU-b", 1, ("GPU-a",)),
    ],
)
def test_visible_device_ids(value: str | None, count: int, expected: tuple[str, ...]) -> None:
    """Engines are pinned by the entries of the operator's CUDA_VISIBLE_DEVICES, not by index."""
    assert visible_device_ids(value, count) == expected


# --------------------------------------------------------------------------- the counter rule


@pytest.mark.parametrize(
    ("mode", "counters", "expected"),
    [
        (FULL, Counters(3, 12, 0), []),
        (FULL, Counters(3, 0, 0), ["graph_replays=0"]),
        (FULL, Counters(0, 0, 0), ["graph_captures=0", "graph_replays=0"]),
        (EAGER, Counters(0, 0, 0), []),
        (EAGER, Counters(1, 0, 0), ["graph_captures=1"]),
        (EAGER, Counters(0, 2, 0), ["graph_replays=2"]),
        (EAGER, Counters(0, 0, 2), ["ubatch_splits=2"]),
        # piecewise: the exchange runs between pieces; graph counters are reported only
        (PIECEWISE, Counters(0, 0, 0), []),
        (PIECEWISE, Counters(5, 50, 0), []),
        (modes.mode_named("dbo"), Counters(1, 1, 0), ["ubatch_splits=0"]),
    ],
)
def test_counter_rule(mode: modes.Mode, counters: Counters, expected: list[str]) -> None:
    """A graph mode with zero captures or replays fails, as does eager with any graph or split."""
    problems = modes.counter_problems(mode, counters)
    assert len(problems) == len(expected), problems
    for problem, text in zip(problems, expected, strict=True):
        assert text in problem and mode.name in problem


@pytest.mark.parametrize(
    "data",
    [
        {"graph_captures": 1, "graph_replays": 2},
        {"graph_captures": 1, "graph_replays": "2", "ubatch_splits": 0},
        {"graph_captures": True, "graph_replays": 2, "ubatch_splits": 0},
        [1, 2, 0],
    ],
)
def test_counters_must_be_three_integers(data: Any) -> None:
    """afd_counters that lack a key or hold a non-integer are refused, naming what is wrong."""
    with pytest.raises(ValueError, match="afd_counters"):
        Counters.from_dict(data)


def test_counters_read_from_a_child() -> None:
    """A child's counters parse; malformed ones become the reason the counters are missing."""
    good = EngineResult.from_child(
        "afd", {"counters": {"graph_captures": 1, "graph_replays": 2, "ubatch_splits": 0}}
    )
    assert good.counters == Counters(1, 2, 0)
    bad = EngineResult.from_child("afd", {"counters": {"graph_captures": 1}})
    assert bad.counters is None and "graph_replays" in bad.counters_error


# --------------------------------------------------------------------------- verdict of a run


def test_a_good_run_passes() -> None:
    """Equal tokens, counters fitting the mode, an exchange and the weight budget: passed."""
    for mode in (EAGER, PIECEWISE, FULL):
        pair = verdict.evaluate_pair(mode, Gate.ATTENTION, modes.LOOPBACK, _afd(mode), _native())
        assert pair.problems == () and pair.passed and pair.tokens_equal
        assert pair.ratio == pytest.approx((96 / 1.0) / (96 / 0.5))


@pytest.mark.parametrize(
    ("mode", "afd", "native", "expected"),
    [
        (EAGER, _afd(tokens=((9,) * 32, *TOKENS[1:])), _native(), "prompt 0 differs from token 0"),
        (EAGER, _afd(tokens=TOKENS[:2]), _native(), "2 outputs vs 3"),
        (EAGER, _afd(ok=False, error="exited with 1"), _native(), "the AFD engine failed"),
        (EAGER, _afd(), _native(ok=False, error="timed out"), "the native engine failed"),
        (
            EAGER,
            _afd(counters=None, counters_error="NotImplementedError"),
            _native(),
            "afd_counters",
        ),
        (FULL, _afd(FULL, counters=Counters(2, 0, 0)), _native(), "graph_replays=0"),
        (EAGER, _afd(counters=Counters(1, 1, 0)), _native(), "graph_captures=1"),
        (EAGER, _afd(connector_stats={"steps": 0, "exchanges": 0}), _native(), "exchanged nothing"),
        (EAGER, _afd(budgeted_bytes=10), _native(), "budgets 10 bytes"),
        (EAGER, _afd(in_process_bytes=None), _native(), "weight budget could not be read"),
        (EAGER, _afd(in_process_bytes=0), _native(), "in-process FFN half's 0"),
        (EAGER, _afd(classes="Worker/GPUModelRunner"), _native(), "expected AFDAttentionWorker"),
        (EAGER, _afd(tokens=tuple(t[:5] for t in TOKENS)), _native(), "do not hold 32 tokens"),
    ],
    ids=[
        "tokens-differ",
        "fewer-outputs",
        "afd-crashed",
        "native-crashed",
        "counters-unreadable",
        "full-graph-never-replayed",
        "eager-captured",
        "no-exchange",
        "weights-not-budgeted",
        "weights-unreadable",
        "no-in-process-weights",
        "native-worker-used",
        "short-output",
    ],
)
def test_a_broken_run_fails_with_the_reason(
    mode: modes.Mode, afd: EngineResult, native: EngineResult, expected: str
) -> None:
    """Each broken check alone makes the run fail, and the problem says which."""
    pair = verdict.evaluate_pair(mode, Gate.FFN, modes.LOOPBACK, afd, native)
    assert not pair.passed
    assert any(expected in problem for problem in pair.problems), pair.problems


def test_graph_mode_with_equal_tokens_but_no_replay_fails() -> None:
    """Equal tokens do not make a FULL_DECODE_ONLY run pass when no graph was replayed."""
    afd = _afd(FULL, counters=Counters(0, 0, 0))
    pair = verdict.evaluate_pair(FULL, Gate.ATTENTION, modes.LOOPBACK, afd, _native())
    assert pair.tokens_equal and not pair.passed


def test_nccl_pair_checks_the_ffn_engine() -> None:
    """The NCCL pair needs a live FFN engine of the right class that recorded steps and whose
    counters fit the mode; the loopback weight budget does not apply."""
    afd = _afd(budgeted_bytes=None, in_process_bytes=None)
    good = verdict.evaluate_pair(EAGER, Gate.FFN, modes.NCCL, afd, _native(), _ffn())
    assert good.passed, good.problems
    cases = {
        "the FFN engine failed": _ffn(ok=False, error="exited with 70"),
        "expected AFDFFNWorker": _ffn(classes="AFDAttentionWorker/x"),
        "recorded 0 steps": _ffn(ffn_steps=0),
        "FFN graph_captures=2": _ffn(counters=Counters(2, 0, 0)),
        "FFN afd_counters": _ffn(counters=None),
    }
    for expected, ffn in cases.items():
        pair = verdict.evaluate_pair(EAGER, Gate.FFN, modes.NCCL, afd, _native(), ffn)
        assert any(expected in p for p in pair.problems), (expected, pair.problems)


def test_tokens_per_s_is_the_median_of_the_timed_runs() -> None:
    result = _native(tokens_per_run=96, timed_s=(1.0, 3.0, 2.0))
    assert result.tokens_per_s == pytest.approx(48.0)
    assert _native(timed_s=()).tokens_per_s is None


def test_exchange_latency_covers_only_the_timed_runs() -> None:
    """The mean round trip between two stats readings, not since start-up."""
    before = {"exchanges": 10, "mean_round_trip_s": 1.0}
    after = {"exchanges": 30, "mean_round_trip_s": 2.0}
    assert exchange_latency(before, after) == pytest.approx(2.5)
    assert exchange_latency(after, after) is None


# --------------------------------------------------------------------------- check, report, JSON


class FakeRunner:
    """Stands in for the engine processes; records what the check asked for."""

    def __init__(self, failing: tuple[str, Gate] | None = None):
        self.failing = failing
        self.natives: list[str] = []
        self.pairs: list[tuple[str, Gate, EngineResult]] = []
        self.nccl: list[tuple[str, Gate, EngineResult]] = []

    def run_native(self, mode: modes.Mode, setup: Setup) -> EngineResult:
        self.natives.append(mode.name)
        return _native(name=f"native-{mode.name}")

    def run_pair(
        self, mode: modes.Mode, gate: Gate, setup: Setup, native: EngineResult
    ) -> PairResult:
        self.pairs.append((mode.name, gate, native))
        afd = _afd(mode)
        if (mode.name, gate) == self.failing:
            afd = dataclasses.replace(afd, counters=Counters(0, 0, 0))
        return verdict.evaluate_pair(mode, gate, modes.LOOPBACK, afd, native)

    def run_nccl_pair(
        self, mode: modes.Mode, gate: Gate, setup: Setup, native: EngineResult
    ) -> PairResult:
        self.nccl.append((mode.name, gate, native))
        afd = _afd(mode, budgeted_bytes=None, in_process_bytes=None)
        return verdict.evaluate_pair(mode, gate, modes.NCCL, afd, native, _ffn(mode))


def _check(
    host: HostInfo, runner: FakeRunner, argv: tuple[str, ...] = (), tmp: Path = Path("/work")
) -> gpu_report.Report:
    options = cli.options_from(cli.build_parser().parse_args(list(argv)))
    setup = Setup(tmp, tmp / "model", {}, host)
    return plan.check(options.modes, options.gates, setup, nccl=options.nccl, runner=runner)


def test_one_gpu_runs_every_mode_and_gate_once_each_and_skips_nccl() -> None:
    """Most valuable first: full-decode-only, piecewise, eager with the gate on the FFN role,
    then again with the gate on attention. Native runs once per mode, before its first AFD run,
    and serves both gates; DBO (NCCL pair only) is not run, not even its native engine; NCCL is
    a labelled skip."""
    runner = FakeRunner()
    report = _check(ONE_GPU, runner)
    assert runner.natives == ["full-decode-only", "piecewise", "eager"]
    assert [(m, g) for m, g, _ in runner.pairs] == [
        (m, g) for g in (Gate.FFN, Gate.ATTENTION) for m in runner.natives
    ]
    assert all(native.name == f"native-{m}" for m, _, native in runner.pairs)
    assert runner.nccl == []
    statuses = {entry.mode.name: entry.status for entry in report.modes}
    assert statuses["dbo"] is ModeStatus.NCCL_ONLY
    assert report.nccl.status is NcclStatus.SKIPPED and "two CUDA devices" in report.nccl.reason
    assert report.exit_code() == 0
    assert "0 failed" in report.summary() and "skipped: NCCL pair" in report.summary()
    assert "not run (NCCL pair only): dbo" in report.summary()


def test_two_gpus_run_the_nccl_pair_against_the_same_native() -> None:
    """With two devices the NCCL pair runs in its modes, compared with the mode's native run."""
    runner = FakeRunner()
    report = _check(TWO_GPUS, runner, ("--gate", "attention"))
    assert [(m, g) for m, g, _ in runner.nccl] == [
        ("full-decode-only", Gate.ATTENTION),
        ("eager", Gate.ATTENTION),
        ("dbo", Gate.ATTENTION),
    ]
    assert all(native.name == f"native-{m}" for m, _, native in runner.nccl)
    assert report.nccl.status is NcclStatus.RAN and report.exit_code() == 0
    assert len(report.runs()) == 3 + 3


def test_skip_nccl_and_unselected_modes_are_reported_as_such() -> None:
    runner = FakeRunner()
    report = _check(TWO_GPUS, runner, ("--only", "piecewise", "--skip-nccl"))
    assert runner.natives == ["piecewise"] and runner.nccl == []
    statuses = {entry.mode.name: entry.status for entry in report.modes}
    assert statuses == {
        "eager": ModeStatus.NOT_SELECTED,
        "piecewise": ModeStatus.RAN,
        "full-decode-only": ModeStatus.NOT_SELECTED,
        "dbo": ModeStatus.NOT_SELECTED,
        "eager-v2": ModeStatus.NOT_SELECTED,
        "piecewise-v2": ModeStatus.NOT_SELECTED,
        "full-decode-only-v2": ModeStatus.NOT_SELECTED,
    }
    assert report.nccl.reason == "--skip-nccl"


def test_model_runner_v2_modes_run_where_the_hosts_vllm_has_them() -> None:
    """Every mode but DBO runs again on Model Runner V2 with vLLM 0.30+; with an older vLLM
    those modes are reported as not run, naming the release, and the rest still decides."""
    old_host = _check(TWO_GPUS, FakeRunner())
    statuses = {entry.mode.name: entry for entry in old_host.modes}
    for name in ("eager-v2", "piecewise-v2", "full-decode-only-v2"):
        assert statuses[name].status is ModeStatus.NEEDS_NEWER_VLLM
        assert "Model Runner V2 from vLLM 0.30; this host has vLLM 0.26.0" in statuses[name].reason
    assert "not run (vLLM 0.26.0 too old): full-decode-only-v2, piecewise-v2, eager-v2" in (
        old_host.summary()
    )
    assert old_host.exit_code() == 0

    runner = FakeRunner()
    report = _check(dataclasses.replace(TWO_GPUS, vllm="0.30.0+cu130"), runner, ("--gate", "ffn"))
    # the loopback modes by priority (V1 before V2), then the NCCL pair's, DBO's native with it
    assert runner.natives == [
        "full-decode-only",
        "piecewise",
        "eager",
        "full-decode-only-v2",
        "piecewise-v2",
        "eager-v2",
        "dbo",
    ]
    assert [m for m, _, _ in runner.nccl] == [
        "full-decode-only",
        "eager",
        "dbo",
        "full-decode-only-v2",
        "eager-v2",
    ]
    assert report.exit_code() == 0 and "too old" not in report.summary()
    assert "== full-decode-only-v2 (" in gpu_report.render(report)
    assert "model runner v2, loopback connector" in gpu_report.render(report)


def test_a_v2_mode_must_run_the_afd_v2_runner_and_replay_its_graphs() -> None:
    """An Attention engine that ran the V1 runner in a V2 mode tested nothing of V2."""
    mode = modes.mode_named("full-decode-only-v2")
    assert mode.runner is modes.ModelRunner.V2 and mode.graphs is modes.Expect.POSITIVE
    assert mode.runner.since == MODEL_RUNNER_V2_FROM  # the release the workers accept V2 from
    assert "dbo-v2" not in {m.name for m in modes.MODES}
    on_v1 = _afd(mode, classes=modes.ATTENTION_CLASSES)
    pair = verdict.evaluate_pair(mode, Gate.FFN, modes.LOOPBACK, on_v1, _native())
    assert pair.problems == (
        "the AFD engine ran AFDAttentionWorker/AFDAttentionGPUModelRunner, expected "
        "AFDAttentionWorker/AFDAttentionGPUModelRunnerV2",
    )
    assert verdict.evaluate_pair(mode, Gate.FFN, modes.LOOPBACK, _afd(mode), _native()).passed


class Clock:
    """A monotonic clock that the fake engines advance."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TimedRunner(FakeRunner):
    """A FakeRunner whose engines each take their mode's expected time on ``clock``."""

    def __init__(self, clock: Clock):
        super().__init__()
        self.clock = clock

    def run_native(self, mode: modes.Mode, setup: Setup) -> EngineResult:
        self.clock.now += mode.expected_s
        return super().run_native(mode, setup)

    def run_pair(
        self, mode: modes.Mode, gate: Gate, setup: Setup, native: EngineResult
    ) -> PairResult:
        self.clock.now += mode.expected_s
        return super().run_pair(mode, gate, setup, native)


FFN, ATTENTION = Gate.FFN, Gate.ATTENTION


@pytest.mark.parametrize(
    ("seconds", "ran", "statuses", "summary"),
    [
        (
            None,
            [(m, g) for g in (FFN, ATTENTION) for m in ("full-decode-only", "piecewise", "eager")],
            ["ran", "ran", "ran"],
            None,
        ),
        (
            190.0,
            [("full-decode-only", FFN), ("eager", FFN)],
            ["ran", "left out by --deadline", "ran"],
            "left out by --deadline: piecewise, full-decode-only (gate on attention: expected 60 "
            "s, 10 s left), eager (gate on attention: expected 30 s, 10 s left)",
        ),
        (
            130.0,
            [("full-decode-only", FFN)],
            ["ran", "left out by --deadline", "left out by --deadline"],
            "left out by --deadline: piecewise, eager, full-decode-only (gate on attention: "
            "expected 60 s, 10 s left)",
        ),
    ],
    ids=["no-deadline", "a-cheaper-run-still-fits", "first-run-only"],
)
def test_the_deadline_starts_no_run_that_would_not_finish(
    seconds: float | None,
    ran: list[tuple[str, Gate]],
    statuses: list[str],
    summary: str | None,
) -> None:
    """Each engine takes its mode's expected time (120 s for a compiled mode's first run, native
    and AFD; 60 s for its second); a run that would end past the deadline is left out and said
    so, a later one that fits still runs, and what ran decides the exit code."""
    clock = Clock()
    runner = TimedRunner(clock)
    deadline = plan.Deadline(seconds, clock.now, clock)
    setup = Setup(Path("/work"), Path("/work/model"), {}, ONE_GPU)
    report = plan.check(
        [modes.mode_named(m) for m in EVERY_MODE],
        list(Gate),
        setup,
        deadline=deadline,
        runner=runner,
    )
    assert [(m, g) for m, g, _ in runner.pairs] == ran
    found = {entry.mode.name: entry.status.value for entry in report.modes}
    assert [found[m] for m in ("full-decode-only", "piecewise", "eager")] == statuses
    assert report.exit_code() == 0 and report.deadline_s == seconds
    if summary is None:
        assert "deadline" not in report.summary() + gpu_report.render(report)
    else:
        assert summary in report.summary()
        assert "left out by --deadline" in gpu_report.render(report)


def test_a_report_follows_every_run() -> None:
    """on_progress gets the report after each run: unfinished, with the runs so far and the
    modes not reached yet marked as such, so a check stopped from outside keeps them."""
    reports: list[gpu_report.Report] = []
    setup = Setup(Path("/work"), Path("/work/model"), {}, ONE_GPU)
    final = plan.check(
        [modes.mode_named(m) for m in EVERY_MODE],
        list(Gate),
        setup,
        runner=FakeRunner(),
        on_progress=reports.append,
    )
    assert len(reports) == 6 and not any(r.finished for r in reports) and final.finished
    first = reports[0].as_dict()
    assert first["finished"] is False
    by_mode = {entry["mode"]: entry for entry in first["modes"]}
    assert [run["gate"] for run in by_mode["full-decode-only"]["runs"]] == ["ffn"]
    assert by_mode["piecewise"]["status"] == by_mode["eager"]["status"] == "not run yet"
    assert first["nccl"]["status"] == "skipped"
    assert [len(r.runs()) for r in reports] == [1, 2, 3, 4, 5, 6]


def test_one_failed_run_makes_exit_2_and_is_shown() -> None:
    """A failed check anywhere is exit 2 (block); the table marks it and prints the problem."""
    report = _check(ONE_GPU, FakeRunner(failing=("full-decode-only", Gate.FFN)))
    assert report.exit_code() == 2
    assert "5 passed; 1 failed" in report.summary()
    text = gpu_report.render(report)
    assert "FAIL" in text and "ffn: graph_replays=0 in mode full-decode-only" in text


def test_report_text() -> None:
    """One table per mode with every column; DBO and the NCCL skip are labelled, not scored."""
    text = gpu_report.render(_check(ONE_GPU, FakeRunner()))
    for column in gpu_report.COLUMNS:
        assert column in text
    assert "== dbo: NCCL pair only: an in-process FFN half would compute inside" in text
    assert "the NCCL pair is skipped: needs two CUDA devices" in text
    assert "NCCL pair (two processes): SKIPPED: needs two CUDA devices, found 1" in text
    # the modes in run priority: full-decode-only, piecewise, eager, then dbo
    assert text.index("== full-decode-only") < text.index("== piecewise") < text.index("== eager")
    full = text[text.index("== full-decode-only") : text.index("== piecewise")]
    eager = text[text.index("== eager") : text.index("== dbo")]
    assert full.count(modes.EXCHANGE_IN_GRAPH) == 2
    assert eager.count("125.0 us") == 2 and modes.EXCHANGE_IN_GRAPH not in eager
    assert "NVIDIA H200" in text and "vLLM 0.26.0" in text


def test_report_shows_the_runner_cost_or_why_it_is_missing() -> None:
    native = _native()
    measured = _afd(runner_cost={"seconds": 0.0125, "allocated_bytes": 3 * 2**20})
    failed = _afd(runner_cost={"error": "RuntimeError: boom"})
    lines = gpu_report.table(
        EAGER,
        [
            verdict.evaluate_pair(EAGER, Gate.ATTENTION, modes.LOOPBACK, measured, native),
            verdict.evaluate_pair(EAGER, Gate.FFN, modes.LOOPBACK, failed, native),
        ],
    )
    assert lines[-2:] == [
        "    attention: vLLM's runner, which the AFD worker builds and replaces: 12.5 ms, "
        "3.0 MiB allocated on the device",
        "    ffn: vLLM's runner, which the AFD worker builds and replaces: not measured "
        "(RuntimeError: boom)",
    ]


def test_json_report_shape(tmp_path: Path) -> None:
    """The JSON has the date, versions, device, a result per run and no result for DBO."""
    report = _check(ONE_GPU, FakeRunner(failing=("full-decode-only", Gate.ATTENTION)), tmp=tmp_path)
    path = tmp_path / "out" / "report.json"
    write_json(report.as_dict(), path)
    data = json.loads(path.read_text())
    assert data["format"] == "afd-gpu-check/1"
    assert data["date"].endswith("+00:00")
    assert data["versions"] == {
        "python": "3.12.3",
        "torch": "2.11.0+cu128",
        "cuda": "12.8",
        "vllm": "0.26.0",
    }
    assert data["device"] == {"name": "NVIDIA H200", "count": 1, "all": ["NVIDIA H200"]}
    assert (data["finished"], data["deadline_s"]) == (True, None)
    modes = {entry["mode"]: entry for entry in data["modes"]}
    assert set(modes["dbo"]) == {"mode", "model_runner", "status", "reason", "expected_engine_s"}
    assert modes["dbo"]["status"] == "NCCL pair only"
    assert (modes["eager"]["expected_engine_s"], modes["piecewise"]["expected_engine_s"]) == (
        30.0,
        60.0,
    )
    runs = modes["eager"]["runs"]
    # in run order: the gate on the FFN role first
    assert [run["gate"] for run in runs] == ["ffn", "attention"]
    assert [run["passed"] for run in runs] == [True, True]
    assert "reason" not in modes["eager"]
    failed = modes["full-decode-only"]["runs"][1]
    assert failed["passed"] is False and "graph_captures=0" in failed["problems"][0]
    for key in ("tokens_equal", "afd_tokens_per_s", "native_tokens_per_s", "ratio", "counters"):
        assert key in runs[0]
    assert runs[0]["counters"] == {"graph_captures": 0, "graph_replays": 0, "ubatch_splits": 0}
    assert runs[0]["ratio"] == pytest.approx(0.5)
    assert modes["eager"]["engine_args"]["enforce_eager"] is True
    assert data["nccl"]["status"] == "skipped" and data["nccl"]["runs"] == []
    assert (data["passed"], data["failed"], data["exit_code"]) == (5, 1, 2)


# --------------------------------------------------------------------------- processes, with fakes


@pytest.fixture
def fake_env(tmp_path: Path) -> dict[str, str]:
    """The engines' environment with fake ``torch`` and ``vllm`` packages first on PYTHONPATH."""
    fakes = write_packages(tmp_path / "fakes", FAKE_TORCH, FAKE_VLLM)
    env = gpu_host.base_env([fakes])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return {**env, "FAKE_GPUS": "1"}


def _gone(pid: int, wait_s: float = 5.0) -> bool:
    """Whether ``pid`` has died within ``wait_s``: a SIGKILL is delivered asynchronously, and on
    a loaded machine the process can still be running the moment the kill returns."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # killed, but not reaped yet by whoever inherited it
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return True
        except FileNotFoundError:  # reaped between the two looks
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_probe_reads_the_host(fake_env: dict[str, str], tmp_path: Path) -> None:
    """Devices are named by torch and pinned by the operator's CUDA_VISIBLE_DEVICES entries."""
    env = {**fake_env, "FAKE_GPUS": "2", "CUDA_VISIBLE_DEVICES": "4,6"}
    host = gpu_host.probe(env, tmp_path)
    assert host.devices == ("Fake GPU 0", "Fake GPU 1")
    assert host.device_ids == ("4", "6")
    assert (host.torch, host.cuda, host.vllm) == ("2.11.0+cu128", "12.8", "0.26.0")


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"FAKE_GPUS": "0"}, "sees no CUDA device"),
        ({"FAKE_VLLM": "raise"}, "`import vllm` fails in the engines' environment"),
        (
            {"FAKE_VLLM_VERSION": "0.27.0"},
            "vLLM 0.27.0 found, which AFD does not support; supported (overlay/pins.toml): "
            "0.26.0, 0.28.0, 0.30.0, 0.32.0; pass --bundle DIR (vLLM 0.26.0)",
        ),
    ],
    ids=["no-gpu", "no-vllm", "other-vllm"],
)
def test_probe_refuses_a_host_that_cannot_run_the_check(
    fake_env: dict[str, str], tmp_path: Path, changes: dict[str, str], expected: str
) -> None:
    """No CUDA device, no importable vLLM, another vLLM: a usage error (exit 3) saying which."""
    with pytest.raises(UsageError) as caught:
        gpu_host.probe({**fake_env, **changes}, tmp_path)
    assert expected in str(caught.value)


def test_prepare_reuses_the_model_of_an_earlier_run(
    fake_env: dict[str, str], tmp_path: Path
) -> None:
    """The model process writes the model whole or not at all, so a work directory that has it
    (an earlier run cut off, a rerun with --only) skips writing it; writing fails here, where
    torch is a stand-in."""
    with pytest.raises(RuntimeError, match="writing the tiny model failed"):
        gpu_host.prepare(tmp_path / "fresh", fake_env)
    assert not (tmp_path / "fresh" / modes.MODEL_DIR).exists()
    (tmp_path / "earlier" / modes.MODEL_DIR).mkdir(parents=True)
    setup = gpu_host.prepare(tmp_path / "earlier", fake_env)
    assert setup.model == tmp_path / "earlier" / modes.MODEL_DIR


def test_the_model_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    """The model process writes beside the model's directory and renames it into place, over
    what a process killed while writing left there."""
    model = tmp_path / modes.MODEL_DIR
    partial = tmp_path / f"{modes.MODEL_DIR}.partial"
    partial.mkdir()
    (partial / "config.json").write_text("{")  # a write cut short
    assert child.model_main(model) == 0
    assert json.loads((model / "config.json").read_text())["architectures"]
    assert (model / "model.safetensors").stat().st_size > 0 and not partial.exists()


def _setup(tmp_path: Path, env: dict[str, str], timeout_s: float) -> Setup:
    return Setup(tmp_path, tmp_path / "model", env, ONE_GPU, engine_timeout_s=timeout_s)


def test_an_engine_that_fails_is_a_failed_result_with_its_log(
    fake_env: dict[str, str], tmp_path: Path
) -> None:
    """An engine process that raises gives ok=False, its exit status and the end of its log."""
    setup = _setup(tmp_path, {**fake_env, "FAKE_VLLM": "raise"}, 60)
    result = runs.run_native(EAGER, setup)
    assert not result.ok
    assert "exited with 3" in result.error
    assert "RuntimeError: fake vLLM refuses to start" in result.error
    pair = verdict.evaluate_pair(EAGER, Gate.FFN, modes.LOOPBACK, _afd(), result)
    assert not pair.passed and "the native engine failed" in pair.problems[0]


def test_an_engine_past_its_timeout_is_killed_with_what_it_started(
    fake_env: dict[str, str], tmp_path: Path
) -> None:
    """A hanging engine is a timed-out failure; its process group (a child it started) is gone."""
    pid_file = tmp_path / "grandchild.pid"
    env = {**fake_env, "FAKE_VLLM": "hang", "FAKE_VLLM_PID": str(pid_file)}
    result = runs.run_native(EAGER, _setup(tmp_path, env, 3))
    assert not result.ok and "timed out after" in result.error
    assert _gone(int(pid_file.read_text()))


def test_engine_spec_is_what_the_engine_process_reads(tmp_path: Path) -> None:
    """The AFD run's spec carries the mode's, the common and the AFD engine arguments."""
    engine = EngineProcess(
        EngineSpec(
            "afd-x",
            "/m",
            runs.llm_args(FULL, modes.ATTENTION_WORKER, {"role": "attention"}),
        ),
        tmp_path,
        CHILDREN,
    )
    data = json.loads(engine.spec_path.read_text())
    assert data["result_path"] == str(tmp_path / "afd-x.result.json")
    assert data["llm_args"] == {
        **modes.COMMON_ENGINE_ARGS,
        "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"},
        "worker_cls": "afd_models.workers.AFDAttentionWorker",
        "additional_config": {"afd": {"role": "attention"}},
    }


def test_run_env_pins_the_device_and_dynamo_by_mode(tmp_path: Path) -> None:
    """Each engine sees one device; eager turns Dynamo off, compiled modes turn it back on."""
    setup = _setup(tmp_path, {"TORCHDYNAMO_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "2,3"}, 1)
    eager, full = runs.run_env(setup, EAGER, "3"), runs.run_env(setup, FULL, "2")
    assert (eager["CUDA_VISIBLE_DEVICES"], full["CUDA_VISIBLE_DEVICES"]) == ("3", "2")
    assert eager["TORCHDYNAMO_DISABLE"] == "1" and "TORCHDYNAMO_DISABLE" not in full
    assert eager["VLLM_CACHE_ROOT"] == str(tmp_path / "vllm-cache")
    # native vLLM and AFD run the runner of the mode
    assert eager["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert runs.run_env(setup, modes.mode_named("eager-v2"), "3")["VLLM_USE_V2_MODEL_RUNNER"] == "1"


def test_worker_classes_look_through_vllms_worker_wrapper() -> None:
    """collective_rpc hands a callable vLLM's WorkerWrapperBase; the classes are the worker's."""

    class Runner:
        pass

    class Worker:
        model_runner = Runner()

    class WorkerWrapperBase:
        worker = Worker()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.worker, name)

    assert worker_classes(WorkerWrapperBase()) == "Worker/Runner"


@pytest.mark.parametrize(("failing", "exit_code"), [(None, 0), (("full-decode-only", Gate.FFN), 2)])
def test_main_prints_and_writes_the_report_and_exits_with_its_verdict(
    failing: tuple[str, Gate] | None,
    exit_code: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Through ``main``: the table on stdout, the JSON at --json, exit 0 only when all passed."""

    def prepare(work_dir: Path, env: Any, timeout_s: float) -> Setup:
        return Setup(work_dir, work_dir / "model", env, ONE_GPU, timeout_s)

    host = cli.Host(lambda: True, _unreachable, prepare, FakeRunner(failing))
    path = tmp_path / "report.json"
    code = cli.main(["--json", str(path), "--work-dir", str(tmp_path)], host)
    out = capsys.readouterr().out
    assert code == exit_code
    assert f"exit {exit_code}" in out.splitlines()[-1] and "== full-decode-only" in out
    assert json.loads(path.read_text())["exit_code"] == exit_code


def test_relative_paths_reach_the_engines_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engines run in their log directories: a relative ``--target`` and relative entries of
    the operator's ``PYTHONPATH`` are made absolute against where the check was started."""
    (tmp_path / "bundle" / "bin").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "extra")
    env = child_env(gpu_host.base_env([Path("bundle")]))
    entries = env["PYTHONPATH"].split(os.pathsep)
    assert entries[:2] == [str(tmp_path / "bundle"), str(REPO_ROOT)]
    assert str(tmp_path / "extra") in entries
    assert all(Path(entry).is_absolute() for entry in entries)
    assert env["PATH"].split(os.pathsep)[0] == str(tmp_path / "bundle" / "bin")
