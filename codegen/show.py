"""``python -m codegen show SYMBOL``: a generated member as generated, edit regions marked.

For a fork each line carries the id of the edit that wrote it (``+``) or nothing (an upstream
line); ``super()`` marks upstream lines whose ``super()`` the generator spelled out, and lines an
edit removed are listed after the method. The method is rendered through the same
formatter as the generated file, so what you read is what runs.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import libcst as cst

from codegen.emit import format_source
from codegen.fork import FailedFork, apply_fork
from codegen.generate import Generation
from codegen.index import UpstreamIndex
from codegen.model import GeneratedClass, GeneratedMember, MemberKind
from codegen.pipeline import generate, open_context


class ShowError(LookupError):
    """The symbol names no generated member."""


def _render(function: cst.FunctionDef) -> list[str]:
    return format_source(cst.Module(body=[function]).code, "show.py").splitlines()


def find_member(generation: Generation, symbol: str) -> tuple[GeneratedClass, GeneratedMember]:
    """Accepts ``Class.member``, ``module:Class.member`` or ``module.Class.member``."""
    text = symbol.replace(":", ".")
    for generated in generation.classes:
        for member in generated.members:
            full = f"{generated.module}.{generated.name}.{member.decl.name}"
            if text == full or full.endswith("." + text):
                return generated, member
    known = sorted(f"{c.name}.{m.decl.name}" for c in generation.classes for m in c.members)
    raise ShowError(f"{symbol!r} is not a generated member; known: {', '.join(known)}")


def render_member(index: UpstreamIndex, generated: GeneratedClass, member: GeneratedMember) -> str:
    decl = member.decl
    header = [
        f"# {generated.name}.{decl.name}  ({decl.kind.value}; overlay {generated.overlay_path}:{decl.line})"
    ]
    if decl.kind is not MemberKind.FORK or member.upstream is None:
        return "\n".join([*header, cst.Module(body=[member.node]).code.rstrip()])
    upstream = index.find_member(generated.base, decl.name)
    assert upstream is not None
    header.append(f"# fork of {member.upstream} ({upstream.module.path}:{upstream.line})")
    fork = apply_fork(upstream, decl.edits, index.versions)
    if isinstance(fork, FailedFork):
        raise fork.error  # generation applied these very edits
    edits = fork.edits
    stages = [(e.id, _render(step)) for e, step in zip(edits, fork.steps, strict=True)]
    final = member.node
    assert isinstance(final, cst.FunctionDef)
    stages.append(("super()", _render(final)))
    previous = _render(fork.parsed.function)
    owners: list[str | None] = [None] * len(previous)
    removed: list[tuple[str, str]] = []
    for edit_id, current in stages:
        carried: list[str | None] = [edit_id] * len(current)
        for op, a1, a2, b1, b2 in difflib.SequenceMatcher(
            a=previous, b=current, autojunk=False
        ).get_opcodes():
            if op == "equal":
                carried[b1:b2] = owners[a1:a2]
                continue
            kept = {line.strip() for line in current[b1:b2]}
            removed.extend((edit_id, line) for line in previous[a1:a2] if line.strip() not in kept)
        previous, owners = current, carried
    width = max([len(e.id) for e in edits] + [len("super()")])
    lines = [
        f"{(owner or ''):>{width}} {'+' if owner else '|'} {line}"
        for owner, line in zip(owners, previous, strict=True)
    ]
    if removed:
        lines.append("")
        lines.append("# upstream lines the edits removed:")
        lines.extend(f"{edit_id:>{width}} - {line}" for edit_id, line in removed)
    return "\n".join(header + lines)


def show(
    repo_root: Path,
    symbol: str,
    *,
    upstream_root: Path | None = None,
    use_installed: bool = True,
    version: str | None = None,
) -> str:
    context = open_context(
        repo_root, upstream_root=upstream_root, use_installed=use_installed, version=version
    )
    generation, index = generate(context)
    generated, member = find_member(generation, symbol)
    return render_member(index, generated, member)
