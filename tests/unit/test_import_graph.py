"""The house rules of the project's imports, read statically from ``codegen/``, ``afd_models/``
(the generated code left out) and ``tools/``:

* no import cycle among modules, nor among packages: the children of one package (its modules
  and subpackages, each standing for everything inside it) import one another without a cycle,
  so ``afd_models.cli`` importing ``afd_models.deploy`` while ``afd_models.deploy`` imports
  ``afd_models.cli`` fails even where no module cycle closes;
* the shipped runtime (``afd_models/``, its operator commands included) never imports the
  generator (``codegen``) or the repository's tools (``tools``): what they share is below all
  of them (``afd_models.commandline``, ``afd_models.generated_registry``, ...);
* the transports (``afd_models/connectors/``) never import the workers, the models or the FFN
  server: the wiring that connects a worker's model to its connector is the floor above them
  (``afd_models/wiring/``);
* the tool packages' ``__init__`` files import nothing (they re-export nothing: tests import
  the modules they test).

Every import counts, wherever it is written: at module level, inside a function (a lazy import
only postpones the cycle), under ``if TYPE_CHECKING:`` (a layering loop all the same), relative
(``from . import x``) or absolute. Importing ``a.b.c`` also runs the packages ``a`` and ``a.b``,
so those are edges too, except the importer's own enclosing packages (already running when it
runs). ``from package import name`` is an edge to the submodule ``package.name`` when there is
one, else to the package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the directories walked, and what is left out of them
ROOTS = ("codegen", "afd_models", "tools")
EXCLUDED = ("afd_models/_generated",)
#: the shipped runtime, and what it never imports
RUNTIME = "afd_models"
ABOVE_THE_RUNTIME = ("codegen", "tools")
#: the transports, and what they never import: the workers, the models, the FFN server, and the
#: wiring and commands above them all
TRANSPORTS = "afd_models.connectors"
ABOVE_THE_TRANSPORTS = (
    "afd_models.workers",
    "afd_models.worker_config",
    "afd_models.runner_roles",
    "afd_models.scheduler",
    "afd_models.models",
    "afd_models.ffn_server",
    "afd_models.ffn_compile",
    "afd_models.wiring",
    "afd_models.cli",
    "afd_models.deploy",
)


@dataclass(frozen=True)
class Edge:
    """One import: the module imported, and where the import is written."""

    target: str
    path: str
    line: int


def module_name(path: Path, root: Path) -> str:
    """``codegen/drift/compare.py`` -> ``codegen.drift.compare`` (a package: its ``__init__``)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path, roots: tuple[str, ...], excluded: tuple[str, ...]) -> dict[str, Path]:
    """Every module under ``roots`` (relative to ``root``), by dotted name."""
    found = {}
    for top in roots:
        for path in sorted((root / top).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if "__pycache__" in path.parts or any(
                relative == e or relative.startswith(e + "/") for e in excluded
            ):
                continue
            found[module_name(path, root)] = path
    return found


def _imported(node: ast.Import | ast.ImportFrom, name: str, is_package: bool) -> Iterator[str]:
    """The dotted modules (or packages) one import statement of module ``name`` names."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    if node.level:
        package = name if is_package else name.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = ".".join(p for p in (package, node.module) if p)
    else:
        base = node.module or ""
    for alias in node.names:
        yield f"{base}.{alias.name}"  # a submodule, if there is one (else the name is base's)
        yield base


def edges(name: str, path: Path, known: Mapping[str, Path], root: Path) -> Iterator[Edge]:
    """The imports of one module that name modules of ``known``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"
    enclosing = {name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1)}
    if is_package:
        enclosing.add(name)
    where = path.relative_to(root).as_posix()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        targets = list(_imported(node, name, is_package))
        if isinstance(node, ast.ImportFrom):
            # ``from p import x``: the submodule p.x when it exists, else p itself
            pairs = list(zip(targets[::2], targets[1::2], strict=True))
            targets = [sub if sub in known else base for sub, base in pairs]
        for target in targets:
            parts = target.split(".")
            for depth in range(1, len(parts) + 1):
                prefix = ".".join(parts[:depth])
                last = depth == len(parts)
                if prefix in known and (last or prefix not in enclosing):
                    yield Edge(prefix, where, node.lineno)


def import_graph(
    root: Path, roots: tuple[str, ...] = ROOTS, excluded: tuple[str, ...] = EXCLUDED
) -> dict[str, list[Edge]]:
    """module -> the imports it writes of the other walked modules."""
    known = modules(root, roots, excluded)
    return {name: list(edges(name, path, known, root)) for name, path in known.items()}


def cycles(graph: Mapping[str, list[Edge]]) -> list[list[Edge]]:
    """One cycle per strongly connected component that has one (Tarjan), as the edges around it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for edge in graph.get(node, []):
            if edge.target not in index:
                visit(edge.target)
                low[node] = min(low[node], low[edge.target])
            elif edge.target in on_stack:
                low[node] = min(low[node], index[edge.target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    found = []
    for component in components:
        start = min(component)
        if len(component) == 1 and not any(e.target == start for e in graph[start]):
            continue
        found.append(_cycle_through(start, component, graph))
    return found


def _cycle_through(start: str, component: set[str], graph: Mapping[str, list[Edge]]) -> list[Edge]:
    """The shortest cycle from ``start`` back to itself inside ``component`` (breadth first)."""
    paths: dict[str, list[Edge]] = {start: []}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for edge in graph[node]:
            if edge.target == start:
                return [*paths[node], edge]
            if edge.target in component and edge.target not in paths:
                paths[edge.target] = [*paths[node], edge]
                queue.append(edge.target)
    raise AssertionError(f"{start} is in a strongly connected component without a cycle")


def describe(cycle: list[Edge]) -> str:
    """``a -> b -> a (imports at a.py:1, b.py:2)``."""
    names = [cycle[-1].target, *(e.target for e in cycle)]
    where = ", ".join(f"{e.path}:{e.line}" for e in cycle)
    return f"{' -> '.join(names)} (imports at {where})"


def test_no_import_cycle() -> None:
    """The modules of codegen/, afd_models/ and tools/ import one another without a cycle."""
    graph = import_graph(REPO)
    assert "codegen.pipeline" in graph and "afd_models.plugin" in graph  # the walk found them
    found = [describe(c) for c in cycles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


def package_graph(graph: Mapping[str, list[Edge]]) -> dict[str, list[Edge]]:
    """Every import lifted to the children of the innermost package holding both ends (an import
    of ``a.x.m`` from ``a.y.n`` is an edge ``a.y -> a.x``); a module importing a package that
    encloses it, or is inside it, is no edge between siblings."""
    lifted: dict[str, list[Edge]] = {}
    for name, written in graph.items():
        for edge in written:
            source, target = name.split("."), edge.target.split(".")
            common = 0
            while common < min(len(source), len(target)) and source[common] == target[common]:
                common += 1
            if common in (len(source), len(target)):
                continue
            child, imported = ".".join(source[: common + 1]), ".".join(target[: common + 1])
            lifted.setdefault(child, []).append(Edge(imported, edge.path, edge.line))
            lifted.setdefault(imported, [])
    return lifted


def test_no_package_cycle() -> None:
    """The packages of codegen/, afd_models/ and tools/ import one another without a cycle:
    each package is one floor of its parent."""
    found = [describe(c) for c in cycles(package_graph(import_graph(REPO)))]
    assert not found, "package import cycles:\n" + "\n".join(found)


def within(name: str, package: str) -> bool:
    """Whether module ``name`` is ``package`` or lies inside it."""
    return name == package or name.startswith(package + ".")


def crossings(
    graph: Mapping[str, list[Edge]], importers: str, forbidden: tuple[str, ...]
) -> list[str]:
    """Each import written in a module inside ``importers`` of a module inside one of
    ``forbidden``, as ``path:line imports target``."""
    found = [
        f"{edge.path}:{edge.line} imports {edge.target}"
        for name, written in sorted(graph.items())
        if within(name, importers)
        for edge in written
        if any(within(edge.target, package) for package in forbidden)
    ]
    return list(dict.fromkeys(found))  # an import of a.b is an edge to a and to a.b


def test_the_runtime_never_imports_codegen_or_tools() -> None:
    """Nothing in afd_models/ (its commands included) imports codegen or tools, not even lazily:
    they stand above the runtime, which reads what they write (the generated code), never them."""
    found = crossings(import_graph(REPO), RUNTIME, ABOVE_THE_RUNTIME)
    assert not found, "the runtime imports the generator or the tools:\n" + "\n".join(found)


def test_the_transports_never_import_workers_models_or_the_ffn_server() -> None:
    """Nothing in afd_models/connectors/ imports a worker, a model, the FFN server or the wiring
    above them, so a transport can be tested, and reasoned about, with tensors and sockets alone."""
    found = crossings(import_graph(REPO), TRANSPORTS, ABOVE_THE_TRANSPORTS)
    assert not found, "a transport imports a floor above it:\n" + "\n".join(found)


def test_the_tool_packages_re_export_nothing() -> None:
    """A tool package's ``__init__`` is its docstring: a name has one home, its module."""
    inits = sorted(REPO.glob("tools/*/__init__.py"))
    assert len(inits) >= 4
    found = []
    for path in [REPO / "tools/__init__.py", *inits]:
        relative = path.relative_to(REPO).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), relative)
        found += [
            f"{relative}:{node.lineno}"
            for node in tree.body
            if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
        ]
    assert not found, "tool packages that hold more than a docstring:\n" + "\n".join(found)


def _package(root: Path, files: dict[str, str]) -> dict[str, list[Edge]]:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return import_graph(root, ("pkg",), ())


def test_a_function_level_relative_cycle_is_found(tmp_path: Path) -> None:
    """A cycle closed by an import inside a function, written ``from . import x``, is reported
    with both import lines."""
    graph = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import helper\n",
            "pkg/b.py": "def helper():\n    from . import a\n    return a\n",
        },
    )
    (cycle,) = cycles(graph)
    assert describe(cycle) == "pkg.a -> pkg.b -> pkg.a (imports at pkg/a.py:1, pkg/b.py:2)"


def test_a_package_init_cycle_is_found(tmp_path: Path) -> None:
    """A package whose ``__init__`` imports a submodule that imports a submodule of the package
    back (running the package) is a cycle; a submodule importing its sibling is not."""
    graph = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from pkg.sub.run import main\n",
            "pkg/sub/run.py": "from pkg.sub.engine import go\nfrom pkg import core\n",
            "pkg/sub/engine.py": "",
            "pkg/core.py": "import pkg.sub.engine\n",
        },
    )
    (cycle,) = cycles(graph)
    assert describe(cycle) == (
        "pkg.core -> pkg.sub -> pkg.sub.run -> pkg.core "
        "(imports at pkg/core.py:1, pkg/sub/__init__.py:1, pkg/sub/run.py:2)"
    )


def test_no_cycle_without_one(tmp_path: Path) -> None:
    """Siblings importing each other's names one way, and a package's own submodules importing
    through it, are no cycle."""
    graph = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import x\n",
            "pkg/a.py": "from pkg.b import y\nx = y\n",
            "pkg/b.py": "import pkg.c\ny = 1\n",
            "pkg/c.py": "",
        },
    )
    assert cycles(graph) == []


def test_a_package_cycle_without_a_module_cycle_is_found(tmp_path: Path) -> None:
    """Two packages whose modules import each other's other modules form no module cycle, but a
    package cycle, reported with both import lines."""
    graph = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/cli/__init__.py": "",
            "pkg/cli/serve.py": "from pkg.deploy.spec import WORKERS\n",
            "pkg/deploy/__init__.py": "",
            "pkg/deploy/spec.py": "WORKERS = {}\n",
            "pkg/deploy/run.py": "from pkg.cli import serve\n",
        },
    )
    assert cycles(graph) == []
    (cycle,) = cycles(package_graph(graph))
    assert describe(cycle) == (
        "pkg.cli -> pkg.deploy -> pkg.cli (imports at pkg/cli/serve.py:1, pkg/deploy/run.py:1)"
    )
