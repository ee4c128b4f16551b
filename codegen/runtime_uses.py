"""What the lock records of the hand-written runtime (``afd_models/`` but its generated code): the
upstream names it imports, the upstream attributes it declares reading
(``afd_models/upstream_fields.py``), and where it calls, constructs, reads or sets upstream
members (:mod:`codegen.call_sites`).

The runtime enters the inputs digest (:mod:`codegen.digest`) through this record, never through
its bytes: an edit that changes none of it (a comment, the deployment writer, code moved within
its function) changes no lock, while one that adds a call into upstream changes both the lock and
the digest, so ``regenerate``'s fast path does not call it up to date.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from afd_models.generated_registry import GENERATED_ROOT
from codegen.call_sites import GeneratedBase, SiteUse, runtime_sites
from codegen.findings import Finding, Kind, Location, Severity
from codegen.index import UpstreamIndex
from codegen.model import GENERATED_PACKAGE, SymbolRef

#: Hand-written runtime whose upstream uses the lock records.
RUNTIME_ROOT = Path("afd_models")
#: The runtime's list of upstream attributes it reads (``UPSTREAM_FIELDS``), read statically.
UPSTREAM_FIELDS_PATH = RUNTIME_ROOT / "upstream_fields.py"


@dataclass(frozen=True)
class RuntimeUses:
    """The runtime's uses of upstream, as the lock records them."""

    #: upstream symbol -> the runtime's imports of it (the lock records their files)
    imports: Mapping[SymbolRef, tuple[Location, ...]]
    #: upstream attributes the runtime reads through values of unknown type
    fields: tuple[SymbolRef, ...]
    #: where the runtime calls, constructs, reads or sets upstream members
    sites: tuple[SiteUse, ...]

    def digest(self) -> str:
        """sha256 of exactly what the lock records of these uses: imports by file, fields, and
        sites by file and function (no line, no order)."""
        recorded = {
            *(f"import {ref} {at.path}" for ref, places in self.imports.items() for at in places),
            *(f"field {ref}" for ref in self.fields),
            *(f"site {use!r}" for use in self.sites),
        }
        return hashlib.sha256("\n".join(sorted(recorded)).encode()).hexdigest()


def runtime_uses(
    repo_root: Path, index: UpstreamIndex, generated: Mapping[SymbolRef, GeneratedBase]
) -> RuntimeUses:
    """The runtime's uses of upstream (``generated``: the generated classes, which runtime classes
    may derive from)."""
    imports: dict[SymbolRef, list[Location]] = {}
    sites: list[SiteUse] = []
    for relative, tree in _upstream_users(repo_root, index):
        for ref, at in _imports(tree, relative, index):
            imports.setdefault(ref, []).append(at)
        sites.extend(runtime_sites(tree, relative, index, generated))
    return RuntimeUses(
        {ref: tuple(places) for ref, places in imports.items()},
        tuple(runtime_fields(repo_root)),
        tuple(sites),
    )


def runtime_findings(uses: RuntimeUses, index: UpstreamIndex) -> list[Finding]:
    """An import of a name upstream does not define, and a declared field upstream does not
    define: both block."""
    findings = []
    for ref, places in uses.imports.items():
        if (
            not index.is_indexed_class(ref)
            and index.resolve(ref.module, ref.qualname.split(".")[0]) is None
        ):
            findings.append(
                Finding(
                    Kind.UNBOUND_NAME,
                    Severity.BLOCK,
                    str(ref),
                    f"the runtime imports it ({places[0]}), but upstream does not define it",
                    places[0],
                )
            )
    for ref in uses.fields:
        owner, _, member = ref.qualname.partition(".")
        if index.find_member(SymbolRef(ref.module, owner), member) is None:
            findings.append(
                Finding(
                    Kind.TARGET_MISSING,
                    Severity.BLOCK,
                    str(ref),
                    f"the runtime reads this attribute, which upstream does not define; update {UPSTREAM_FIELDS_PATH.as_posix()} and the code",
                    Location(str(UPSTREAM_FIELDS_PATH)),
                )
            )
    return findings


def runtime_files(repo_root: Path) -> list[Path]:
    """The hand-written runtime modules."""
    root = repo_root / RUNTIME_ROOT
    return sorted(
        p for p in root.rglob("*.py") if GENERATED_ROOT not in p.relative_to(repo_root).parents
    )


def runtime_upstream_imports(
    repo_root: Path, index: UpstreamIndex
) -> dict[SymbolRef, tuple[Location, ...]]:
    """Upstream names the hand-written runtime imports (``from vllm... import X``), resolved, with
    where each import is now."""
    found: dict[SymbolRef, list[Location]] = {}
    for relative, tree in _upstream_users(repo_root, index):
        for ref, at in _imports(tree, relative, index):
            found.setdefault(ref, []).append(at)
    return {ref: tuple(places) for ref, places in found.items()}


#: a module that touches the process environment may read an upstream variable without
#: importing upstream (``os.environ.get("VLLM_...")``)
_ENVIRONMENT = re.compile(r"\b(?:environ|getenv)\b")


def _upstream_users(repo_root: Path, index: UpstreamIndex) -> Iterator[tuple[str, ast.Module]]:
    """Each runtime module that imports from upstream or from the generated code, or touches the
    process environment, parsed; the others cannot use upstream (their text says so without a
    parse)."""
    packages = "|".join(map(re.escape, sorted(index.sources)))
    imports = re.compile(rf"^\s*from\s+(?:{packages}|{re.escape(GENERATED_PACKAGE)})\b", re.M)
    for path in runtime_files(repo_root):
        text = path.read_text(encoding="utf-8")
        if imports.search(text) or _ENVIRONMENT.search(text):
            yield path.relative_to(repo_root).as_posix(), ast.parse(text)


def _imports(
    tree: ast.Module, relative: str, index: UpstreamIndex
) -> Iterator[tuple[SymbolRef, Location]]:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and not node.level
            and index.owns(node.module)
        ):
            for alias in node.names:
                ref = index.resolve(node.module, alias.name) or SymbolRef(node.module, alias.name)
                yield ref, Location(relative, node.lineno)


def runtime_fields(repo_root: Path) -> list[SymbolRef]:
    """``UPSTREAM_FIELDS`` of :data:`UPSTREAM_FIELDS_PATH` (empty when the file does not exist)."""
    path = repo_root / UPSTREAM_FIELDS_PATH
    if not path.exists():
        return []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [
            "UPSTREAM_FIELDS"
        ]:
            return [SymbolRef.parse(text) for text in ast.literal_eval(node.value)]
    return []
