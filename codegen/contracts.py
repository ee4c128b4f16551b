"""Contracts: what AFD relies on in an upstream method (inherited, or run by an override's
``super()`` call), stated as anchor patterns.

An overlay declares them with ``relies_on={"forward": (contract(...), ...)}``. Generation checks
each against the pinned body (it must match exactly ``count`` times) and records where it
matched in the lock; ``codegen drift`` evaluates the same patterns on a new body, so a change
that keeps every contract is only info and a broken one blocks, saying what AFD would do wrong.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from codegen.edit import ParsedMethod, anchor_lines, parse_member, parse_method
from codegen.index import Member
from codegen.markers import Contract
from codegen.model import ContractMatch
from codegen.pattern import parse_pattern


def evaluate(member: Member, contracts: Sequence[Contract]) -> tuple[ContractMatch, ...]:
    """Where each contract matches in ``member``'s body; raises PatternError for a bad pattern."""
    return _evaluate(parse_member(member), contracts)


def evaluate_source(source: str, contracts: Sequence[Contract]) -> tuple[ContractMatch, ...]:
    """Where each contract matches in a live function's source (``inspect.getsource``: a platform
    plugin's replacement of a relied-on method, a method or a module-level function); lines
    count from the source's first line."""
    return _evaluate(parse_method(textwrap.indent(textwrap.dedent(source), "    "), 1), contracts)


def _evaluate(parsed: ParsedMethod, contracts: Sequence[Contract]) -> tuple[ContractMatch, ...]:
    results = []
    for contract in contracts:
        lines, codes = anchor_lines(parsed, parse_pattern(contract.pattern))
        results.append(ContractMatch(contract, tuple(lines), tuple(codes)))
    return tuple(results)
