#!/usr/bin/env python3
"""Validate an AFD install on an Ascend NPU host (vLLM-Ascend 0.26.0rc1), and report.

    export VLLM_PLUGINS=afd_npu,afd_models,ascend_kv_connector,ascend_model_loader,ascend_service_profiling,ascend_model
    python tools/npu_check.py [--json PATH] [--work-dir DIR] [--engine-timeout S]

Run from the repository root, in the operator's NPU environment (CANN, torch_npu, this checkout
installed with the ``npu`` extra, ``afd_models/_generated`` regenerated there; docs/npu.md). Two
checks, each in fresh interpreters:

1. **runtime origin**: ``python -m codegen check --format json``; with vLLM-Ascend importable it
   applies vLLM-Ascend's platform and worker patches before its runtime checks, so a forked or
   relied-on upstream method or an imported upstream name that vLLM-Ascend replaces is a finding
   (``RT005``). Any block or review finding fails, and so does a run whose runtime checks did not
   run (``RT001``): it would have tested nothing of the NPU runtime.
2. **parity**: a tiny DeepSeek model with one MoE layer, written here with a local tokenizer;
   native vLLM-Ascend (its own platform and ``NPUWorker``) against the AFD Attention NPU worker
   with the in-process ``LoopbackAFDConnector`` (AFD's platform), eager, greedy: the tokens must be
   equal, and the connector must have exchanged.

Exit codes: 0 both checks passed; 1 a check failed; 2 bad usage, or a host that cannot run the
check (no torch_npu or vLLM-Ascend, the ``afd_npu`` platform plugin not installed or not selected
by ``VLLM_PLUGINS``, no NPU, other versions, stale generated code); 3 the script itself crashed.

Only the standard library is imported here. The engine-process handling, the engine results and
the exit-code guard are tools/gpu_check.py's; the engine processes run this file again with an
internal command (``_probe``, ``_model``, ``_engine``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import gpu_check
from gpu_check import EngineResult, EngineSpec, UsageError

SCRIPT = Path(__file__).resolve()
REPO_ROOT = SCRIPT.parent.parent
FORMAT = "afd-npu-check/1"
VLLM_VERSION = "0.26.0"
VLLM_ASCEND_VERSION = "0.26.0rc1"

#: AFD's platform plugin (pyproject.toml, ``vllm.platform_plugins``) and general plugin
PLATFORM_PLUGIN = "afd_npu"
GENERAL_PLUGIN = "afd_models"
#: vLLM-Ascend's platform plugin, which must stay out: vLLM activates one platform plugin only
ASCEND_PLATFORM_PLUGIN = "ascend"
#: vLLM-Ascend's general plugins (its patches and registrations), needed with either platform
ASCEND_GENERAL_PLUGINS = (
    "ascend_kv_connector",
    "ascend_model_loader",
    "ascend_service_profiling",
    "ascend_model",
)
#: ``VLLM_PLUGINS`` selecting AFD's platform (what docs/npu.md tells operators to set)
AFD_PLUGINS = ",".join((PLATFORM_PLUGIN, GENERAL_PLUGIN, *ASCEND_GENERAL_PLUGINS))
#: ``VLLM_PLUGINS`` of the native engine: vLLM-Ascend as shipped, nothing of AFD
NATIVE_PLUGINS = ",".join((ASCEND_PLATFORM_PLUGIN, *ASCEND_GENERAL_PLUGINS))

ATTENTION_WORKER = "afd_models.workers.AFDAttentionNPUWorker"
LOOPBACK = "LoopbackAFDConnector"
NATIVE_CLASSES = "NPUWorker/NPUModelRunner"
NPU_PLATFORM = "vllm_ascend.platform.NPUPlatform"

PROMPTS = gpu_check.PROMPTS
MAX_TOKENS = gpu_check.MAX_TOKENS
#: the tiny model: DeepSeek-V2-Lite's layout (no q LoRA) and MLA head sizes, one MoE layer
MODEL_VARIANT = "v2-lite"
MODEL_OVERRIDES: Mapping[str, Any] = {
    "num_hidden_layers": 1,
    "first_k_dense_replace": 0,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
#: engine arguments of both engines
ENGINE_ARGS: Mapping[str, Any] = {
    "dtype": "bfloat16",
    "max_model_len": 256,
    "max_num_seqs": 8,
    "seed": 0,
    "gpu_memory_utilization": 0.3,
    "enforce_eager": True,
}
#: environment of every process this check starts, on top of the operator's
ENGINE_ENV: Mapping[str, str] = {
    # the engine core in the LLM's own process: collective_rpc calls the worker directly
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # AFD's NPU runners derive from vLLM-Ascend's MRv1 NPUModelRunner; the native engine too
    "VLLM_USE_V2_MODEL_RUNNER": "0",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
#: seconds each helper process may take: the probe, writing the model, ``codegen check``
PROBE_TIMEOUT_S = 300
MODEL_TIMEOUT_S = 300
CODEGEN_TIMEOUT_S = 900
CODEGEN_COMMAND = ("-m", "codegen", "check", "--format", "json")
#: the findings ``codegen check`` emits when its runtime checks did not run (RT001)
RUNTIME_UNAVAILABLE = "runtime_unavailable"


def log(message: str) -> None:
    gpu_check.log(message, SCRIPT)


# --------------------------------------------------------------------------- host requirements


def plugins_problem(value: str | None) -> str | None:
    """What is wrong with ``VLLM_PLUGINS`` for AFD's platform (None: nothing)."""
    if value is None:
        return "VLLM_PLUGINS is not set, so vLLM-Ascend's own platform plugin is selected"
    names = value.split(",")  # as vLLM splits it: no spaces
    missing = [
        name
        for name in (PLATFORM_PLUGIN, GENERAL_PLUGIN, *ASCEND_GENERAL_PLUGINS)
        if name not in names
    ]
    if ASCEND_PLATFORM_PLUGIN in names:
        return (
            f"VLLM_PLUGINS={value!r} names {ASCEND_PLATFORM_PLUGIN!r}, vLLM-Ascend's platform "
            "plugin; vLLM activates one platform plugin only"
        )
    if missing:
        return f"VLLM_PLUGINS={value!r} lacks {', '.join(missing)}"
    return None


def installed_platform_plugins() -> set[str]:
    """Names of the installed ``vllm.platform_plugins`` entry points (without loading them)."""
    return {entry.name for entry in importlib.metadata.entry_points(group="vllm.platform_plugins")}


def resolve_env(host: Host) -> dict[str, str]:
    """The environment of the processes this check starts. Raises UsageError, before anything
    runs, naming what is missing and what to install or set."""
    missing = [name for name in ("torch_npu", "vllm_ascend") if host.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"{' and '.join(missing)} not importable by {sys.executable} (no Ascend NPU stack): "
            f"install CANN and torch_npu as vLLM-Ascend {VLLM_ASCEND_VERSION}'s installation guide "
            'says, then `pip install -e ".[npu,codegen]"` from this checkout (docs/npu.md), and '
            "run this with that Python"
        )
    if PLATFORM_PLUGIN not in host.platform_plugins():
        raise UsageError(
            f"the {PLATFORM_PLUGIN!r} vllm.platform_plugins entry point is not installed for "
            f'{sys.executable}: `pip install -e ".[npu,codegen]"` from this checkout'
        )
    environ = host.environ()
    problem = plugins_problem(environ.get("VLLM_PLUGINS"))
    if problem is not None:
        raise UsageError(f"{problem}; set exactly: export VLLM_PLUGINS={AFD_PLUGINS}")
    env = {**environ, **ENGINE_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), environ.get("PYTHONPATH")]))
    return env


@dataclass(frozen=True)
class HostInfo:
    """What the probe process found (the operator's interpreter and ``VLLM_PLUGINS``)."""

    python: str
    torch: str
    torch_npu: str
    vllm: str
    vllm_ascend: str
    #: vLLM's platform class under ``VLLM_PLUGINS`` (AFD's)
    platform: str
    #: ``torch.npu.get_device_name(i)`` of each visible device
    devices: tuple[str, ...]
    #: the ``ASCEND_RT_VISIBLE_DEVICES`` entry of each visible device
    device_ids: tuple[str, ...]


def host_info(info: Mapping[str, Any], visible_devices: str | None) -> HostInfo:
    """The probe's findings, or UsageError saying why this host cannot run the check."""
    if not info["devices"]:
        raise UsageError(
            f"torch_npu {info['torch_npu']} sees no NPU (ASCEND_RT_VISIBLE_DEVICES="
            f"{visible_devices or 'unset'}): run this on an Ascend host with its driver loaded"
        )
    for name, found, wanted in (
        ("vLLM", info["vllm"], VLLM_VERSION),
        ("vLLM-Ascend", info["vllm_ascend"], VLLM_ASCEND_VERSION),
    ):
        if found.split("+")[0] != wanted:
            raise UsageError(f"{name} {found} found, this checks {name} {wanted}")
    if "afd_models_error" in info:
        raise UsageError(
            f"the generated code is not usable: {info['afd_models_error']} (afd_models/_generated is a "
            "build artifact: run `python -m codegen regenerate` in this environment)"
        )
    if "worker_error" in info:
        raise UsageError(f"{ATTENTION_WORKER} does not import: {info['worker_error']}")
    if not info["afd_platform"]:
        raise UsageError(
            f"vLLM selected the platform {info['platform']}, not AFD's subclass of {NPU_PLATFORM} "
            f"(is the {PLATFORM_PLUGIN!r} entry point of this checkout's install?); set exactly: "
            f"export VLLM_PLUGINS={AFD_PLUGINS}"
        )
    devices = tuple(info["devices"])
    ids = gpu_check.visible_device_ids(visible_devices, len(devices))
    return HostInfo(
        info["python"],
        info["torch"],
        info["torch_npu"],
        info["vllm"],
        info["vllm_ascend"],
        info["platform"],
        devices,
        ids,
    )


@dataclass(frozen=True)
class Setup:
    """Everything the checks share."""

    work_dir: Path
    model: Path
    #: the operator's environment with :data:`ENGINE_ENV` and the repository on PYTHONPATH
    env: Mapping[str, str]
    host: HostInfo
    engine_timeout_s: float = 600.0


def probe(env: Mapping[str, str], work_dir: Path) -> HostInfo:
    """What the engines' interpreter sees. Raises UsageError when it cannot run the check."""
    out, log_path = work_dir / "probe.json", work_dir / "probe.log"
    log("probe: torch_npu, NPUs, vLLM, vLLM-Ascend, vLLM's platform, afd_models")
    code = gpu_check.run_internal("_probe", out, env, log_path, PROBE_TIMEOUT_S, SCRIPT)
    if code != 0 or not out.exists():
        raise UsageError(
            f"the probe failed (`import torch_npu`? CANN's set_env.sh sourced?) or took over "
            f"{PROBE_TIMEOUT_S} s; end of {log_path}:\n{gpu_check._tail(log_path)}"
        )
    return host_info(json.loads(out.read_text()), env.get("ASCEND_RT_VISIBLE_DEVICES"))


def prepare(work_dir: Path, env: Mapping[str, str], engine_timeout_s: float) -> Setup:
    """Probe the host and write the tiny model. Raises UsageError when the host cannot run it."""
    work_dir = work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    host = probe(env, work_dir)
    log(f"{len(host.devices)} NPU(s): {', '.join(host.devices)}; platform {host.platform}")
    model, log_path = work_dir / "tiny-one-moe-layer", work_dir / "model.log"
    if gpu_check.run_internal("_model", model, env, log_path, MODEL_TIMEOUT_S, SCRIPT) != 0:
        raise RuntimeError(
            f"writing the tiny model failed or took over {MODEL_TIMEOUT_S} s; end of "
            f"{log_path}:\n{gpu_check._tail(log_path)}"
        )
    log(f"tiny DeepSeek model (one MoE layer) in {model}")
    return Setup(work_dir, model, env, host, engine_timeout_s)


@dataclass(frozen=True)
class Host:
    """What the check asks of the machine; the unit tests pass fakes."""

    #: whether this interpreter finds a module (without importing it)
    find_spec: Callable[[str], object | None] = importlib.util.find_spec
    #: the installed ``vllm.platform_plugins`` entry point names
    platform_plugins: Callable[[], set[str]] = installed_platform_plugins
    #: the operator's environment
    environ: Callable[[], Mapping[str, str]] = lambda: os.environ
    #: probe the host and write the model (:func:`prepare`)
    prepare: Callable[[Path, Mapping[str, str], float], Setup] = prepare
    #: runs the checks (``run_origin_check``, ``run_parity``); None: this module
    runner: Any = None


# --------------------------------------------------------------------------- checks and verdicts


@dataclass(frozen=True)
class CheckResult:
    """One check; ``problems`` empty: passed."""

    name: str
    #: what it ran, for the report
    what: str
    problems: tuple[str, ...]
    #: check-specific results for the JSON report
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "passed": self.passed}


ORIGIN = "runtime origin"
PARITY = "parity"


def origin_problems(returncode: int, stdout: str) -> tuple[list[str], str]:
    """The problems of a ``codegen check --format json`` run, and its summary line."""
    try:
        report = json.loads(stdout)
        findings, summary = report["findings"], report["summary"]
    except (ValueError, KeyError, TypeError):
        return [f"codegen check wrote no JSON report (exit {returncode})"], ""
    problems = [
        f"{f['code']} {f['severity']} {f['symbol']}: {f['message']}"
        for f in findings
        if f["severity"] in ("block", "review")
    ]
    problems += [
        f"{f['code']} {f['symbol']}: {f['message']}: RT005 was not checked"
        for f in findings
        if f["kind"] == RUNTIME_UNAVAILABLE
    ]
    if returncode != 0 and not problems:
        problems.append(f"codegen check exited {returncode} ({summary})")
    return problems, summary


def run_origin_check(setup: Setup) -> CheckResult:
    """``python -m codegen check`` in the operator's environment, bounded by
    :data:`CODEGEN_TIMEOUT_S`; its JSON on stdout, its progress in a log."""
    command = [sys.executable, *CODEGEN_COMMAND]
    out, log_path = setup.work_dir / "codegen-check.json", setup.work_dir / "codegen-check.log"
    log(f"runtime origin: {' '.join(command[1:])}, log {log_path}")
    with out.open("wb") as stdout, log_path.open("wb") as stderr:
        process = subprocess.Popen(
            command,
            env=dict(setup.env),
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        returncode = process.wait(CODEGEN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        gpu_check._kill(process)
        problem = f"python -m codegen check did not finish within {CODEGEN_TIMEOUT_S} s"
        return CheckResult(ORIGIN, "python -m codegen check", (f"{problem}; see {log_path}",))
    problems, summary = origin_problems(returncode, out.read_text(errors="replace"))
    if problems and not summary:
        problems.append(f"end of {log_path}:\n{gpu_check._tail(log_path)}")
    details = {
        "exit_code": returncode,
        "summary": summary,
        "report": str(out),
        "log": str(log_path),
    }
    return CheckResult(ORIGIN, "python -m codegen check", tuple(problems), details)


def parity_problems(afd: EngineResult, native: EngineResult) -> list[str]:
    """Every check of the AFD run against the native one (empty: passed)."""
    problems = []
    if not native.ok:
        problems.append(f"the native engine failed: {native.error}")
    elif native.classes != NATIVE_CLASSES:
        problems.append(f"the native engine ran {native.classes}, expected {NATIVE_CLASSES}")
    if not afd.ok:
        return [*problems, f"the AFD engine failed: {afd.error}"]
    worker = ATTENTION_WORKER.rpartition(".")[2]
    if afd.classes.partition("/")[0] != worker:
        problems.append(f"the AFD engine ran {afd.classes}, expected the worker {worker}")
    if native.ok and afd.tokens != native.tokens:
        difference = gpu_check._first_difference(afd.tokens, native.tokens)
        problems.append(f"greedy tokens differ: {difference}")
    short = [i for i, seq in enumerate(afd.tokens) if len(seq) != MAX_TOKENS]
    if not afd.tokens or short:
        problems.append(
            f"AFD outputs {short or 'all'} do not hold {MAX_TOKENS} tokens (ignore_eos)"
        )
    stats = afd.connector_stats or {}
    if not stats.get("exchanges") or not stats.get("steps"):
        problems.append(
            f"the connector exchanged nothing: afd_connector_stats {dict(stats)} (see {afd.log})"
        )
    return problems


def run_parity(setup: Setup) -> CheckResult:
    """Native vLLM-Ascend, then the AFD Attention worker with the loopback connector."""
    device = {"ASCEND_RT_VISIBLE_DEVICES": setup.host.device_ids[0]}
    directory = setup.work_dir / "engines"
    native = gpu_check.run_engine(
        EngineSpec("native", str(setup.model), dict(ENGINE_ARGS)),
        {**setup.env, **device, "VLLM_PLUGINS": NATIVE_PLUGINS},
        directory,
        setup.engine_timeout_s,
        SCRIPT,
    )
    afd_args = {
        **ENGINE_ARGS,
        "worker_cls": ATTENTION_WORKER,
        "additional_config": {"afd": {"role": "attention", "connector": LOOPBACK}},
    }
    afd = gpu_check.run_engine(
        EngineSpec("afd-loopback", str(setup.model), afd_args, afd_attention=True),
        {**setup.env, **device},
        directory,
        setup.engine_timeout_s,
        SCRIPT,
    )
    details = {
        "engine_args": dict(ENGINE_ARGS),
        "model_overrides": dict(MODEL_OVERRIDES),
        "afd": afd.as_dict(),
        "native": native.as_dict(),
    }
    what = f"native vLLM-Ascend vs {ATTENTION_WORKER} + {LOOPBACK}, one MoE layer, eager, greedy"
    return CheckResult(PARITY, what, tuple(parity_problems(afd, native)), details)


# --------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Report:
    date: str
    host: HostInfo
    checks: tuple[CheckResult, ...]
    work_dir: str

    def exit_code(self) -> int:
        """0 when every check ran and passed, else 1."""
        return 0 if self.checks and all(check.passed for check in self.checks) else 1

    def summary(self) -> str:
        passed = sum(check.passed for check in self.checks)
        failed = len(self.checks) - passed
        return f"npu_check: {passed} passed, {failed} failed; exit {self.exit_code()}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "date": self.date,
            "host": dataclasses.asdict(self.host),
            "checks": [check.as_dict() for check in self.checks],
            "work_dir": self.work_dir,
            "exit_code": self.exit_code(),
        }


def render(report: Report) -> str:
    """The readable report."""
    host = report.host
    lines = [
        f"AFD NPU check, {report.date}",
        f"  NPUs: {', '.join(host.devices)}; torch {host.torch}, torch_npu {host.torch_npu}, "
        f"vLLM {host.vllm}, vLLM-Ascend {host.vllm_ascend}, Python {host.python}",
        f"  platform: {host.platform}",
    ]
    for check in report.checks:
        lines.append(f"\n== {check.name} ({check.what}): {'PASS' if check.passed else 'FAIL'}")
        if check.details.get("summary"):
            lines.append(f"  findings: {check.details['summary']}")
        lines += [f"  {problem}" for problem in check.problems]
    lines += ["", f"logs: {report.work_dir}", report.summary()]
    return "\n".join(lines)


def check(setup: Setup, runner: Any = None) -> Report:
    """Both checks; ``runner`` provides ``run_origin_check`` and ``run_parity`` (this module by
    default; the unit tests pass fakes)."""
    runner = runner or sys.modules[__name__]
    checks = (runner.run_origin_check(setup), runner.run_parity(setup))
    for result in checks:
        log(f"{result.name}: {'PASS' if result.passed else 'FAIL'}")
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return Report(date, setup.host, checks, str(setup.work_dir))


# --------------------------------------------------------------------------- processes
# These run in fresh interpreters (``python tools/npu_check.py _probe OUT``), never here.


def probe_main(out: Path) -> int:
    """Versions, NPUs, vLLM's platform and whether afd_models imports; JSON to ``out``."""
    import torch
    import torch_npu

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_npu": torch_npu.__version__,
        "devices": [torch.npu.get_device_name(i) for i in range(torch.npu.device_count())],
        "vllm": importlib.metadata.version("vllm"),
        "vllm_ascend": importlib.metadata.version("vllm_ascend"),
    }
    try:
        # first: with AFD's platform selected, vLLM imports the generated platform while it picks
        # the platform, and stale generated code should be reported as such
        from afd_models._freshness import check_generated_code

        check_generated_code()
    except ImportError as exc:
        info["afd_models_error"] = f"{type(exc).__name__}: {exc}"
        gpu_check._write_result(out, info)
        return 0
    from vllm.platforms import current_platform
    from vllm_ascend.platform import NPUPlatform

    cls = type(current_platform)
    info["platform"] = f"{cls.__module__}.{cls.__qualname__}"
    info["afd_platform"] = issubclass(cls, NPUPlatform) and cls is not NPUPlatform
    try:
        import afd_models.workers

        getattr(afd_models.workers, ATTENTION_WORKER.rpartition(".")[2])
    except ImportError as exc:
        info["afd_models_error"] = f"{type(exc).__name__}: {exc}"
    except AttributeError as exc:
        info["worker_error"] = f"{type(exc).__name__}: {exc}"
    gpu_check._write_result(out, info)
    return 0


def model_main(out: Path) -> int:
    from afd_models.testing.tiny_models import write_tiny_model

    write_tiny_model(
        out,
        MODEL_VARIANT,
        seed=0,
        dtype=ENGINE_ARGS["dtype"],
        overrides=MODEL_OVERRIDES,
        margin_scale=50.0,
    )
    return 0


def engine_main(spec_path: Path) -> int:
    """Build the spec's LLM on the platform its run needs, generate, write the result file."""
    began = time.monotonic()
    payload = json.loads(spec_path.read_text())
    result_path = Path(payload.pop("result_path"))
    spec = EngineSpec(**{**payload, "prompts": tuple(payload["prompts"])})
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform
    from vllm_ascend.platform import NPUPlatform

    cls = type(current_platform)
    afd = spec.afd_attention
    if (cls is NPUPlatform) == afd or not issubclass(cls, NPUPlatform):
        wanted = f"AFD's subclass of {NPU_PLATFORM}" if afd else NPU_PLATFORM
        raise RuntimeError(
            f"vLLM's platform is {cls.__module__}.{cls.__qualname__}, this run needs {wanted} "
            f"(VLLM_PLUGINS={os.environ.get('VLLM_PLUGINS')!r})"
        )
    llm = LLM(model=spec.model, **spec.llm_args)
    result: dict[str, Any] = {
        "startup_s": time.monotonic() - began,
        "classes": llm.collective_rpc(gpu_check._worker_classes)[0],
    }
    params = SamplingParams(temperature=0.0, max_tokens=spec.max_tokens, ignore_eos=True)
    outputs = llm.generate(list(spec.prompts), params, use_tqdm=False)
    result["tokens"] = [list(output.outputs[0].token_ids) for output in outputs]
    if afd:
        try:
            result["connector_stats"] = llm.collective_rpc("afd_connector_stats")[0]
        except Exception as exc:  # reported as a failed check, with the tokens still compared
            print(f"AFD npu_check: afd_connector_stats unreadable: {exc!r}", flush=True)
    gpu_check._write_result(result_path, result)
    gpu_check._shutdown(llm)
    return 0


INTERNAL_COMMANDS = {"_probe": probe_main, "_model": model_main, "_engine": engine_main}


# --------------------------------------------------------------------------- CLI


@dataclass(frozen=True)
class Options:
    json_path: Path | None = None
    work_dir: Path | None = None
    engine_timeout_s: float = 600.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu_check.py",
        description=__doc__.split("\n\n")[0],
        epilog=f"Needs VLLM_PLUGINS={AFD_PLUGINS}. Exit codes: 0 passed, 1 a check failed, "
        "2 bad usage or unusable host, 3 crash.",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the report as JSON")
    parser.add_argument(
        "--work-dir",
        type=Path,
        metavar="DIR",
        help="model, logs and reports (default: a new temporary directory)",
    )
    parser.add_argument(
        "--engine-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds one engine may take (default: %(default)s)",
    )
    return parser


def options_from(args: argparse.Namespace) -> Options:
    """Validate the arguments. Raises UsageError naming the bad value and the allowed ones."""
    if not args.engine_timeout > 0:
        raise UsageError(
            f"--engine-timeout {args.engine_timeout} is not allowed; allowed: seconds > 0"
        )
    if args.json is not None and args.json.is_dir():
        raise UsageError(f"--json {args.json} is a directory; allowed: a file path")
    return Options(args.json, args.work_dir, args.engine_timeout)


def run(options: Options, host: Host) -> int:
    """The whole check for validated options; its exit code."""
    began = time.monotonic()
    env = resolve_env(host)
    work_dir = options.work_dir or Path(tempfile.mkdtemp(prefix="afd-npu-check-"))
    setup = host.prepare(work_dir, env, options.engine_timeout_s)
    report = check(setup, host.runner)
    print(render(report), flush=True)
    if options.json_path is not None:
        gpu_check.write_json(report, options.json_path)
        log(f"JSON report in {options.json_path}")
    log(f"whole check: {time.monotonic() - began:.0f} s")
    return report.exit_code()


def main(argv: Sequence[str] | None = None, host: Host | None = None) -> int:
    """0 passed, 1 a check failed, 2 bad usage or unusable host, 3 the script crashed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in INTERNAL_COMMANDS:
        return INTERNAL_COMMANDS[argv[0]](Path(argv[1]))
    args = build_parser().parse_args(argv)  # exits 2 on a malformed command line, 0 for --help
    return gpu_check.guarded(SCRIPT.name, lambda: run(options_from(args), host or Host()))


if __name__ == "__main__":
    if sys.argv[1:2] and sys.argv[1] in INTERNAL_COMMANDS:
        gpu_check._engine_process_exit(main)
    sys.exit(main())
