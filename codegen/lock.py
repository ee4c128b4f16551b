"""``overlay/overlay.lock``: what the overlay depends on in upstream, as reviewable JSON.

Per upstream symbol used (bases and their MRO, overridden, forked and inherited methods, names the
overlay and the runtime import, names forked bodies use, members of imported classes they read): its kind, signature and a fingerprint of
its normalized body. Per anchor: where it matched and what it matched. Per generated file: its
sha256. ``codegen check`` regenerates in memory and diffs against this file; ``codegen drift``
compares its symbols with another upstream version.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import libcst as cst

from codegen.generate import UPSTREAM_FIELDS_PATH, Generation, calls_super
from codegen.index import Member, UpstreamIndex, body_fingerprint
from codegen.model import MemberKind, Signature, SymbolRef
from codegen.names import ModuleNamespace

LOCK_FORMAT = 2


def describe_symbol(index: UpstreamIndex, ref: SymbolRef) -> dict[str, Any]:
    """Kind, location, signature and body fingerprint of one upstream symbol, as lock data."""
    info = index.module(ref.module)
    if info is None:
        return {"kind": "external"}
    if ref.qualname == "":
        return {"kind": "module", "file": info.path.as_posix()}
    owner, _, member = ref.qualname.partition(".")
    if member:
        found = index.find_member(SymbolRef(ref.module, owner), member)
        if found is None:
            return {"kind": "missing"}
        return _describe_member(found)
    if owner in info.classes:
        node = info.classes[owner]
        entry: dict[str, Any] = {
            "kind": "class",
            "file": info.path.as_posix(),
            "line": node.lineno,
            "bases": [str(b) for b in index.bases(ref)],
        }
        init = index.find_member(ref, "__init__")
        if init is not None and init.is_method:
            entry["init"] = str(init.ref)
            entry["init_signature"] = init.signature().render()
        return entry
    if owner in info.functions:
        function = info.functions[owner]
        return {
            "kind": "function",
            "file": info.path.as_posix(),
            "line": function.lineno,
            "signature": Signature.from_ast(function).render(),
            "body": body_fingerprint(function),
        }
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
        return {
            "kind": "attribute",
            "file": info.path.as_posix(),
            "value": hashlib.sha256(value.encode()).hexdigest(),
        }
    if "__getattr__" in info.functions:
        return {
            "kind": "lazy_attribute",
            "file": info.path.as_posix(),
        }  # computed by the module's __getattr__
    return {"kind": "missing"}


def _describe_member(member: Member) -> dict[str, Any]:
    entry: dict[str, Any] = {"file": member.module.path.as_posix(), "line": member.line}
    if member.is_method:
        entry.update(
            kind="method", signature=member.signature().render(), body=member.fingerprint()
        )
    else:
        entry.update(kind="class_attribute", value=member.fingerprint())
    return entry


class _Symbols:
    def __init__(self, index: UpstreamIndex):
        self.index = index
        self.entries: dict[str, dict[str, Any]] = {}

    def add(self, ref: SymbolRef, role: str, user: str) -> None:
        key = str(ref)
        entry = self.entries.get(key)
        if entry is None:
            entry = describe_symbol(self.index, ref)
            entry["roles"] = []
            entry["used_by"] = []
            self.entries[key] = entry
        if role not in entry["roles"]:
            entry["roles"].append(role)
            entry["roles"].sort()
        if user not in entry["used_by"]:
            entry["used_by"].append(user)
            entry["used_by"].sort()


def build_lock(
    generation: Generation,
    index: UpstreamIndex,
    versions: dict[str, str],
    upstream: dict[str, dict[str, str]],
    generated_files: dict[str, str],
) -> dict[str, Any]:
    symbols = _Symbols(index)
    classes: dict[str, Any] = {}
    for generated in generation.classes:
        key = f"{generated.module}:{generated.name}"
        mro = index.mro(generated.base)
        for cls in mro:
            symbols.add(cls, "base" if cls == generated.base else "mro", key)
        members: dict[str, Any] = {}
        for member in generated.members:
            entry: dict[str, Any] = {"kind": member.decl.kind.value}
            if member.upstream is not None:
                entry["upstream"] = str(member.upstream)
                symbols.add(member.upstream, member.decl.kind.value, f"{key}.{member.decl.name}")
            if member.decl.kind is MemberKind.OVERRIDE:
                entry["calls_super"] = calls_super(member.decl.node, member.decl.name)
            if member.decl.deltas:
                entry["deltas"] = [
                    f"{d.kind} {d.param or ''}: {d.upstream!r} -> {d.ours!r}".strip()
                    for d in member.decl.deltas
                ]
            if member.decl.kind is MemberKind.FORK:
                entry["anchors"] = {
                    a.edit.id: {
                        "action": a.edit.action,
                        "anchor": a.edit.anchor,
                        "count": a.edit.count,
                        "lines": list(a.lines),
                        "matched": list(a.matched),
                    }
                    for a in member.anchors
                }
            members[member.decl.name] = entry
        namespace = generation.namespaces.get(generated.module)
        for member in generated.members:
            for ref in class_members_used(member.node, namespace, index) if namespace else ():
                symbols.add(ref, "generated_import", f"{key}.{member.decl.name}")
        for name, ref in generated.inherited.items():
            role = "relied_on" if name in generated.overlay.relies_on else "inherited"
            symbols.add(ref, role, f"{key}.{name}")
        classes[key] = {
            "base": str(generated.base),
            "mro": [str(c) for c in mro],
            "overlay": f"{generated.overlay_path.as_posix()}:{generated.overlay.line}",
            "members": members,
            "inherited": {name: str(ref) for name, ref in generated.inherited.items()},
            "relies_on": {
                name: {
                    m.contract.id: {
                        "pattern": m.contract.pattern,
                        "count": m.contract.count,
                        "if_broken": m.contract.if_broken,
                        "lines": list(m.lines),
                        "matched": list(m.matched),
                    }
                    for m in matches
                }
                for name, matches in sorted(generated.contracts.items())
            },
        }
    for module, namespace in generation.namespaces.items():
        for name, ref in namespace.overlay.items():
            if index.owns(ref.module):
                symbols.add(namespace.definition(ref), "overlay_import", f"{module}:{name}")
        for name, (_, ref) in namespace.added.items():
            symbols.add(ref, "generated_import", f"{module}:{name}")
    for ref, users in generation.runtime_imports.items():
        for user in users:
            symbols.add(ref, "runtime_import", user)
    for ref in generation.runtime_fields:
        symbols.add(ref, "runtime_field", UPSTREAM_FIELDS_PATH.as_posix())
    return {
        "format": LOCK_FORMAT,
        "about": "Generated by `python -m codegen regenerate`; review changes, never edit by hand.",
        "upstream": {
            p: {"version": versions[p], "files": upstream.get(p, {})} for p in sorted(versions)
        },
        "overlays": {
            o.path.as_posix(): o.sha256 for o in sorted(generation.overlays, key=lambda o: o.path)
        },
        "classes": classes,
        "symbols": dict(sorted(symbols.entries.items())),
        "generated": dict(sorted(generated_files.items())),
    }


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


def render_lock(lock: dict[str, Any]) -> str:
    return json.dumps(lock, indent=2, sort_keys=True) + "\n"


def read_lock(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def lock_diff(old_text: str, new_text: str, *, context: int = 2, limit: int = 200) -> list[str]:
    """A unified diff of two lock texts, cut to ``limit`` lines."""
    lines = list(
        difflib.unified_diff(
            old_text.splitlines(),
            new_text.splitlines(),
            "overlay.lock (committed)",
            "overlay.lock (regenerated)",
            n=context,
            lineterm="",
        )
    )
    if len(lines) > limit:
        lines = [*lines[:limit], f"... {len(lines) - limit} more diff lines"]
    return lines


def sha256_of(texts: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {path: hashlib.sha256(text.encode()).hexdigest() for path, text in texts}
