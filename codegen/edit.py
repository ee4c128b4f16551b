"""Apply a fork's edits to an upstream method, one libcst transformer per action.

Each edit's anchor is matched against the body as left by the previous edits; the match count
must equal the declared count. The same anchors are also matched against the *pinned* body, so
the lock records where in upstream each edit lands.

Sketch, ``wrap("self.self_attn = attn_cls(...)", "if builds_attention:")``::

    self.self_attn = attn_cls(...)     ->     if builds_attention:
                                                  self.self_attn = attn_cls(...)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from codegen.index import Member
from codegen.markers import Edit
from codegen.pattern import (
    MANY_PREFIX,
    ONE_PREFIX,
    Bindings,
    Match,
    Pattern,
    PatternError,
    block_body,
    find_matches,
    normalized_code,
    parse_code,
    parse_code_expression,
    parse_pattern,
    placeholder,
)

WRAPPER_CLASS = "_AFDUpstreamClass"


class EditError(ValueError):
    """An edit cannot be applied: the anchor count is off or the code is invalid."""

    def __init__(self, edit: Edit, found: int, message: str):
        super().__init__(message)
        self.edit = edit
        self.found = found


@dataclass(frozen=True)
class ParsedMethod:
    """An upstream method parsed on its own, with the line it starts at in its file."""

    #: the wrapper module (``class _AFDUpstreamClass:`` + the method's original lines)
    module: cst.Module
    #: 1-based line in the upstream file of the wrapper's second line (first decorator or ``def``)
    first_line: int

    @functools.cached_property
    def positions(self) -> Mapping[cst.CSTNode, CodeRange]:
        """Positions of every node, resolved once per method."""
        return MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(PositionProvider)

    @property
    def function(self) -> cst.FunctionDef:
        cls = self.module.body[0]
        assert isinstance(cls, cst.ClassDef)
        func = block_body(cls.body)[0]
        assert isinstance(func, cst.FunctionDef)
        return func


def parse_method(source: str, first_line: int) -> ParsedMethod:
    """Parse a method's source lines (with their indentation) inside a dummy class."""
    return ParsedMethod(cst.parse_module(f"class {WRAPPER_CLASS}:\n{source}"), first_line)


def parse_member(member: Member) -> ParsedMethod:
    """Parse an upstream method found by the index, decorators included."""
    return parse_method(member.source(), member.first_line)


def anchor_lines(method: ParsedMethod, pattern: Pattern) -> tuple[list[int], list[str]]:
    """Upstream lines and normalized code of every match of ``pattern`` in the pinned body."""
    positions = method.positions
    matches = find_matches(pattern, method.function.body)
    lines, codes = [], []
    for match in matches:
        node = match.nodes()[0]
        lines.append(positions[node].start.line + method.first_line - 2)
        codes.append(" | ".join(normalized_code(n) for n in match.nodes()))
    return lines, codes


def apply_edits(function: cst.FunctionDef, edits: Sequence[Edit]) -> cst.FunctionDef:
    """Apply ``edits`` in order; raises EditError / PatternError on the first that cannot apply."""
    for edit in edits:
        pattern = parse_pattern(edit.anchor)
        matches = find_matches(pattern, function.body)
        if len(matches) != edit.count:
            raise EditError(
                edit,
                len(matches),
                f"edit {edit.id!r}: anchor {edit.anchor!r} matches {len(matches)} time(s), expected {edit.count}",
            )
        function = _apply(function, edit, pattern, matches)
    return function


def _apply(
    function: cst.FunctionDef, edit: Edit, pattern: Pattern, matches: list[Match]
) -> cst.FunctionDef:
    if edit.action == "replace" and pattern.is_expression:
        replacements = {id(m.expression): _substitute_expression(edit, m.bindings) for m in matches}
        result = function.visit(_ExpressionReplacer(replacements))
        assert isinstance(result, cst.FunctionDef)
        return result
    runs = _statement_runs(function, pattern, matches)
    result = function.visit(_BlockRewriter(edit, runs))
    assert isinstance(result, cst.FunctionDef)
    return result


def _statement_runs(
    function: cst.FunctionDef, pattern: Pattern, matches: list[Match]
) -> dict[int, list[Match]]:
    """Matches keyed by the id of the block that holds their statements."""
    runs: dict[int, list[Match]] = {}
    for match in matches:
        if match.block is None:  # expression pattern used with a statement action
            assert match.statement is not None
            block, index = _find_statement(function, match.statement)
            match = Match(block, index, index + 1, None, None, match.bindings)
        assert match.block is not None
        runs.setdefault(id(match.block), []).append(match)
    return runs


def _find_statement(root: cst.CSTNode, statement: cst.CSTNode) -> tuple[cst.CSTNode, int]:
    stack = [root]
    while stack:
        node = stack.pop()
        for index, child in enumerate(block_body(node)):
            if child is statement:
                return node, index
        stack.extend(node.children)
    raise PatternError("matched statement not found in its function")


class _ExpressionReplacer(cst.CSTTransformer):
    def __init__(self, replacements: dict[int, cst.BaseExpression]):
        self.replacements = replacements

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
        return self.replacements.get(id(original_node), updated_node)


class _BlockRewriter(cst.CSTTransformer):
    def __init__(self, edit: Edit, runs: dict[int, list[Match]]):
        self.edit = edit
        self.runs = runs

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        matches = self.runs.get(id(original_node))
        if not matches:
            return updated_node
        body = list(updated_node.body)
        for match in sorted(matches, key=lambda m: m.start, reverse=True):
            body[match.start : match.stop] = self._rewrite(
                body[match.start : match.stop], match.bindings
            )
        if not body:
            body = [cst.SimpleStatementLine([cst.Pass()])]
        return updated_node.with_changes(body=body)

    def _rewrite(
        self, statements: list[cst.BaseStatement], bindings: Bindings
    ) -> list[cst.BaseStatement]:
        edit = self.edit
        if edit.action == "delete":
            return []
        assert edit.code is not None
        if edit.action == "wrap":
            return [_wrap(statements, edit, bindings)]
        code = substitute(parse_code(edit.code), bindings, edit)
        if edit.action == "replace":
            return code
        if edit.action == "insert_before":
            return [*code, *statements]
        if edit.action == "insert_after":
            return [*statements, *code]
        raise PatternError(f"edit {edit.id!r}: unknown action {edit.action!r}")


def _wrap(statements: list[cst.BaseStatement], edit: Edit, bindings: Bindings) -> cst.BaseStatement:
    assert edit.code is not None
    header = edit.code.strip()
    if not header.endswith(":"):
        raise PatternError(f"edit {edit.id!r}: wrap header {header!r} must end with ':'")
    compound = substitute(parse_code(header + "\n    pass"), bindings, edit)[0]
    if not isinstance(compound, cst.If | cst.With):
        raise PatternError(
            f"edit {edit.id!r}: wrap header must be 'if ...:' or 'with ...:', got {header!r}"
        )
    wrapped = compound.with_changes(body=cst.IndentedBlock(body=statements))
    if edit.orelse is not None:
        if not isinstance(wrapped, cst.If):
            raise PatternError(f"edit {edit.id!r}: orelse needs an 'if' header")
        else_body = substitute(parse_code(edit.orelse), bindings, edit)
        wrapped = wrapped.with_changes(orelse=cst.Else(body=cst.IndentedBlock(body=else_body)))
    return wrapped


def _substitute_expression(edit: Edit, bindings: Bindings) -> cst.BaseExpression:
    assert edit.code is not None
    expression = parse_code_expression(edit.code)
    result = expression.visit(_Substituter(bindings, edit))
    assert isinstance(result, cst.BaseExpression)
    return result


def substitute(
    statements: Sequence[cst.BaseStatement], bindings: Bindings, edit: Edit
) -> list[cst.BaseStatement]:
    """Fill ``$X`` / ``$...X`` placeholders of edit code with captured nodes."""
    body = [cast(cst.SimpleStatementLine | cst.BaseCompoundStatement, s) for s in statements]
    module = cst.Module(body=body).visit(_Substituter(bindings, edit))
    return list(module.body)


class _Substituter(cst.CSTTransformer):
    def __init__(self, bindings: Bindings, edit: Edit):
        self.bindings = bindings
        self.edit = edit

    def _bound(self, name: str) -> object:
        if name not in self.bindings:
            raise PatternError(
                f"edit {self.edit.id!r}: code uses ${name}, which the anchor does not capture"
            )
        return self.bindings[name]

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        name = placeholder(updated_node, ONE_PREFIX)
        if name is None:
            return updated_node
        bound = self._bound(name)
        assert isinstance(bound, cst.BaseExpression)
        return bound

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        return updated_node.with_changes(args=self._expand(updated_node.args))

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self._expand(updated_node.body))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._expand(updated_node.body))

    def _expand(self, items: Sequence[cst.CSTNode]) -> list[cst.CSTNode]:
        result: list[cst.CSTNode] = []
        for item in items:
            value = None
            if isinstance(item, cst.Arg) and item.keyword is None and item.star in ("", "*"):
                value = item.value
            elif (
                isinstance(item, cst.SimpleStatementLine)
                and len(item.body) == 1
                and isinstance(item.body[0], cst.Expr)
            ):
                value = item.body[0].value
            name = placeholder(value, MANY_PREFIX) if value is not None else None
            if name is None:
                result.append(item)
                continue
            bound = self._bound(name)
            assert isinstance(bound, tuple)
            for node in bound:
                if isinstance(node, cst.Arg):
                    node = node.with_changes(comma=cst.MaybeSentinel.DEFAULT)
                result.append(node)
        if result and isinstance(result[-1], cst.Arg):
            result[-1] = result[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return result


class SuperRewriter(cst.CSTTransformer):
    """``super()`` in a forked body means the base of the upstream class that wrote it.

    In the generated subclass a bare ``super()`` would resolve to that upstream class itself, so
    the generator spells it out: ``super().__init__()`` -> ``super(DeepseekV2MoE, self).__init__()``.
    """

    def __init__(self, defining_class: str, first_param: str):
        self.defining_class = defining_class
        self.first_param = first_param
        self.count = 0

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False  # a nested class has its own super()

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if (
            isinstance(updated_node.func, cst.Name)
            and updated_node.func.value == "super"
            and not updated_node.args
        ):
            self.count += 1
            return updated_node.with_changes(
                args=[
                    cst.Arg(
                        cst.Name(self.defining_class),
                        comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
                    ),
                    cst.Arg(cst.Name(self.first_param)),
                ]
            )
        return updated_node


class RelativeImportRewriter(cst.CSTTransformer):
    """A relative import in a forked body (``from .method_adapters import X``) is relative to the
    upstream module that wrote it; the generated module lives elsewhere, so the generator makes
    it absolute: ``from vllm_ascend.quantization.method_adapters import X``.
    """

    def __init__(self, package: str):
        #: the package the upstream module's level-1 imports are relative to
        self.package = package

    def leave_ImportFrom(
        self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom
    ) -> cst.ImportFrom:
        if not updated_node.relative:
            return updated_node
        parts = self.package.split(".")
        up = len(updated_node.relative) - 1
        if up >= len(parts):  # Python itself refuses such an import
            raise ValueError(f"a relative import goes above the top of package {self.package}")
        base = parts[: len(parts) - up]
        if updated_node.module is not None:
            base.append(cst.Module([]).code_for_node(updated_node.module))
        return updated_node.with_changes(relative=(), module=cst.parse_expression(".".join(base)))
