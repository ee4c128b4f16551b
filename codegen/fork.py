"""Apply a fork for one release: parse the upstream method, keep the edits of that release (their
``when=``), match each anchor in the upstream body, and apply the edits in order.

The one implementation behind generation (:mod:`codegen.generate`), the drift checker's re-base
and generated diff (:mod:`codegen.drift.forks`) and ``codegen show``. The result is closed:
:class:`AppliedFork` or :class:`FailedFork`; nothing is raised for an edit that does not apply.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import libcst as cst

from codegen.edit import EditError, ParsedMethod, anchor_lines, apply_edits, parse_member
from codegen.index import Member
from codegen.markers import Edit
from codegen.model import AnchorMatch
from codegen.pattern import PatternError, parse_pattern
from codegen.releases import applicable


class ForkStage(enum.Enum):
    """Where applying a fork stopped."""

    #: an edit's anchor is not a valid pattern
    ANCHOR = "anchor"
    #: an edit does not apply to the body as the previous edits left it
    APPLY = "apply"


@dataclass(frozen=True)
class AppliedFork:
    """Every edit of the release applied."""

    #: the upstream method, parsed on its own
    parsed: ParsedMethod
    #: the edits that apply to the release, in order
    edits: tuple[Edit, ...]
    #: where each edit's anchor matches in the upstream body, one per edit
    anchors: tuple[AnchorMatch, ...]
    #: the method after each edit, in order (the last is :attr:`function`)
    steps: tuple[cst.FunctionDef, ...]

    @property
    def function(self) -> cst.FunctionDef:
        """The edited method (the upstream one when no edit applies to the release)."""
        return self.steps[-1] if self.steps else self.parsed.function


@dataclass(frozen=True)
class FailedFork:
    """An edit of the release that could not be anchored or applied."""

    #: the upstream method, parsed on its own
    parsed: ParsedMethod
    #: the edits that apply to the release, in order
    edits: tuple[Edit, ...]
    #: where it stopped
    stage: ForkStage
    #: the edit it stopped at
    edit: Edit
    #: why
    error: EditError | PatternError
    #: every edit that did not apply, each with why, in order (the first is ``edit``): the
    #: later edits are tried on the body as the ones before left it, so that a maintainer sees
    #: every lost anchor of the fork at once
    failures: tuple[tuple[Edit, EditError | PatternError], ...] = ()


ForkResult = AppliedFork | FailedFork


def apply_fork(member: Member, edits: Sequence[Edit], release: Mapping[str, str]) -> ForkResult:
    """``edits`` of the fork of ``member`` that apply at ``release`` (package -> version),
    anchored in the upstream body and applied in order."""
    parsed = parse_member(member)
    kept = applicable(edits, release)
    anchors: list[AnchorMatch] = []
    for edit in kept:
        try:
            lines, codes = anchor_lines(parsed, parse_pattern(edit.anchor))
        except PatternError as exc:
            return FailedFork(parsed, kept, ForkStage.ANCHOR, edit, exc)
        anchors.append(AnchorMatch(edit, tuple(lines), tuple(codes)))
    steps: list[cst.FunctionDef] = []
    failures: list[tuple[Edit, EditError | PatternError]] = []
    function = parsed.function
    for edit in kept:
        try:
            function = apply_edits(function, [edit])
        except (EditError, PatternError) as exc:
            failures.append((edit, exc))
            continue
        steps.append(function)
    if failures:
        edit, error = failures[0]
        return FailedFork(parsed, kept, ForkStage.APPLY, edit, error, tuple(failures))
    return AppliedFork(parsed, kept, tuple(anchors), tuple(steps))
