"""Release ranges: the ``when=`` of an edit limited to some upstream releases (``"vllm>=0.28"``).

A range names one pinned package and comma-separated clauses, each an operator (``<``, ``<=``,
``>``, ``>=``, ``==``, ``!=``) and a release (``0.28``, ``0.26.0``, ``0.26.0rc1``). Releases
compare as :func:`afd_models.release_order.release_key` orders them (missing numbers count as 0,
a release candidate sorts before its release), the comparator the runtime uses too. No
third-party parser: the overlay vocabulary must load with the standard library.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from afd_models.release_order import release_key

_CLAUSE = re.compile(r"\s*(<=|>=|==|!=|<|>)\s*(\S+?)\s*")
_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True)
class ReleaseRange:
    """Releases of one package, as ``when=`` declares them."""

    package: str
    clauses: tuple[tuple[str, str], ...]

    def contains(self, release: str) -> bool:
        key = release_key(release)
        return all(_OPERATORS[op](key, release_key(bound)) for op, bound in self.clauses)


def parse_range(text: str) -> ReleaseRange:
    """``"vllm>=0.28"`` or ``"vllm>=0.26,<0.30"``; ValueError naming what is wrong."""
    match = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*(.+)", text)
    allowed = "allowed: a package and clauses such as 'vllm>=0.28' or 'vllm>=0.26,<0.30'"
    if match is None:
        raise ValueError(f"when={text!r}: {allowed}")
    clauses = []
    for part in match.group(2).split(","):
        clause = _CLAUSE.fullmatch(part)
        if clause is None:
            raise ValueError(f"when={text!r}: clause {part.strip()!r} is not valid; {allowed}")
        try:
            release_key(clause.group(2))
        except ValueError as exc:
            raise ValueError(f"when={text!r}: {exc}; {allowed}") from None
        clauses.append((clause.group(1), clause.group(2)))
    return ReleaseRange(match.group(1), tuple(clauses))


class Limited(Protocol):
    @property
    def when(self) -> str | None: ...


def applies(item: Limited, versions: Mapping[str, str]) -> bool:
    """Whether an edit (anything with ``when``) applies to upstream at ``versions``; an edit
    limited to a package not in ``versions`` never does."""
    if item.when is None:
        return True
    limit = parse_range(item.when)
    return limit.package in versions and limit.contains(versions[limit.package])


T = TypeVar("T", bound=Limited)


def applicable(items: Sequence[T], versions: Mapping[str, str]) -> tuple[T, ...]:
    """The ``items`` that apply to upstream at ``versions``, in order."""
    return tuple(item for item in items if applies(item, versions))
