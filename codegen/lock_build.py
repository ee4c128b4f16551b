"""Build the lock (:class:`codegen.lock.Lock`) of one generation: every upstream symbol the
overlay, the generated code and the runtime use, described from the upstream index."""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable
from typing import Any

import libcst as cst

from codegen.generate import Generation, calls_super
from codegen.index import Member, UpstreamIndex, body_fingerprint
from codegen.lock import (
    AnchorEntry,
    ClassEntry,
    ContractEntry,
    Lock,
    MemberEntry,
    Site,
    SymbolDescription,
    SymbolEntry,
    SymbolKind,
    SymbolUse,
    UpstreamEntry,
)
from codegen.model import GeneratedMember, MemberKind, Signature, SymbolRef
from codegen.names import ModuleNamespace
from codegen.runtime_uses import UPSTREAM_FIELDS_PATH
from codegen.upstream_values import (
    declared_type,
    environment_variable,
    field_signature,
    has_environment_table,
)


def describe_symbol(index: UpstreamIndex, ref: SymbolRef) -> SymbolDescription:
    """Kind, location, signature and body fingerprint of one upstream symbol, as lock data."""
    info = index.module(ref.module)
    if info is None:
        return SymbolDescription(SymbolKind.EXTERNAL)
    file = info.path.as_posix()
    if ref.qualname == "":
        return SymbolDescription(SymbolKind.MODULE, file)
    owner, _, member = ref.qualname.partition(".")
    if member:
        found = index.find_member(SymbolRef(ref.module, owner), member)
        if found is not None:
            return _describe_member(found)
        assigned = index.instance_attribute(SymbolRef(ref.module, owner), member)
        if assigned is not None:  # no value fingerprint: any change to the assignment is noise
            return SymbolDescription(
                SymbolKind.INSTANCE_ATTRIBUTE,
                assigned.module.path.as_posix(),
                assigned.line,
                type=declared_type(assigned.node),
            )
        return SymbolDescription(SymbolKind.MISSING)
    variable = environment_variable(index, ref)
    if variable is not None:
        parser = ast.dump(variable.parser, include_attributes=False)
        return SymbolDescription(
            SymbolKind.ENVIRONMENT_VARIABLE,
            file,
            variable.line,
            value=hashlib.sha256(parser.encode()).hexdigest(),
            type=variable.type,
        )
    if has_environment_table(index, ref.module) and owner not in info.assigned | set(
        info.functions
    ):
        # its module's __getattr__ reads only the table's variables: not in it, no such variable
        return SymbolDescription(SymbolKind.MISSING)
    if owner in info.classes:
        init = index.find_member(ref, "__init__")
        has_init = init is not None and init.is_method
        fields = None if has_init else field_signature(index, ref)
        return SymbolDescription(
            SymbolKind.CLASS,
            file,
            info.classes[owner].lineno,
            bases=tuple(str(b) for b in index.bases(ref)),
            init=str(init.ref) if init is not None and has_init else None,
            init_signature=init.signature().render()
            if init is not None and has_init
            else (fields.render() if fields is not None else None),
        )
    if owner in info.functions:
        function = info.functions[owner]
        return SymbolDescription(
            SymbolKind.FUNCTION,
            file,
            function.lineno,
            signature=Signature.from_ast(function).render(),
            body=body_fingerprint(function),
        )
    if owner in info.assigned:
        assignment = next(
            (
                n
                for n in info.tree.body
                if isinstance(n, ast.Assign | ast.AnnAssign)
                and owner in {t.id for t in ast.walk(n) if isinstance(t, ast.Name)}
            ),
            None,
        )
        value = ast.dump(assignment, include_attributes=False) if assignment is not None else ""
        return SymbolDescription(
            SymbolKind.ATTRIBUTE,
            file,
            assignment.lineno if assignment is not None else None,
            value=hashlib.sha256(value.encode()).hexdigest(),
        )
    if "__getattr__" in info.functions:
        return SymbolDescription(SymbolKind.LAZY_ATTRIBUTE, file)
    return SymbolDescription(SymbolKind.MISSING)


def _describe_member(member: Member) -> SymbolDescription:
    file = member.module.path.as_posix()
    if member.is_method:
        return SymbolDescription(
            SymbolKind.METHOD,
            file,
            member.line,
            signature=member.signature().render(),
            body=member.fingerprint(),
        )
    return SymbolDescription(
        SymbolKind.CLASS_ATTRIBUTE,
        file,
        member.line,
        value=member.fingerprint(),
        type=declared_type(member.node),
    )


class _Symbols:
    def __init__(self, index: UpstreamIndex):
        self.index = index
        self.uses: dict[str, set[SymbolUse]] = {}
        self.users: dict[str, set[str]] = {}
        self.descriptions: dict[str, SymbolDescription] = {}
        self.sites: dict[str, set[Site]] = {}

    def add(self, ref: SymbolRef, use: SymbolUse, user: str, site: Site | None = None) -> None:
        key = str(ref)
        if key not in self.descriptions:
            self.descriptions[key] = describe_symbol(self.index, ref)
        self.uses.setdefault(key, set()).add(use)
        self.users.setdefault(key, set()).add(user)
        if site is not None:
            self.sites.setdefault(key, set()).add(site)

    def entries(self) -> dict[str, SymbolEntry]:
        return {
            key: SymbolEntry(
                self.descriptions[key],
                frozenset(self.uses[key]),
                tuple(sorted(self.users[key])),
                tuple(sorted(self.sites.get(key, ()), key=Site.order)),
            )
            for key in sorted(self.descriptions)
        }


def _member_use(member: GeneratedMember) -> SymbolUse:
    """How a generated member that has an upstream counterpart uses it."""
    kind = member.decl.kind
    if kind is MemberKind.FORK:
        return SymbolUse.FORKED
    if kind is MemberKind.OVERRIDE_ATTR:
        return SymbolUse.ATTRIBUTE_OVERRIDE
    if calls_super(member.decl.node, member.decl.name):
        return SymbolUse.OVERRIDE_CALLING_SUPER
    return SymbolUse.OVERRIDE_NOT_CALLING_SUPER


def _member_entry(member: GeneratedMember) -> MemberEntry:
    decl = member.decl
    return MemberEntry(
        kind=decl.kind,
        upstream=str(member.upstream) if member.upstream is not None else None,
        calls_super=calls_super(decl.node, decl.name) if decl.kind is MemberKind.OVERRIDE else None,
        deltas=tuple(
            f"{d.kind.value} {d.param or ''}: {d.upstream!r} -> {d.ours!r}".strip()
            for d in decl.deltas
        ),
        anchors={
            a.edit.id: AnchorEntry(
                a.edit.action, a.edit.anchor, a.edit.count, tuple(a.lines), tuple(a.matched)
            )
            for a in member.anchors
        }
        if decl.kind is MemberKind.FORK
        else None,
    )


def build_lock(
    generation: Generation,
    index: UpstreamIndex,
    versions: dict[str, str],
    upstream: dict[str, dict[str, str]],
    generated_files: dict[str, str],
) -> Lock:
    symbols = _Symbols(index)
    classes: dict[str, ClassEntry] = {}
    for generated in generation.classes:
        key = f"{generated.module}:{generated.name}"
        mro = index.mro(generated.base)
        for cls in mro:
            use = SymbolUse.BASE if cls == generated.base else SymbolUse.BASE_ANCESTOR
            symbols.add(cls, use, key)
        for member in generated.members:
            if member.upstream is not None:
                symbols.add(member.upstream, _member_use(member), f"{key}.{member.decl.name}")
        namespace = generation.namespaces.get(generated.module)
        for member in generated.members:
            for ref in class_members_used(member.node, namespace, index) if namespace else ():
                symbols.add(ref, SymbolUse.IMPORTED_BY_GENERATED, f"{key}.{member.decl.name}")
        for name, ref in generated.inherited.items():
            relied = name in generated.contracts  # some of its contracts hold on this release
            use = SymbolUse.INHERITED_RELIED_ON if relied else SymbolUse.INHERITED
            symbols.add(ref, use, f"{key}.{name}")
        for name in generated.contracts:
            if ":" in name:  # resolved at generation: the key is the method's own reference
                symbols.add(SymbolRef.parse(name), SymbolUse.RELIED_ON_OUTSIDE, key)
        classes[key] = ClassEntry(
            base=str(generated.base),
            base_mro=tuple(str(c) for c in mro),
            overlay=f"{generated.overlay_path.as_posix()}:{generated.overlay.line}",
            members={m.decl.name: _member_entry(m) for m in generated.members},
            inherited={name: str(ref) for name, ref in generated.inherited.items()},
            relies_on={
                name: {
                    m.contract.id: ContractEntry(
                        m.contract.pattern,
                        m.contract.count,
                        m.contract.if_broken,
                        tuple(m.lines),
                        tuple(m.matched),
                        m.contract.selects,
                    )
                    for m in matches
                }
                for name, matches in sorted(generated.contracts.items())
            },
            declared=generated.overlay.name,
            feature=generated.overlay.feature,
        )
    for module, namespace in generation.namespaces.items():
        for name, ref in namespace.overlay.items():
            if index.owns(ref.module):
                symbols.add(
                    namespace.definition(ref), SymbolUse.IMPORTED_BY_OVERLAY, f"{module}:{name}"
                )
        for name, (_, ref) in namespace.added.items():
            symbols.add(ref, SymbolUse.IMPORTED_BY_GENERATED, f"{module}:{name}")
    runtime = generation.runtime
    for ref, places in runtime.imports.items():
        for at in places:  # by file: moving an import line does not rewrite the lock
            symbols.add(ref, SymbolUse.IMPORTED_BY_RUNTIME, at.path)
    for ref in runtime.fields:
        symbols.add(ref, SymbolUse.READ_BY_RUNTIME, UPSTREAM_FIELDS_PATH.as_posix())
    for found in (*generation.sites, *runtime.sites):
        symbols.add(found.ref, found.use, found.user, found.site)
    return Lock(
        upstream={
            p: UpstreamEntry(versions[p], dict(sorted(upstream.get(p, {}).items())))
            for p in sorted(versions)
        },
        overlays={
            o.path.as_posix(): o.sha256 for o in sorted(generation.overlays, key=lambda o: o.path)
        },
        classes=classes,
        symbols=symbols.entries(),
        generated=dict(sorted(generated_files.items())),
    )


def class_members_used(
    node: Any, namespace: ModuleNamespace, index: UpstreamIndex
) -> list[SymbolRef]:
    """Members of imported upstream classes a generated body reads (``rocm_aiter_ops.is_enabled()``):
    the lock records them, so drift reports their removal or a new signature like the class's."""
    imported = {**namespace.overlay, **{n: ref for n, (_, ref) in namespace.added.items()}}
    found: list[SymbolRef] = []

    class _Finder(cst.CSTVisitor):
        def visit_Attribute(self, attribute: cst.Attribute) -> None:
            if not isinstance(attribute.value, cst.Name) or attribute.value.value not in imported:
                return
            owner = namespace.definition(imported[attribute.value.value])
            if not index.owns(owner.module) or not index.is_indexed_class(owner):
                return
            member = index.find_member(owner, attribute.attr.value)
            if member is not None and member.ref not in found:
                found.append(member.ref)

    node.visit(_Finder())
    return found


def sha256_of(texts: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {path: hashlib.sha256(text.encode()).hexdigest() for path, text in texts}
