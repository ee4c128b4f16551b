"""Mutation testing of the drift checker against the real pinned upstream.

    python benchmarks/mutations.py [--count N] [--seed S] [--json OUT]

Each mutation is one random single edit to a copy of the pinned vLLM source. A mutation of a
symbol the lock records counts as detected only when drift reports the finding code that names
the break; other findings do not count:

==================  ==========================================================================
rename_param        DRF012 (DRF022 for a method AFD's code only calls: :func:`_signature_code`)
change_default      DRF015 (idem)
drop_param          DRF011 (idem)
change_body         by the method's uses (:func:`_body_code`): a fork DRF032 (DRF030 when the
                    new line splits anchored statements), an overridden method DRF020, an
                    inherited or relied-on one DRF021
delete_anchor       DRF030
duplicate_anchor    DRF031
break_contract      DRF070 (DRF071 when the contract still holds in another of its places)
change_rule         the same, for a rule outside the generated classes' MRO that AFD relies on
                    (which runner vLLM builds, the CPU KV block size)
shadow_extend       DRF040
change_base         DRF041
rename_keyword      DRF023: a parameter AFD's code passes by keyword renamed
require_param       DRF023: a class AFD's code constructs gains a required keyword-only parameter
rename_attribute    DRF001: an attribute AFD's code reads (``self.x = ...`` upstream) renamed
rename_env          DRF024: an environment variable AFD reads or sets renamed in its table
change_type         DRF025: an attribute AFD calls a method on, indexes or iterates becomes
                    another container (a set a dict, a dict a list)
drop_field          DRF023: a field AFD passes to a field-built class (``@dataclass``,
                    ``NamedTuple``) it constructs removed
add_field           DRF023: such a class gains a required field
change_selection    DRF072: a selection rule (``contract(selects=...)``) no longer holds
delete_module       DRF080: a module a generated class derives from, the overlay mirrors or the
                    runtime imports deleted
registry_param      DRF023: a class AFD builds through ``generated_subclass(...)`` gains a
                    required keyword-only parameter
==================  ==========================================================================

The new kinds draw at sites the issue that introduced them does not name (:data:`ISSUE_SITES`),
so that they show the checker, not its examples.

The signature, body and attribute operators also edit functions and methods that the lock does
not record, in the upstream files it tracks; those must get no finding at all. The score is the share of
mutations that got the expected answer.
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codegen.drift.contracts import relied_ref
from codegen.drift.symbols import is_callee
from codegen.drift_run import run_drift
from codegen.lock import (
    OVERRIDES,
    RELIED_ON,
    Lock,
    SiteKind,
    SymbolEntry,
    SymbolKind,
    SymbolUse,
)
from codegen.model import MemberKind, SymbolRef
from codegen.pattern import parse_pattern
from codegen.pipeline import Context, generate, open_context
from codegen.upstream_values import builds_fields

REPO_ROOT = Path(__file__).resolve().parent.parent

Function = ast.FunctionDef | ast.AsyncFunctionDef

#: the uses issue 55 names as its examples: its operators draw elsewhere
ISSUE_SITES = frozenset(
    {
        "vllm.envs:VLLM_USE_V2_MODEL_RUNNER",
        "vllm.v1.core.sched.scheduler:Scheduler.grammar_compile_error_reqs",
        "vllm.v1.outputs:ModelRunnerOutput",
        "vllm.v1.worker.cpu_worker:CPUWorker.init_device",
        "vllm.v1.worker.gpu_model_runner",
        "vllm.v1.worker.cpu_model_runner",
        "vllm.v1.worker.gpu_ubatch_wrapper",
        "vllm.v1.worker.gpu_input_batch",
    }
)
#: a container of another family for each, as ``change_type`` rewrites an annotation and value
_OTHER_CONTAINER = {
    "set": ("dict[str, object]", "{}"),
    "frozenset": ("dict[str, object]", "{}"),
    "dict": ("list[object]", "[]"),
    "list": ("dict[str, object]", "{}"),
    "tuple": ("dict[str, object]", "{}"),
}


@dataclass(frozen=True)
class Mutation:
    """One single edit to one upstream file."""

    #: operator name, e.g. ``rename_param``
    operator: str
    #: the symbol mutated (``module:Class.member``, ``...#edit-id`` for anchors and contracts)
    symbol: str
    #: file relative to the source root
    path: str
    #: the finding code drift must report; None for a symbol the lock does not record (then
    #: drift must report nothing at all)
    expected: str | None
    #: 1-based line range replaced (``stop == start - 1`` inserts before ``start``), and the new lines
    start: int
    stop: int
    lines: tuple[str, ...]
    #: the whole file is deleted instead (``delete_module``)
    deletes: bool = False

    @property
    def used(self) -> bool:
        """Whether the lock records the symbol."""
        return self.expected is not None

    def apply(self, text: str) -> str:
        lines = text.splitlines()
        lines[self.start - 1 : self.stop] = list(self.lines)
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Outcome:
    mutation: Mutation
    codes: tuple[str, ...]

    @property
    def correct(self) -> bool:
        if self.mutation.expected is None:
            return not self.codes
        return self.mutation.expected in self.codes


def _require_keyword(args: ast.arguments) -> bool:
    """Add a required keyword-only parameter to a signature (the two constructor operators)."""
    args.kwonlyargs.append(ast.arg("afd_required"))
    args.kw_defaults.append(None)
    return True


def _function(source: str, line: int) -> Function:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, Function) and node.lineno == line:
            return node
    raise LookupError(f"no function at line {line}")


def _indent(text: str) -> str:
    return text[: len(text) - len(text.lstrip())]


def _first_line(node: ast.stmt) -> int:
    """The first line of a statement, its decorators included."""
    decorators: list[ast.expr] = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def _body(node: Function) -> list[ast.stmt]:
    """The statements of a body, its docstring left out."""
    first = node.body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return node.body[1:] if docstring else node.body


def _statements_at(tree: ast.AST, line: int, count: int) -> tuple[int, int] | None:
    """First and last line of ``count`` consecutive statements of one block, the first being the
    innermost statement that contains ``line``; None if its block has fewer."""
    containing = []
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for i, statement in enumerate(block):
                if isinstance(statement, ast.stmt) and (
                    _first_line(statement) <= line <= (statement.end_lineno or 0)
                ):
                    containing.append(
                        (_first_line(statement), -(statement.end_lineno or 0), block, i)
                    )
    if not containing:
        return None
    # the innermost statement containing the line starts last (and, on a tie, ends first)
    start, _, block, i = max(containing, key=lambda found: found[:2])
    if i + count > len(block):
        return None
    return start, block[i + count - 1].end_lineno or 0


def _statement_count(pattern: str) -> int:
    """How many consecutive statements an anchor or contract matches (an expression: the one
    statement it is in). A ``$...`` run in the middle counts as one statement."""
    parsed = parse_pattern(pattern)
    return 1 if parsed.is_expression else len(parsed.statements)


def _module(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _body_code(uses: frozenset[SymbolUse]) -> str:
    """What drift must report when a method's body changes, by the method's uses in the lock:
    a fork is re-based (DRF032; a lost anchor, DRF030, when the change splits the statements an
    edit anchors on); an overridden or otherwise used method reports the body (DRF020); a method
    we inherit, relied on or not, or rely on outside a class's MRO, reports an inherited or
    relied-on body (DRF021)."""
    if SymbolUse.FORKED in uses:
        return "DRF032"
    if uses & OVERRIDES:
        return "DRF020"
    if uses & (RELIED_ON | {SymbolUse.INHERITED}):
        return "DRF021"
    return "DRF020"


def _in_vllm(symbol: SymbolEntry) -> bool:
    """Whether a symbol the lock records lives in vLLM's source, the tree mutations change (what
    the lock records of the other pinned packages, vLLM-Ascend's, is left out)."""
    return (symbol.description.file or "").startswith("vllm/")


def _signature_code(uses: frozenset[SymbolUse], code: str) -> str:
    """What drift must report when a recorded method's signature changes: ``code``, or, for a
    method AFD's code only calls, the callee finding DRF022 that names the call sites."""
    return "DRF022" if is_callee(uses) else code


class Mutator:
    """Builds mutations from the lock's symbols and from the unrecorded functions and methods of
    the upstream files the lock tracks."""

    def __init__(self, context: Context, lock: Lock, rng: random.Random):
        self.root: Path = context.sources["vllm"].root
        self.lock = lock
        self.rng = rng
        self._texts: dict[str, str] = {}
        #: recorded methods grouped by their uses, so that rare uses (forks) get drawn too
        self.recorded: dict[str, list[str]] = {}
        for key, entry in sorted(lock.symbols.items()):
            if entry.kind is SymbolKind.METHOD and _in_vllm(entry):
                group = " ".join(sorted(u.value for u in entry.uses))
                self.recorded.setdefault(group, []).append(key)
        self.unrecorded = list(self._unrecorded())
        self._unread: list[tuple[str, str, int, str]] | None = None

    def text(self, path: str) -> str:
        if path not in self._texts:
            self._texts[path] = (self.root / path).read_text()
        return self._texts[path]

    def _lines(self, path: str) -> list[str]:
        return self.text(path).splitlines()

    def _unrecorded(self) -> Iterator[tuple[str, str, Function]]:
        """Module functions and methods of module classes, in the files the lock tracks, that the
        lock does not record in any use."""
        for path in sorted(self.lock.upstream["vllm"].files):
            module = _module(path)
            for node in ast.parse(self.text(path)).body:
                functions = [(node.name, node)] if isinstance(node, Function) else []
                if isinstance(node, ast.ClassDef):
                    functions = [
                        (f"{node.name}.{child.name}", child)
                        for child in node.body
                        if isinstance(child, Function)
                    ]
                for qualname, function in functions:
                    if f"{module}:{qualname}" not in self.lock.symbols:
                        yield f"{module}:{qualname}", path, function

    def _method(self, used: bool) -> tuple[str, str, Function, frozenset[SymbolUse]]:
        """A method the lock records (key, file, node, uses), or an unrecorded one (no uses)."""
        if not used:
            key, path, node = self.rng.choice(self.unrecorded)
            return key, path, node, frozenset()
        key = self.rng.choice(self.recorded[self.rng.choice(sorted(self.recorded))])
        entry = self.lock.symbols[key]
        file, line = entry.description.file or "", entry.description.line or 0
        return key, file, _function(self.text(file), line), entry.uses

    def make(self, operator: str, used: bool = True) -> Mutation | None:
        """One mutation by ``operator``, or None where the drawn symbol does not suit it."""
        build: Callable[[bool], Mutation | None] = getattr(self, f"_{operator}")
        return build(used)

    def draw(self, operator: str, used: bool, tries: int = 20) -> Mutation | None:
        """A mutation by ``operator`` that leaves the file valid Python, within ``tries`` draws."""
        for _ in range(tries):
            mutation = self.make(operator, used)
            if mutation is None:
                continue
            try:
                if not mutation.deletes:
                    ast.parse(mutation.apply(self.text(mutation.path)))
            except SyntaxError:
                continue
            return mutation
        return None

    # --- signature operators --------------------------------------------------------

    def _replace(
        self,
        operator: str,
        key: str,
        path: str,
        expected: str | None,
        node: ast.arg | ast.expr,
        width: int,
        new: str,
    ) -> Mutation:
        """Replace the ``width`` bytes of source where ``node`` starts with ``new``."""
        text = self._lines(path)[node.lineno - 1]
        encoded = text.encode()  # ast columns are UTF-8 byte offsets
        start = len(encoded[: node.col_offset].decode())
        stop = len(encoded[: node.col_offset + width].decode())
        return Mutation(
            operator,
            key,
            path,
            expected,
            node.lineno,
            node.lineno,
            (text[:start] + new + text[stop:],),
        )

    @staticmethod
    def _params(node: Function) -> list[ast.arg]:
        """Positional and keyword-only parameters, ``self`` / ``cls`` left out."""
        positional = node.args.posonlyargs + node.args.args
        if positional and positional[0].arg in ("self", "cls"):
            positional = positional[1:]
        return positional + node.args.kwonlyargs

    def _rename_param(self, used: bool) -> Mutation | None:
        """Append ``_renamed`` to one parameter's name."""
        key, path, node, uses = self._method(used)
        params = self._params(node)
        if not params:
            return None
        param = self.rng.choice(params)
        expected = _signature_code(uses, "DRF012") if used else None
        width = len(param.arg.encode())
        return self._replace(
            "rename_param", key, path, expected, param, width, f"{param.arg}_renamed"
        )

    def _change_default(self, used: bool) -> Mutation | None:
        """Change one constant default (``True`` to ``False``, a string, ``None`` to ``0``, ...)."""
        key, path, node, uses = self._method(used)
        defaults = [
            d for d in [*node.args.defaults, *node.args.kw_defaults] if isinstance(d, ast.Constant)
        ]
        if not defaults:
            return None
        default = self.rng.choice(defaults)
        if default.end_lineno != default.lineno:
            return None
        value = default.value
        if isinstance(value, bool):
            new = repr(not value)
        elif isinstance(value, str):
            new = repr(value + "_changed")
        elif value is None:
            new = "0"
        else:
            new = "None"
        expected = _signature_code(uses, "DRF015") if used else None
        width = (default.end_col_offset or 0) - default.col_offset
        return self._replace("change_default", key, path, expected, default, width, new)

    def _drop_param(self, used: bool) -> Mutation | None:
        """Remove one parameter written on a line of its own."""
        key, path, node, uses = self._method(used)
        params = [p for p in self._params(node) if p.lineno != node.lineno]
        if not params:
            return None
        param = self.rng.choice(params)
        text = self._lines(path)[param.lineno - 1]
        if text[: param.col_offset].strip() or any(
            p is not param and p.lineno == param.lineno for p in params
        ):
            return None  # only a parameter alone on its line (draw() rejects one that runs on)
        expected = _signature_code(uses, "DRF011") if used else None
        return Mutation("drop_param", key, path, expected, param.lineno, param.lineno, ())

    # --- body operators -------------------------------------------------------------

    def _change_body(self, used: bool) -> Mutation | None:
        """Insert an assignment before one statement of the body (not inside a block)."""
        key, path, node, uses = self._method(used)
        body = _body(node)
        if not body:
            return None
        line = _first_line(self.rng.choice(body))
        expected = _body_code(uses) if used else None
        if expected == "DRF032" and self._splits_anchor(key, path, line):
            expected = "DRF030"
        text = self._lines(path)[line - 1]
        new = (f"{_indent(text)}_afd_mutation = 1",)
        return Mutation("change_body", key, path, expected, line, line - 1, new)

    def _splits_anchor(self, key: str, path: str, line: int) -> bool:
        """Whether a line inserted before ``line`` lands between the statements an edit of the
        fork ``key`` anchors on: then the anchor no longer matches (a lost anchor, not a re-base)."""
        tree = ast.parse(self.text(path))
        for entry in self.lock.classes.values():
            for member in entry.members.values():
                if member.upstream != key:
                    continue
                for anchor in (member.anchors or {}).values():
                    count = _statement_count(anchor.anchor)
                    for start in anchor.lines:
                        span = _statements_at(tree, start, count)
                        if span is not None and span[0] < line <= span[1]:
                            return True
        return False

    def _delete_anchor(self, used: bool) -> Mutation | None:
        """Replace the statement(s) an edit anchors on with ``pass``."""
        found = self._anchored()
        if found is None:
            return None
        symbol, path, start, stop = found
        indent = _indent(self._lines(path)[start - 1])
        return Mutation("delete_anchor", symbol, path, "DRF030", start, stop, (f"{indent}pass",))

    def _duplicate_anchor(self, used: bool) -> Mutation | None:
        """Repeat the statement(s) an edit anchors on."""
        found = self._anchored()
        if found is None:
            return None
        symbol, path, start, stop = found
        block = tuple(self._lines(path)[start - 1 : stop])
        return Mutation("duplicate_anchor", symbol, path, "DRF031", start, stop, block + block)

    def _anchored(self) -> tuple[str, str, int, int] | None:
        """A fork's anchor that matched once: its symbol, file and the lines of the statements it
        matched (an expression anchor: the statement it is in)."""
        anchors = []
        for class_key, entry in self.lock.classes.items():
            for name, member in entry.members.items():
                for edit_id, anchor in (member.anchors or {}).items():
                    if len(anchor.lines) == 1 and member.upstream:
                        recorded = self.lock.symbols[member.upstream]
                        if not _in_vllm(recorded):
                            continue
                        anchors.append(
                            (
                                f"{class_key}.{name}#{edit_id}",
                                recorded.description.file or "",
                                anchor.lines[0],
                                anchor.anchor,
                            )
                        )
        if not anchors:
            return None
        symbol, path, line, pattern = self.rng.choice(sorted(anchors))
        span = _statements_at(ast.parse(self.text(path)), line, _statement_count(pattern))
        return (symbol, path, *span) if span else None

    def _break_contract(self, used: bool) -> Mutation | None:
        """Replace the statement(s) where a relied-on method's contract matched with ``pass``."""
        return self._contract_mutation("break_contract", outside=False)

    def _change_rule(self, used: bool) -> Mutation | None:
        """The same for a method outside the generated classes' MRO: a rule vLLM applies to
        AFD's configurations (which runner it builds, the CPU KV block size)."""
        return self._contract_mutation("change_rule", outside=True)

    def _contract_mutation(
        self, operator: str, outside: bool, selection: bool = False
    ) -> Mutation | None:
        contracts = {}
        for entry in self.lock.classes.values():
            for method, stated in entry.relies_on.items():
                if outside and ":" not in method:
                    continue  # a ``module:Class.method`` key names a method outside the MRO
                key = relied_ref(entry, method)
                if key is None or not _in_vllm(self.lock.symbols[key]):
                    continue
                if selection and key in ISSUE_SITES:
                    continue
                for contract_id, recorded in stated.items():
                    if recorded.lines and (recorded.selects is not None) == selection:
                        contracts[f"{key}#{contract_id}"] = (key, recorded)
        if not contracts:
            return None
        symbol = self.rng.choice(sorted(contracts))
        key, recorded = contracts[symbol]
        path = self.lock.symbols[key].description.file or ""
        line = self.rng.choice(recorded.lines)
        span = _statements_at(ast.parse(self.text(path)), line, _statement_count(recorded.pattern))
        if span is None:
            return None
        start, stop = span
        # a contract declared to hold in several places still holds in the others
        elsewhere = any(not start <= other <= stop for other in recorded.lines)
        expected = "DRF071" if elsewhere else ("DRF072" if selection else "DRF070")
        indent = _indent(self._lines(path)[start - 1])
        return Mutation(operator, symbol, path, expected, start, stop, (f"{indent}pass",))

    # --- operators on AFD's own call sites and reads ----------------------------------

    def _sited(
        self, how: SiteKind, keywords: bool = False, bound: bool = False
    ) -> list[tuple[str, SymbolEntry]]:
        """Recorded vLLM symbols AFD's code uses at a site of kind ``how`` (with keywords; with
        every argument known: a call unpacking ``**kwargs`` may pass any parameter)."""
        return [
            (key, entry)
            for key, entry in sorted(self.lock.symbols.items())
            if _in_vllm(entry)
            and any(
                s.how is how and (s.keywords or not keywords) and not (bound and s.unpacked)
                for s in entry.sites
            )
        ]

    def _header(
        self,
        operator: str,
        key: str,
        path: str,
        expected: str | None,
        node: Function,
        change: Callable[[ast.arguments], bool],
    ) -> Mutation | None:
        """Rewrite the ``def`` line(s) of ``node`` with its parameters changed by ``change`` (which
        says whether it changed anything); None for a one-line function."""
        first_body = _first_line(node.body[0])
        if first_body <= node.lineno:
            return None
        arguments = ast.parse(ast.unparse(node.args).join(("def f(", "): pass"))).body[0]
        assert isinstance(arguments, ast.FunctionDef)
        if not change(arguments.args):
            return None
        indent = _indent(self._lines(path)[node.lineno - 1])
        returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
        prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
        header = f"{indent}{prefix} {node.name}({ast.unparse(arguments.args)}){returns}:"
        return Mutation(operator, key, path, expected, node.lineno, first_body - 1, (header,))

    def _rename_keyword(self, used: bool) -> Mutation | None:
        """Rename a parameter AFD's code passes by keyword (a method's, or a constructor's)."""
        sited = self._sited(SiteKind.CALL, True) + self._sited(SiteKind.CONSTRUCT, True)
        if not sited:
            return None
        key, entry = self.rng.choice(sited)
        site = self.rng.choice([s for s in entry.sites if s.keywords])
        keyword = self.rng.choice(site.keywords)
        found = self._callable(key, entry, site.how)
        if found is None:
            return None
        path, node = found

        def rename(args: ast.arguments) -> bool:
            for arg in [*args.args, *args.kwonlyargs]:
                if arg.arg == keyword:
                    arg.arg = f"{keyword}_renamed"
                    return True
            return False  # passed through **kwargs

        return self._header("rename_keyword", key, path, "DRF023", node, rename)

    def _require_param(self, used: bool) -> Mutation | None:
        """Give a constructor AFD's code calls (or, unrecorded, any unrecorded method) a required
        keyword-only parameter."""
        if used:
            constructed = self._sited(SiteKind.CONSTRUCT, bound=True)
            if not constructed:
                return None
            key, entry = self.rng.choice(constructed)
            found = self._callable(key, entry, SiteKind.CONSTRUCT)
            if found is None:
                return None
            path, node = found
        else:
            key, path, node = self.rng.choice(self.unrecorded)

        expected = "DRF023" if used else None
        return self._header("require_param", key, path, expected, node, _require_keyword)

    def _callable(self, key: str, entry: SymbolEntry, how: SiteKind) -> tuple[str, Function] | None:
        """The file and ``def`` a site of ``how`` binds to: the function or method, or the
        class's own ``__init__`` (None when the class inherits it or is a dataclass)."""
        file, line = entry.description.file or "", entry.description.line or 0
        if how is SiteKind.CALL:
            return file, _function(self.text(file), line)
        cls = self._class(file, line)
        init = next((n for n in cls.body if isinstance(n, Function) and n.name == "__init__"), None)
        return None if init is None else (file, init)

    def _unread_attributes(self, annotated: bool = False) -> Iterator[tuple[str, str, int, str]]:
        """``self.x = ...`` lines (``annotated``: ``self.x: T = ...``) in methods the lock does
        not record, of attributes it does not record either (key, file, line, attribute)."""
        for key, path, node in self.unrecorded:
            owner = key.rpartition(".")[0]
            if ":" not in owner:
                continue  # a module function
            for statement in ast.walk(node):
                if annotated and isinstance(statement, ast.AnnAssign):
                    target = statement.target
                elif not annotated and isinstance(statement, ast.Assign):
                    if len(statement.targets) != 1:
                        continue
                    target = statement.targets[0]
                else:
                    continue
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                    and f"{owner}.{target.attr}" not in self.lock.symbols
                ):
                    yield key, path, statement.lineno, target.attr

    def _rename_attribute(self, used: bool) -> Mutation | None:
        """Rename where upstream sets an attribute AFD's code reads (unrecorded: one in a method
        the lock does not record, whose attribute AFD never reads)."""
        if used:
            attributes = [
                (key, entry)
                for key, entry in self._sited(SiteKind.READ)
                if entry.kind is SymbolKind.INSTANCE_ATTRIBUTE
            ]
            if not attributes:
                return None
            key, entry = self.rng.choice(attributes)
            path, line = entry.description.file or "", entry.description.line or 0
            name = key.rsplit(".", 1)[1]
            if self.text(path).count(f"self.{name} =") != 1:
                return None  # set in more than one place: renaming one leaves it defined
            expected: str | None = "DRF001"
        else:
            if self._unread is None:
                self._unread = list(self._unread_attributes())
            if not self._unread:
                return None
            key, path, line, name = self.rng.choice(self._unread)
            expected = None
        text = self._lines(path)[line - 1]
        target = f"self.{name} "
        if text.count(target) != 1 or not text.lstrip().startswith(target):
            return None  # only a plain ``self.x = ...`` line
        new = text.replace(target, f"self.{name}_renamed ", 1)
        return Mutation("rename_attribute", key, path, expected, line, line, (new,))

    # --- operators on the values AFD's code uses (issue 55) ---------------------------------

    def _recorded(self, kinds: tuple[SymbolKind, ...]) -> list[tuple[str, SymbolEntry]]:
        """Recorded vLLM symbols of ``kinds``, those the issue names left out."""
        return [
            (key, entry)
            for key, entry in sorted(self.lock.symbols.items())
            if entry.kind in kinds and _in_vllm(entry) and key not in ISSUE_SITES
        ]

    def _rename_env(self, used: bool) -> Mutation | None:
        """Rename a variable in its module's environment table (unrecorded: one AFD never uses)."""
        path = "vllm/envs.py"
        info = ast.parse(self.text(path))
        table = next(
            (
                node.value
                for node in info.body
                if isinstance(node, ast.Assign | ast.AnnAssign)
                and isinstance(node.value, ast.Dict)
                and ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
                == "environment_variables"
            ),
            None,
        )
        if table is None:
            return None
        keys = {k.value: k.lineno for k in table.keys if isinstance(k, ast.Constant)}
        recorded = {
            key.split(":")[1] for key, _ in self._recorded((SymbolKind.ENVIRONMENT_VARIABLE,))
        }
        names = sorted(
            recorded & keys.keys()
            if used
            else keys.keys()
            - recorded
            - {k.split(":")[1] for k in self.lock.symbols if k.startswith("vllm.envs:")}
        )
        if not names:
            return None
        name = self.rng.choice(names)
        line = keys[name]
        text = self._lines(path)[line - 1]
        if text.count(f'"{name}"') != 1:
            return None
        new = text.replace(f'"{name}"', f'"{name}_RENAMED"')
        expected = "DRF024" if used else None
        return Mutation("rename_env", f"vllm.envs:{name}", path, expected, line, line, (new,))

    def _change_type(self, used: bool) -> Mutation | None:
        """Make an attribute AFD calls a method on, indexes or iterates a container of another
        family (unrecorded: an annotated ``self.x: set[...] = ...`` of a method the lock does
        not record)."""
        if used:
            candidates = [
                (key, entry.description.file or "", entry.description.line or 0)
                for key, entry in self._recorded(
                    (SymbolKind.INSTANCE_ATTRIBUTE, SymbolKind.CLASS_ATTRIBUTE)
                )
                if any(s.operations for s in entry.sites)
            ]
        else:
            candidates = [
                (f"{key.rpartition('.')[0]}.{attribute}", path, line)
                for key, path, line, attribute in self._unread_attributes(annotated=True)
            ]
        if not candidates:
            return None
        key, path, line = self.rng.choice(candidates)
        node = next(
            (
                n
                for n in ast.walk(ast.parse(self.text(path)))
                if isinstance(n, ast.AnnAssign) and n.lineno == line and n.end_lineno == line
            ),
            None,
        )
        outer = ast.unparse(node.annotation).split("[")[0] if node is not None else ""
        if node is None or outer not in _OTHER_CONTAINER:
            return None
        annotation, value = _OTHER_CONTAINER[outer]
        text = self._lines(path)[line - 1]
        target = ast.unparse(node.target)
        new = f"{_indent(text)}{target}: {annotation}" + (f" = {value}" if node.value else "")
        expected = "DRF025" if used else None
        return Mutation("change_type", key, path, expected, line, line, (new,))

    def _field_built(self, used: bool) -> list[tuple[str, str, ast.ClassDef, tuple[str, ...]]]:
        """Field-built classes of vLLM: (key, file, node, the keywords AFD's code passes when
        it constructs one); unrecorded: classes of tracked files the lock does not record."""
        found = []
        if used:
            for key, entry in self._recorded((SymbolKind.CLASS,)):
                passed = {k for s in entry.sites if s.how is SiteKind.CONSTRUCT for k in s.keywords}
                if entry.description.init is None and entry.description.init_signature and passed:
                    path = entry.description.file or ""
                    node = self._class(path, entry.description.line or 0)
                    found.append((key, path, node, tuple(sorted(passed))))
            return found
        for path in sorted(self.lock.upstream["vllm"].files):
            for node in ast.parse(self.text(path)).body:
                key = f"{_module(path)}:{getattr(node, 'name', '')}"
                if (
                    isinstance(node, ast.ClassDef)
                    and builds_fields(node)
                    and key not in self.lock.symbols
                ):
                    found.append((key, path, node, ()))
        return found

    def _drop_field(self, used: bool) -> Mutation | None:
        """Remove a field AFD passes by keyword (unrecorded: any field of a class AFD never uses)."""
        candidates = self._field_built(used)
        if not candidates:
            return None
        key, path, node, passed = self.rng.choice(candidates)
        fields = [
            s
            for s in node.body
            if isinstance(s, ast.AnnAssign)
            and isinstance(s.target, ast.Name)
            and (not used or s.target.id in passed)
            and s.lineno == s.end_lineno
        ]
        if not fields:
            return None
        field = self.rng.choice(fields)
        expected = "DRF023" if used else None
        return Mutation("drop_field", key, path, expected, field.lineno, field.lineno, ())

    def _add_field(self, used: bool) -> Mutation | None:
        """Give a field-built class AFD constructs a first, required field."""
        candidates = self._field_built(True)
        if not candidates:
            return None
        key, path, node, _ = self.rng.choice(candidates)
        first = next((s for s in node.body if isinstance(s, ast.AnnAssign)), None)
        if first is None:
            return None
        indent = _indent(self._lines(path)[first.lineno - 1])
        line = (f"{indent}afd_required: int",)
        return Mutation("add_field", key, path, "DRF023", first.lineno, first.lineno - 1, line)

    def _change_selection(self, used: bool) -> Mutation | None:
        """Break a selection rule's pattern where it matched (the rule changes)."""
        return self._contract_mutation("change_selection", outside=False, selection=True)

    def _delete_module(self, used: bool) -> Mutation | None:
        """Delete a module AFD stands on (unrecorded: one no tracked file imports)."""
        tracked = self.lock.upstream["vllm"].files
        if used:
            modules = {
                SymbolRef.parse(cls).module
                for entry in self.lock.classes.values()
                for cls in entry.base_mro
            } | {
                SymbolRef.parse(key).module
                for key, entry in self.lock.symbols.items()
                if SymbolUse.IMPORTED_BY_RUNTIME in entry.uses
            }
            paths = sorted(
                p
                for p in tracked
                if _module(p) in modules
                and not p.endswith("__init__.py")
                and _module(p) not in ISSUE_SITES
            )
        else:
            texts = "\n".join(self.text(p) for p in tracked)
            paths = sorted(
                p.relative_to(self.root).as_posix()
                for p in (self.root / "vllm").rglob("*.py")
                if p.name != "__init__.py"
                and p.relative_to(self.root).as_posix() not in tracked
                and _module(p.relative_to(self.root).as_posix()).rpartition(".")[2] not in texts
            )
        if not paths:
            return None
        path = self.rng.choice(paths)
        expected = "DRF080" if used else None
        return Mutation("delete_module", _module(path), path, expected, 1, 0, (), deletes=True)

    def _registry_param(self, used: bool) -> Mutation | None:
        """Give a class AFD builds through ``generated_subclass(...)`` a required keyword-only
        parameter."""
        built = [
            (key, entry)
            for key, entry in self._recorded((SymbolKind.CLASS,))
            if any(s.via.startswith("generated_subclass:") and not s.unpacked for s in entry.sites)
        ]
        if not built:
            return None
        key, entry = self.rng.choice(built)
        found = self._callable(key, entry, SiteKind.CONSTRUCT)
        if found is None:
            return None
        path, node = found

        return self._header("registry_param", key, path, "DRF023", node, _require_keyword)

    # --- class operators ------------------------------------------------------------

    def _shadow_extend(self, used: bool) -> Mutation | None:
        """Define a method named like one of our ``extend``s in the upstream base class."""
        extends = []
        for entry in self.lock.classes.values():
            for name, member in entry.members.items():
                if member.kind is MemberKind.EXTEND and _in_vllm(self.lock.symbols[entry.base]):
                    extends.append((entry.base, name))
        if not extends:
            return None
        base, name = self.rng.choice(sorted(extends))
        symbol = self.lock.symbols[base].description
        file = symbol.file or ""
        node = self._class(file, symbol.line or 0)
        line = _first_line(node.body[0])
        indent = _indent(self._lines(file)[node.body[0].lineno - 1])
        method = (f"{indent}def {name}(self):", f"{indent}    return None", "")
        return Mutation("shadow_extend", f"{base}.{name}", file, "DRF040", line, line - 1, method)

    def _change_base(self, used: bool) -> Mutation | None:
        """Replace the bases of an upstream class we derive from with ``object``."""
        bases = sorted(
            k
            for k, v in self.lock.symbols.items()
            if v.kind is SymbolKind.CLASS
            and SymbolUse.BASE in v.uses
            and v.description.bases
            and _in_vllm(v)
        )
        if not bases:
            return None
        key = self.rng.choice(bases)
        entry = self.lock.symbols[key].description
        file = entry.file or ""
        node = self._class(file, entry.line or 0)
        start, stop = node.lineno, _first_line(node.body[0]) - 1
        if stop < start:
            return None  # a one-line class
        indent = _indent(self._lines(file)[start - 1])
        header = (f"{indent}class {node.name}(object):",)
        return Mutation("change_base", key, file, "DRF041", start, stop, header)

    def _class(self, path: str, line: int) -> ast.ClassDef:
        for node in ast.walk(ast.parse(self.text(path))):
            if isinstance(node, ast.ClassDef) and node.lineno == line:
                return node
        raise LookupError(f"no class at {path}:{line}")


OPERATORS = (
    "rename_param",
    "change_default",
    "drop_param",
    "change_body",
    "delete_anchor",
    "duplicate_anchor",
    "break_contract",
    "shadow_extend",
    "change_base",
    "change_rule",
    "rename_keyword",
    "require_param",
    "rename_attribute",
    "rename_env",
    "change_type",
    "drop_field",
    "add_field",
    "change_selection",
    "delete_module",
    "registry_param",
)
#: operators that also make sense on symbols the lock does not record (expected: no finding)
UNUSED_OPERATORS = (
    "rename_param",
    "change_default",
    "drop_param",
    "change_body",
    "require_param",
    "rename_attribute",
    "rename_env",
    "change_type",
    "drop_field",
    "delete_module",
)


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
    text = mutation.apply(target.read_text())
    target.unlink()
    if not mutation.deletes:
        target.write_text(text)
    return tree


def _random_picks(rng: random.Random) -> Iterator[tuple[str, bool]]:
    """Rounds of every operator on a recorded symbol and every unrecorded one, each round
    shuffled, so that every operator gets about as many mutations."""
    pairs = [(op, True) for op in OPERATORS] + [(op, False) for op in UNUSED_OPERATORS]
    while True:
        rng.shuffle(pairs)
        yield from pairs


def run(
    count: int,
    seed: int,
    progress: Callable[[str], None] = lambda _: None,
    plan: Sequence[tuple[str, bool]] = (),
) -> list[Outcome]:
    """``count`` random mutations, each checked by one drift run; or, with ``plan``, one mutation
    per (operator, whether the symbol is recorded)."""
    context = open_context(REPO_ROOT, quiet=True)
    generation, _ = generate(context)
    rng = random.Random(seed)
    assert generation.lock is not None, "the pinned upstream must generate"
    mutator = Mutator(context, generation.lock, rng)
    picks = iter(plan) if plan else _random_picks(rng)
    wanted = len(plan) if plan else count
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="afd-mutations-") as tmp:
        for attempt, (operator, used) in enumerate(picks):
            if len(outcomes) == wanted or attempt == wanted * 5:
                break
            mutation = mutator.draw(operator, used)
            if mutation is None:
                if plan:
                    raise LookupError(f"found no valid {operator} mutation")
                continue
            tree = apply(mutation, context.sources["vllm"].root, Path(tmp))
            result = run_drift(REPO_ROOT, context.versions["vllm"], to_root=tree)
            outcome = Outcome(mutation, tuple(sorted({f.code for f in result.findings})))
            outcomes.append(outcome)
            progress(
                f"{len(outcomes):3d} {operator:16} {mutation.symbol} "
                f"expected {mutation.expected or 'nothing'}, got {', '.join(outcome.codes) or 'nothing'}"
                + ("" if outcome.correct else "  MISS")
            )
    return outcomes


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    """Counts by recorded / unrecorded and by operator, the score, and every miss."""
    used = [o for o in outcomes if o.mutation.used]
    unused = [o for o in outcomes if not o.mutation.used]
    by_operator: dict[str, list[int]] = {}
    for outcome in outcomes:
        name = outcome.mutation.operator + ("" if outcome.mutation.used else " (unrecorded)")
        tally = by_operator.setdefault(name, [0, 0])
        tally[0] += outcome.correct
        tally[1] += 1
    return {
        "mutations": len(outcomes),
        "used_detected": f"{sum(o.correct for o in used)}/{len(used)}",
        "unused_silent": f"{sum(o.correct for o in unused)}/{len(unused)}",
        "score": sum(o.correct for o in outcomes) / len(outcomes) if outcomes else 0.0,
        "by_operator": {k: f"{v[0]}/{v[1]}" for k, v in sorted(by_operator.items())},
        "misses": [
            {
                "operator": o.mutation.operator,
                "symbol": o.mutation.symbol,
                "path": o.mutation.path,
                "line": o.mutation.start,
                "expected": o.mutation.expected or "nothing",
                "codes": list(o.codes),
            }
            for o in outcomes
            if not o.correct
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/mutations.py", description=__doc__.splitlines()[0]
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
