"""The value-level uses :mod:`codegen.call_sites` finds in hand-written code, beyond plain calls
and reads: environment variables (through an upstream environment module or ``os.environ``),
what is done with a value read (a method called on it, an index, an iteration), constructions
through the generated registry (``generated_subclass("AFDX", Base)(...)``), and parameters
annotated with an upstream class."""

from __future__ import annotations

import ast
from collections.abc import Mapping

from codegen.index import UpstreamIndex
from codegen.lock import Site, SiteKind
from codegen.model import SymbolRef
from codegen.site_scope import PlaceOf, Scope
from codegen.upstream_values import environment_module, has_environment_table

#: builtins that iterate their argument: ``set(self.x)`` iterates ``self.x``
_ITERATING = frozenset(
    {"set", "list", "tuple", "sorted", "frozenset", "sum", "min", "max", "any", "all"}
)


def registry_call(
    node: ast.expr, scope: Scope, index: UpstreamIndex
) -> tuple[str, tuple[SymbolRef, ...]] | None:
    """``generated_subclass("AFDX", Base)``: the overlay class and the upstream bases it stands
    for (``Base`` when that names an imported upstream class, else every base of ``AFDX``)."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in scope.registry_names
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return None
    name = node.args[0].value
    named = node.args[1] if len(node.args) > 1 else None
    if isinstance(named, ast.Name) and named.id in scope.imported:
        ref = scope.imported[named.id]
        if index.is_indexed_class(ref):
            return name, (ref,)
    return name, tuple(scope.registry.get(name, ()))


def registry_variables(
    nodes: list[ast.AST], scope: Scope, index: UpstreamIndex, place: PlaceOf
) -> dict[tuple[str, str], tuple[tuple[int, str, tuple[SymbolRef, ...]], ...]]:
    """Names a function binds to ``generated_subclass(...)``: what calling them constructs, by
    the line of each binding."""
    found: dict[tuple[str, str], list[tuple[int, str, tuple[SymbolRef, ...]]]] = {}
    for node in nodes if scope.registry_names else ():
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            registry = registry_call(node.value, scope, index)
            if registry is not None:
                key = (place(node).function, node.targets[0].id)
                found.setdefault(key, []).append((node.lineno, *registry))
    return {key: tuple(sorted(bound)) for key, bound in found.items()}


def annotated_parameters(
    nodes: list[ast.AST], scope: Scope, index: UpstreamIndex, place: PlaceOf
) -> dict[tuple[str, str], SymbolRef]:
    """(function, parameter) -> the imported upstream class the parameter is annotated with
    (``vllm_config: VllmConfig``, ``"VllmConfig"``, ``VllmConfig | None``)."""
    found = {}
    for node in nodes:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        arguments = node.args
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            ref = _annotated_class(arg.annotation, scope)
            if ref is not None and index.is_indexed_class(ref):
                found[(place(node).function, arg.arg)] = ref
    return found


def _annotated_class(annotation: ast.expr | None, scope: Scope) -> SymbolRef | None:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        sides = [annotation.left, annotation.right]
        named = [s for s in sides if not (isinstance(s, ast.Constant) and s.value is None)]
        annotation = named[0] if len(named) == 1 else None
    if isinstance(annotation, ast.Name):
        return scope.imported.get(annotation.id)
    return None


def name_of(node: ast.AST | None) -> str:
    return node.id if isinstance(node, ast.Name) else ""


def operations_on(node: ast.Attribute, parents: Mapping[int, ast.AST]) -> tuple[str, ...]:
    """What the code does with the value ``node`` reads: calls a method on it, indexes it,
    iterates it (none: reads it as a whole)."""
    parent = parents.get(id(node))
    if isinstance(parent, ast.Attribute) and parent.value is node:
        call = parents.get(id(parent))
        return (f".{parent.attr}()",) if isinstance(call, ast.Call) and call.func is parent else ()
    if isinstance(parent, ast.Subscript) and parent.value is node:
        return ("[]",)
    if isinstance(parent, ast.For | ast.AsyncFor | ast.comprehension) and parent.iter is node:
        return ("iter",)
    if (
        isinstance(parent, ast.Call)
        and isinstance(parent.func, ast.Name)
        and parent.func.id in _ITERATING
        and node in parent.args
    ):
        return ("iter",)
    return ()


def environment_site(
    node: ast.AST, scope: Scope, index: UpstreamIndex, place: PlaceOf
) -> tuple[SymbolRef, Site] | None:
    """An environment variable ``node`` reads or writes: ``envs.VLLM_X`` (a module with an
    environment table), ``os.environ.get("VLLM_X")``, ``os.environ["VLLM_X"]``,
    ``os.getenv("VLLM_X")``, ``"VLLM_X" in os.environ``; only variables an upstream table defines."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and isinstance(node.ctx, ast.Load)
    ):
        module = scope.imported.get(node.value.id)
        if (
            module is not None
            and module.qualname == ""
            and has_environment_table(index, module.module)
        ):
            return SymbolRef(module.module, node.attr), Site(
                place(node), SiteKind.READ, via=module.module
            )
        return None
    name, how = _environ_use(node, scope)
    ref = environment_module(index, name) if name else None
    if ref is None:
        return None
    return ref, Site(place(node), how, via="os.environ")


def _environ_use(node: ast.AST, scope: Scope) -> tuple[str, SiteKind]:
    """The variable name a use of ``os.environ`` names, and whether it reads or writes it."""

    def environ(value: ast.expr) -> bool:
        return (
            isinstance(value, ast.Attribute)
            and value.attr == "environ"
            and isinstance(value.value, ast.Name)
            and value.value.id in scope.os_names
        )

    def constant(value: ast.expr | None) -> str:
        return (
            value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else ""
        )

    if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
        func = node.func
        if environ(func.value) and func.attr in ("get", "pop", "setdefault"):
            how = SiteKind.WRITE if func.attr == "setdefault" else SiteKind.READ
            return constant(node.args[0]), how
        if (
            isinstance(func.value, ast.Name)
            and func.value.id in scope.os_names
            and func.attr == "getenv"
        ):
            return constant(node.args[0]), SiteKind.READ
    if isinstance(node, ast.Subscript) and environ(node.value):
        how = SiteKind.READ if isinstance(node.ctx, ast.Load) else SiteKind.WRITE
        return constant(node.slice), how
    if (
        isinstance(node, ast.Compare)
        and len(node.comparators) == 1
        and isinstance(node.ops[0], ast.In | ast.NotIn)
        and environ(node.comparators[0])
    ):
        return constant(node.left), SiteKind.READ
    return "", SiteKind.READ
