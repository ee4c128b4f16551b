"""CI must fail on a commit that changed the overlay but not the lock: `nox -s tests` checks first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import noxfile
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
    root = tracked_copy(tmp_path / "clone")
    clean = _committed_check(root)
    assert clean.returncode == 0, clean.stdout + clean.stderr

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
    # every supported release's lock is checked, not only the primary's
    assert (
        "overlay/overlay.lock" in stale.stdout and "overlay/locks/vllm-0.28.0.lock" in stale.stdout
    )


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
