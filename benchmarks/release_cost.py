"""The cost of a release: overlay lines that exist for some supported vLLM releases only.

    python benchmarks/release_cost.py

Every marker call in ``overlay/`` with a ``when=`` (a member, an edit, a delta, a contract) is a
declaration some supported release needs and another does not; its source lines (a member's whole
definition, an edit's, delta's or contract's call) are what supporting that release costs. For each
supported release the table counts the lines whose range holds it without holding every release
(what it adds to the common overlay) and the lines whose range holds it alone. Goal
(docs/benchmarks.md): at most 60 lines per release. A whole class limited by
``@subclass(when=...)`` is counted apart: it subclasses an upstream class that older releases
lack (Model Runner V2's helpers from vLLM 0.30), new surface rather than a difference to follow.
Reads source only; nothing is imported.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from _results import write_section

from codegen.overlay import overlay_files
from codegen.releases import parse_range
from codegen.sources import load_pins

REPO = Path(__file__).resolve().parent.parent
GOAL_LINES = 60
#: method markers: their ``when=`` limits a whole method (its decorators and body count)
METHOD_MARKERS = {"override", "fork", "extend"}
#: call markers: their ``when=`` limits the call's own lines (an edit, a delta, an attribute,
#: a contract)
CALL_MARKERS = {
    "replace",
    "insert_before",
    "insert_after",
    "delete",
    "wrap",
    "delta",
    "override_attr",
    "extend_attr",
    "contract",
}


@dataclass(frozen=True)
class Limited:
    """Source lines that exist for the releases of one ``when=`` range."""

    path: str
    when: str
    lines: frozenset[int]
    #: a whole ``@subclass(when=...)`` class: new surface of the releases whose upstream has the
    #: class (Model Runner V2's helpers from vLLM 0.30), not a difference between releases
    whole_class: bool = False
    #: the range of the limited class it is declared in (it holds only where both hold)
    within: str | None = None

    def holds(self, release: str) -> bool:
        ranges = [self.when] if self.within is None else [self.when, self.within]
        return all(parse_range(text).contains(release) for text in ranges)


def _when(call: ast.Call) -> str | None:
    for keyword in call.keywords:
        if keyword.arg == "when" and isinstance(keyword.value, ast.Constant):
            return str(keyword.value.value)
    return None


def _marker(call: ast.Call) -> str | None:
    return call.func.id if isinstance(call.func, ast.Name) else None


def limited_lines(path: Path) -> list[Limited]:
    """Every ``when=``-limited declaration of one overlay file, with its lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    relative = path.relative_to(REPO).as_posix()
    found: list[Limited] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            calls = [d for d in node.decorator_list if isinstance(d, ast.Call)]
            for marker in (d for d in calls if _marker(d) == "subclass"):
                if (when := _when(marker)) is not None:
                    assert node.end_lineno is not None
                    first = min(d.lineno for d in node.decorator_list)
                    lines = frozenset(range(first, node.end_lineno + 1))
                    found.append(Limited(relative, when, lines, whole_class=True))
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min((d.lineno for d in node.decorator_list), default=node.lineno)
            calls = [d for d in node.decorator_list if isinstance(d, ast.Call)]
            markers = [d for d in calls if _marker(d) in METHOD_MARKERS]
        elif isinstance(node, ast.Call) and _marker(node) in CALL_MARKERS:
            first, markers = node.lineno, [node]
        else:
            continue
        for marker in markers:
            when = _when(marker)
            if when is not None:
                assert node.end_lineno is not None
                found.append(Limited(relative, when, frozenset(range(first, node.end_lineno + 1))))
    classes = [item for item in found if item.whole_class]
    return [
        item
        if item.whole_class
        else next(
            (
                dataclasses.replace(item, within=c.when)
                for c in classes
                if min(item.lines) in c.lines
            ),
            item,
        )
        for item in found
    ]


def main() -> None:
    supported = load_pins(REPO / "overlay" / "pins.toml")["vllm"].supported
    paths = [REPO / p for p in overlay_files(REPO)]
    total = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in paths)
    limited = [item for path in paths for item in limited_lines(path)]
    per_release: dict[str, set[tuple[str, int]]] = {r: set() for r in supported}
    alone: dict[str, set[tuple[str, int]]] = {r: set() for r in supported}
    classes: dict[str, set[tuple[str, int]]] = {r: set() for r in supported}
    for item in limited:
        holds = [r for r in supported if item.holds(r)]
        if len(holds) == len(supported):
            continue  # a range that holds every supported release limits nothing (yet)
        lines = {(item.path, line) for line in item.lines}
        for release in holds:
            if item.whole_class:
                classes[release] |= lines
                continue
            per_release[release] |= lines
            if len(holds) == 1:
                alone[release] |= lines
    every = {(i.path, line) for i in limited for line in i.lines}
    rows = [
        "| vLLM release | lines limited to ranges holding it | of them, for it alone | goal "
        "| whole classes of upstream classes older releases lack |",
        "| --- | --- | --- | --- | --- |",
    ]
    for release in supported:
        count = len(per_release[release])
        mark = "met" if count <= GOAL_LINES else "missed"
        rows.append(
            f"| {release} | {count} | {len(alone[release])} | <= {GOAL_LINES}: {mark} "
            f"| {len(classes[release] - per_release[release])} |"
        )
    by_range: dict[tuple[str, str], set[int]] = {}
    for item in limited:
        by_range.setdefault((item.path, item.when), set()).update(item.lines)
    detail = [
        "| overlay file | `when=` | lines |",
        "| --- | --- | --- |",
        *(
            f"| `{path}` | `{when}` | {len(lines)} |"
            for (path, when), lines in sorted(by_range.items())
        ),
    ]
    body = "\n".join(
        [
            f"The overlay is {total} lines in {len(paths)} files; {len(every)} of them are limited "
            f"by `when=` to some of the supported releases ({', '.join(supported)}).",
            "",
            *rows,
            "",
            *detail,
        ]
    )
    write_section("release_cost", body)


if __name__ == "__main__":
    main()
