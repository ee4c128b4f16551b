"""What AFD's hand-written code does with upstream values, on the new release: the environment
variables it reads or sets, the attributes it calls methods on, indexes or iterates (judged by
their type: a set that became a dict takes ``.update(ids)`` another way), and the field-built
classes it derives classes from. Each finding names the line of this repository that uses the
value (:class:`codegen.places.Places`). A change that breaks the use blocks, one that may still
work is a review, one that keeps it valid is info."""

from __future__ import annotations

import ast
import collections
from collections.abc import Iterator

from codegen.drift.sides import Side
from codegen.findings import Finding, Kind, Location, Severity
from codegen.lock import Site, SiteKind, SymbolDescription, SymbolEntry
from codegen.model import SymbolRef
from codegen.places import Places

#: what a container type's outer name builds, as Python's own types (typing's aliases too)
CONTAINERS: dict[str, type] = {
    "set": set,
    "Set": set,
    "MutableSet": set,
    "AbstractSet": frozenset,
    "frozenset": frozenset,
    "FrozenSet": frozenset,
    "dict": dict,
    "Dict": dict,
    "MutableMapping": dict,
    "Mapping": dict,
    "defaultdict": collections.defaultdict,
    "DefaultDict": collections.defaultdict,
    "OrderedDict": collections.OrderedDict,
    "Counter": collections.Counter,
    "list": list,
    "List": list,
    "MutableSequence": list,
    "Sequence": tuple,
    "tuple": tuple,
    "Tuple": tuple,
    "deque": collections.deque,
    "Deque": collections.deque,
}
#: a container's family: a method of one name means another thing in another family
#: (``set.update`` adds elements, ``dict.update`` key-value pairs)
_FAMILIES: dict[type, str] = {
    set: "set",
    frozenset: "set",
    dict: "mapping",
    collections.defaultdict: "mapping",
    collections.OrderedDict: "mapping",
    collections.Counter: "mapping",
    list: "sequence",
    tuple: "sequence",
    collections.deque: "sequence",
}


def container(type_text: str | None) -> type | None:
    """The Python container a type annotation (or inferred type) names; None for anything else."""
    if not type_text:
        return None
    try:
        node = ast.parse(type_text, mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.Subscript):
        node = node.value
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return CONTAINERS.get(name)


def _supports(kind: type, operation: str) -> bool:
    """Whether a value of ``kind`` takes ``operation`` (``.name()``, ``[]``, ``iter``)."""
    if operation == "[]":
        return hasattr(kind, "__getitem__")
    if operation == "iter":
        return hasattr(kind, "__iter__")
    return hasattr(kind, operation.removeprefix(".").removesuffix("()"))


def operation_severity(old: type, new: type | None, operation: str) -> Severity:
    """What a changed type means for one operation AFD does on the value."""
    if new is None:
        return Severity.REVIEW  # no container any more, or one this check does not know
    if not _supports(new, operation):
        return Severity.BLOCK
    if _FAMILIES[old] != _FAMILIES[new]:
        # iterating still iterates (a dict's keys); a method or an index means another thing
        return Severity.REVIEW if operation == "iter" else Severity.BLOCK
    return Severity.REVIEW  # the same family: the elements' type changed, or a sibling container


def type_findings(
    key: str,
    entry: SymbolEntry,
    current: SymbolDescription,
    old: Side,
    new: Side,
    places: Places,
) -> Iterator[Finding]:
    """An attribute AFD calls methods on, indexes or iterates, whose type changed: judged per
    operation against the new type (only a container's type is judged: a class's methods are
    symbols of their own)."""
    recorded = entry.description
    before = container(recorded.type)
    operated = [s for s in entry.sites if s.operations]
    if before is None or not operated or recorded.type == current.type:
        return
    after = container(current.type)
    judged = [
        (s, op, operation_severity(before, after, op)) for s in operated for op in s.operations
    ]
    site, operation, severity = max(judged, key=lambda j: j[2].rank)
    ref = SymbolRef.parse(key)
    where = places.location(site, ref)
    ops = ", ".join(sorted({op for _, op, _ in judged}))
    reason = {
        Severity.BLOCK: f"{operation} {'is not' if after is None or not _supports(after, operation) else 'means another thing'} "
        f"on {current.type}: AFD's line at {where} fails or does something else; change it to the new type",
        Severity.REVIEW: f"{operation} may still work on {current.type}; check AFD's line at {where}",
    }[severity]
    yield Finding(
        Kind.DRIFT_ATTRIBUTE_TYPE,
        severity,
        key,
        f"type changed: {recorded.type} -> {current.type or 'not stated'}; AFD does {ops} with it; {reason}",
        ours=where,
        upstream=_defined_at(recorded),
        target=_defined_at(current),
        old=recorded.type,
        new=current.type,
    )


def environment_findings(
    key: str,
    entry: SymbolEntry,
    current: SymbolDescription,
    old: Side,
    new: Side,
    places: Places,
) -> Iterator[Finding]:
    """An environment variable AFD reads or sets: gone (a read through its module raises, one
    through ``os.environ`` or a write no longer reaches vLLM), of another type, or parsed
    another way."""
    recorded = entry.description
    ref = SymbolRef.parse(key)
    sites = sorted(entry.sites, key=lambda s: (s.via == "os.environ", s.at))
    site = sites[0] if sites else None
    where = places.location(site, ref) if site is not None else None
    name = ref.qualname
    if current.kind is not recorded.kind:
        through_module = site is not None and site.via != "os.environ" and site.how is SiteKind.READ
        effect = (
            f"AFD reads it through {site.via if site else 'its module'} at {where}, which raises "
            "AttributeError now"
            if through_module
            else f"AFD {_verb(site)} it through os.environ at {where}, which vLLM no longer reads"
        )
        yield Finding(
            Kind.DRIFT_ENVIRONMENT,
            Severity.BLOCK if through_module else Severity.REVIEW,
            key,
            f"environment variable {name} is gone in {new.version}: {effect}; drop or replace "
            "the use",
            ours=where,
            upstream=_defined_at(recorded),
            old=name,
        )
        return
    if recorded.type != current.type:
        yield Finding(
            Kind.DRIFT_ENVIRONMENT,
            Severity.REVIEW,
            key,
            f"environment variable {name}'s type changed: {recorded.type} -> {current.type}; "
            f"check what AFD does with its value at {where}",
            ours=where,
            upstream=_defined_at(recorded),
            target=_defined_at(current),
            old=recorded.type,
            new=current.type,
        )
    elif recorded.value != current.value:
        # a value AFD sets may no longer parse (say "0" becoming an error): that needs a look;
        # one AFD only reads keeps its type
        writes = [s for s in sites if s.how is SiteKind.WRITE]
        where = places.location(writes[0], ref) if writes else where
        yield Finding(
            Kind.DRIFT_ENVIRONMENT,
            Severity.REVIEW if writes else Severity.INFO,
            key,
            f"environment variable {name} is parsed another way; its type ({current.type}) "
            + (
                f"is unchanged, but AFD sets it at {where}: check that vLLM still accepts the "
                "value AFD sets"
                if writes
                else f"is unchanged (AFD uses it at {where})"
            ),
            ours=where,
            upstream=_defined_at(recorded),
            target=_defined_at(current),
        )


def field_findings(
    key: str,
    entry: SymbolEntry,
    current: SymbolDescription,
    old: Side,
    new: Side,
    places: Places,
) -> Iterator[Finding]:
    """A field-built class AFD derives a class from, whose fields changed: a subclass declaring
    fields of its own builds its constructor from both (a required field after its defaulted
    ones fails the class statement, a field of the same name replaces the base's), so a review;
    one declaring none takes the base's as they are, and its constructions are judged at their
    calls (DRF023), so info."""
    recorded = entry.description
    subclassing = [s for s in entry.sites if s.how is SiteKind.SUBCLASS]
    if (
        not subclassing
        or recorded.init is not None
        or recorded.init_signature == current.init_signature
    ):
        return
    site = max(subclassing, key=lambda s: len(s.keywords))
    where = places.location(site, SymbolRef.parse(key))
    own = ", ".join(site.keywords)
    yield Finding(
        Kind.DRIFT_FIELDS,
        Severity.REVIEW if own else Severity.INFO,
        key,
        f"its fields changed; AFD derives a class from it at {where}"
        + (
            f", which declares fields of its own ({own}) after the base's: check the class "
            "statement still holds and what it sets"
            if own
            else ", which declares no field of its own: its constructions are judged at each "
            "call (DRF023)"
        ),
        ours=where,
        upstream=_defined_at(recorded),
        target=_defined_at(current),
        old=recorded.init_signature,
        new=current.init_signature,
    )


def _verb(site: Site | None) -> str:
    return "sets" if site is not None and site.how is SiteKind.WRITE else "reads"


def _defined_at(description: SymbolDescription) -> Location | None:
    """Where the lock says a symbol is defined (its file and line)."""
    if description.file is None:
        return None
    return Location(description.file, description.line or 0)
