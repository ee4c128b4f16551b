"""vLLM's model registry: the native architectures AFD registers for still map to the same
vLLM classes (the registry is read statically, like every upstream file)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from codegen.drift.sides import Side
from codegen.findings import Finding, Kind, Severity
from codegen.index import UpstreamIndex

REGISTRY_MODULE = "vllm.model_executor.models.registry"


def _registry_table(index: UpstreamIndex) -> dict[str, tuple[str, str]]:
    """Architecture -> (module, class) from vLLM's model registry, read statically."""
    info = index.module(REGISTRY_MODULE)
    table: dict[str, tuple[str, str]] = {}
    if info is None:
        return table
    for node in ast.walk(info.tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and isinstance(value, ast.Tuple)
                    and len(value.elts) == 2
                ):
                    try:
                        module, cls = ast.literal_eval(value)
                    except ValueError:
                        continue
                    if (
                        isinstance(key.value, str)
                        and isinstance(module, str)
                        and isinstance(cls, str)
                    ):
                        table.setdefault(key.value, (module, cls))
    return table


def registry_findings(architectures: list[str], old: Side, new: Side) -> Iterator[Finding]:
    """The native architectures AFD registers for still map to the same vLLM classes."""
    before, after = _registry_table(old.index), _registry_table(new.index)
    for arch in architectures:
        if arch not in after:
            yield Finding(
                Kind.DRIFT_REGISTRY,
                Severity.BLOCK,
                arch,
                f"is no longer in vLLM {new.version}'s model registry",
                old=str(before.get(arch)),
            )
        elif before.get(arch) != after[arch]:
            yield Finding(
                Kind.DRIFT_REGISTRY,
                Severity.REVIEW,
                arch,
                "now maps to another vLLM class",
                old=str(before.get(arch)),
                new=str(after[arch]),
            )


def native_architectures(repo_root: Path) -> list[str]:
    """The keys of ``AFD_ARCHITECTURES`` in afd_models/plugin.py, read statically."""
    tree = ast.parse((repo_root / "afd_models/plugin.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if ast.unparse(target) == "AFD_ARCHITECTURES" and isinstance(node.value, ast.Dict):
                return [ast.literal_eval(k) for k in node.value.keys if k is not None]
    return []
