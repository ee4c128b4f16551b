"""What every tool's command line shares: usage errors and the crash guard that give
the project's exit codes (:class:`afd_models.commandline.ExitCode`, the table in docs/maintainers.md:
0 clean, 2 a check found a real problem, 3 bad usage or a tool error), progress lines and the
atomic JSON report. No tool has review-only findings (1)."""

from __future__ import annotations

import json
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from afd_models.commandline import ExitCode


class UsageError(Exception):
    """Bad arguments, or a host that cannot run the command; the message says what to pass or fix."""


def log(tag: str, message: str) -> None:
    """A progress line on stderr: ``[tag HH:MM:SS] message``."""
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def exit_on_sigterm() -> None:
    """SIGTERM ends the command as Ctrl-C does, by an exception, so that every ``finally`` runs
    and stops the engines it started (Python's default would end it at once and leave them)."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def guarded(prog: str, run: Callable[[], int]) -> int:
    """``run()``'s exit code; a UsageError is 3 with its message, any other exception 3 with its
    traceback (a crash is never a pass, nor a check's finding)."""
    try:
        return run()
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except Exception:
        traceback.print_exc()
        print(f"{prog}: internal error: the tool itself crashed (exit 3)", file=sys.stderr)
        return ExitCode.ERROR


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path``, written to a temporary file and renamed into place: a reader (the
    parent of a child, a later install) never sees half a file."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    partial.replace(path)


def write_json(data: Mapping[str, Any], path: Path) -> None:
    """``data`` as indented JSON at ``path``, written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(data, indent=2) + "\n").encode())
