"""The run-time uses of hand-written code the lock learns by analysis (issue 55), on a fake
upstream: environment variables, the type of an attribute AFD calls a method on, a dataclass AFD
derives a class from and constructs, a class built through the generated registry, a selection
rule, a module a generated class derives from. Each is recorded at its file and function; a
change that breaks it blocks at the line of this repository that uses it, one that may still work
is a review, one that keeps it valid is info; a comment above a use changes no lock byte, and the
finding names the line the use is on now."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from codegen.drift.compare import compare
from codegen.drift.features import feature_findings, fold
from codegen.drift.ours import locate_ours
from codegen.drift.sides import Side
from codegen.drift.values import operation_severity
from codegen.findings import Finding, Severity
from codegen.index import UpstreamIndex
from codegen.lock import Lock, Place, SiteKind, SymbolKind, render_lock
from codegen.model import SymbolRef
from codegen.pipeline import Context, generate, write_output
from codegen.places import Places
from codegen.sources import UpstreamSource

from .fake_repo import make_repo, write

ENVS = '''
"""Fake environment module."""
import os
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    VLLM_A: bool = False
    VLLM_B: int = 0


def __getattr__(name: str):
    return environment_variables[name]()


environment_variables: dict[str, Callable[[], Any]] = {
    "VLLM_A": lambda: os.environ.get("VLLM_A", "0") == "1",
    "VLLM_B": lambda: int(os.getenv("VLLM_B", "0")),
}
'''

SCHED = '''
"""Fake scheduler."""
from dataclasses import dataclass


@dataclass
class Output:
    ids: list[str]
    index: dict[str, int]
    extra: int = 0


class Scheduler:
    def __init__(self) -> None:
        self.errors: set[str] = set()

    def update(self, out):
        return sorted(self.errors)

    def pick(self):
        if self.errors:
            return "a"
        return "b"
'''

OVERLAY_SCHED = '''
from codegen.markers import contract, override, subclass
from vllm.sched import Scheduler


@subclass(
    feature="failing a lost step",
    relies_on={
        "pick": (
            contract(
                """
                if self.errors:
                    return "a"
                """,
                id="a-when-errors",
                selects="the letter the scheduler picks",
                if_broken="AFD would get another letter",
            ),
        )
    },
)
class AFDScheduler(Scheduler):
    @override
    def update(self, out):
        self.errors.update(["x"])
        return super().update(out)
'''

OVERLAY_LAYERS = """
from codegen.markers import override, subclass
from vllm.layers import Base


@subclass()
class A(Base):
    @override
    def helper(self, a: int, *, b: int = 2) -> int:
        return a
"""

WORKERS = '''
"""Runtime code using upstream values."""
import os

from vllm import envs
from vllm.layers import Base
from vllm.sched import Output

from afd_models.generated_classes import generated_subclass


class Failed(Output):
    """A dataclass of AFD's own, derived from upstream's."""


def build() -> object:
    wrapper = generated_subclass("A", Base)
    return wrapper(4, prefix="p")


def read() -> object:
    flag = envs.VLLM_A
    count = os.environ.get("VLLM_B")
    return flag, count, Failed(ids=[], index={})
'''

#: each kind's recorded use: symbol, how, via, and the text of the line it is on
USES = {
    "environment variable (vllm.envs)": ("vllm.envs:VLLM_A", SiteKind.READ, "vllm.envs", "flag = envs.VLLM_A"),
    "environment variable (os.environ)": ("vllm.envs:VLLM_B", SiteKind.READ, "os.environ", 'os.environ.get("VLLM_B")'),
    "dataclass constructed through a subclass": ("vllm.sched:Output", SiteKind.CONSTRUCT, "subclass:Failed", "Failed(ids=[], index={})"),
    "dataclass subclassed": ("vllm.sched:Output", SiteKind.SUBCLASS, "", "class Failed(Output):"),
    "class built through the registry": ("vllm.layers:Base", SiteKind.CONSTRUCT, "generated_subclass:A", 'wrapper(4, prefix="p")'),
}  # fmt: skip


def _repo(tmp_path: Path) -> Context:
    context = make_repo(tmp_path, OVERLAY_LAYERS, {"vllm/envs.py": ENVS, "vllm/sched.py": SCHED})
    write(
        context.repo_root,
        {"overlay/vllm/sched.py": OVERLAY_SCHED, "afd_models/workers.py": WORKERS},
    )
    generation, _ = generate(context)
    assert not generation.blocked, [f.one_line() for f in generation.findings]
    write_output(context.repo_root, generation)
    return context


def _lock(context: Context) -> Lock:
    generation, _ = generate(context)
    assert generation.lock is not None
    return generation.lock


def _line(context: Context, path: str, text: str) -> int:
    lines = (context.repo_root / path).read_text().splitlines()
    [found] = [n for n, line in enumerate(lines, 1) if text in line]
    return found


def test_the_lock_records_each_kind_of_use(tmp_path: Path) -> None:
    """Each use at its file and function, with its indirection; an environment variable with its
    type, an attribute with its type and what AFD does with it, a dataclass with its fields, a
    selection rule with its choice, a class with its feature."""
    context = _repo(tmp_path)
    lock = _lock(context)
    for symbol, how, via, _ in USES.values():
        sites = lock.symbols[symbol].sites
        assert any(s.how is how and s.via == via for s in sites), (symbol, sites)
        assert all(s.at.file == "afd_models/workers.py" for s in sites)
    variable = lock.symbols["vllm.envs:VLLM_A"]
    assert (variable.kind, variable.description.type) == (SymbolKind.ENVIRONMENT_VARIABLE, "bool")
    [construct] = [
        s for s in lock.symbols["vllm.sched:Output"].sites if s.how is SiteKind.CONSTRUCT
    ]
    assert construct.at == Place("afd_models/workers.py", "read")
    assert construct.keywords == ("ids", "index")
    assert lock.symbols["vllm.sched:Output"].description.init_signature == (
        "(ids: list[str], index: dict[str, int], extra: int = 0)"
    )
    errors = lock.symbols["vllm.sched:Scheduler.errors"]
    assert errors.description.type == "set[str]"
    assert [s.operations for s in errors.sites] == [(".update()",)]
    scheduler = lock.classes["afd_models._generated.vllm.sched:AFDScheduler"]
    assert scheduler.feature == "failing a lost step" and scheduler.declared == "AFDScheduler"
    rule = scheduler.relies_on["pick"]["a-when-errors"]
    assert rule.selects == "the letter the scheduler picks"
    text = render_lock(lock)
    assert '"via": "generated_subclass:A"' in text and '"operations": [' in text


def test_an_environment_read_in_a_module_importing_no_upstream_is_recorded(
    tmp_path: Path,
) -> None:
    """A runtime module that imports nothing of vLLM can still read vLLM's variables through
    ``os.environ``: it is analysed too."""
    context = _repo(tmp_path)
    launcher = 'import os\n\n\ndef flag() -> str | None:\n    return os.environ.get("VLLM_A")\n'
    write(context.repo_root, {"afd_models/launcher.py": launcher})
    sites = _lock(context).symbols["vllm.envs:VLLM_A"].sites
    assert Place("afd_models/launcher.py", "flag") in {s.at for s in sites if s.via == "os.environ"}


@pytest.mark.parametrize("use", sorted(USES))
def test_a_comment_above_a_use_changes_no_lock_and_moves_its_line(tmp_path: Path, use: str) -> None:
    """A comment added above a recorded use: the lock is byte-identical, and the line looked up
    for the use is its new one."""
    context = _repo(tmp_path)
    before = render_lock(_lock(context))
    symbol, how, via, text = USES[use]
    path = "afd_models/workers.py"
    workers = context.repo_root / path
    line = _line(context, path, text)
    lines = workers.read_text().splitlines(keepends=True)
    indent = lines[line - 1][: len(lines[line - 1]) - len(lines[line - 1].lstrip())]
    lines.insert(line - 1, f"{indent}# a comment above the use\n")
    workers.write_text("".join(lines))
    lock = _lock(context)
    assert render_lock(lock) == before
    [site] = [s for s in lock.symbols[symbol].sites if s.how is how and s.via == via]
    found = Places(context.repo_root).location(site, SymbolRef.parse(symbol))
    assert (found.path, found.line) == (path, line + 1)


def _drift(context: Context, tmp_path: Path, changes: dict[str, str | None]) -> list[Finding]:
    """Drift from the fake upstream to a copy with ``changes`` (file -> new text, None: deleted)."""
    generation, index = generate(context)
    assert generation.lock is not None
    lock = generation.lock
    root = tmp_path / "new"
    shutil.copytree(context.sources["vllm"].root, root)
    for relative, text in changes.items():
        if text is None:
            (root / relative).unlink()
        else:
            write(root, {relative: text})
    new_index = UpstreamIndex({"vllm": UpstreamSource("vllm", "0.27.0", root, "tree")})
    old, new = Side("0.26.0", index), Side("0.27.0", new_index)
    places = Places(context.repo_root)
    findings = compare(lock, {}, old, new, places, own=frozenset())
    losses = feature_findings(lock, old, new, "vllm", {"vllm"})
    return locate_ours(losses + fold(findings, lock, losses), places, lock, context.lock_path, old)


def _found(findings: list[Finding], code: str, symbol: str) -> Finding:
    [finding] = [f for f in findings if f.code == code and f.symbol.startswith(symbol)]
    return finding


CHANGES = [
    # (what changed, file, old text, new text, code, severity, the line of ours, its text)
    (
        "an environment variable read through vllm.envs removed",
        "vllm/envs.py",
        '    "VLLM_A": lambda: os.environ.get("VLLM_A", "0") == "1",\n',
        "",
        "DRF024",
        Severity.BLOCK,
        "vllm.envs:VLLM_A",
        ("afd_models/workers.py", "flag = envs.VLLM_A"),
    ),
    (
        "an environment variable read through os.environ removed",
        "vllm/envs.py",
        '    "VLLM_B": lambda: int(os.getenv("VLLM_B", "0")),\n',
        "",
        "DRF024",
        Severity.REVIEW,
        "vllm.envs:VLLM_B",
        ("afd_models/workers.py", 'os.environ.get("VLLM_B")'),
    ),
    (
        "an environment variable parsed another way, its type unchanged",
        "vllm/envs.py",
        '"VLLM_A", "0") == "1"',
        '"VLLM_A", "0") in ("1", "true")',
        "DRF024",
        Severity.INFO,
        "vllm.envs:VLLM_A",
        ("afd_models/workers.py", "flag = envs.VLLM_A"),
    ),
    (
        "a set AFD calls .update() on becomes a dict",
        "vllm/sched.py",
        "self.errors: set[str] = set()",
        "self.errors: dict[str, str] = {}",
        "DRF025",
        Severity.BLOCK,
        "vllm.sched:Scheduler.errors",
        ("overlay/vllm/sched.py", 'self.errors.update(["x"])'),
    ),
    (
        "a set AFD calls .update() on holds another element type",
        "vllm/sched.py",
        "self.errors: set[str] = set()",
        "self.errors: set[int] = set()",
        "DRF025",
        Severity.REVIEW,
        "vllm.sched:Scheduler.errors",
        ("overlay/vllm/sched.py", 'self.errors.update(["x"])'),
    ),
    (
        "a field AFD passes removed",
        "vllm/sched.py",
        "    index: dict[str, int]\n",
        "",
        "DRF023",
        Severity.BLOCK,
        "vllm.sched:Output",
        ("afd_models/workers.py", "Failed(ids=[], index={})"),
    ),
    (
        "a constructor reached through the registry gains a required parameter",
        "vllm/layers.py",
        'def __init__(self, size: int, prefix: str = "") -> None:',
        'def __init__(self, size: int, prefix: str = "", *, owner) -> None:',
        "DRF023",
        Severity.BLOCK,
        "vllm.layers:Base",
        ("afd_models/workers.py", 'wrapper(4, prefix="p")'),
    ),
    (
        "a selection rule changed",
        "vllm/sched.py",
        '        if self.errors:\n            return "a"\n',
        '        if len(self.errors) > 1:\n            return "a"\n',
        "DRF072",
        Severity.BLOCK,
        "vllm.sched:Scheduler.pick#a-when-errors",
        ("overlay/vllm/sched.py", 'id="a-when-errors"'),
    ),
]


@pytest.mark.parametrize(
    ("what", "path", "old", "new", "code", "severity", "symbol", "ours"),
    CHANGES,
    ids=[c[0] for c in CHANGES],
)
def test_a_change_to_a_use_is_judged_at_its_line(
    tmp_path: Path,
    what: str,
    path: str,
    old: str,
    new: str,
    code: str,
    severity: Severity,
    symbol: str,
    ours: tuple[str, str],
) -> None:
    context = _repo(tmp_path)
    text = (context.sources["vllm"].root / path).read_text()
    assert text.count(old) == 1, old
    findings = _drift(context, tmp_path, {path: text.replace(old, new)})
    found = _found(findings, code, symbol)
    assert found.severity is severity, found.verbose()
    assert found.ours is not None
    assert (found.ours.path, found.ours.line) == (ours[0], _line(context, *ours)), found.verbose()


def test_a_variable_afd_sets_parsed_another_way_is_a_review_at_the_setting(
    tmp_path: Path,
) -> None:
    """vLLM parsing a variable another way keeps a reader's value valid (info, the case above),
    but a value AFD sets may no longer parse: a review naming where AFD sets it."""
    context = _repo(tmp_path)
    launcher = 'import os\n\n\ndef prepare() -> None:\n    os.environ["VLLM_A"] = "0"\n'
    write(context.repo_root, {"afd_models/launcher.py": launcher})
    envs = (context.sources["vllm"].root / "vllm/envs.py").read_text()
    parsed = envs.replace('"VLLM_A", "0") == "1"', '"VLLM_A", "0") in ("1", "true")')
    found = _found(
        _drift(context, tmp_path, {"vllm/envs.py": parsed}), "DRF024", "vllm.envs:VLLM_A"
    )
    assert found.severity is Severity.REVIEW, found.verbose()
    assert "AFD sets it at afd_models/launcher.py:5" in found.message, found.verbose()


def test_a_harmless_change_to_a_dataclass_binds_as_before(tmp_path: Path) -> None:
    """A new defaulted field: AFD's construction still binds (no DRF023), and its subclass
    declares no field of its own, so the changed fields are info."""
    context = _repo(tmp_path)
    text = (context.sources["vllm"].root / "vllm/sched.py").read_text()
    changed = text.replace("    extra: int = 0\n", "    extra: int = 0\n    more: int = 1\n")
    findings = _drift(context, tmp_path, {"vllm/sched.py": changed})
    assert not [f for f in findings if f.code == "DRF023"]
    assert _found(findings, "DRF026", "vllm.sched:Output").severity is Severity.INFO


def test_a_deleted_module_is_one_finding_naming_the_feature(tmp_path: Path) -> None:
    """The module a generated class derives from deleted: one DRF080 first, naming the class and
    its feature; the symbol findings it explains are folded under it, still listed."""
    context = _repo(tmp_path)
    envs = (context.sources["vllm"].root / "vllm/envs.py").read_text()
    unrelated = envs.replace('    "VLLM_A": lambda: os.environ.get("VLLM_A", "0") == "1",\n', "")
    findings = _drift(context, tmp_path, {"vllm/sched.py": None, "vllm/envs.py": unrelated})
    assert findings[0].code == "DRF080" and findings[0].symbol == "vllm.sched"
    assert "failing a lost step (AFDScheduler)" in findings[0].message
    folded = [f for f in findings if f.folded_under == "vllm.sched"]
    assert {f.symbol for f in folded} >= {"vllm.sched:Scheduler", "vllm.sched:Scheduler.update"}
    # a change the loss does not explain stays a finding of its own
    assert _found(findings, "DRF024", "vllm.envs:VLLM_A").folded_under is None


@pytest.mark.parametrize(
    ("old", "new", "operation", "severity"),
    [
        (set, dict, ".add()", Severity.BLOCK),  # the new type has no such method
        (set, dict, ".update()", Severity.BLOCK),  # the same name, another meaning
        (dict, list, "[]", Severity.BLOCK),  # an index by key becomes one by position
        (set, dict, "iter", Severity.REVIEW),  # a dict iterates its keys
        (set, frozenset, "iter", Severity.REVIEW),  # the same family
        (list, None, "[]", Severity.REVIEW),  # no container this check knows
    ],
)
def test_a_changed_type_is_judged_per_operation(
    old: type, new: type | None, operation: str, severity: Severity
) -> None:
    """What a container that became another means for each thing AFD does with it."""
    assert operation_severity(old, new, operation) is severity
