"""Mutation testing of the drift checker against the real pinned upstream.

    python -m codegen.mutations [--count N] [--seed S] [--json OUT]

Each mutation is one random single edit to a copy of the pinned vLLM source: rename, drop or
reorder a parameter, change a default, delete or duplicate an anchored statement, add a method
named like one of our ``extend``s, change a base, change an inherited body. Mutations of symbols
the lock records must be reported (any finding); mutations of symbols it does not record must
not be (no finding at all). The score is the share of mutations that got the expected answer.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from codegen.drift_cli import run_drift
from codegen.pipeline import Context, generate, open_context

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    """One single edit to one upstream file."""

    #: operator name, e.g. ``rename_param``
    operator: str
    #: the symbol mutated (``module:Class.member``)
    symbol: str
    #: file relative to the source root
    path: str
    #: whether the lock records the symbol (then drift must report it)
    used: bool
    #: 1-based line range replaced, and the new lines
    start: int
    stop: int
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Outcome:
    mutation: Mutation
    codes: tuple[str, ...]

    @property
    def correct(self) -> bool:
        return bool(self.codes) if self.mutation.used else not self.codes


def _function(info_source: str, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef:
    for node in ast.walk(ast.parse(info_source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.lineno == line:
            return node
    raise LookupError(f"no function at line {line}")


def _indent(text: str) -> str:
    return text[: len(text) - len(text.lstrip())]


def _statement_end(lines: list[str], line: int) -> int:
    """Last line (1-based) of the statement starting at ``line``: its deeper-indented continuation
    and closing brackets."""
    indent = _indent(lines[line - 1])
    stop = line
    while (
        stop < len(lines)
        and lines[stop].strip()
        and (_indent(lines[stop]) > indent or lines[stop].strip().startswith((")", "]", "}")))
    ):
        stop += 1
    return stop


class Mutator:
    """Builds mutations from the lock's symbols and from unrelated upstream methods."""

    def __init__(self, context: Context, lock: dict[str, Any], rng: random.Random):
        self.root = context.sources["vllm"].root
        self.lock = lock
        self.rng = rng
        self.methods = {
            key: entry
            for key, entry in lock["symbols"].items()
            if entry.get("kind") == "method" and entry.get("roles") != ["inherited"]
        }

    def _lines(self, path: str) -> list[str]:
        return (self.root / path).read_text().splitlines()

    def _method(self, used: bool) -> tuple[str, str, ast.FunctionDef | ast.AsyncFunctionDef]:
        if used:
            key = self.rng.choice(sorted(self.methods))
            entry = self.methods[key]
            return (
                key,
                entry["file"],
                _function((self.root / entry["file"]).read_text(), entry["line"]),
            )
        candidates = sorted(self.root.joinpath("vllm/model_executor/models").glob("l*.py"))
        path = self.rng.choice(candidates)
        functions = [
            n
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.FunctionDef) and n.args.args
        ]
        node = self.rng.choice(functions)
        return f"{path.name}:{node.name}", path.relative_to(self.root).as_posix(), node

    def make(self, operator: str, used: bool = True) -> Mutation | None:
        build: Callable[[bool], Mutation | None] = getattr(self, f"_{operator}")
        return build(used)

    # --- signature operators --------------------------------------------------------

    def _signature_line_edit(
        self,
        used: bool,
        operator: str,
        change: Callable[[list[ast.arg], ast.arguments], list[str] | None],
    ) -> Mutation | None:
        key, path, node = self._method(used)
        args = (
            node.args.args[1:]
            if node.args.args and node.args.args[0].arg in ("self", "cls")
            else node.args.args
        )
        if not args:
            return None
        lines = self._lines(path)
        start, stop = node.lineno, node.body[0].lineno - 1
        header = "\n".join(lines[start - 1 : stop])
        replaced = change(args, node.args)
        if replaced is None:
            return None
        old, new = replaced
        if old not in header:
            return None
        new_header = header.replace(old, new, 1)
        return Mutation(operator, key, path, used, start, stop, tuple(new_header.splitlines()))

    def _rename_param(self, used: bool) -> Mutation | None:
        def change(args: list[ast.arg], _: ast.arguments) -> list[str] | None:
            arg = self.rng.choice(args)
            return [f"{arg.arg}", f"{arg.arg}_renamed"]

        return self._signature_line_edit(used, "rename_param", change)

    def _change_default(self, used: bool) -> Mutation | None:
        def change(_: list[ast.arg], spec: ast.arguments) -> list[str] | None:
            defaults = [d for d in spec.defaults if isinstance(d, ast.Constant)]
            if not defaults:
                return None
            default = self.rng.choice(defaults)
            old = ast.unparse(default)
            new = {"True": "False", "False": "True", "None": "0", "''": "'x'"}.get(
                old, f"{old}_changed" if isinstance(default.value, str) else "None"
            )
            if isinstance(default.value, str):
                new = repr(default.value + "_changed")
            return [f"= {old}", f"= {new}"] if f"= {old}" else None

        return self._signature_line_edit(used, "change_default", change)

    def _drop_param(self, used: bool) -> Mutation | None:
        key, path, node = self._method(used)
        positional = node.args.args[1:]
        if len(positional) < 1:
            return None
        arg = positional[-1]
        if arg.lineno == node.lineno or node.args.defaults:
            return (
                None  # only parameters on their own line, without defaults to keep the code valid
            )
        return Mutation("drop_param", key, path, used, arg.lineno, arg.lineno, ())

    # --- body operators -------------------------------------------------------------

    def _change_body(self, used: bool) -> Mutation | None:
        key, path, node = self._method(used)
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            if len(node.body) < 2:
                return None
            first = node.body[1]
        lines = self._lines(path)
        line = lines[first.lineno - 1]
        return Mutation(
            "change_body",
            key,
            path,
            used,
            first.lineno,
            first.lineno - 1,
            (f"{_indent(line)}_afd_mutation = 1",),
        )

    def _delete_anchor(self, used: bool) -> Mutation | None:
        anchor = self._anchor()
        if anchor is None:
            return None
        key, path, line = anchor
        lines = self._lines(path)
        stop = _statement_end(lines, line)
        return Mutation(
            "delete_anchor", key, path, True, line, stop, (f"{_indent(lines[line - 1])}pass",)
        )

    def _duplicate_anchor(self, used: bool) -> Mutation | None:
        anchor = self._anchor()
        if anchor is None:
            return None
        key, path, line = anchor
        lines = self._lines(path)
        block = lines[line - 1 : _statement_end(lines, line)]
        return Mutation(
            "duplicate_anchor", key, path, True, line, line + len(block) - 1, tuple(block + block)
        )

    def _anchor(self) -> tuple[str, str, int] | None:
        anchors = []
        for class_key, entry in self.lock["classes"].items():
            for name, member in entry["members"].items():
                for edit_id, anchor in member.get("anchors", {}).items():
                    if len(anchor["lines"]) == 1 and member.get("upstream"):
                        symbol = self.lock["symbols"][member["upstream"]]
                        anchors.append(
                            (f"{class_key}.{name}#{edit_id}", symbol["file"], anchor["lines"][0])
                        )
        return self.rng.choice(sorted(anchors)) if anchors else None

    # --- class operators ------------------------------------------------------------

    def _shadow_extend(self, used: bool) -> Mutation | None:
        extends = []
        for entry in self.lock["classes"].values():
            for name, member in entry["members"].items():
                if member["kind"] == "extend":
                    extends.append((entry["base"], name))
        if not extends:
            return None
        base, name = self.rng.choice(sorted(extends))
        symbol = self.lock["symbols"][base]
        lines = self._lines(symbol["file"])
        line = symbol["line"]
        body_indent = next(_indent(text) for text in lines[line:] if text.strip())
        method = (f"{body_indent}def {name}(self):", f"{body_indent}    return None", "")
        return Mutation(
            "shadow_extend", f"{base}.{name}", symbol["file"], True, line + 1, line, method
        )

    def _change_base(self, used: bool) -> Mutation | None:
        bases = sorted(
            k
            for k, v in self.lock["symbols"].items()
            if v.get("kind") == "class" and "base" in v.get("roles", []) and v.get("bases")
        )
        if not bases:
            return None
        key = self.rng.choice(bases)
        entry = self.lock["symbols"][key]
        lines = self._lines(entry["file"])
        line = lines[entry["line"] - 1]
        if "(" not in line or not line.rstrip().endswith(":"):
            return None
        name = key.split(":")[1]
        return Mutation(
            "change_base",
            key,
            entry["file"],
            True,
            entry["line"],
            entry["line"],
            (f"{_indent(line)}class {name}(object):",),
        )


OPERATORS = (
    "rename_param",
    "change_default",
    "drop_param",
    "change_body",
    "delete_anchor",
    "duplicate_anchor",
    "shadow_extend",
    "change_base",
)
#: operators that also make sense on symbols the overlay does not use (expected: no finding)
UNUSED_OPERATORS = ("rename_param", "change_default", "change_body")


def apply(mutation: Mutation, source_root: Path, work: Path) -> Path:
    """A hard-linked copy of the tree with the one file rewritten."""
    tree = work / "tree"
    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(
        source_root / "vllm",
        tree / "vllm",
        copy_function=os.link,
        ignore=shutil.ignore_patterns("__pycache__", "*.so"),
    )
    target = tree / mutation.path
    lines = target.read_text().splitlines()
    lines[mutation.start - 1 : mutation.stop] = list(mutation.lines)
    target.unlink()
    target.write_text("\n".join(lines) + "\n")
    return tree


def run(count: int, seed: int, progress: Callable[[str], None] = lambda _: None) -> list[Outcome]:
    context = open_context(REPO_ROOT, quiet=True)
    generation, _ = generate(context)
    rng = random.Random(seed)
    mutator = Mutator(context, generation.lock, rng)
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="afd-mutations-") as tmp:
        attempts = 0
        while len(outcomes) < count and attempts < count * 20:
            attempts += 1
            used = rng.random() < 0.8
            operator = rng.choice(OPERATORS if used else UNUSED_OPERATORS)
            mutation = mutator.make(operator, used)
            if mutation is None:
                continue
            tree = apply(mutation, context.sources["vllm"].root, Path(tmp))
            try:
                ast.parse((tree / mutation.path).read_text())
            except SyntaxError:
                continue  # the edit broke the file; not a meaningful mutation
            result = run_drift(REPO_ROOT, context.versions["vllm"], to_root=tree)
            codes = tuple(sorted({f.code for f in result.findings}))
            outcomes.append(Outcome(mutation, codes))
            progress(
                f"{len(outcomes):3d} {mutation.operator:16} {'used' if mutation.used else 'unused':6} {mutation.symbol} -> {', '.join(codes) or 'nothing'}"
            )
    return outcomes


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    used = [o for o in outcomes if o.mutation.used]
    unused = [o for o in outcomes if not o.mutation.used]
    by_operator: dict[str, list[int]] = {}
    for outcome in outcomes:
        by_operator.setdefault(outcome.mutation.operator, [0, 0])
        by_operator[outcome.mutation.operator][0] += outcome.correct
        by_operator[outcome.mutation.operator][1] += 1
    return {
        "mutations": len(outcomes),
        "used_detected": f"{sum(o.correct for o in used)}/{len(used)}",
        "unused_silent": f"{sum(o.correct for o in unused)}/{len(unused)}",
        "score": sum(o.correct for o in outcomes) / len(outcomes) if outcomes else 0.0,
        "by_operator": {k: f"{v[0]}/{v[1]}" for k, v in sorted(by_operator.items())},
        "misses": [asdict(o.mutation) | {"codes": o.codes} for o in outcomes if not o.correct],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m codegen.mutations", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    started = time.monotonic()
    outcomes = run(
        args.count, args.seed, progress=lambda line: print(line, file=sys.stderr, flush=True)
    )
    report = summarize(outcomes) | {
        "seconds": round(time.monotonic() - started, 1),
        "seed": args.seed,
    }
    text = json.dumps(report, indent=2) + "\n"
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0 if report["score"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
