"""No monkey patches: a static scan of the project's Python files.

Flagged, with file:line:

* MP001 assigning (or deleting) an attribute of an imported module or class, or of a class
  reached through ``type(x)`` / ``x.__class__`` (``torch.set_num_threads = f``,
  ``DeepseekV2MoE.forward = f``);
* MP002 ``setattr`` on one of those;
* MP003 rebinding ``sys.modules`` (item assignment, ``del``, ``update``/``pop``/``setdefault``...);
* MP004 mock patching (``mock.patch``, ``patch.object``, pytest's ``monkeypatch.setattr``).

Instances are fair game (``self.gate.bias = ...``, a config object we were handed); what is
imported is not. Generated code is scanned too: a fork that copied an upstream monkey patch
would be ours to answer for.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from codegen.findings import Finding, Kind, Location, Severity

#: top-level directories and files of the repository that hold our Python code
SCANNED = ("afd_models", "overlay", "codegen", "tests", "benchmarks", "tools", "noxfile.py")
_SYS_MODULES_MUTATORS = frozenset(
    {"update", "pop", "popitem", "setdefault", "clear", "__setitem__", "__delitem__"}
)


def project_files(repo_root: Path) -> list[Path]:
    files: list[Path] = []
    for entry in SCANNED:
        path = repo_root / entry
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
    return sorted(files)


def _imported_names(tree: ast.Module) -> set[str]:
    """Names a module binds by importing (modules, classes, functions of other packages)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.add(alias.asname or alias.name.split(".", 1)[0])
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name != "*":
                    names.add(alias.asname or alias.name)
    return names


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node


def _is_class_of_instance(node: ast.expr) -> bool:
    """``type(x)`` or ``x.__class__``: a class reached through an instance."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "type"
        and len(node.args) == 1
    ):
        return True
    return isinstance(node, ast.Attribute) and node.attr == "__class__"


def _targets_foreign(target: ast.expr, imported: set[str]) -> bool:
    if not isinstance(target, ast.Attribute):
        return False
    chain: ast.expr = target.value
    while True:
        if _is_class_of_instance(chain):
            return True
        if isinstance(chain, ast.Attribute):
            chain = chain.value
            continue
        break
    root = _root(target)
    return isinstance(root, ast.Name) and root.id in imported


def _is_sys_modules(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "modules"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _is_mock_patch(func: ast.expr) -> bool:
    spelled = ast.unparse(func)
    return spelled in (
        "patch",
        "monkeypatch.setattr",
        "monkeypatch.delattr",
        "monkeypatch.setitem",
    ) or spelled.endswith(("mock.patch", "patch.object", "patch.dict", "patch.multiple"))


def scan_source(text: str, path: str) -> Iterator[Finding]:
    """Findings for one file's source."""
    tree = ast.parse(text)
    imported = _imported_names(tree)
    for node in ast.walk(tree):
        where = Location(path, getattr(node, "lineno", 0))
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in targets:
                for leaf in (
                    ast.walk(target) if isinstance(target, ast.Tuple | ast.List) else [target]
                ):
                    if isinstance(leaf, ast.Subscript) and _is_sys_modules(leaf.value):
                        yield Finding(
                            Kind.PATCH_SYS_MODULES,
                            Severity.BLOCK,
                            ast.unparse(leaf),
                            "rebinds an entry of sys.modules",
                            where,
                        )
                    elif isinstance(leaf, ast.Attribute) and _targets_foreign(leaf, imported):
                        yield Finding(
                            Kind.PATCH_ATTRIBUTE,
                            Severity.BLOCK,
                            ast.unparse(leaf),
                            "assigns an attribute of an imported module or class; subclass it and select the subclass by dotted path",
                            where,
                        )
        elif isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if name == "setattr" and isinstance(func, ast.Name) and node.args:
                target = node.args[0]
                root = _root(target)
                if _is_class_of_instance(target) or (
                    isinstance(root, ast.Name) and root.id in imported
                ):
                    yield Finding(
                        Kind.PATCH_SETATTR,
                        Severity.BLOCK,
                        ast.unparse(target),
                        "calls setattr on an imported module or class; subclass it instead",
                        where,
                    )
            elif (
                isinstance(func, ast.Attribute)
                and _is_sys_modules(func.value)
                and name in _SYS_MODULES_MUTATORS
            ):
                yield Finding(
                    Kind.PATCH_SYS_MODULES,
                    Severity.BLOCK,
                    f"sys.modules.{name}",
                    "mutates sys.modules",
                    where,
                )
            elif _is_mock_patch(func):
                yield Finding(
                    Kind.PATCH_MOCK,
                    Severity.BLOCK,
                    ast.unparse(func),
                    "mock-patches an object; inject a fake instead (hardware paths take their dependencies as arguments)",
                    where,
                )


def scan(repo_root: Path) -> list[Finding]:
    findings: list[Finding] = []
    for path in project_files(repo_root):
        relative = path.relative_to(repo_root).as_posix()
        findings.extend(scan_source(path.read_text(encoding="utf-8"), relative))
    return findings
