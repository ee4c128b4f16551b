"""Anchor patterns: upstream code with wildcards, matched structurally with libcst.

A pattern is Python source. Formatting and comments never matter; the node structure does.

* ``...`` matches any one expression; as a call argument, list element or statement it matches
  any run of them, including an empty one.
* ``$X`` matches any one expression and captures it as ``X``; repeating ``$X`` requires equal code.
* ``$...X`` matches a run of arguments, elements or statements and captures it as ``X``.

A pattern that is a single expression (``FusedMoE(...)``) matches expressions anywhere in the
body; anything else (``self.experts = FusedMoE(...)``, several lines, compound statements)
matches runs of consecutive statements in one block. Captures can be used in the edit's code.

Before::

    self.experts = FusedMoE(shared_experts=self.shared_experts, gate=self.gate, ...)

``replace("self.experts = FusedMoE($...ARGS)", "self.experts = RemoteExperts($...ARGS)")``::

    self.experts = RemoteExperts(shared_experts=self.shared_experts, gate=self.gate, ...)
"""

from __future__ import annotations

import ast
import dataclasses
import re
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import libcst as cst

ONE_PREFIX = "__afd_one_"
MANY_PREFIX = "__afd_many_"
#: an anonymous run wildcard (``...`` as a whole argument or element)
ANY_RUN = "__afd_any_run__"
_SUFFIX = "__"

#: libcst fields that only carry formatting, punctuation or comments.
_FORMAT_FIELDS = frozenset(
    {
        "lpar",
        "rpar",
        "leading_lines",
        "lines_after_decorators",
        "comma",
        "semicolon",
        "equal",
        "colon",
        "dot",
        "newline",
        "header",
        "footer",
        "lbracket",
        "rbracket",
        "lbrace",
        "rbrace",
        "trailing_whitespace",
        "indent",
        "default_indent",
        "default_newline",
        "has_trailing_newline",
        "encoding",
    }
)


class PatternError(ValueError):
    """A pattern or edit code that does not parse or uses a capture wrongly."""


_TOKENS = re.compile(
    r"""(?P<string>'[^'\\\n]*(?:\\.[^'\\\n]*)*'|"[^"\\\n]*(?:\\.[^"\\\n]*)*")"""
    r"|\$\.\.\.(?P<many>[A-Za-z_]\w*)|\$(?P<one>[A-Za-z_]\w*)|(?P<dots>\.\.\.)|(?P<open>[(\[{])|(?P<close>[)\]}])"
)


def _encode(text: str) -> str:
    """Turn ``$...X`` / ``$X`` / run ``...`` into parseable placeholder names.

    Inside brackets a run becomes a starred name (``*__afd_many_X__``), which Python accepts
    after keyword arguments; in a block it is a plain name statement.
    """
    out: list[str] = []
    depth = 0
    position = 0
    for match in _TOKENS.finditer(text):
        out.append(text[position : match.start()])
        position = match.end()
        token = match.group(0)
        if match.group("open"):
            depth += 1
        elif match.group("close"):
            depth = max(depth - 1, 0)
        elif match.group("many"):
            token = ("*" if depth else "") + f"{MANY_PREFIX}{match.group('many')}{_SUFFIX}"
        elif match.group("one"):
            token = f"{ONE_PREFIX}{match.group('one')}{_SUFFIX}"
        elif match.group("dots") and depth:
            before = "".join(out).rstrip()[-1:]
            after = text[position:].lstrip()[:1]
            if before in ("(", ",", "[") and after in (")", ",", "]"):
                token = f"*{ANY_RUN}"
        out.append(token)
    out.append(text[position:])
    return "".join(out)


def placeholder(node: cst.CSTNode, prefix: str) -> str | None:
    """The capture name if ``node`` is a placeholder ``Name`` with that prefix."""
    if (
        isinstance(node, cst.Name)
        and node.value.startswith(prefix)
        and node.value.endswith(_SUFFIX)
    ):
        return node.value[len(prefix) : -len(_SUFFIX)]
    return None


@dataclass(frozen=True)
class Pattern:
    """A parsed anchor."""

    #: the text as written in the overlay
    text: str
    #: an expression pattern, or None for a statement pattern
    expression: cst.BaseExpression | None
    #: statements of a statement pattern
    statements: tuple[cst.BaseStatement, ...]

    @property
    def is_expression(self) -> bool:
        return self.expression is not None


def parse_pattern(text: str) -> Pattern:
    """Parse an anchor; raises PatternError with the parser's message."""
    source = textwrap.dedent(_encode(text)).strip() + "\n"
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise PatternError(f"anchor {text!r} does not parse: {exc.message}") from exc
    body = module.body
    if not body:
        raise PatternError(f"anchor {text!r} is empty")
    if (
        len(body) == 1
        and isinstance(body[0], cst.SimpleStatementLine)
        and len(body[0].body) == 1
        and isinstance(body[0].body[0], cst.Expr)
        and not _is_many(body[0])
    ):
        return Pattern(text, body[0].body[0].value, ())
    if _is_many(body[0]) or _is_many(body[-1]):
        raise PatternError(f"anchor {text!r} cannot start or end with a run wildcard")
    return Pattern(text, None, tuple(body))


def parse_code(text: str) -> tuple[cst.BaseStatement, ...]:
    """Statements of an edit's code."""
    try:
        return tuple(cst.parse_module(textwrap.dedent(_encode(text)).strip() + "\n").body)
    except cst.ParserSyntaxError as exc:
        raise PatternError(f"edit code {text!r} does not parse: {exc.message}") from exc


def parse_code_expression(text: str) -> cst.BaseExpression:
    try:
        return cst.parse_expression(textwrap.dedent(_encode(text)).strip())
    except cst.ParserSyntaxError as exc:
        raise PatternError(f"edit code {text!r} is not an expression: {exc.message}") from exc


# --------------------------------------------------------------------------- matching

Bindings = dict[str, Any]


def _is_many(node: Any) -> str | bool:
    """A run wildcard element: ``...`` or ``$...X`` as a statement, argument or element.

    Returns the capture name, True for an anonymous run, False otherwise.
    """
    value: Any = None
    if (
        isinstance(node, cst.SimpleStatementLine)
        and len(node.body) == 1
        and isinstance(node.body[0], cst.Expr)
    ):
        value = node.body[0].value
    elif isinstance(node, cst.Arg) and node.keyword is None and node.star in ("", "*"):
        value = node.value
    elif isinstance(node, cst.Element | cst.StarredElement):
        value = node.value
    if value is None:
        return False
    if isinstance(value, cst.Ellipsis) or (isinstance(value, cst.Name) and value.value == ANY_RUN):
        return True
    name = placeholder(value, MANY_PREFIX)
    return name if name is not None else False


def _string_value(node: cst.CSTNode) -> object:
    if isinstance(node, cst.SimpleString | cst.ConcatenatedString):
        return ("string", node.evaluated_value)
    if isinstance(node, cst.Integer | cst.Float | cst.Imaginary):
        return ("number", node.evaluated_value)
    return None


def normalized_code(node: cst.CSTNode) -> str:
    """Code of a node with comments and formatting normalized (for equality and the lock)."""
    code = cst.Module(body=[]).code_for_node(node)
    try:
        return ast.unparse(ast.parse(textwrap.dedent(code)))
    except SyntaxError:
        return " ".join(code.split())


def nodes_equal(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return match_node(a, b, {}) and match_node(b, a, {})


def match_node(pattern: Any, node: Any, bindings: Bindings) -> bool:
    """Does ``node`` match ``pattern``? Captures go into ``bindings`` (updated only on success)."""
    trial = dict(bindings)
    if _match(pattern, node, trial):
        bindings.clear()
        bindings.update(trial)
        return True
    return False


def _match(pattern: Any, node: Any, bindings: Bindings) -> bool:
    if isinstance(pattern, cst.CSTNode):
        if isinstance(pattern, cst.Ellipsis) and isinstance(node, cst.BaseExpression):
            return True
        name = placeholder(pattern, ONE_PREFIX)
        if name is not None and isinstance(node, cst.BaseExpression):
            if name in bindings:
                return nodes_equal(bindings[name], node)
            bindings[name] = node
            return True
        if not isinstance(node, cst.CSTNode):
            return False
        literal = _string_value(pattern)
        if literal is not None:
            return literal == _string_value(node)
        if type(pattern) is not type(node):
            return False
        for field in dataclasses.fields(pattern):
            if field.name in _FORMAT_FIELDS or field.name.startswith("whitespace"):
                continue
            if not _match(getattr(pattern, field.name), getattr(node, field.name), bindings):
                return False
        return True
    if isinstance(pattern, list | tuple):
        if not isinstance(node, list | tuple):
            return False
        return _match_sequence(list(pattern), list(node), bindings)
    if isinstance(pattern, cst.MaybeSentinel) or isinstance(node, cst.MaybeSentinel):
        return type(pattern) is type(node)
    return bool(pattern == node)


def _match_sequence(pattern: list[Any], nodes: list[Any], bindings: Bindings) -> bool:
    if not pattern:
        return not nodes
    head = pattern[0]
    many = _is_many(head)
    if many is not False:
        for take in range(len(nodes) + 1):
            trial = dict(bindings)
            if isinstance(many, str):
                run = tuple(nodes[:take])
                if many in trial and not _runs_equal(trial[many], run):
                    continue
                trial[many] = run
            if _match_sequence(pattern[1:], nodes[take:], trial):
                bindings.clear()
                bindings.update(trial)
                return True
        return False
    if not nodes:
        return False
    trial = dict(bindings)
    if _match(head, nodes[0], trial) and _match_sequence(pattern[1:], nodes[1:], trial):
        bindings.clear()
        bindings.update(trial)
        return True
    return False


def _runs_equal(a: Sequence[cst.CSTNode], b: Sequence[cst.CSTNode]) -> bool:
    return len(a) == len(b) and all(nodes_equal(x, y) for x, y in zip(a, b, strict=True))


@dataclass(frozen=True)
class Match:
    """One place an anchor matched."""

    #: for statement patterns: the block node and the slice of its body that matched
    block: cst.CSTNode | None
    start: int
    stop: int
    #: for expression patterns: the matched expression and the statement that contains it
    expression: cst.BaseExpression | None
    statement: cst.BaseStatement | None
    bindings: Bindings

    def nodes(self) -> tuple[cst.CSTNode, ...]:
        if self.expression is not None:
            return (self.expression,)
        assert self.block is not None
        return tuple(block_body(self.block)[self.start : self.stop])


def block_body(block: cst.CSTNode) -> Sequence[cst.BaseStatement]:
    body = getattr(block, "body", ())
    return body if isinstance(body, list | tuple) else ()


def _blocks(root: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node whose ``body`` is a statement sequence, in source order."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.IndentedBlock | cst.Module):
            yield node
        stack.extend(reversed(node.children))


def find_matches(pattern: Pattern, root: cst.CSTNode) -> list[Match]:
    """Non-overlapping matches of ``pattern`` inside ``root`` (a function body), in source order."""
    if pattern.expression is not None:
        return list(_expression_matches(pattern.expression, root, None))
    matches = []
    statements = list(pattern.statements)
    fixed = not any(_is_many(s) for s in statements)  # then a match spans exactly len(statements)
    first_type = type(statements[0])
    for block in _blocks(root):
        body = list(block_body(block))
        start = 0
        while start < len(body):
            found = None
            if type(body[start]) is not first_type:
                start += 1
                continue
            stops = [start + len(statements)] if fixed else range(start + 1, len(body) + 1)
            for stop in stops:
                if stop > len(body):
                    break
                bindings: Bindings = {}
                if match_node(statements, body[start:stop], bindings):
                    found = Match(block, start, stop, None, None, bindings)
                    break
            if found is None:
                start += 1
            else:
                matches.append(found)
                start = found.stop
    return matches


def _expression_matches(
    pattern: cst.BaseExpression, node: cst.CSTNode, statement: cst.BaseStatement | None
) -> Iterator[Match]:
    if isinstance(node, cst.BaseStatement):
        statement = node
    if isinstance(node, cst.BaseExpression):
        bindings: Bindings = {}
        if match_node(pattern, node, bindings):
            yield Match(None, 0, 0, node, statement, bindings)
            return
    for child in node.children:
        yield from _expression_matches(pattern, child, statement)
