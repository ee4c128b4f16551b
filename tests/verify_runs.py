"""``python -m afd_models.cli.verify`` runs of one test module's selected cases, two at a time.

A run is one process busy on about one core (measured on the 2-core machine: 43 s of CPU in a
45 s run), and the cases of a module are independent: the module's fixture starts every case
pytest selected (on the other releases, only those marked ``every_release``), two at a time, and
each test then checks its own run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

VERIFY = (sys.executable, "-m", "afd_models.cli.verify")
#: runs at a time: this machine's cores
WORKERS = 2
TIMEOUT_S = 900


@dataclass(frozen=True)
class VerifyRun:
    """One finished run: the process and the JSON report it was asked to write."""

    result: subprocess.CompletedProcess[str]
    report: Path

    def data(self) -> dict[str, Any]:
        """The report, once the run exited with 0 (else its output, in the failure)."""
        assert self.result.returncode == 0, self.result.stdout + self.result.stderr[-3000:]
        data: dict[str, Any] = json.loads(self.report.read_text())
        return data


def selected(request: pytest.FixtureRequest, test: str, *params: str) -> list[tuple[Any, ...]]:
    """The parameter values of each selected case of ``test`` in the requesting module."""
    return [
        tuple(item.callspec.params[p] for p in params)
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.module is request.module
        and item.originalname == test
    ]


def run_all(
    configs: Mapping[Hashable, tuple[dict[str, Any], tuple[str, ...]]],
    directory: Path,
    env: dict[str, str],
) -> dict[Hashable, VerifyRun]:
    """Run ``verify`` on each case's HF config with its extra arguments, ``WORKERS`` at a time."""

    def run(index: int, config: dict[str, Any], extra: tuple[str, ...]) -> VerifyRun:
        case_dir = directory / f"case{index}"
        case_dir.mkdir()
        config_path, report = case_dir / "config.json", case_dir / "report.json"
        config_path.write_text(json.dumps(config))
        command = [*VERIFY, "--hf-config", str(config_path), *extra, "--json", str(report)]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        return VerifyRun(result, report)

    with ThreadPoolExecutor(WORKERS) as pool:
        futures = {
            case: pool.submit(run, index, config, extra)
            for index, (case, (config, extra)) in enumerate(configs.items())
        }
        return {case: future.result() for case, future in futures.items()}
