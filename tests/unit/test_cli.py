"""Exit codes of ``python -m codegen``: 0 clean, 1 review, 2 blocking, 3 usage or tool error
(never 0 after an exception), as the table in docs/maintainers.md says."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from afd_models.commandline import ExitCode
from codegen.cli import build_parser, main
from codegen.findings import Finding, Kind, Severity, exit_code
from codegen.pipeline import generate, write_output

from .fake_repo import HEADER, make_repo

REPO = Path(__file__).resolve().parents[2]

OK = (
    HEADER
    + "\n@subclass()\nclass A(Base):\n    @override\n    def helper(self, a: int, *, b: int = 2) -> int:\n        return a\n"
)


def _args(context, *rest: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [
        "--repo",
        str(context.repo_root),
        *rest,
        "--upstream-root",
        str(context.sources["vllm"].root),
    ]


def test_regenerate_then_check_is_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """regenerate writes code and lock; check then finds nothing to block (exit 0), JSON on request."""
    context = make_repo(tmp_path, OK)
    assert main(_args(context, "regenerate")) == 0
    assert main(_args(context, "check", "--no-runtime", "--format", "json")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["summary"] == "0 block, 0 review, 0 info"


def test_blocking_finding_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A signature mismatch blocks: exit 2, nothing written, JSON findings carry code/severity/symbol/message."""
    context = make_repo(tmp_path, OK.replace("-> int:", ":"))
    assert main(_args(context, "regenerate")) == 2
    assert not (context.repo_root / "afd_models/_generated").exists()
    capsys.readouterr()
    assert main(_args(context, "check", "--no-runtime", "--format", "json")) == 2
    (finding,) = json.loads(capsys.readouterr().out)["findings"]
    assert {finding["code"], finding["severity"]} == {"SIG007", "block"}
    assert finding["symbol"].endswith("A.helper") and "return annotation" in finding["message"]


def test_stale_lock_blocks_with_a_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A lock that no longer matches a regeneration is LCK002 with a readable diff."""
    context = make_repo(tmp_path, OK)
    generation, _ = generate(context)
    write_output(context.repo_root, generation)
    lock = context.repo_root / "overlay/overlay.lock"
    lock.write_text(lock.read_text().replace('"version": "0.26.0"', '"version": "0.25.0"'))
    assert main(_args(context, "check", "--no-runtime", "-v")) == 2
    out = capsys.readouterr().out
    assert "LCK002" in out and '-      "version": "0.25.0"' in out


def test_internal_error_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A crash inside the tool (here: a corrupt lock) is exit 3 with the traceback, never a pass."""
    context = make_repo(tmp_path, OK)
    (context.repo_root / "overlay/overlay.lock").write_text("{not json")
    assert main(_args(context, "check", "--no-runtime")) == 3
    assert "internal error" in capsys.readouterr().err


def test_show_marks_edits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """show prints a fork with each edited line tagged by its edit id."""
    overlay = HEADER + (
        "\n@subclass()\nclass A(Base):\n"
        "    @fork(insert_after('super().__init__()', 'marker = 1', id='mark', why='w'))\n"
        "    def __init__(self, size: int, prefix: str = '') -> None: ...\n"
    )
    context = make_repo(tmp_path, overlay)
    assert main(_args(context, "show", "A.__init__")) == 0
    out = capsys.readouterr().out
    assert "mark +     marker = 1" in out
    assert "super() +     super(Base, self).__init__()" in out


def test_show_of_an_unknown_member_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """show of a symbol no generated member has: exit 3 naming the known members, no traceback."""
    context = make_repo(tmp_path, OK)
    assert main(_args(context, "show", "A.nope")) == 3
    err = capsys.readouterr().err
    assert "'A.nope' is not a generated member; known: A.helper" in err
    assert "Traceback" not in err


def test_unsupported_release_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--vllm-version outside the pins' support window: exit 3 before anything is read, naming
    the value and the supported releases; --all-versions takes no single release."""
    context = make_repo(tmp_path, OK)
    assert main(_args(context, "regenerate", "--vllm-version", "0.27.0")) == 3
    err = capsys.readouterr().err
    assert "--vllm-version 0.27.0: not a supported release; supported: 0.26.0" in err
    assert not (context.repo_root / "afd_models/_generated").exists()
    assert main(_args(context, "check", "--all-versions")) == 3
    assert "--all-versions reads every supported release itself" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [[], ["frobnicate"], ["check", "--format", "xml"], ["drift"], ["regenerate", "--nope"]],
    ids=["no-command", "unknown-command", "bad-choice", "missing-option", "unknown-option"],
)
def test_usage_errors_exit_3(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """An argparse usage error exits 3 (usage or tool error), not argparse's 2 (which reads as
    "blocks"), with the usage line."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 3
    assert "usage: python -m codegen" in capsys.readouterr().err


def test_usage_error_exit_code_of_the_command() -> None:
    """``python -m codegen`` itself exits 3 on a usage error."""
    result = subprocess.run(
        [sys.executable, "-m", "codegen", "frobnicate"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 3, result.stderr


@pytest.mark.parametrize(
    ("severities", "code"),
    [
        ((), 0),
        ((Severity.INFO,), 0),
        ((Severity.INFO, Severity.REVIEW), 1),
        ((Severity.REVIEW, Severity.BLOCK, Severity.INFO), 2),
    ],
)
def test_exit_code_is_the_worst_finding(severities: tuple[Severity, ...], code: int) -> None:
    """0 clean (info only), 1 something to review, 2 something blocks."""
    findings = [Finding(Kind.DRIFT_BODY, s, f"m:f{i}", "changed") for i, s in enumerate(severities)]
    assert exit_code(findings) == code


def _tables(section: str) -> list[list[list[str]]]:
    """The Markdown tables of a section, as rows of cells (header and rule left out)."""
    tables: list[list[list[str]]] = []
    rows: list[list[str]] = []
    for line in [*section.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            tables.append(rows[2:])
            rows = []
    return tables


def test_exit_code_table_is_documented() -> None:
    """docs/maintainers.md, "Exit codes": one row per code of ExitCode, one row per codegen
    command, and nothing else."""
    text = (REPO / "docs/maintainers.md").read_text()
    section = re.search(r"^## Exit codes$(.*?)^## ", text, re.MULTILINE | re.DOTALL)
    assert section is not None
    codes, commands, *_ = _tables(section.group(1))
    assert [int(row[0]) for row in codes] == [code.value for code in ExitCode]
    (subcommands,) = (
        action.choices
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    documented = [row[0].strip("`").removeprefix("python -m codegen ") for row in commands]
    assert documented == list(subcommands)


def test_tools_exit_codes_are_documented() -> None:
    """docs/maintainers.md, "Exit codes": one row per runnable tool (a package of ``tools/`` with a
    ``__main__``, and ``cpu_env``) and operator command (a module of ``afd_models/cli`` with a
    ``__main__`` guard or package), and none says 1, which none of them returns."""
    text = (REPO / "docs/maintainers.md").read_text()
    section = re.search(r"^## Exit codes$(.*?)^## ", text, re.MULTILINE | re.DOTALL)
    assert section is not None
    _, _, tools = _tables(section.group(1))
    documented = {re.search(r"(tools|cli)[./](\w+)", row[0]).group(2) for row in tools}  # type: ignore[union-attr]
    cli = REPO / "afd_models" / "cli"
    runnable = {
        *(path.parent.name for path in (REPO / "tools").glob("*/__main__.py")),
        "cpu_env",
        *(path.parent.name for path in cli.glob("*/__main__.py")),
        *(
            path.stem
            for path in cli.glob("*.py")
            if 'if __name__ == "__main__":' in path.read_text()
        ),
    }
    assert documented == runnable
    assert all(row[2] == "-" for row in tools)
