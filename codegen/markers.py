"""The overlay vocabulary: markers and edit declarations used in ``overlay/**.py``.

Overlay modules import these names so that IDEs, ruff and type checkers can read them; the
generator never imports an overlay, it parses it and evaluates only the arguments of these calls
(literals only). At run time every marker is an identity function, so an overlay module is also
importable for documentation tools.

Example (see docs/overlay.md for the whole format)::

    @subclass(name="AFD{base}", bases=("DeepseekV2MoE",))
    class AFDDeepseekV2MoE(DeepseekV2MoE):
        @fork(
            replace(
                "self.experts = FusedMoE(...)",
                "self.experts = make_experts($...)",
                id="remote-experts",
                why="Attention keeps only a proxy of the experts",
            ),
        )
        def __init__(self, config, parallel_config, ...): ...
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

#: The edit actions a fork may declare.
ACTIONS = ("replace", "insert_before", "insert_after", "delete", "wrap")


class DifferenceKind(enum.Enum):
    """One way two signatures differ: what a ``delta(...)`` declares, what the signature check
    (:mod:`codegen.signatures`) and drift report. The value is the name a delta uses."""

    PARAM_ADDED = "param_added"
    PARAM_REMOVED = "param_removed"
    PARAM_RENAMED = "param_renamed"
    PARAM_KIND = "param_kind"
    PARAM_ORDER = "param_order"
    PARAM_DEFAULT = "param_default"
    PARAM_ANNOTATION = "param_annotation"
    RETURN_ANNOTATION = "return_annotation"
    DECORATORS = "decorators"


#: The signature differences a delta may declare, by name.
DELTA_KINDS = tuple(k.value for k in DifferenceKind)


@dataclass(frozen=True)
class Edit:
    """One anchored change to a forked upstream body."""

    #: one of ACTIONS
    action: str
    #: upstream code to find; ``...`` matches anything, ``$X`` / ``$...X`` capture
    anchor: str
    #: code that replaces / is inserted / wraps (``if cond:`` or ``with ctx:`` header for wrap)
    code: str | None
    #: stable name of the edit, unique in its method (lock keys and reports use it)
    id: str
    #: why AFD needs this edit (reviewed, shown in reports and provenance headers)
    why: str
    #: how many places the anchor must match
    count: int = 1
    #: for ``wrap`` with an ``if`` header: statements of an ``else:`` branch
    orelse: str | None = None
    #: the upstream releases it applies to (``"vllm>=0.28"``, :mod:`codegen.releases`); None: all.
    #: Edits of one method may share an id when no supported release gets both.
    when: str | None = None


@dataclass(frozen=True)
class Delta:
    """A declared, exact difference between an overlay signature and upstream's."""

    kind: DifferenceKind
    #: the parameter concerned (None for return annotation and decorators)
    param: str | None
    #: the upstream side, as normalized source text (None where there is none)
    upstream: str | None
    #: our side, as normalized source text (None where there is none)
    ours: str | None
    #: why the difference is needed
    why: str
    #: the base it applies to when the class has several (its name or ``module:Class``); None: all
    base: str | None = None
    #: the upstream releases it applies to, as for an edit's ``when``; None: all
    when: str | None = None

    def applies_to(self, base: str) -> bool:
        """Whether this delta is for ``base`` (``module:Class``)."""
        return self.base is None or self.base in (base, base.rsplit(":", 1)[-1])


@dataclass(frozen=True)
class Contract:
    """A structural fact about an upstream method AFD depends on (inherited, or run by an
    override's ``super()`` call).

    It is checked against the pinned body at generation (it must match exactly ``count`` times)
    and against every new body by ``codegen drift``: a body change that keeps every contract is
    only info, a broken contract blocks and says what AFD would do wrong.
    """

    #: upstream code that must be present, in the anchor pattern language (``...``, ``$X``, ``$...X``)
    pattern: str
    #: stable name, unique in its method
    id: str
    #: one sentence: what AFD would do wrong if upstream no longer did this
    if_broken: str
    #: how many places the pattern matches in the pinned body
    count: int = 1
    #: the upstream releases it is checked on, as for an edit's ``when``; None: all
    when: str | None = None
    #: a selection rule: the choice of class vLLM makes that this contract pins, in words ("the
    #: model runner the CPU worker builds"); a rule that changes blocks naming the AFD roles of
    #: the classes relying on it. None: a contract on behaviour, not on a choice of class
    selects: str | None = None
    #: the base whose generated class states it when the class has several (its name or
    #: ``module:Class``), as for a delta; None: all
    base: str | None = None

    def applies_to(self, base: str) -> bool:
        """Whether the class generated for ``base`` (``module:Class``) states this contract."""
        return self.base is None or self.base in (base, base.rsplit(":", 1)[-1])


def replace(
    anchor: str, code: str, *, id: str, why: str, count: int = 1, when: str | None = None
) -> Edit:
    """Replace each match of ``anchor`` with ``code``."""
    return Edit("replace", anchor, code, id, why, count, when=when)


def insert_before(
    anchor: str, code: str, *, id: str, why: str, count: int = 1, when: str | None = None
) -> Edit:
    """Insert the statements of ``code`` before each matched statement."""
    return Edit("insert_before", anchor, code, id, why, count, when=when)


def insert_after(
    anchor: str, code: str, *, id: str, why: str, count: int = 1, when: str | None = None
) -> Edit:
    """Insert the statements of ``code`` after each matched statement."""
    return Edit("insert_after", anchor, code, id, why, count, when=when)


def delete(anchor: str, *, id: str, why: str, count: int = 1, when: str | None = None) -> Edit:
    """Delete each matched statement."""
    return Edit("delete", anchor, None, id, why, count, when=when)


def wrap(
    anchor: str,
    header: str,
    *,
    id: str,
    why: str,
    count: int = 1,
    orelse: str | None = None,
    when: str | None = None,
) -> Edit:
    """Wrap each matched statement run in ``header`` (``if ...:`` or ``with ...:``)."""
    return Edit("wrap", anchor, header, id, why, count, orelse, when)


def delta(
    kind: str,
    param: str | None = None,
    *,
    upstream: str | None = None,
    ours: str | None = None,
    why: str,
    base: str | None = None,
    when: str | None = None,
) -> Delta:
    """Declare one exact signature difference from upstream (for one ``base``, or for all; on the
    releases of ``when``, or on all); ``kind`` is one of :data:`DELTA_KINDS`."""
    if kind not in DELTA_KINDS or not why.strip():
        raise ValueError(f"delta kind {kind!r} must be one of {DELTA_KINDS}, with a why")
    return Delta(DifferenceKind(kind), param, upstream, ours, why, base, when)


def contract(
    pattern: str,
    *,
    id: str,
    if_broken: str,
    count: int = 1,
    when: str | None = None,
    selects: str | None = None,
    base: str | None = None,
) -> Contract:
    """Declare what AFD relies on in an upstream method (an argument of ``relies_on``), on the
    releases of ``when`` (as for an edit), or on all; ``selects``: the contract is a selection
    rule, pinning which class vLLM builds (named in words); ``base``: only the class generated
    for that base states it."""
    return Contract(pattern, id, if_broken, count, when, selects, base)


def subclass(
    *,
    bases: tuple[str, ...] = (),
    name: str | None = None,
    relies_on: Mapping[str, tuple[Contract, ...]] | None = None,
    when: str | None = None,
    feature: str | None = None,
) -> Callable[[type[T]], type[T]]:
    """Declare a plugin-owned subclass of one or more upstream classes.

    Parameters:
        bases: upstream classes, as names visible in the mirrored upstream module or the overlay's
            imports, or ``"module:Class"``. Empty: the class statement's own base.
        name: generated class name; ``{base}`` is replaced by each base's name. Default: the
            overlay class name (one base only).
        relies_on: upstream methods whose behaviour AFD depends on (inherited, or run by an
            override's ``super()`` call), each with the contracts (``contract(...)``) that say
            what exactly; drift checks them on every bump. A key ``"module:Class.method"`` names
            a method outside the class's MRO whose decision the class depends on (such as the
            config property that picks the runner vLLM builds).
        when: the upstream releases the class is generated for (as for an edit), for an
            upstream class that older releases lack; None: all. Elsewhere nothing of it is
            generated, checked or locked, and an overlay module none of whose classes applies
            generates no module.
        feature: the AFD feature the class carries, in words ("DBO on one DP rank"), for a class
            that is no role's worker or runner: drift names it when upstream takes its base away.
    """
    del bases, name, relies_on, when, feature

    def mark(cls: type[T]) -> type[T]:
        return cls

    return mark


def _identity_or_factory(args: tuple[Any, ...]) -> Any:
    if len(args) == 1 and callable(args[0]):
        return args[0]
    return lambda function: function


def override(*args: Any, deltas: tuple[Delta, ...] = (), when: str | None = None) -> Any:
    """The method body is ours; the signature must equal upstream's (or declare ``deltas``).
    ``when``: the upstream releases the member exists on (as for an edit); None: all."""
    del deltas, when
    return _identity_or_factory(args)


def extend(*args: Any, when: str | None = None) -> Any:
    """A method upstream does not have; an error if any upstream class in the MRO gains the name.
    ``@extend`` or ``@extend(when="vllm>=0.30")``."""
    del when
    return _identity_or_factory(args)


def fork(*edits: Edit, deltas: tuple[Delta, ...] = (), when: str | None = None) -> Callable[[T], T]:
    """The body is the pinned upstream body with ``edits`` applied in order; ``when`` as for
    :func:`override`."""
    del edits, deltas, when
    return lambda function: function


def override_attr(value: T, *, when: str | None = None) -> T:
    """A class attribute that replaces one upstream defines (recorded in the lock)."""
    del when
    return value


def extend_attr(value: T, *, when: str | None = None) -> T:
    """A new class attribute; an error if upstream's MRO has the name."""
    del when
    return value
