"""Frozen data that crosses stage boundaries (load -> match -> edit -> emit -> check)."""

from __future__ import annotations

import ast
import enum
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from codegen.markers import Contract, Delta, Edit

#: the package the generated code is imported as, and the prefix of its lock keys
GENERATED_PACKAGE = "afd_models._generated"
GENERATED_PREFIX = GENERATED_PACKAGE + "."


def package_of(key: str) -> str:
    """The upstream package a lock key is about: ``vllm`` of ``vllm.v1.outputs:X`` and of
    ``afd_models._generated.vllm.v1.worker.x:AFDX`` (generated from vLLM's code)."""
    return key.removeprefix(GENERATED_PREFIX).split(".", 1)[0]


@dataclass(frozen=True, order=True)
class SymbolRef:
    """A module-level symbol or a class member: ``module:Qual.name``."""

    #: dotted module, e.g. ``vllm.model_executor.models.deepseek_v2``
    module: str
    #: qualified name inside the module, e.g. ``DeepseekV2MoE`` or ``DeepseekV2MoE.forward``
    qualname: str

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}"

    @classmethod
    def parse(cls, text: str) -> SymbolRef:
        """``module:Qual.name``, or ``module:`` for the module itself (what ``str`` gives)."""
        module, colon, qualname = text.partition(":")
        if not module or not colon:
            raise ValueError(f"{text!r} is not a 'module:Name' reference")
        return cls(module, qualname)

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]

    def member(self, name: str) -> SymbolRef:
        return SymbolRef(self.module, f"{self.qualname}.{name}")


class ParamKind(enum.Enum):
    POSITIONAL_ONLY = "positional-only"
    POSITIONAL_OR_KEYWORD = "positional-or-keyword"
    VAR_POSITIONAL = "var-positional"
    KEYWORD_ONLY = "keyword-only"
    VAR_KEYWORD = "var-keyword"


@dataclass(frozen=True)
class Param:
    """One parameter; default and annotation as normalized source text."""

    name: str
    kind: ParamKind
    default: str | None = None
    annotation: str | None = None

    def render(self) -> str:
        prefix = {ParamKind.VAR_POSITIONAL: "*", ParamKind.VAR_KEYWORD: "**"}.get(self.kind, "")
        text = prefix + self.name
        if self.annotation is not None:
            text += f": {self.annotation}"
        if self.default is not None:
            text += f" = {self.default}" if self.annotation is not None else f"={self.default}"
        return text


def normalize_expr(node: ast.expr | None) -> str | None:
    """Source text of an expression with formatting and comments normalized away."""
    return None if node is None else ast.unparse(node)


@dataclass(frozen=True)
class Signature:
    """What the signature checker compares: parameters, return annotation, decorators, async."""

    params: tuple[Param, ...]
    returns: str | None
    decorators: tuple[str, ...] = ()
    is_async: bool = False

    @classmethod
    def from_ast(
        cls,
        node: ast.FunctionDef | ast.AsyncFunctionDef,
        skip_decorators: frozenset[str] = frozenset(),
    ) -> Signature:
        a = node.args
        params: list[Param] = []
        positional = [*a.posonlyargs, *a.args]
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(
            a.defaults
        )
        for index, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
            kind = (
                ParamKind.POSITIONAL_ONLY
                if index < len(a.posonlyargs)
                else ParamKind.POSITIONAL_OR_KEYWORD
            )
            params.append(
                Param(arg.arg, kind, normalize_expr(default), normalize_expr(arg.annotation))
            )
        if a.vararg:
            params.append(
                Param(
                    a.vararg.arg,
                    ParamKind.VAR_POSITIONAL,
                    None,
                    normalize_expr(a.vararg.annotation),
                )
            )
        for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
            params.append(
                Param(
                    arg.arg,
                    ParamKind.KEYWORD_ONLY,
                    normalize_expr(default),
                    normalize_expr(arg.annotation),
                )
            )
        if a.kwarg:
            params.append(
                Param(a.kwarg.arg, ParamKind.VAR_KEYWORD, None, normalize_expr(a.kwarg.annotation))
            )
        decorators = tuple(
            text for d in node.decorator_list if (text := ast.unparse(d)) not in skip_decorators
        )
        return cls(
            tuple(params),
            normalize_expr(node.returns),
            decorators,
            isinstance(node, ast.AsyncFunctionDef),
        )

    def render(self) -> str:
        parts: list[str] = []
        kinds = [p.kind for p in self.params]
        for index, param in enumerate(self.params):
            if param.kind is ParamKind.KEYWORD_ONLY and ParamKind.VAR_POSITIONAL not in kinds:
                if index == 0 or self.params[index - 1].kind is not ParamKind.KEYWORD_ONLY:
                    parts.append("*")
            parts.append(param.render())
            if param.kind is ParamKind.POSITIONAL_ONLY and (
                index + 1 == len(self.params)
                or self.params[index + 1].kind is not ParamKind.POSITIONAL_ONLY
            ):
                parts.append("/")
        text = f"({', '.join(parts)})"
        if self.returns is not None:
            text += f" -> {self.returns}"
        prefix = "".join(f"@{d} " for d in self.decorators)
        return prefix + ("async " if self.is_async else "") + text


class MemberKind(enum.Enum):
    """How an overlay class member relates to upstream."""

    OVERRIDE = "override"
    EXTEND = "extend"
    FORK = "fork"
    OVERRIDE_ATTR = "override_attr"
    EXTEND_ATTR = "extend_attr"

    @property
    def is_method(self) -> bool:
        return self in (MemberKind.OVERRIDE, MemberKind.EXTEND, MemberKind.FORK)

    @property
    def needs_upstream(self) -> bool:
        return self in (MemberKind.OVERRIDE, MemberKind.FORK, MemberKind.OVERRIDE_ATTR)


@dataclass(frozen=True)
class MemberDecl:
    """One member of an overlay class."""

    name: str
    kind: MemberKind
    #: the overlay's own code: a method (markers stripped) or a class-level assignment
    node: cst.FunctionDef | cst.SimpleStatementLine
    #: the overlay's signature (methods only)
    signature: Signature | None
    #: fork edits, in order
    edits: tuple[Edit, ...] = ()
    #: declared signature differences
    deltas: tuple[Delta, ...] = ()
    #: 1-based line in the overlay file
    line: int = 0
    #: the upstream releases the member exists on (``"vllm>=0.30"``, :mod:`codegen.releases`);
    #: None: all. Members of one name may share a class when no supported release gets two.
    when: str | None = None


@dataclass(frozen=True)
class OverlayClass:
    """One ``@subclass`` declaration; generates one class per base."""

    name: str
    #: upstream base classes, resolved
    bases: tuple[SymbolRef, ...]
    #: generated class name; ``{base}`` is each base's name
    name_template: str
    #: upstream methods AFD's behaviour depends on (inherited, or run by an override's super()),
    #: with the contracts that say how
    relies_on: dict[str, tuple[Contract, ...]]
    members: tuple[MemberDecl, ...]
    #: class decorators other than the marker (copied onto generated classes)
    decorators: tuple[cst.Decorator, ...]
    docstring: str | None
    line: int
    #: the upstream releases the class is generated for, as for a member's ``when``; None: all
    when: str | None = None
    #: the AFD feature it carries, in words (``feature=``); None: none named
    feature: str | None = None

    def generated_name(self, base: SymbolRef) -> str:
        return self.name_template.replace("{base}", base.name)


@dataclass(frozen=True)
class OverlayModule:
    """One overlay file, mirroring one upstream module."""

    #: path relative to the repository root
    path: Path
    #: the upstream module it mirrors
    upstream_module: str
    #: the module docstring
    docstring: str | None
    #: import statements to copy into the generated module (marker imports removed)
    imports: tuple[cst.SimpleStatementLine, ...]
    #: names bound by those imports
    imported: dict[str, SymbolRef]
    classes: tuple[OverlayClass, ...]
    sha256: str

    @property
    def generated_module(self) -> str:
        relative = self.path.relative_to("overlay").with_suffix("")
        return GENERATED_PREFIX + ".".join(relative.parts)

    @property
    def generated_path(self) -> Path:
        return Path("afd_models/_generated") / self.path.relative_to("overlay")


@dataclass(frozen=True)
class AnchorMatch:
    """Where one edit's anchor matched in an upstream body."""

    #: the edit
    edit: Edit
    #: upstream lines (1-based) of each match, in order
    lines: tuple[int, ...]
    #: normalized code of each match
    matched: tuple[str, ...]


@dataclass(frozen=True)
class ContractMatch:
    """Where one contract of a relied-on method matched in the pinned upstream body."""

    contract: Contract
    #: upstream lines (1-based) of each match, in order
    lines: tuple[int, ...]
    #: normalized code of each match
    matched: tuple[str, ...]


@dataclass(frozen=True)
class GeneratedMember:
    """A member of a generated class, with what it came from."""

    decl: MemberDecl
    #: the upstream member it overrides/forks, with the class that defines it
    upstream: SymbolRef | None
    #: the upstream signature it was checked against
    upstream_signature: Signature | None
    #: the final code (forks: edited upstream body)
    node: cst.FunctionDef | cst.SimpleStatementLine
    anchors: tuple[AnchorMatch, ...] = ()


@dataclass(frozen=True)
class GeneratedClass:
    """One plugin-owned subclass."""

    name: str
    #: the generated module it lives in
    module: str
    base: SymbolRef
    overlay: OverlayClass
    overlay_path: Path
    members: tuple[GeneratedMember, ...]
    #: upstream methods the class inherits unchanged: name -> defining upstream symbol
    inherited: dict[str, SymbolRef] = field(default_factory=dict)
    #: relied-on upstream methods: name -> where each contract matched in the pinned body
    contracts: dict[str, tuple[ContractMatch, ...]] = field(default_factory=dict)

    @property
    def ref(self) -> SymbolRef:
        return SymbolRef(self.module, self.name)
