"""Exact signature comparison: overlay vs pinned upstream, explained only by declared deltas.

Every difference between the two signatures is one :class:`Difference`. A difference is fine
only if a declared ``delta(...)`` names the same kind and parameter *and* the same values on both
sides; a delta that explains nothing, or explains with other values, is itself an error. The
message of an unexplained difference prints the exact ``delta(...)`` that would declare it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from codegen.findings import Finding, Kind, Location, Severity
from codegen.markers import Delta, DifferenceKind
from codegen.model import Param, Signature

_KIND_OF = {
    DifferenceKind.PARAM_ADDED: Kind.PARAM_ADDED,
    DifferenceKind.PARAM_REMOVED: Kind.PARAM_REMOVED,
    DifferenceKind.PARAM_RENAMED: Kind.PARAM_RENAMED,
    DifferenceKind.PARAM_KIND: Kind.PARAM_KIND,
    DifferenceKind.PARAM_ORDER: Kind.PARAM_ORDER,
    DifferenceKind.PARAM_DEFAULT: Kind.PARAM_DEFAULT,
    DifferenceKind.PARAM_ANNOTATION: Kind.PARAM_ANNOTATION,
    DifferenceKind.RETURN_ANNOTATION: Kind.RETURN_ANNOTATION,
    DifferenceKind.DECORATORS: Kind.DECORATORS,
}


@dataclass(frozen=True)
class Difference:
    """One way two signatures differ; values are normalized source text (None: absent)."""

    kind: DifferenceKind
    param: str | None
    upstream: str | None
    ours: str | None

    def as_delta_call(self) -> str:
        args = [repr(self.kind.value)]
        if self.param is not None:
            args.append(repr(self.param))
        args.append(f"upstream={self.upstream!r}")
        args.append(f"ours={self.ours!r}")
        args.append('why="..."')
        return f"delta({', '.join(args)})"


def differences(upstream: Signature, ours: Signature) -> list[Difference]:
    """All differences from ``upstream`` to ``ours``, in a stable order."""
    result: list[Difference] = []
    up_names = [p.name for p in upstream.params]
    our_names = [p.name for p in ours.params]
    renamed: dict[str, str] = {}
    for a, b in zip(upstream.params, ours.params, strict=False):
        if a.name != b.name and a.name not in our_names and b.name not in up_names:
            renamed[a.name] = b.name
            result.append(Difference(DifferenceKind.PARAM_RENAMED, a.name, a.name, b.name))
    ours_by_name = {p.name: p for p in ours.params}
    for param in upstream.params:
        counterpart = ours_by_name.get(renamed.get(param.name, param.name))
        if counterpart is None:
            result.append(
                Difference(DifferenceKind.PARAM_REMOVED, param.name, param.render(), None)
            )
            continue
        result.extend(_param_differences(param, counterpart))
    matched = {renamed.get(n, n) for n in up_names}
    for param in ours.params:
        if param.name not in matched:
            result.append(Difference(DifferenceKind.PARAM_ADDED, param.name, None, param.render()))
    common_up = [renamed.get(n, n) for n in up_names if renamed.get(n, n) in our_names]
    common_ours = [n for n in our_names if n in matched]
    if common_up != common_ours:
        result.append(
            Difference(
                DifferenceKind.PARAM_ORDER, None, ", ".join(common_up), ", ".join(common_ours)
            )
        )
    if upstream.returns != ours.returns:
        result.append(
            Difference(DifferenceKind.RETURN_ANNOTATION, None, upstream.returns, ours.returns)
        )
    if upstream.decorators != ours.decorators:
        result.append(
            Difference(
                DifferenceKind.DECORATORS,
                None,
                _decorators(upstream.decorators),
                _decorators(ours.decorators),
            )
        )
    return result


def _decorators(items: Sequence[str]) -> str | None:
    return " ".join(f"@{d}" for d in items) or None


def _param_differences(up: Param, ours: Param) -> Iterator[Difference]:
    name = up.name
    if up.kind is not ours.kind:
        yield Difference(DifferenceKind.PARAM_KIND, name, up.kind.value, ours.kind.value)
    if up.default != ours.default:
        yield Difference(DifferenceKind.PARAM_DEFAULT, name, up.default, ours.default)
    if up.annotation != ours.annotation:
        yield Difference(DifferenceKind.PARAM_ANNOTATION, name, up.annotation, ours.annotation)


def _normalize(kind: DifferenceKind, text: str | None) -> str | None:
    """Declared values are compared after the same normalization as extracted ones."""
    if text is None:
        return None
    try:
        if kind in (
            DifferenceKind.PARAM_DEFAULT,
            DifferenceKind.PARAM_ANNOTATION,
            DifferenceKind.RETURN_ANNOTATION,
        ):
            return ast.unparse(ast.parse(text, mode="eval"))
        if kind in (DifferenceKind.PARAM_ADDED, DifferenceKind.PARAM_REMOVED):
            func = ast.parse(f"def f({text}): pass").body[0]
            assert isinstance(func, ast.FunctionDef)
            params = Signature.from_ast(func).params
            return params[0].render() if len(params) == 1 else text
    except SyntaxError:
        return text
    return " ".join(text.split())


def check_signature(
    symbol: str,
    upstream: Signature,
    ours: Signature,
    deltas: Sequence[Delta],
    *,
    ours_at: Location,
    upstream_at: Location,
) -> list[Finding]:
    """Findings for unexplained differences, inexact deltas and unused deltas."""
    findings: list[Finding] = []
    used: set[int] = set()
    if upstream.is_async != ours.is_async:
        findings.append(
            Finding(
                Kind.ASYNC,
                Severity.BLOCK,
                symbol,
                f"is {'async' if upstream.is_async else 'not async'} upstream; match it",
                ours_at,
                upstream_at,
            )
        )
    for diff in differences(upstream, ours):
        index = next(
            (
                i
                for i, d in enumerate(deltas)
                if i not in used and d.kind == diff.kind and d.param == diff.param
            ),
            None,
        )
        if index is None:
            findings.append(
                Finding(
                    _KIND_OF[diff.kind],
                    Severity.BLOCK,
                    symbol,
                    f"{_describe(diff)}; write the upstream signature or declare {diff.as_delta_call()}",
                    ours_at,
                    upstream_at,
                    old=diff.upstream,
                    new=diff.ours,
                )
            )
            continue
        used.add(index)
        declared = deltas[index]
        if (_normalize(diff.kind, declared.upstream), _normalize(diff.kind, declared.ours)) != (
            diff.upstream,
            diff.ours,
        ):
            findings.append(
                Finding(
                    Kind.DELTA_INEXACT,
                    Severity.BLOCK,
                    symbol,
                    f"delta {diff.kind.value} {diff.param or ''} declares upstream={declared.upstream!r} ours={declared.ours!r} "
                    f"but the difference is upstream={diff.upstream!r} ours={diff.ours!r}; declare {diff.as_delta_call()}",
                    ours_at,
                    upstream_at,
                    old=diff.upstream,
                    new=diff.ours,
                )
            )
    for index, declared in enumerate(deltas):
        if index not in used:
            findings.append(
                Finding(
                    Kind.DELTA_UNUSED,
                    Severity.BLOCK,
                    symbol,
                    f"delta {declared.kind.value} {declared.param or ''} explains no difference from upstream; remove it",
                    ours_at,
                    upstream_at,
                )
            )
    return findings


def _describe(diff: Difference) -> str:
    p = f"parameter {diff.param!r}"
    return {
        DifferenceKind.PARAM_ADDED: f"{p} is not in upstream's signature",
        DifferenceKind.PARAM_REMOVED: f"{p} of upstream's signature is missing",
        DifferenceKind.PARAM_RENAMED: f"parameter {diff.upstream!r} is called {diff.ours!r}",
        DifferenceKind.PARAM_KIND: f"{p} is {diff.ours} but {diff.upstream} upstream",
        DifferenceKind.PARAM_ORDER: f"parameters are ordered ({diff.ours}) but ({diff.upstream}) upstream",
        DifferenceKind.PARAM_DEFAULT: f"{p} defaults to {diff.ours} but to {diff.upstream} upstream",
        DifferenceKind.PARAM_ANNOTATION: f"{p} is annotated {diff.ours} but {diff.upstream} upstream",
        DifferenceKind.RETURN_ANNOTATION: f"the return annotation is {diff.ours} but {diff.upstream} upstream",
        DifferenceKind.DECORATORS: f"decorators are {diff.ours} but {diff.upstream} upstream",
    }[diff.kind]
