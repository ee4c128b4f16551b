"""CI must fail on a commit that changed the overlay but not the lock: `nox -s tests` checks first.
A commit that changes no upstream use of the runtime changes no lock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import noxfile
from codegen.generate import LOCK_PATH
from codegen.lock import render_lock
from codegen.pipeline import generate, open_context
from tests.checkout import tracked_copy

OVERLAY = "overlay/vllm/model_executor/models/deepseek_v2.py"


def _committed_check(root: Path) -> subprocess.CompletedProcess[str]:
    # `python -m` puts the working directory first on sys.path: the copy's codegen checks the copy.
    return subprocess.run(
        [sys.executable, *noxfile.COMMITTED_CHECK],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_stale_lock_fails_the_committed_check(tmp_path: Path) -> None:
    """An overlay edit without its lock fails the check on the committed tree by that lock
    alone (the same check on the unedited tree is `nox -s tests`' first step)."""
    root = tracked_copy(tmp_path / "clone")
    overlay = root / OVERLAY
    text = overlay.read_text()
    assert 'why="the FFN role constructs nothing of attention"' in text
    overlay.write_text(
        text.replace(
            'why="the FFN role constructs nothing of attention"',
            'why="the FFN role builds no attention modules"',
        )
    )
    stale = _committed_check(root)
    assert stale.returncode == 2, stale.stdout + stale.stderr
    assert "LCK002" in stale.stdout and "nox -s regenerate" in stale.stdout, stale.stdout
    blocks = [line for line in stale.stdout.splitlines() if line.startswith("block")]
    assert all(" LCK002 " in line for line in blocks), blocks
    # every supported release's lock is checked, not only the primary's
    assert (
        "overlay/overlay.lock" in stale.stdout and "overlay/locks/vllm-0.28.0.lock" in stale.stdout
    )


def test_runtime_edits_that_change_no_upstream_use_leave_the_lock(tmp_path: Path) -> None:
    """On a copy of this checkout: a new function in the Kubernetes writer, a comment atop worker
    modules and a command-line module that call upstream (every line below it moves) and inside
    the function that constructs vLLM's ``CompilationConfig``: the regenerated lock (with the
    hashes of the generated code, the registry's inputs digest among them) is the committed one,
    byte for byte."""
    root = tracked_copy(tmp_path / "clone")
    k8s = root / "afd_models/deploy/k8s.py"
    k8s.write_text(k8s.read_text() + "\n\ndef _unused() -> int:\n    return 1\n")
    for module in ("worker_config.py", "runner_roles.py", "cli/gloo_bench.py"):
        path = root / "afd_models" / module
        path.write_text("# a comment: every line below moves\n\n" + path.read_text())
    worker_config = root / "afd_models/worker_config.py"
    lines = worker_config.read_text().splitlines(keepends=True)
    [at] = [n for n, line in enumerate(lines) if "CompilationConfig(" in line]
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    lines[at:at] = [f"{indent}# the FFN side compiles its own graphs\n", "\n"]
    worker_config.write_text("".join(lines))
    generation, _ = generate(open_context(root, quiet=True))
    assert generation.lock is not None, [f.one_line() for f in generation.findings]
    assert render_lock(generation.lock) == (root / LOCK_PATH).read_text()


def _commands(pythons: dict[str, str]) -> list[tuple[str, ...]]:
    commands: list[tuple[str, ...]] = []
    session = SimpleNamespace(
        posargs=[], log=lambda *_: None, run=lambda *args, **_: commands.append(args)
    )
    noxfile.run_tests(session, pythons)
    return commands


def test_tests_session_checks_before_it_regenerates() -> None:
    """The order of the commands `nox -s tests` runs, read from the session's own plan (fake
    interpreters: nothing is built or run)."""
    commands = _commands({"0.26.0": "py-0.26", "0.28.0": "py-0.28", "0.30.0": "py-0.30"})
    steps = [args[1:4] for args in commands]
    assert steps == [
        ("-m", "codegen", "check"),
        ("-m", "codegen", "regenerate"),
        # the pure-Python tiers by two workers, then the engines' tiers in one process
        ("-m", "pytest", "tests/unit"),
        ("-m", "pytest", "tests/cpu"),
        # each other supported release, in its own env: its code, its tiers
        ("-m", "codegen", "regenerate"),
        ("-m", "pytest", "tests/cpu"),
        ("-m", "codegen", "regenerate"),
        ("-m", "pytest", "tests/cpu"),
        # then the primary's code again, once, for the checkout
        ("-m", "codegen", "regenerate"),
    ], commands
    assert commands[0][1:] == noxfile.COMMITTED_CHECK
    assert [c[0] for c in commands] == (
        ["py-0.26"] * 4 + ["py-0.28"] * 2 + ["py-0.30"] * 2 + ["py-0.26"]
    )
    assert commands[2][1:] == (
        "-m",
        "pytest",
        "tests/unit",
        "tests/upstream",
        "-n",
        noxfile.PARALLEL_WORKERS,
        noxfile.DURATIONS,
    )
    assert commands[3][1:5] == ("-m", "pytest", "tests/cpu", "tests/e2e_cpu")
    assert commands[5][1:] == (
        "-m",
        "pytest",
        "tests/cpu",
        "tests/e2e_cpu",
        "-m",
        noxfile.RELEASE_MARKER,
        noxfile.DURATIONS,
    )
    # one release: no further leg
    assert len(_commands({"0.26.0": "py-0.26"})) == 4
