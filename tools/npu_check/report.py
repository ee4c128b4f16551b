"""The NPU check's report: the host, each check's verdict and problems; text and JSON."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from afd_models.commandline import ExitCode
from tools.npu_check.checks import CheckResult
from tools.npu_check.host import HostInfo
from tools.npu_check.settings import FORMAT


@dataclass(frozen=True)
class Report:
    date: str
    host: HostInfo
    checks: tuple[CheckResult, ...]
    work_dir: str

    def exit_code(self) -> ExitCode:
        """CLEAN when every check ran and passed, else BLOCK."""
        passed = self.checks and all(check.passed for check in self.checks)
        return ExitCode.CLEAN if passed else ExitCode.BLOCK

    def summary(self) -> str:
        passed = sum(check.passed for check in self.checks)
        failed = len(self.checks) - passed
        return f"npu_check: {passed} passed, {failed} failed; exit {self.exit_code():d}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "date": self.date,
            "host": dataclasses.asdict(self.host),
            "checks": [check.as_dict() for check in self.checks],
            "work_dir": self.work_dir,
            "exit_code": int(self.exit_code()),
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
