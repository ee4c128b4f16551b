"""Render generated modules, the class registry and package files; format them with ruff.

Output is deterministic: classes in overlay order, generated imports sorted, one pinned
formatter. If ruff fails, generation fails; unformatted code is never written.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import libcst as cst

from afd_models.generated_registry import GENERATED_ROOT
from codegen.generate import Generation
from codegen.model import GeneratedClass, GeneratedMember, MemberKind, OverlayModule

LINE_LENGTH = 100
REGENERATE_COMMAND = "nox -s regenerate"
_RULE = "# " + "=" * 76


class FormatError(RuntimeError):
    """ruff could not format generated code (a generator bug: the code is not valid Python)."""


def format_source(text: str, name: str) -> str:
    """Format with the pinned ruff, ignoring any user configuration."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "format",
            "--isolated",
            f"--line-length={LINE_LENGTH}",
            f"--stdin-filename={name}",
            "-",
        ],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode != 0:
        raise FormatError(f"ruff could not format {name}: {result.stderr.strip()}")
    return result.stdout


def banner(overlay: str, versions: dict[str, str]) -> str:
    applied = ", ".join(f"{p} {v}" for p, v in sorted(versions.items()))
    return "\n".join(
        [
            _RULE,
            "# GENERATED FILE - DO NOT EDIT.",
            "#",
            f"# Made by `python -m codegen regenerate` ({REGENERATE_COMMAND}) from {overlay}",
            f"# applied to {applied}. Edit the overlay and regenerate: `python -m codegen check`",
            "# (run by the tests and CI) fails on any difference from a regeneration.",
            _RULE,
        ]
    )


def _comment_lines(lines: Iterable[str]) -> list[cst.EmptyLine]:
    return [cst.EmptyLine(comment=cst.Comment(f"# {line}".rstrip())) for line in lines]


def _member_provenance(member: GeneratedMember) -> list[str]:
    decl = member.decl
    if decl.kind is MemberKind.FORK:
        assert member.upstream is not None
        edits = ", ".join(
            f"{a.edit.id} ({a.edit.action} at line {', '.join(map(str, a.lines)) or 'new code'})"
            for a in member.anchors
        )
        return [f"fork of {member.upstream}", f"  edits: {edits}"]
    if decl.kind is MemberKind.OVERRIDE:
        return [f"override of {member.upstream} (AFD-owned body)"]
    if decl.kind is MemberKind.OVERRIDE_ATTR:
        return [f"override_attr of {member.upstream} (AFD-owned value)"]
    return [f"{decl.kind.value}: AFD-only member"]


def render_class(
    generated: GeneratedClass, versions: dict[str, str], files: dict[str, str]
) -> cst.ClassDef:
    overlay = generated.overlay
    base_file = _module_file(generated.base.module, files)
    # what this release relies on: the methods some of whose contracts hold on it
    relied = [name for name in generated.contracts if name in generated.inherited]
    relied_outside = [name for name in generated.contracts if ":" in name]
    relied_through_super = [
        name
        for name in generated.contracts
        if name not in generated.inherited and name not in relied_outside
    ]
    header = [
        f"{generated.name} <- {generated.base} ({versions.get(generated.base.module.split('.')[0], '?')})",
        f"  overlay:  {generated.overlay_path}:{overlay.line} class {overlay.name}",
    ]
    if base_file:
        header.append(f"  upstream: {base_file} sha256={files[base_file][:16]}")
    header.append(
        "  members:  "
        + ", ".join(f"{m.decl.name} ({m.decl.kind.value})" for m in generated.members)
    )
    if relied:
        header.append("  relies on inherited: " + ", ".join(relied))
    if relied_through_super:
        header.append("  relies on, through super(): " + ", ".join(relied_through_super))
    if relied_outside:
        header.append("  relies on, outside its MRO: " + ", ".join(relied_outside))
    body: list[cst.BaseStatement] = []
    if overlay.docstring:
        body.append(
            cst.SimpleStatementLine(
                [cst.Expr(cst.SimpleString(_docstring_literal(overlay.docstring)))]
            )
        )
    for member in generated.members:
        node = member.node
        comments = _comment_lines(_member_provenance(member))
        if isinstance(node, cst.FunctionDef):
            body.append(node.with_changes(leading_lines=[cst.EmptyLine(), *comments]))
        else:
            body.append(node.with_changes(leading_lines=comments))
    if not body:
        body.append(cst.SimpleStatementLine([cst.Pass()]))
    return cst.ClassDef(
        name=cst.Name(generated.name),
        body=cst.IndentedBlock(body=body),
        bases=[cst.Arg(cst.Name(generated.base.qualname))],
        decorators=list(overlay.decorators),
        leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *_comment_lines(header)],
    )


def _module_file(module: str, files: dict[str, str]) -> str | None:
    stem = module.replace(".", "/")
    for candidate in (f"{stem}.py", f"{stem}/__init__.py"):
        if candidate in files:
            return candidate
    return None


def _docstring_literal(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return f'"""{escaped}\n"""' if "\n" in escaped else f'"""{escaped}"""'


def render_module(
    overlay: OverlayModule, generation: Generation, versions: dict[str, str], files: dict[str, str]
) -> str:
    classes = [c for c in generation.classes if c.module == overlay.generated_module]
    namespace = generation.namespaces[overlay.generated_module]
    parts = [banner(str(overlay.path), versions)]
    if overlay.docstring:
        parts.append(_docstring_literal(overlay.docstring))
    parts.extend(cst.Module(body=[statement]).code.strip() for statement in overlay.imports)
    parts.extend(namespace.import_lines())
    module = cst.Module(body=[render_class(c, versions, files) for c in classes])
    parts.append(module.code)
    names = ", ".join(repr(c.name) for c in classes)
    parts.append(f"__all__ = [{names}]")
    return format_source("\n".join(parts) + "\n", overlay.generated_path.name)


def render_registry(
    generation: Generation,
    versions: dict[str, str],
    supported: dict[str, tuple[str, ...]],
    digest: str,
    generated_files: dict[str, str],
) -> str:
    """``afd_models/_generated/__init__.py``: what was generated from what, as plain data."""
    rows = "\n".join(
        f"    ({f'{c.module}:{c.name}'!r}, {str(c.base)!r}, {c.overlay_path.as_posix()!r}, {c.overlay.name!r}),"
        for c in generation.classes
    )
    overlays = {o.path.as_posix(): o.sha256 for o in generation.overlays}
    text = f'''{banner("overlay/", versions)}
"""Registry of the generated classes, and the digests checked before any generated code runs."""

# Importing anything generated checks this generation first; a stale one fails here, naming the
# fix. (The vLLM plugin registers names only and imports nothing from this package.)
from afd_models.freshness import check_generated_code

check_generated_code()

#: upstream packages and the versions the code was generated against
UPSTREAM = {dict(sorted(versions.items()))!r}
#: every release the overlay supports (overlay/pins.toml), the primary first
SUPPORTED = {dict(sorted(supported.items()))!r}
#: the lock of this generation
LOCK = {generation.lock_path.as_posix()!r}
#: sha256 of everything the output depends on (codegen.digest: generator, pins, overlays,
#: upstream files, what the lock records of the runtime)
INPUTS_DIGEST = {digest!r}
#: sha256 of each overlay file
OVERLAYS = {dict(sorted(overlays.items()))!r}
#: sha256 of each generated module
FILES = {dict(sorted(generated_files.items()))!r}
#: (generated class, upstream base, overlay file, overlay class) for every generated class
CLASSES = (
{rows}
)
'''
    return format_source(text, "__init__.py")


def package_files(module_paths: Iterable[str]) -> dict[str, str]:
    """``__init__.py`` for every package directory between the registry and the modules."""
    result: dict[str, str] = {}
    for path in module_paths:
        directory = Path(path).parent
        while directory != GENERATED_ROOT and GENERATED_ROOT in directory.parents:
            result[(directory / "__init__.py").as_posix()] = (
                "# GENERATED FILE - DO NOT EDIT (package marker).\n"
            )
            directory = directory.parent
    return result
