"""The engine processes' side, shared by the checks: reading the spec, writing the result, naming
the worker classes, and the way every child process ends.

A check's child module (``tools.gpu_check.child``, ``tools.npu_check.child``) maps its internal
commands to functions and ends with :func:`run_internal_command`; only there are torch and vLLM
imported.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from afd_models.commandline import ExitCode
from tools.harness.cli import write_atomic
from tools.harness.results import EngineSpec

#: an internal command: its path argument to an exit status
InternalCommand = Callable[[Path], int]


def read_spec(spec_path: Path) -> tuple[EngineSpec, Path]:
    """The spec the parent wrote, and where the result goes."""
    payload = json.loads(spec_path.read_text())
    result_path = Path(payload.pop("result_path"))
    return EngineSpec(**{**payload, "prompts": tuple(payload["prompts"])}), result_path


def write_result(path: Path, data: Mapping[str, Any]) -> None:
    """``data`` as JSON at ``path``, written atomically: the parent never reads half a file."""
    write_atomic(path, json.dumps(data).encode())


def worker_classes(wrapper: Any) -> str:
    """``worker class/runner class`` of the worker ``collective_rpc`` hands a callable."""
    # a callable gets vLLM's WorkerWrapperBase, which holds the worker
    worker = getattr(wrapper, "worker", wrapper)
    return f"{type(worker).__name__}/{type(worker.model_runner).__name__}"


def shutdown(llm: Any) -> None:
    """Stop the LLM's engine core."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()


def run_internal_command(commands: Mapping[str, InternalCommand], argv: Sequence[str]) -> None:
    """Run ``argv``'s internal command (``COMMAND PATH``), flush, and exit without interpreter
    teardown (vLLM's helper threads and pools can hang it); an exception is exit 3 with its
    traceback, an unknown command exit 3 naming the known ones."""
    try:
        if len(argv) != 2 or argv[0] not in commands:
            print(f"usage: COMMAND PATH, COMMAND one of {', '.join(commands)}", file=sys.stderr)
            code = int(ExitCode.ERROR)
        else:
            code = commands[argv[0]](Path(argv[1]))
    except BaseException:
        traceback.print_exc()
        code = ExitCode.ERROR
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
