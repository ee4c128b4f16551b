"""``python -m afd_models.cli.verify`` runs of the selected cases of every test module, two at a time.

A run is one process busy on about one core (measured on the 2-core machine: 43 s of CPU in a
45 s run), and the cases are independent: the session's fixture (``verify_runs`` in
tests/cpu/conftest.py) starts every case pytest selected in any module (on the other releases,
only those marked ``every_release``), two at a time across modules, so that no module's last run
leaves a core idle; each test then checks its own run. A module takes part by defining
``verify_cases(session)`` (its selected cases and their configs) and reads its runs with
:func:`runs_of`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Hashable, Mapping
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


#: a module's cases: case -> (its HF config, verify's extra arguments)
Cases = Mapping[Hashable, tuple[dict[str, Any], tuple[str, ...]]]


def selected(
    session: pytest.Session, module: str, test: str, *params: str
) -> list[tuple[Any, ...]]:
    """The parameter values of each selected case of ``test`` in ``module`` (its name)."""
    return [
        tuple(item.callspec.params[p] for p in params)
        for item in session.items
        if isinstance(item, pytest.Function)
        and item.module is not None
        and item.module.__name__ == module
        and item.originalname == test
    ]


def session_runs(
    session: pytest.Session, directory: Path, env: dict[str, str]
) -> dict[Hashable, VerifyRun]:
    """Every selected case of every module that defines ``verify_cases``, run two at a time;
    keyed by (module name, case)."""
    modules = {
        item.module
        for item in session.items
        if isinstance(item, pytest.Function) and item.module is not None
    }
    configs: dict[Hashable, tuple[dict[str, Any], tuple[str, ...]]] = {}
    for module in sorted(modules, key=lambda m: m.__name__):
        cases: Callable[[pytest.Session], Cases] | None = getattr(module, "verify_cases", None)
        if cases is not None:
            configs.update({(module.__name__, c): v for c, v in cases(session).items()})
    return run_all(configs, directory, env)


def runs_of(runs: Mapping[Hashable, VerifyRun], module: str) -> dict[Hashable, VerifyRun]:
    """The runs of ``module``'s cases, by case."""
    return {key[1]: run for key, run in runs.items() if isinstance(key, tuple) and key[0] == module}


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
