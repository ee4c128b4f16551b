"""Running vLLM engines from tests: each in a fresh interpreter, so every test gets a clean vLLM
process state (shared by the cpu and gpu tiers)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

#: environment of every vLLM process the tests start (the KV-cache size applies on CPU only).
#: These engines run eagerly (``enforce_eager=True``); with Dynamo off, vLLM's lazily compiled
#: helpers (grouped top-k routing) run as plain PyTorch instead of compiling on first call. The
#: compiled mode is tested by the exchange-op test and the e2e tier.
VLLM_ENV = {
    "VLLM_MLA_DISABLE": "1",
    "TORCHDYNAMO_DISABLE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}


def run_python(
    code: str,
    env: dict[str, str],
    timeout: float = 300,
    *,
    python: str = sys.executable,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a Python snippet in a fresh interpreter; the result's stdout is the snippet's output.
    ``python -c`` puts ``cwd`` first on the import path."""
    return subprocess.run(
        [python, "-c", textwrap.dedent(code)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_python_result(
    code: str, env: dict[str, str], argv: list[str], timeout: float = 300
) -> dict[str, Any]:
    """Run ``code`` as :func:`run_python` does, with ``sys.argv`` set to ``argv``; the JSON the
    snippet printed last on a ``RESULT `` line (the run must succeed and print one)."""
    result = run_python(f"import sys; sys.argv = {argv!r}\n" + code, env, timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stderr[-6000:]
    found: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return found
