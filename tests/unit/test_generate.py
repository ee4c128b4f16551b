"""The generator on a fake upstream: findings per mistake, golden output, determinism, atomicity."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import libcst as cst
import pytest

from afd_models.generated_registry import GENERATED_ROOT, REGISTRY_PATH
from codegen.generate import LOCK_PATH, calls_super
from codegen.lock import SymbolUse
from codegen.pipeline import Context, generate, up_to_date, write_output

from .fake_repo import HEADER, make_repo, write

GOLDEN = Path(__file__).parent / "golden"

GOOD = (
    HEADER
    + '''

@subclass()
class AFDBase(Base):
    """Experts elsewhere."""

    kind = override_attr("afd")

    @fork(
        insert_after("super().__init__()", "marker = 1", id="marker", why="show an insertion"),
        replace("make_experts($...A, gate=self.gate, $...B)", "make_experts($...A, gate=None, $...B)", id="no-gate", why="test"),
        wrap("if size > 4:\\n    ...\\nelse:\\n    ...", "if marker:", id="guard", why="test"),
    )
    def __init__(self, size: int, prefix: str = "") -> None: ...

    @override
    def helper(self, a: int, *, b: int = 2) -> int:
        return a - b

    @extend
    def afd_only(self) -> str:
        return "afd"


@subclass(bases=("Base", "Child"), name="AFD{base}Forward")
class AFDForward(Base):
    @fork(insert_before("return ...", "x = x", id="touch", why="test"))
    def forward(self, x, scale: float = 1.0): ...
'''
)


def codes(overlay: str, tmp_path: Path) -> list[str]:
    generation, _ = generate(make_repo(tmp_path, HEADER + overlay))
    return sorted(f.code for f in generation.findings)


def test_golden_output(tmp_path: Path) -> None:
    """The generated module for the fake overlay is exactly the reviewed golden file."""
    generation, _ = generate(make_repo(tmp_path, GOOD))
    assert not generation.findings
    text = generation.files[(GENERATED_ROOT / "vllm/layers.py").as_posix()]
    assert text == (GOLDEN / "layers.py.txt").read_text()


def test_fork_takes_the_body_from_the_mro(tmp_path: Path) -> None:
    """A fork of ``forward`` for base Child uses Child's own body; super() names Child."""
    generation, _ = generate(make_repo(tmp_path, GOOD))
    by_name = {c.name: c for c in generation.classes}
    assert str(by_name["AFDChildForward"].members[0].upstream) == "vllm.layers:Child.forward"
    assert str(by_name["AFDBaseForward"].members[0].upstream) == "vllm.layers:Base.forward"
    text = generation.files[(GENERATED_ROOT / "vllm/layers.py").as_posix()]
    assert "super(Child, self).forward(y, scale)" in text


def test_deterministic(tmp_path: Path) -> None:
    """Two generations of the same inputs are byte-identical, files and lock."""
    context = make_repo(tmp_path, GOOD)
    first, _ = generate(context)
    second, _ = generate(context)
    assert first.files == second.files
    assert first.lock == second.lock


def test_write_is_atomic_and_fast_path(tmp_path: Path) -> None:
    """Output replaces the previous output as a whole; a failing write leaves it untouched."""
    context = make_repo(tmp_path, GOOD)
    generation, _ = generate(context)
    write_output(context.repo_root, generation)
    assert up_to_date(context)
    before = {p: p.read_text() for p in (context.repo_root / GENERATED_ROOT).rglob("*.py")}
    broken, _ = generate(context)
    broken.files["afd_models/_generated/vllm/layers.py/impossible.py"] = (
        "x = 1\n"  # a file below a file
    )
    with pytest.raises(OSError):
        write_output(context.repo_root, broken)
    after = {p: p.read_text() for p in (context.repo_root / GENERATED_ROOT).rglob("*.py")}
    assert after == before
    assert not list((context.repo_root / "afd_models").glob(".generated-*"))
    assert (context.repo_root / LOCK_PATH).exists()


def test_up_to_date_notices_overlay_changes(tmp_path: Path) -> None:
    """The no-change fast path is off as soon as an overlay file changes."""
    context = make_repo(tmp_path, GOOD)
    generation, _ = generate(context)
    write_output(context.repo_root, generation)
    overlay = context.repo_root / "overlay/vllm/layers.py"
    overlay.write_text(overlay.read_text() + "\n")
    assert not up_to_date(context)


def test_up_to_date_holds_for_an_upstream_file_with_crlf_line_ends(tmp_path: Path) -> None:
    """vllm-ascend ships files with CRLF line ends: the fast path hashes them as the index read
    them, so a no-change regenerate stays a no-op (it regenerated every time before)."""
    context = make_repo(tmp_path, GOOD)
    layers = context.sources["vllm"].root / "vllm/layers.py"
    layers.write_bytes(layers.read_bytes().replace(b"\n", b"\r\n"))
    generation, _ = generate(context)
    write_output(context.repo_root, generation)
    assert up_to_date(context)
    layers.write_bytes(layers.read_bytes() + b"# changed\r\n")
    assert not up_to_date(context)


@pytest.mark.parametrize(
    ("overlay", "expected"),
    [
        # anchors
        (
            "@subclass()\nclass A(Base):\n    @fork(replace('self.nothing = 1', 'pass', id='x', why='w'))\n"
            "    def __init__(self, size: int, prefix: str = '') -> None: ...",
            ["ANC002"],
        ),
        (  # every lost anchor of a fork at once, not the first only
            "@subclass()\nclass A(Base):\n    @fork(replace('self.nothing = 1', 'pass', id='x', why='w'), "
            "replace('self.nothing = 2', 'pass', id='y', why='w'))\n"
            "    def __init__(self, size: int, prefix: str = '') -> None: ...",
            ["ANC002", "ANC002"],
        ),
        (
            "@subclass()\nclass A(Base):\n    @fork(replace('make_experts(...)', 'None', id='x', why='w'))\n"
            "    def __init__(self, size: int, prefix: str = '') -> None: ...",
            ["ANC003"],
        ),
        (
            "@subclass()\nclass A(Base):\n    @fork(replace('self.x = (', 'pass', id='x', why='w'))\n"
            "    def __init__(self, size: int, prefix: str = '') -> None: ...",
            ["ANC001"],
        ),
        # signatures of forks and overrides
        (
            "@subclass()\nclass A(Base):\n    @fork(delete('self.done = True', id='x', why='w'))\n"
            "    def __init__(self, size: int, prefix: str = 'p') -> None: ...",
            ["SIG005"],
        ),
        (
            "@subclass()\nclass A(Base):\n    @override\n    def helper(self, a: int, *, b: int = 2):\n        return a",
            ["SIG007"],
        ),
        (
            "@subclass()\nclass A(Base):\n    @override(deltas=(delta('return_annotation', upstream='int', ours=None, why='w'),))\n"
            "    def helper(self, a: int, *, b: int = 2):\n        return a",
            [],
        ),
        (
            "@subclass()\nclass A(Base):\n    @override(deltas=(delta('return_annotation', upstream='int', ours=None, why='w'),))\n"
            "    def helper(self, a: int, *, b: int = 2) -> int:\n        return a",
            ["SIG010"],
        ),
        # targets and shadowing
        (
            "@subclass()\nclass A(Base):\n    @override\n    def nowhere(self) -> None:\n        return None",
            ["OVL003"],
        ),
        (
            "@subclass()\nclass A(Base):\n    @extend\n    def helper(self, a: int, *, b: int = 2) -> int:\n        return a",
            ["OVL004"],
        ),
        (
            "@subclass()\nclass A(Base):\n    flag = extend_attr(1)",
            ["OVL001"],
        ),  # extend_attr not imported in HEADER
        ("@subclass()\nclass A(Base):\n    kind = override_attr(1)", []),
        ("@subclass(bases=('Nope',))\nclass A(Base):\n    pass", ["OVL002"]),
        (
            "@subclass(relies_on={'helper': (contract('a + b', id='adds', if_broken='w'),)})\nclass A(Base):\n"
            "    @override\n    def helper(self, a: int, *, b: int = 2) -> int:\n        return a",
            ["OVL001"],
        ),  # relies on a method its override replaces without calling super()
        (
            "@subclass(relies_on={'helper': (contract('a + b', id='adds', if_broken='w'),)})\nclass A(Base):\n"
            "    @override\n    def helper(self, a: int, *, b: int = 2) -> int:\n"
            "        return super().helper(a, b=b)",
            [],
        ),  # an override that runs upstream's body through super() may rely on it
        (
            "@subclass(relies_on={'helper': (contract('a - b', id='subtracts', if_broken='w'),)})\nclass A(Base):\n"
            "    @override\n    def helper(self, a: int, *, b: int = 2) -> int:\n"
            "        return super().helper(a, b=b)",
            ["CTR002"],
        ),
        # contracts of relied-on methods
        (
            "@subclass(relies_on={'helper': (contract('a + b', id='adds', if_broken='w'),)})\nclass A(Base):\n    pass",
            [],
        ),
        (
            "@subclass(relies_on={'helper': (contract('$X + $Y', id='adds', if_broken='w'),)})\nclass A(Base):\n    pass",
            [],
        ),
        (
            "@subclass(relies_on={'helper': (contract('a - b', id='subtracts', if_broken='w'),)})\nclass A(Base):\n    pass",
            ["CTR002"],
        ),
        (
            "@subclass(relies_on={'helper': (contract('a + b', id='adds', if_broken='w', count=2),)})\nclass A(Base):\n    pass",
            ["CTR003"],
        ),
        (
            "@subclass(relies_on={'helper': (contract('a +', id='adds', if_broken='w'),)})\nclass A(Base):\n    pass",
            ["CTR001"],
        ),
        (
            "@subclass(relies_on=('helper',))\nclass A(Base):\n    pass",
            ["OVL001"],
        ),  # names without contracts
        ("@subclass(relies_on={'helper': ()})\nclass A(Base):\n    pass", ["OVL001"]),
        (
            "@subclass(relies_on={'helper': (contract('a + b', id='adds', if_broken=' '),)})\nclass A(Base):\n    pass",
            ["OVL001"],
        ),
        (
            "@subclass(relies_on={'helper': (contract('a', id='x', if_broken='w'), contract('b', id='x', if_broken='w'))})\n"
            "class A(Base):\n    pass",
            ["OVL001"],
        ),
        (
            "@subclass(relies_on={'nowhere': (contract('a', id='x', if_broken='w'),)})\nclass A(Base):\n    pass",
            ["OVL001"],
        ),
        # names
        (
            "@subclass()\nclass A(Base):\n    @override\n    def helper(self, a: int, *, b: int = 2) -> int:\n        return undefined(a)",
            ["OVL006"],
        ),
        (
            "@subclass()\nclass A(Base):\n    @fork(replace('self.done = True', 'self.done = helper_fn()', id='x', why='w'))\n"
            "    def __init__(self, size: int, prefix: str = '') -> None: ...",
            ["OVL006"],
        ),
        # declarations
        (
            "@subclass()\nclass A(Base):\n    def helper(self, a: int, *, b: int = 2) -> int:\n        return a",
            ["OVL001"],
        ),
        (
            "@subclass()\nclass A(Base):\n    @fork()\n    def helper(self, a: int, *, b: int = 2) -> int: ...",
            ["OVL001"],
        ),
        ("@subclass(bases=('Base', 'Child'))\nclass A(Base):\n    pass", ["OVL001"]),
        ("class A(Base):\n    pass", ["OVL001"]),
        ("x = 1 + undefined", ["OVL001"]),
    ],
)
def test_findings_table(overlay: str, expected: list[str], tmp_path: Path) -> None:
    """Each overlay mistake yields exactly its finding code; valid declarations yield none."""
    assert codes(overlay, tmp_path) == expected


def test_name_clash_between_overlay_import_and_upstream(tmp_path: Path) -> None:
    """An overlay import that rebinds a name a forked body uses is a NAME_CLASH."""
    overlay = (
        "from os.path import join as make_experts\n"
        "@subclass()\nclass A(Base):\n    @fork(delete('self.done = True', id='x', why='w'))\n"
        "    def __init__(self, size: int, prefix: str = '') -> None: ..."
    )
    assert codes(overlay, tmp_path) == ["OVL005"]


# --- several releases: when= picks each release's edits ----------------------------------------

ALTERNATIVES = """

@subclass()
class AFDBase(Base):
    @fork(
        replace(
            "make_experts($...A, gate=self.gate, $...B)",
            "make_experts($...A, gate=None, $...B)",
            id="gate",
            why="test",
            when="vllm<0.27",
        ),
        replace(
            "make_experts($...A, gate=self.gate, $...B)",
            "make_experts($...A, gate=0, $...B)",
            id="gate",
            why="test",
            when="vllm>=0.27",
        ),
    )
    def __init__(self, size: int, prefix: str = "") -> None: ...
"""


def at_release(context: Context, version: str) -> Context:
    """``context`` reading the same fake upstream as vLLM ``version``, with pins supporting 0.26.0
    (the primary) and 0.28.0."""
    pin = dataclasses.replace(context.pins["vllm"], also_supported=("0.28.0",))
    source = dataclasses.replace(context.sources["vllm"], version=version)
    return dataclasses.replace(context, pins={"vllm": pin}, sources={"vllm": source})


def test_each_release_gets_its_edits_and_its_lock(tmp_path: Path) -> None:
    """Alternatives sharing an id: each release applies the one its range holds, and the lock of
    a release other than the primary lives in overlay/locks/."""
    context = make_repo(tmp_path, HEADER + ALTERNATIVES)
    module = (GENERATED_ROOT / "vllm/layers.py").as_posix()
    for version, code, lock in (
        ("0.26.0", "gate=None", LOCK_PATH),
        ("0.28.0", "gate=0", Path("overlay/locks/vllm-0.28.0.lock")),
    ):
        generation, _ = generate(at_release(context, version))
        assert not generation.findings, [f.one_line() for f in generation.findings]
        assert f"make_experts(size, {code}, prefix=" in generation.files[module]
        assert generation.lock_path == lock
        assert generation.lock is not None
        entry = generation.lock.classes["afd_models._generated.vllm.layers:AFDBase"]
        assert list(entry.members["__init__"].anchors or {}) == ["gate"]


@pytest.mark.parametrize(
    ("first", "second", "version", "expected"),
    [
        ('when="vllm>=0.26"', 'when="vllm<0.30"', "0.26.0", "must not both apply to one release"),
        ('when="vllm>=0.30"', 'when="vllm>=0.31"', "0.26.0", "a fork needs at least one"),
    ],
)
def test_alternatives_must_cover_each_release_once(
    first: str, second: str, version: str, expected: str, tmp_path: Path
) -> None:
    overlay = ALTERNATIVES.replace('when="vllm<0.27"', first).replace('when="vllm>=0.27"', second)
    generation, _ = generate(make_repo(tmp_path, HEADER + overlay))
    (finding,) = [f for f in generation.findings if expected in f.message]
    assert finding.code == "OVL001" and "vllm 0.26.0" in finding.message


def test_a_range_no_supported_release_holds_is_dead_code(tmp_path: Path) -> None:
    """An alternative for releases outside the support window is refused, naming the window."""
    overlay = ALTERNATIVES.replace('when="vllm>=0.27"', 'when="vllm>=0.40"')
    generation, _ = generate(make_repo(tmp_path, HEADER + overlay))
    (finding,) = generation.findings
    assert finding.code == "OVL001" and finding.symbol.endswith("AFDBase.__init__#gate")
    assert "when='vllm>=0.40' holds none of the supported releases (0.26.0)" in finding.message


def test_a_range_of_an_unpinned_package_is_refused(tmp_path: Path) -> None:
    overlay = ALTERNATIVES.replace('when="vllm>=0.27"', 'when="vlm>=0.27"')
    generation, _ = generate(make_repo(tmp_path, HEADER + overlay))
    messages = [f.message for f in generation.findings if f.code == "OVL001"]
    assert "when='vlm>=0.27' names no pinned package; allowed: vllm" in messages


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('when="vllm<0.27",', ""), "edits may share an id only as per-release alternatives"),
        (('when="vllm<0.27"', 'when="vllm=<0.27"'), "when='vllm=<0.27'"),
    ],
)
def test_bad_alternatives_are_refused_when_loading(
    change: tuple[str, str], expected: str, tmp_path: Path
) -> None:
    generation, _ = generate(make_repo(tmp_path, HEADER + ALTERNATIVES.replace(*change)))
    messages = [f.message for f in generation.findings if f.code == "OVL001"]
    assert any(expected in m for m in messages), messages


DELTA_BEFORE_028 = """

@subclass()
class AFDBase(Base):
    @override(
        deltas=(
            delta(
                "param_added",
                "extra",
                ours="extra: bool = False",
                why="a later release added it",
                when="vllm<0.28",
            ),
        )
    )
    def helper(self, a: int, *, b: int = 2, extra: bool = False) -> int:
        return a
"""


def test_a_delta_explains_the_difference_on_its_releases_only(tmp_path: Path) -> None:
    """A delta with ``when=`` applies on the releases of its range (and is in their lock only);
    on another release the difference it explained is unexplained again (the fake upstream has
    no ``extra`` on any release)."""
    context = make_repo(tmp_path, HEADER + DELTA_BEFORE_028)
    generation, _ = generate(at_release(context, "0.26.0"))
    assert not generation.findings, [f.one_line() for f in generation.findings]
    assert generation.lock is not None
    member = generation.lock.classes["afd_models._generated.vllm.layers:AFDBase"].members
    assert member["helper"].deltas == ("param_added extra: None -> 'extra: bool = False'",)
    generation, _ = generate(at_release(context, "0.28.0"))
    assert [f.code for f in generation.findings] == ["SIG001"]
    assert "extra" in generation.findings[0].message


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        (
            "vllm>=0.40",
            "when='vllm>=0.40' holds none of the supported releases (0.26.0); drop the delta",
        ),
        ("vllm=<0.28", "when='vllm=<0.28'"),
        ("vlm<0.28", "when='vlm<0.28' names no pinned package; allowed: vllm"),
    ],
)
def test_a_delta_range_must_be_valid_and_hold_a_release(
    when: str, expected: str, tmp_path: Path
) -> None:
    overlay = DELTA_BEFORE_028.replace('when="vllm<0.28"', f'when="{when}"')
    generation, _ = generate(make_repo(tmp_path, HEADER + overlay))
    messages = [f.message for f in generation.findings if f.code == "OVL001"]
    assert any(expected in m for m in messages), [f.one_line() for f in generation.findings]


# --- when= on members: a member exists on the releases of its range only -----------------------

MEMBER_ALTERNATIVES = """

@subclass()
class AFDBase(Base):
    @override(when="vllm<0.28")
    def helper(self, a: int, *, b: int = 2) -> int:
        return a

    @fork(delete("self.done = True", id="not-done", why="test"), when="vllm>=0.28")
    def __init__(self, size: int, prefix: str = "") -> None: ...

    @extend(when="vllm>=0.28")
    def afd_only_later(self) -> int:
        return 1

    kind = override_attr("afd", when="vllm<0.28")
"""


def test_each_release_gets_the_members_of_its_range(tmp_path: Path) -> None:
    """Members limited by when= are generated, checked and locked on their releases only; the
    others keep inheriting upstream's."""
    context = make_repo(tmp_path, HEADER + MEMBER_ALTERNATIVES)
    key = "afd_models._generated.vllm.layers:AFDBase"
    for version, members in (
        ("0.26.0", ["helper", "kind"]),
        ("0.28.0", ["__init__", "afd_only_later"]),
    ):
        generation, _ = generate(at_release(context, version))
        assert not generation.findings, [f.one_line() for f in generation.findings]
        assert generation.lock is not None
        entry = generation.lock.classes[key]
        assert sorted(entry.members) == members
        text = generation.files[(GENERATED_ROOT / "vllm/layers.py").as_posix()]
        assert ("def afd_only_later" in text) == (version == "0.28.0")
        # the fork of __init__ (0.28.0 only) drops the statement its edit deletes
        assert ("def __init__" in text) == (version == "0.28.0")
        assert "self.done = True" not in text
        assert ("helper" in entry.inherited) == (version == "0.28.0")


@pytest.mark.parametrize(
    ("overlay", "expected"),
    [
        # one name twice, the second without a range
        (
            "    @override(when='vllm<0.28')\n    def helper(self, a: int, *, b: int = 2) -> int:\n"
            "        return a\n\n    @override\n    def helper(self, a: int, *, b: int = 2) -> int:\n"
            "        return b\n",
            "members may share a name only as per-release alternatives",
        ),
        # both ranges hold 0.26.0
        (
            "    @override(when='vllm<0.28')\n    def helper(self, a: int, *, b: int = 2) -> int:\n"
            "        return a\n\n    @override(when='vllm<0.30')\n"
            "    def helper(self, a: int, *, b: int = 2) -> int:\n        return b\n",
            "2 declarations of 'helper' apply to vllm 0.26.0",
        ),
        (
            "    @extend(when='vllm>=0.40')\n    def later(self) -> int:\n        return 1\n",
            "when='vllm>=0.40' holds none of the supported releases (0.26.0, 0.28.0); drop the member",
        ),
        (
            "    @extend(when='vlm>=0.28')\n    def later(self) -> int:\n        return 1\n",
            "when='vlm>=0.28' names no pinned package; allowed: vllm",
        ),
        (
            "    kind = override_attr('afd', when='vllm=<0.28')\n",
            "when='vllm=<0.28'",
        ),
        (
            "    @extend(7)\n    def later(self) -> int:\n        return 1\n",
            "@extend takes only when=...",
        ),
    ],
)
def test_member_ranges_must_be_valid_hold_a_release_and_not_overlap(
    overlay: str, expected: str, tmp_path: Path
) -> None:
    context = make_repo(tmp_path, HEADER + "\n@subclass()\nclass AFDBase(Base):\n" + overlay)
    generation, _ = generate(at_release(context, "0.26.0"))
    messages = [f.message for f in generation.findings if f.code == "OVL001"]
    assert any(expected in m for m in messages), [f.one_line() for f in generation.findings]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("return super().load_weights(weights)", True),
        # handed on as a bound method: upstream's loader still runs inside ours
        ("return load_role_weights(self, super().load_weights, weights)", True),
        ("return super().other(weights)", False),
        ("return self.load_weights(weights)", False),
    ],
)
def test_calls_super_counts_a_call_or_a_bound_super_method(body: str, expected: bool) -> None:
    node = cst.parse_statement(f"def load_weights(self, weights):\n    {body}\n")
    assert calls_super(node, "load_weights") is expected


# --- contracts on a method outside the class's MRO (relies_on key "module:Class.method") -------

#: a fake upstream config whose property decides what a worker builds
CONFIG = '''
"""Fake upstream config."""


def read_setting():
    return None


class Config:
    @property
    def use_v2(self) -> bool:
        setting = read_setting()
        if setting is not None:
            return setting
        return False


class Derived(Config):
    pass
'''
OUTSIDE = "vllm.config:Config.use_v2"


def outside(
    key: str = OUTSIDE, pattern: str = "if setting is not None:\n    return setting", **kw: str
) -> str:
    extra = "".join(f", {name}={value!r}" for name, value in kw.items())
    return (
        f"\n@subclass(relies_on={{{key!r}: (contract({pattern!r}, id='setting', if_broken='w'{extra}),)}})\n"
        "class AFDBase(Base):\n    pass\n"
    )


def test_a_contract_outside_the_class_is_checked_and_locked(tmp_path: Path) -> None:
    """A class may rely on an upstream method it neither inherits nor overrides (the property
    that picks what vLLM builds): its contracts are checked on the pinned body and locked, and
    the method's symbol is recorded as relied on outside the MRO, for drift."""
    generation, _ = generate(make_repo(tmp_path, HEADER + outside(), {"vllm/config.py": CONFIG}))
    assert not generation.findings, [f.one_line() for f in generation.findings]
    assert generation.lock is not None
    entry = generation.lock.classes["afd_models._generated.vllm.layers:AFDBase"]
    assert list(entry.relies_on) == [OUTSIDE]
    assert entry.relies_on[OUTSIDE]["setting"].lines == (12,)
    assert SymbolUse.RELIED_ON_OUTSIDE in generation.lock.symbols[OUTSIDE].uses
    module = generation.files[(GENERATED_ROOT / "vllm/layers.py").as_posix()]
    assert f"relies on, outside its MRO: {OUTSIDE}" in module


@pytest.mark.parametrize(
    ("overlay", "code", "expected"),
    [
        (outside(pattern="return True"), "CTR002", "matches 0 place(s)"),
        (outside("vllm.config:Config.nowhere"), "OVL001", "not a method upstream defines"),
        # inherited by Derived: name the class that defines it
        (outside("vllm.config:Derived.use_v2"), "OVL001", "name the class that defines it"),
        (outside("vllm.config:use_v2"), "OVL001", "named 'module:Class.method'"),
        (outside(when="vllm>=0.40"), "OVL001", "holds none of the supported releases"),
        (outside(when="vllm=<0.40"), "OVL001", "when='vllm=<0.40'"),
    ],
)
def test_a_bad_outside_contract_is_refused(
    overlay: str, code: str, expected: str, tmp_path: Path
) -> None:
    generation, _ = generate(make_repo(tmp_path, HEADER + overlay, {"vllm/config.py": CONFIG}))
    found = [f for f in generation.findings if f.code == code and expected in f.message]
    assert found, [f.one_line() for f in generation.findings]


def test_a_contract_is_checked_and_locked_on_the_releases_of_its_range(tmp_path: Path) -> None:
    """A contract with ``when=`` holds on its releases only: the other releases neither check
    it (it would not match there) nor lock it."""
    overlay = outside(pattern="return False", when="vllm<0.28")
    context = make_repo(tmp_path, HEADER + overlay, {"vllm/config.py": CONFIG})
    generation, _ = generate(at_release(context, "0.26.0"))
    assert not generation.findings, [f.one_line() for f in generation.findings]
    assert generation.lock is not None
    assert generation.lock.classes["afd_models._generated.vllm.layers:AFDBase"].relies_on
    later = context.sources["vllm"].root / "vllm/config.py"
    later.write_text(later.read_text().replace("        return False\n", "        return True\n"))
    generation, _ = generate(at_release(context, "0.28.0"))
    assert not generation.findings, [f.one_line() for f in generation.findings]
    assert generation.lock is not None
    assert not generation.lock.classes["afd_models._generated.vllm.layers:AFDBase"].relies_on


def test_a_method_is_relied_on_only_where_one_of_its_contracts_holds(tmp_path: Path) -> None:
    """An inherited method whose only contract is for older releases is plain inherited on a
    later one: drift would otherwise ask for a review of every body change ("no contract
    states how"), and the generated class would list it as relied on."""
    overlay = (
        "\n@subclass(relies_on={'helper': (contract('a + b', id='adds', if_broken='w', "
        "when='vllm<0.28'),)})\nclass AFDBase(Base):\n    pass\n"
    )
    context = make_repo(tmp_path, HEADER + overlay)
    helper = "vllm.layers:Base.helper"
    module = (GENERATED_ROOT / "vllm/layers.py").as_posix()
    for version, use in (
        ("0.26.0", SymbolUse.INHERITED_RELIED_ON),
        ("0.28.0", SymbolUse.INHERITED),
    ):
        generation, _ = generate(at_release(context, version))
        assert not generation.findings, [f.one_line() for f in generation.findings]
        assert generation.lock is not None
        assert generation.lock.symbols[helper].uses == frozenset({use})
        listed = "relies on inherited: helper" in generation.files[module]
        assert listed is (use is SymbolUse.INHERITED_RELIED_ON)


CLASS_FROM_028 = """

@subclass(when="vllm>=0.28")
class AFDLater(Base):
    @extend
    def afd_later(self) -> int:
        return 1
"""


def test_a_class_is_generated_checked_and_locked_on_the_releases_of_its_range(
    tmp_path: Path,
) -> None:
    """A class limited by when= (an upstream class older releases lack, such as Model Runner V2's
    micro-batch runner from vLLM 0.30) exists on its releases only; an overlay module none of
    whose classes applies mirrors nothing there, so its upstream module need not exist."""
    context = make_repo(tmp_path, HEADER + CLASS_FROM_028)
    write(context.repo_root, {"overlay/vllm/later.py": HEADER + CLASS_FROM_028})
    key = "afd_models._generated.vllm.layers:AFDLater"
    generation, _ = generate(at_release(context, "0.26.0"))
    assert not generation.findings, [f.one_line() for f in generation.findings]
    assert generation.lock is not None and key not in generation.lock.classes
    assert not any(path.endswith(("vllm/layers.py", "vllm/later.py")) for path in generation.files)
    assert "AFDLater" not in generation.files[REGISTRY_PATH.as_posix()]
    generation, _ = generate(at_release(context, "0.28.0"))
    (missing,) = generation.findings  # vllm/later.py is mirrored from 0.28 on: it must exist
    assert (
        missing.code == "OVL001"
        and "mirrors vllm.later, which the pinned upstream" in missing.message
    )
    (tmp_path / "repo/overlay/vllm/later.py").unlink()
    generation, _ = generate(at_release(context, "0.28.0"))
    assert not generation.findings, [f.one_line() for f in generation.findings]
    assert generation.lock is not None and "afd_later" in generation.lock.classes[key].members
    assert (
        "class AFDLater(Base)" in generation.files[(GENERATED_ROOT / "vllm/layers.py").as_posix()]
    )


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        (
            "vllm>=0.40",
            "when='vllm>=0.40' holds none of the supported releases (0.26.0, 0.28.0); drop the class",
        ),
        ("vllm=>0.28", "class AFDLater: when='vllm=>0.28'"),
    ],
)
def test_a_class_range_must_be_valid_and_hold_a_release(
    when: str, expected: str, tmp_path: Path
) -> None:
    overlay = CLASS_FROM_028.replace('when="vllm>=0.28"', f'when="{when}"')
    generation, _ = generate(at_release(make_repo(tmp_path, HEADER + overlay), "0.26.0"))
    messages = [f.message for f in generation.findings if f.code == "OVL001"]
    assert any(expected in m for m in messages), messages


def test_a_member_range_must_hold_a_release_of_its_class(tmp_path: Path) -> None:
    """A member of a class limited to vllm>=0.28 whose own range holds only 0.26 would never be
    generated: refused like a dead range, naming the class's releases."""
    overlay = CLASS_FROM_028.replace("    @extend\n", '    @extend(when="vllm<0.28")\n')
    generation, _ = generate(at_release(make_repo(tmp_path, HEADER + overlay), "0.28.0"))
    messages = [f.message for f in generation.findings if f.code == "OVL001"]
    assert messages == [
        "when='vllm<0.28' holds none of the releases its class is generated for (0.28.0); "
        "drop the member or the range"
    ]


def test_drift_counts_a_limited_class_member_only_on_the_releases_of_its_class(
    tmp_path: Path,
) -> None:
    """Drift judges a target by what the overlay declares for it: the member of a class limited
    to vllm>=0.28 is declared elsewhere (not there) on 0.26.0, and there on 0.28.0."""
    from codegen.drift_run import overlay_members

    context = make_repo(tmp_path, HEADER + CLASS_FROM_028)
    key = "afd_models._generated.vllm.layers:AFDLater.afd_later"
    before = overlay_members(context.repo_root, {"vllm": "0.26.0"})
    after = overlay_members(context.repo_root, {"vllm": "0.28.0"})
    assert key in before.every and key in before.elsewhere
    assert key in after.every and key not in after.elsewhere
