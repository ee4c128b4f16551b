"""What upstream values are, read statically: the environment variables a module's table defines,
the type an attribute is declared with, and the fields a field-built class (``@dataclass``,
vLLM's ``@config``, ``NamedTuple``) is constructed from.

The lock records them (:mod:`codegen.lock_build`) beside the uses of AFD's hand-written code that
depend on them (:mod:`codegen.call_sites`): an environment variable it reads, the methods it calls
on an attribute, the fields it passes.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from codegen.index import ModuleInfo, UpstreamIndex
from codegen.model import Param, ParamKind, Signature, SymbolRef

#: the module-level table a package's environment module declares its variables in, name ->
#: the function that parses each (vLLM's ``vllm/envs.py``)
ENVIRONMENT_TABLE = "environment_variables"
#: each package's module that holds :data:`ENVIRONMENT_TABLE`
ENVIRONMENT_MODULE = "envs"


@dataclass(frozen=True)
class EnvironmentVariable:
    """One variable of an environment table."""

    #: ``module:NAME``
    ref: SymbolRef
    #: the line its table entry starts on
    line: int
    #: how it is parsed: the entry's value (a lambda), as source
    parser: ast.expr
    #: the type its module declares for it (``bool | None``), None if none
    type: str | None


def environment_table(info: ModuleInfo) -> dict[str, tuple[int, ast.expr]] | None:
    """Variable name -> (line, parser) of the module's :data:`ENVIRONMENT_TABLE`; None when the
    module has no such table."""
    for node in info.tree.body:
        target: ast.expr | None = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if (
            isinstance(target, ast.Name)
            and target.id == ENVIRONMENT_TABLE
            and isinstance(node, ast.Assign | ast.AnnAssign)
            and isinstance(node.value, ast.Dict)
        ):
            return {
                key.value: (key.lineno, value)
                for key, value in zip(node.value.keys, node.value.values, strict=True)
                if isinstance(key, ast.Constant) and isinstance(key.value, str)
            }
    return None


def environment_variable(index: UpstreamIndex, ref: SymbolRef) -> EnvironmentVariable | None:
    """The variable ``ref`` (``vllm.envs:VLLM_X``) names, if its module's table defines it."""
    info = index.module(ref.module)
    table = environment_table(info) if info is not None else None
    if info is None or table is None or ref.qualname not in table:
        return None
    line, parser = table[ref.qualname]
    return EnvironmentVariable(ref, line, parser, _declared_in_module(info, ref.qualname))


def environment_module(index: UpstreamIndex, name: str) -> SymbolRef | None:
    """``<package>.envs:NAME`` for the first indexed package whose environment table defines the
    variable ``name`` (what ``os.environ["NAME"]`` reads for it), else None."""
    for package in sorted(index.sources):
        ref = SymbolRef(f"{package}.{ENVIRONMENT_MODULE}", name)
        if environment_variable(index, ref) is not None:
            return ref
    return None


def has_environment_table(index: UpstreamIndex, module: str) -> bool:
    """Whether ``module`` declares its environment variables in a table."""
    info = index.module(module)
    return info is not None and environment_table(info) is not None


def _declared_in_module(info: ModuleInfo, name: str) -> str | None:
    """The annotation of a module-level ``name: T`` (``if TYPE_CHECKING:`` blocks included)."""
    for node in ast.walk(info.tree):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
        ):
            return ast.unparse(node.annotation)
    return None


#: the containers a value's display or constructor call builds
_CONTAINERS: dict[type, str] = {
    ast.Set: "set",
    ast.SetComp: "set",
    ast.Dict: "dict",
    ast.DictComp: "dict",
    ast.List: "list",
    ast.ListComp: "list",
    ast.Tuple: "tuple",
}
_CONSTRUCTORS = ("set", "dict", "list", "tuple", "frozenset", "deque", "defaultdict", "OrderedDict")


def declared_type(statement: ast.AST) -> str | None:
    """The type an assignment gives its attribute: the annotation (``x: set[str] = set()``), else
    the container its value builds (``set``, ``dict``, ``list``...); None when neither says."""
    if isinstance(statement, ast.AnnAssign):
        return ast.unparse(statement.annotation)
    value = statement.value if isinstance(statement, ast.Assign) else None
    if value is None:
        return None
    if type(value) in _CONTAINERS:
        return _CONTAINERS[type(value)]
    if isinstance(value, ast.Call) and _called_name(value) in _CONSTRUCTORS:
        return _called_name(value)
    return None


#: decorators and bases that make a class's constructor take its annotated fields
FIELD_CLASSES = ("dataclass", "config", "NamedTuple")


def builds_fields(node: ast.ClassDef) -> bool:
    """Whether a class is built from its annotated fields (``@dataclass``, ``@config``,
    ``NamedTuple``)."""
    marks = [*node.decorator_list, *node.bases]
    return any(_called_name(mark) in FIELD_CLASSES for mark in marks)


def field_signature(index: UpstreamIndex, ref: SymbolRef) -> Signature | None:
    """The constructor of a class built from its annotated fields: the fields of every such class
    along the MRO, bases first, as keyword-or-positional parameters; a ``field(...)`` without
    ``default=`` or ``default_factory=`` is required. None for any other class."""
    nodes = [n for cls in index.mro(ref) if (n := index.class_node(cls)) is not None]
    if not any(builds_fields(node) for node in nodes):
        return None
    fields: dict[str, Param] = {}
    for node in reversed(nodes):
        if builds_fields(node):
            fields.update((param.name, param) for param in own_fields(node))
    return Signature(tuple(fields.values()), None)


def own_fields(node: ast.ClassDef) -> list[Param]:
    """The annotated fields a class body declares (``ClassVar`` ones left out)."""
    return [
        Param(
            statement.target.id,
            ParamKind.POSITIONAL_OR_KEYWORD,
            _field_default(statement.value),
            ast.unparse(statement.annotation),
        )
        for statement in node.body
        if isinstance(statement, ast.AnnAssign)
        and isinstance(statement.target, ast.Name)
        and "ClassVar" not in ast.unparse(statement.annotation)
    ]


def _called_name(node: ast.expr) -> str:
    """``dataclass`` of ``@dataclass``, ``@dataclass(frozen=True)``, ``dataclasses.dataclass``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _field_default(value: ast.expr | None) -> str | None:
    """A field's default as source text; None when the field is required."""
    if value is None:
        return None
    if isinstance(value, ast.Call) and _called_name(value) == "field":
        given = {k.arg for k in value.keywords}
        if not given & {"default", "default_factory"}:
            return None
    return ast.unparse(value)
