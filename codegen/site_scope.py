"""What names mean in the hand-written code :mod:`codegen.call_sites` scans: the upstream names a
file imports, ``os``, the generated registry's lookup function, the classes it derives from
upstream ones, and the class ``self`` resolves in."""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from codegen.index import UpstreamIndex
from codegen.lock import Place
from codegen.model import SymbolRef
from codegen.places import REGISTRY_FUNCTION
from codegen.upstream_values import builds_fields

#: the module of the function that looks up a class of the generated registry
REGISTRY_MODULE = "afd_models.generated_classes"


@dataclass(frozen=True)
class LocalClass:
    """A class of the scanned file derived from an imported upstream class."""

    base: SymbolRef
    #: the fields it declares itself (a field-built class's), which its constructor binds
    fields: frozenset[str]
    #: whether it defines its own ``__init__`` (then constructing it is no use of the base's)
    has_init: bool


@dataclass(frozen=True)
class Scope:
    """What names mean in the code being scanned."""

    #: local name -> the upstream symbol it is bound to
    imported: Mapping[str, SymbolRef]
    #: the upstream class ``self`` and ``super()`` resolve in (None: outside such a class)
    self_class: SymbolRef | None = None
    #: names the scanned class defines itself (its own members shadow upstream's)
    own: frozenset[str] = frozenset()
    #: local names bound to the module ``os``
    os_names: frozenset[str] = frozenset()
    #: local names bound to :data:`REGISTRY_FUNCTION`
    registry_names: frozenset[str] = frozenset()
    #: overlay class -> the upstream bases it is generated for (:func:`registry_bases`)
    registry: Mapping[str, tuple[SymbolRef, ...]] = field(default_factory=dict)
    #: classes of the file derived from upstream ones, by name
    local_classes: Mapping[str, LocalClass] = field(default_factory=dict)


#: the place of a scanned node
PlaceOf = Callable[[ast.AST], Place]


def file_scope(
    tree: ast.Module, index: UpstreamIndex, registry: Mapping[str, tuple[SymbolRef, ...]]
) -> Scope:
    """The names one file binds: its upstream imports, ``os``, the registry's lookup function,
    and (at its top level) the classes it derives from imported upstream ones."""
    imported = imported_names(tree, index)
    os_names: set[str] = set()
    registry_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_names |= {a.asname or a.name for a in node.names if a.name == "os"}
        elif isinstance(node, ast.ImportFrom) and node.module == REGISTRY_MODULE:
            registry_names |= {
                a.asname or a.name for a in node.names if a.name == REGISTRY_FUNCTION
            }
    local = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        base = _upstream_base(node, imported, index)
        if base is not None:
            own = {
                s.name for s in node.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            fields = {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
            local[node.name] = LocalClass(
                base, frozenset(fields) if builds_fields(node) else frozenset(), "__init__" in own
            )
    return Scope(
        imported,
        os_names=frozenset(os_names),
        registry_names=frozenset(registry_names),
        registry=registry,
        local_classes=local,
    )


def _upstream_base(
    node: ast.ClassDef, imported: Mapping[str, SymbolRef], index: UpstreamIndex
) -> SymbolRef | None:
    """The first imported upstream class ``node`` derives from directly."""
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in imported:
            ref = imported[base.id]
            if index.is_indexed_class(ref):
                return ref
    return None


def imported_names(tree: ast.Module, index: UpstreamIndex) -> dict[str, SymbolRef]:
    """Names any ``from <upstream> import x`` of the file binds, resolved to their definition."""
    found: dict[str, SymbolRef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if not index.owns(node.module):
                continue
            for alias in node.names:
                ref = index.resolve(node.module, alias.name)
                if ref is not None and index.owns(ref.module):
                    found[alias.asname or alias.name] = ref
    return found
