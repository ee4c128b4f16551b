"""The cost of a release: overlay lines that exist for some supported vLLM releases only.

    python benchmarks/release_cost.py

Every marker call in ``overlay/`` with a ``when=`` (a member, an edit, a delta, a contract) is a
declaration some supported release needs and another does not; its source lines (a member's whole
definition, an edit's, delta's or contract's call) are what supporting that release costs. For each
supported release the table counts the lines whose range holds it without holding every release
(what it adds to the common overlay) and the lines whose range holds it alone. Goal
(docs/benchmarks.md): at most 60 lines per release. Reads source only; nothing is imported.
"""

from __future__ import annotations

import ast
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
    return found


def main() -> None:
    supported = load_pins(REPO / "overlay" / "pins.toml")["vllm"].supported
    paths = [REPO / p for p in overlay_files(REPO)]
    total = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in paths)
    limited = [item for path in paths for item in limited_lines(path)]
    per_release: dict[str, set[tuple[str, int]]] = {r: set() for r in supported}
    alone: dict[str, set[tuple[str, int]]] = {r: set() for r in supported}
    for item in limited:
        holds = [r for r in supported if parse_range(item.when).contains(r)]
        if len(holds) == len(supported):
            continue  # a range that holds every supported release limits nothing (yet)
        for release in holds:
            per_release[release] |= {(item.path, line) for line in item.lines}
            if len(holds) == 1:
                alone[release] |= {(item.path, line) for line in item.lines}
    every = {(i.path, line) for i in limited for line in i.lines}
    rows = [
        "| vLLM release | lines limited to ranges holding it | of them, for it alone | goal |",
        "| --- | --- | --- | --- |",
    ]
    for release in supported:
        count = len(per_release[release])
        mark = "met" if count <= GOAL_LINES else "missed"
        rows.append(f"| {release} | {count} | {len(alone[release])} | <= {GOAL_LINES}: {mark} |")
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
