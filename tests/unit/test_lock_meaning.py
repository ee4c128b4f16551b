"""The lock records what the hand-written runtime means to upstream, not its bytes: an edit that
changes no upstream use (the deployment writer, the command line, a comment, code moved within its
function) leaves the lock and the generated code byte-identical and the fast path up to date; an
edit that adds a call into upstream makes `check` report the lock stale and `regenerate` record the
call, at its file and function, while a finding still names the line the call is on."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen.cli import main
from codegen.generate import LOCK_PATH
from codegen.lock import Place, SiteKind, render_lock
from codegen.model import SymbolRef
from codegen.pipeline import Context, generate, up_to_date, write_output
from codegen.places import Places

from .fake_repo import HEADER, make_repo, write

OVERLAY = (
    HEADER + "\n@subclass()\nclass A(Base):\n"
    "    @override\n    def helper(self, a: int, *, b: int = 2) -> int:\n        return a\n"
)

WORKERS = '''
"""A worker that calls upstream."""

from vllm.layers import Base, make_experts


class Worker(Base):
    def init_device(self) -> None:
        self.experts = make_experts(4, prefix="w")
        self.helper(1, b=3)
'''

RUNTIME = {
    "afd_models/workers.py": WORKERS,
    "afd_models/deploy/k8s.py": '''
        """The deployment writer: no upstream use."""


        def manifest(name: str) -> dict[str, str]:
            return {"name": name}
        ''',
    "afd_models/cli/main.py": '''
        """The command line."""


        def main() -> int:
            return 0
        ''',
}

#: edits that change no upstream use
NO_MEANING = {
    "afd_models/deploy/k8s.py": '''
        """The deployment writer: no upstream use."""


        def manifest(name: str, replicas: int = 1) -> dict[str, str]:
            return {"name": name, "replicas": str(replicas)}


        def service(name: str) -> dict[str, str]:
            return {"service": name}
        ''',
    "afd_models/cli/serve.py": '''
        """A new command."""


        def serve() -> int:
            return 0
        ''',
    "afd_models/workers.py": WORKERS.replace(
        "\n\nclass Worker", "\n# the Attention side\n\n\nclass Worker"
    ).replace(
        "        self.helper(1, b=3)",
        "        # make the helper run once\n\n        self.helper(1, b=3)",
    ),
}

CALL = "        self.helper(1, b=3)\n"
NEW_CALL = CALL + "\n    def step(self, x):\n        return self.forward(x, 2.0)\n"
FORWARD = "vllm.layers:Base.forward"


def _repo(tmp_path: Path) -> Context:
    context = make_repo(tmp_path, OVERLAY)
    write(context.repo_root, RUNTIME)
    generation, _ = generate(context)
    assert not generation.blocked, [f.one_line() for f in generation.findings]
    write_output(context.repo_root, generation)
    return context


def _outputs(context: Context) -> tuple[str, dict[str, str]]:
    generation, _ = generate(context)
    assert generation.lock is not None
    return render_lock(generation.lock), generation.files


def _args(context: Context, *rest: str) -> list[str]:
    upstream = ["--upstream-root", str(context.sources["vllm"].root)]
    return ["--repo", str(context.repo_root), *rest, *upstream]


def test_the_lock_records_runtime_sites_by_file_and_function(tmp_path: Path) -> None:
    """A runtime call is recorded at its file and enclosing function, never at a line."""
    context = _repo(tmp_path)
    generation, _ = generate(context)
    assert generation.lock is not None
    [site] = generation.lock.symbols["vllm.layers:Base.helper"].sites
    assert (site.at, site.how, site.positional, site.keywords) == (
        Place("afd_models/workers.py", "Worker.init_device"),
        SiteKind.CALL,
        1,
        ("b",),
    )
    assert '"at": "afd_models/workers.py:Worker.init_device"' in render_lock(generation.lock)


@pytest.mark.parametrize("changed", sorted(NO_MEANING))
def test_an_edit_that_changes_no_upstream_use_changes_no_lock_byte(
    tmp_path: Path, changed: str
) -> None:
    """The deployment writer, a new command, a comment and moved lines in a worker: the lock and
    the generated code (its registry's inputs digest included) stay byte-identical, and
    `regenerate`'s fast path finds nothing to do."""
    context = _repo(tmp_path)
    before = _outputs(context)
    write(context.repo_root, {changed: NO_MEANING[changed]})
    assert up_to_date(context)
    assert _outputs(context) == before


def test_a_new_call_into_upstream_is_stale_until_regenerated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker edit that adds a call: the fast path is off, `check` blocks on the lock (LCK002),
    `regenerate` records the call at its function, and `check` is clean again."""
    context = _repo(tmp_path)
    workers = context.repo_root / "afd_models/workers.py"
    workers.write_text(workers.read_text().replace(CALL, NEW_CALL))
    assert not up_to_date(context)
    capsys.readouterr()
    assert main(_args(context, "check", "--no-runtime")) == 2
    out = capsys.readouterr().out
    assert "LCK002" in out and str(LOCK_PATH) in out
    assert main(_args(context, "regenerate")) == 0
    assert "up to date" not in capsys.readouterr().err
    generation, _ = generate(context)
    assert generation.lock is not None
    [site] = generation.lock.symbols[FORWARD].sites
    assert site.at == Place("afd_models/workers.py", "Worker.step")
    assert (context.repo_root / LOCK_PATH).read_text() == render_lock(generation.lock)
    assert main(_args(context, "check", "--no-runtime")) == 0


def test_a_finding_names_the_line_the_use_is_on_now(tmp_path: Path) -> None:
    """The line of a recorded call is looked up when it is reported: code moved above it moves
    the line a finding names, and no lock byte."""
    context = _repo(tmp_path)
    workers = context.repo_root / "afd_models/workers.py"
    workers.write_text(workers.read_text().replace(CALL, NEW_CALL))
    generation, _ = generate(context)
    assert generation.lock is not None
    [site] = generation.lock.symbols[FORWARD].sites

    def line() -> int:
        lines = workers.read_text().splitlines()
        return next(n for n, text in enumerate(lines, 1) if "self.forward(" in text)

    assert Places(context.repo_root).location(site, SymbolRef.parse(FORWARD)).line == line()
    workers.write_text(workers.read_text().replace("class Worker", "# moved\n\n\nclass Worker"))
    found = Places(context.repo_root).location(site, SymbolRef.parse(FORWARD))
    assert (found.path, found.line) == ("afd_models/workers.py", line())
    assert _outputs(context)[0] == render_lock(generation.lock)
