"""Contracts: what AFD relies on in an inherited upstream method, stated as anchor patterns.

An overlay declares them with ``relies_on={"forward": (contract(...), ...)}``. Generation checks
each against the pinned body (it must match exactly ``count`` times) and records where it
matched in the lock; ``codegen drift`` evaluates the same patterns on a new body, so a change
that keeps every contract is only info and a broken one blocks, saying what AFD would do wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

from codegen.edit import anchor_lines, parse_member
from codegen.index import Member
from codegen.markers import Contract
from codegen.model import ContractMatch
from codegen.pattern import parse_pattern


def evaluate(member: Member, contracts: Sequence[Contract]) -> tuple[ContractMatch, ...]:
    """Where each contract matches in ``member``'s body; raises PatternError for a bad pattern."""
    parsed = parse_member(member)
    results = []
    for contract in contracts:
        lines, codes = anchor_lines(parsed, parse_pattern(contract.pattern))
        results.append(ContractMatch(contract, tuple(lines), tuple(codes)))
    return tuple(results)
