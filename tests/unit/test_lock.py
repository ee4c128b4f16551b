"""The lock's model: one parser, one serializer, symbol uses named for what they are, runtime
imports by file, and a clear refusal of a malformed lock or one of another format."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from codegen.cli import main
from codegen.lock import (
    LOCK_FORMAT,
    LockError,
    LockFormatError,
    SymbolUse,
    parse_lock,
    read_lock,
    render_lock,
)
from codegen.pipeline import generate, write_output

from .fake_repo import HEADER, make_repo

REPO = Path(__file__).resolve().parents[2]
LOCKS = (REPO / "overlay/overlay.lock", REPO / "overlay/locks/vllm-0.28.0.lock")

OVERRIDES = (
    HEADER + "\n@subclass()\nclass A(Base):\n"
    "    @override\n    def helper(self, a: int, *, b: int = 2) -> int:\n"
    "        return super().helper(a, b=b)\n\n"
    "    @override\n    def __init__(self, size: int, prefix: str = '') -> None:\n"
    "        self.size = size\n"
)


def _committed() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(LOCKS[0].read_text())
    return data


@pytest.mark.parametrize("path", LOCKS, ids=lambda p: p.name)
def test_committed_locks_round_trip(path: Path) -> None:
    """Parsing a committed lock and serializing it again gives the same text."""
    lock = read_lock(path)
    assert lock is not None
    assert render_lock(lock) == path.read_text()
    assert parse_lock(json.loads(render_lock(lock))) == lock


def test_runtime_imports_are_recorded_by_file() -> None:
    """A runtime import is recorded by its file, not by its line: moving the import line does not
    rewrite the lock."""
    lock = read_lock(LOCKS[0])
    assert lock is not None
    runtime = [e for e in lock.symbols.values() if SymbolUse.IMPORTED_BY_RUNTIME in e.uses]
    assert runtime
    users = [u for e in runtime for u in e.used_by if u.startswith("afd_models/")]
    assert users and not [u for u in users if re.search(r":\d+$", u)]
    assert all(len(set(e.used_by)) == len(e.used_by) for e in runtime)


def test_overrides_are_recorded_by_whether_they_call_super(tmp_path: Path) -> None:
    """An override calling super() and one that does not are two different uses of upstream."""
    generation, _ = generate(make_repo(tmp_path, OVERRIDES))
    assert not generation.findings, [f.one_line() for f in generation.findings]
    assert generation.lock is not None
    uses = {k.rsplit(".", 1)[-1]: e.uses for k, e in generation.lock.symbols.items()}
    assert SymbolUse.OVERRIDE_CALLING_SUPER in uses["helper"]
    assert SymbolUse.OVERRIDE_NOT_CALLING_SUPER in uses["__init__"]


def test_another_format_is_refused_naming_the_fix() -> None:
    data = _committed()
    data["format"] = LOCK_FORMAT - 1
    with pytest.raises(LockFormatError, match=rf"format {LOCK_FORMAT - 1}; .*`nox -s regenerate`"):
        parse_lock(data, "overlay/overlay.lock")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: d.pop("symbols"), "missing key 'symbols'"),
        (lambda d: next(iter(d["symbols"].values())).pop("uses"), "missing key 'uses'"),
        (
            lambda d: next(iter(d["symbols"].values())).update(uses=["extended"]),
            ".uses: 'extended'",
        ),
        (
            lambda d: next(iter(d["symbols"].values())).update(line="7"),
            ".line: expected an integer",
        ),
        (
            lambda d: next(iter(d["classes"].values())).update(members=[]),
            ".members: expected an object",
        ),
        (
            lambda d: next(v for v in d["symbols"].values() if "sites" in v)["sites"][0].update(
                how="calls"
            ),
            ".sites[0].how: 'calls' is not one of call, construct, read",
        ),
        (  # a site at a line, as format 5 recorded it
            lambda d: next(v for v in d["symbols"].values() if "sites" in v)["sites"][0].update(
                at="afd_models/models/plan.py:39"
            ),
            ".sites[0].at: 'afd_models/models/plan.py:39' is not file:function",
        ),
    ],
)
def test_a_malformed_lock_names_the_key(change: Any, named: str) -> None:
    data = copy.deepcopy(_committed())
    change(data)
    with pytest.raises(LockError, match=re.escape(named)) as error:
        parse_lock(data, "overlay/overlay.lock")
    assert str(error.value).startswith("overlay/overlay.lock")


def test_check_reports_a_lock_of_another_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`codegen check` on a lock of an older format blocks (LCK002) and says to regenerate; the
    regeneration itself reads past it."""
    context = make_repo(tmp_path, OVERRIDES)
    generation, _ = generate(context)
    write_output(context.repo_root, generation)
    path = context.repo_root / "overlay/overlay.lock"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "format": LOCK_FORMAT - 1}))
    upstream = ["--upstream-root", str(context.sources["vllm"].root)]
    assert main(["--repo", str(context.repo_root), "check", "--no-runtime", *upstream]) == 2
    out = capsys.readouterr().out
    assert "LCK002" in out and f"has format {LOCK_FORMAT - 1}" in out
    assert "nox -s regenerate" in out
    assert main(["--repo", str(context.repo_root), "regenerate", *upstream]) == 0
    assert read_lock(path) is not None
