"""No monkey patches: a static scan of the project's Python files.

Flagged, with file:line:

* MP001 assigning or deleting an attribute of an imported module or class, or of a class
  reached through ``type(x)`` / ``x.__class__`` (``torch.set_num_threads = f``,
  ``DeepseekV2MoE.forward = f``); writing into a container reached from one
  (``Registry.models[k] = v``, ``del Registry.models[k]``, ``envs.environment_variables.update(...)``,
  ``Cls.hooks.append(f)``); swapping the class of any object (``obj.__class__ = X``);
* MP002 ``setattr`` / ``delattr`` / ``object.__setattr__`` / ``type.__setattr__`` /
  ``__delattr__`` on one of those, or to swap ``__class__``;
* MP003 rebinding ``sys.modules`` (item assignment, ``del``, ``update``/``pop``/``setdefault``...);
* MP004 mock patching (``mock.patch`` under any name, ``patch.object``, ``pytest.MonkeyPatch``
  and the ``monkeypatch`` fixture's ``setattr``/``delattr``/``setitem``/``delitem``/``context``);
* MP005 installing import hooks or replacing builtins (``sys.meta_path``, ``sys.path_hooks``,
  ``builtins.x = f``, ``setattr(builtins, ...)``, ``__builtins__[k] = v``).

A name counts as imported when an import binds it, when ``importlib.import_module`` /
``__import__`` does, or when it is a plain alias of an imported name (``C = mod.Cls``, bound once
in the file). Code that tests run in a fresh interpreter (``[sys.executable, "-c", CODE]``, or a
helper that puts its parameter there, such as ``tests.engine.run_python``) is parsed and scanned
too; its findings point at the string's lines.

Instances are fair game (``self.gate.bias = ...``, a config object we were handed); what is
imported is not. So are the process's environment and search path (``os.environ[k] = v``,
``sys.path.insert(0, d)``), and vLLM's registration APIs (:data:`REGISTRATION_APIS`). Generated
code is scanned too: a fork that copied an upstream monkey patch would be ours to answer for.
"""

from __future__ import annotations

import ast
import dataclasses
import string
import textwrap
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from codegen.findings import Finding, Kind, Location, Severity

#: top-level directories and files of the repository that hold our Python code
SCANNED = ("afd_models", "overlay", "codegen", "tests", "benchmarks", "tools", "noxfile.py")
#: vLLM's own extension points, never flagged although they change state behind an imported name:
#: ``ModelRegistry.register_model``, ``@CustomOp.register_oot``, ``direct_register_custom_op`` and
#: ``torch.library.Library(...)`` fragments. Plugin entry points live in ``pyproject.toml``.
#: Matched against the called name with its import resolved, as a dotted suffix.
REGISTRATION_APIS = (
    "ModelRegistry.register_model",
    "CustomOp.register_oot",
    "vllm.utils.torch_utils.direct_register_custom_op",
    "torch.library.Library",
)
#: process state, not upstream code: their contents may change (not the objects themselves)
_PROCESS_STATE = ("os.environ", "sys.path")
#: the import machinery and the builtins (MP005)
_IMPORT_SYSTEM = (
    "sys.meta_path",
    "sys.path_hooks",
    "sys.path_importer_cache",
    "builtins",
)
#: methods that change a list, dict, set or deque in place
_MUTATORS = frozenset(
    {
        "update",
        "append",
        "extend",
        "insert",
        "pop",
        "popitem",
        "setdefault",
        "clear",
        "remove",
        "add",
        "discard",
        "sort",
        "reverse",
        "appendleft",
        "extendleft",
        "__setitem__",
        "__delitem__",
    }
)
#: namespaces of functions that share a name with a container method (``torch.ops.aten.add``)
_OPERATOR_NAMESPACES = ("torch.ops",)
#: calls that bind a module
_IMPORTERS = frozenset({"importlib.import_module", "__import__"})
#: what the pytest fixture ``monkeypatch`` may not do (``setenv``, ``chdir`` and friends are fine)
_MONKEYPATCH_FIXTURE = frozenset({"setattr", "delattr", "setitem", "delitem", "context"})
_MOCK_SUFFIXES = ("mock.patch", "mocker.patch", "patch.object", "patch.dict", "patch.multiple")


def project_files(repo_root: Path) -> list[Path]:
    files: list[Path] = []
    for entry in SCANNED:
        path = repo_root / entry
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
    return sorted(files)


@dataclass(frozen=True)
class _Names:
    """What the names of one file stand for."""

    #: name -> the dotted path it was imported as (``C = mod.Cls`` aliases count)
    imported: dict[str, str]
    #: imported names bound to a module: ``os.remove(p)`` is a function, not a container method
    modules: set[str]
    #: name -> every value assigned to it (to find the code a subprocess runs)
    values: dict[str, list[ast.expr]]
    #: function name -> position and name of the parameter it runs as ``python -c``
    runners: Mapping[str, tuple[int, str]]


def _bind_names(tree: ast.Module, runners: Mapping[str, tuple[int, str]]) -> _Names:
    imported: dict[str, str] = {}
    modules: set[str] = set()
    values: dict[str, list[ast.expr]] = {}
    bindings: Counter[str] = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".", 1)[0]
                imported[local] = alias.name if alias.asname else local
                modules.add(local)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            for alias in node.names:
                if alias.name != "*":
                    full = f"{base}.{alias.name}" if node.module else base + alias.name
                    imported[alias.asname or alias.name] = full
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bindings[node.id] += 1
        elif isinstance(node, ast.arg):
            bindings[node.arg] += 1
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    values.setdefault(target.id, []).append(node.value)
    names = _Names(imported, modules, values, runners)
    changed = True
    while changed:  # aliases of aliases
        changed = False
        for name, assigned in values.items():
            for value in assigned:
                found = None if name in imported else _imported_as(value, names, bindings[name])
                if found:
                    imported[name], is_module = found
                    if is_module:
                        modules.add(name)
                    changed = True
    return names


def _imported_as(value: ast.expr, names: _Names, bindings: int) -> tuple[str, bool] | None:
    """(dotted path, is a module) when ``name = value`` binds something imported."""
    if isinstance(value, ast.Call) and _spell(value.func, names) in _IMPORTERS:
        # a module, as an import statement binds it, however often the name is rebound
        return _module_argument(value), True
    if (
        bindings == 1
        and isinstance(value, ast.Name | ast.Attribute)
        and _root_name(value) in names.imported
    ):
        # a plain alias (``C = mod.Cls``); a name bound twice may be a local list elsewhere
        return _spell(value, names), isinstance(value, ast.Name) and value.id in names.modules
    return None


def _module_argument(call: ast.Call) -> str:
    first = call.args[0] if call.args else None
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else "?"


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _spell(node: ast.expr, names: _Names) -> str:
    """``node`` as a dotted path from what its first name was imported as; ``[]`` is an item."""
    if isinstance(node, ast.Name):
        return names.imported.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        return f"{_spell(node.value, names)}.{node.attr}"
    if isinstance(node, ast.Subscript):
        return f"{_spell(node.value, names)}[]"
    if isinstance(node, ast.Call):
        return f"{_spell(node.func, names)}()"
    return "?"


def _ends_with(dotted: str, suffix: str) -> bool:
    return dotted == suffix or dotted.endswith("." + suffix)


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


def _reaches_imported(node: ast.expr, names: _Names) -> bool:
    """Whether ``node`` is, or is reached from, an imported name or a class of an instance."""
    while True:
        if _is_class_of_instance(node):
            return True
        if not isinstance(node, ast.Attribute | ast.Subscript):
            break
        node = node.value
    if isinstance(node, ast.Call):
        return _spell(node.func, names) in _IMPORTERS
    return isinstance(node, ast.Name) and node.id in names.imported


def _under(place: str, prefix: str) -> bool:
    return place == prefix or place.startswith((prefix + ".", prefix + "["))


def _change_kind(place: str, obj: ast.expr, names: _Names, kind: Kind) -> Kind | None:
    """The finding for changing ``place`` (spelled by :func:`_spell`) of ``obj``, None if allowed."""
    if _under(place, "__builtins__"):  # bound in every module without an import
        return Kind.PATCH_IMPORT_SYSTEM
    if not _reaches_imported(obj, names):
        return None
    if place in ("sys.modules", "sys.modules[]"):
        return Kind.PATCH_SYS_MODULES
    if any(_under(place, p) for p in _IMPORT_SYSTEM):
        return Kind.PATCH_IMPORT_SYSTEM
    if any(place.startswith(p + "[") for p in _PROCESS_STATE):
        return None
    return kind


_MESSAGES = {
    Kind.PATCH_ATTRIBUTE: "assigns an attribute of an imported module or class; subclass it and select the subclass by dotted path",
    Kind.PATCH_SETATTR: "calls setattr on an imported module or class; subclass it instead",
    Kind.PATCH_SYS_MODULES: "rebinds an entry of sys.modules",
    Kind.PATCH_IMPORT_SYSTEM: "installs an import hook or replaces a builtin; import the real module instead",
    Kind.PATCH_MOCK: "mock-patches an object; inject a fake instead (hardware paths take their dependencies as arguments)",
}
_CONTAINER_MESSAGE = (
    "changes a container of an imported module or class; pass your own object instead"
)
_CLASS_SWAP_MESSAGE = "swaps the class of an object; construct the subclass instead"


def _container_message(kind: Kind) -> str:
    return _CONTAINER_MESSAGE if kind is Kind.PATCH_ATTRIBUTE else _MESSAGES[kind]


def _target_findings(target: ast.expr, names: _Names) -> Iterator[tuple[ast.expr, Kind, str]]:
    """(target, kind, message) for one target of an assignment or ``del``, tuples unpacked."""
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _target_findings(element, names)
    elif isinstance(target, ast.Starred):
        yield from _target_findings(target.value, names)
    elif isinstance(target, ast.Attribute) and target.attr == "__class__":
        yield target, Kind.PATCH_ATTRIBUTE, _CLASS_SWAP_MESSAGE
    elif isinstance(target, ast.Attribute):
        kind = _change_kind(_spell(target, names), target, names, Kind.PATCH_ATTRIBUTE)
        if kind:
            yield target, kind, _MESSAGES[kind]
    elif isinstance(target, ast.Subscript):
        place = _spell(target.value, names) + "[]"
        kind = _change_kind(place, target.value, names, Kind.PATCH_ATTRIBUTE)
        if kind:
            yield target, kind, _container_message(kind)


def _is_mock(called: str) -> bool:
    first, _, method = called.partition(".")
    return (
        called == "patch"
        or any(_ends_with(called, s) for s in _MOCK_SUFFIXES)
        or _ends_with(called, "MonkeyPatch")
        or _ends_with(called, "MonkeyPatch.context")
        or (first == "monkeypatch" and method in _MONKEYPATCH_FIXTURE)
    )


def _setattr_target(call: ast.Call) -> tuple[ast.expr, ast.expr | None] | None:
    """(object, attribute name) of ``setattr``/``delattr``/``__setattr__``/``__delattr__``."""
    func, args = call.func, call.args
    if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and args:
        return args[0], args[1] if len(args) > 1 else None
    if isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__"):
        if args and not (isinstance(args[0], ast.Constant) and isinstance(args[0].value, str)):
            # unbound: ``object.__setattr__(obj, name, v)``, ``nn.Module.__setattr__(self, ...)``
            return args[0], args[1] if len(args) > 1 else None
        return func.value, args[0] if args else None
    return None


def _call_findings(call: ast.Call, names: _Names) -> Iterator[tuple[Kind, str]]:
    func = call.func
    called = _spell(func, names)
    if any(_ends_with(called, api) for api in REGISTRATION_APIS):
        return
    attribute = _setattr_target(call)
    if _is_mock(called):
        yield Kind.PATCH_MOCK, _MESSAGES[Kind.PATCH_MOCK]
    elif attribute:
        obj, name = attribute
        attr = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else "?"
        if attr == "__class__":
            yield Kind.PATCH_SETATTR, _CLASS_SWAP_MESSAGE
            return
        kind = _change_kind(f"{_spell(obj, names)}.{attr}", obj, names, Kind.PATCH_SETATTR)
        if kind:
            yield kind, _MESSAGES[kind]
    elif isinstance(func, ast.Attribute) and func.attr in _MUTATORS:
        receiver = func.value
        spelled = _spell(receiver, names)
        if isinstance(receiver, ast.Name) and receiver.id in names.modules:
            return  # a module's function (``os.remove``), not a container's method
        if any(_under(spelled, namespace) for namespace in _OPERATOR_NAMESPACES):
            return
        kind = _change_kind(spelled + "[]", receiver, names, Kind.PATCH_ATTRIBUTE)
        if kind:
            yield kind, _container_message(kind)


# -- code that runs in a fresh interpreter ---------------------------------------------------


def _python_c_code(node: ast.List | ast.Tuple) -> ast.expr | None:
    """``CODE`` of ``[python, "-c", CODE, ...]``; a ``bash -c`` script is not Python."""
    elements = node.elts
    for i, element in enumerate(elements[1:-1], start=1):
        if isinstance(element, ast.Constant) and element.value == "-c":
            interpreter = ast.unparse(elements[0]).lower()
            if "python" in interpreter or "executable" in interpreter:
                return elements[i + 1]
    return None


def _unwrap_dedent(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Call) and ast.unparse(node.func).endswith("dedent") and node.args:
        node = node.args[0]
    return node


def _python_runners(tree: ast.Module) -> dict[str, tuple[int, str]]:
    """Functions that run one of their parameters as ``python -c``: name -> (position, name)."""
    runners: dict[str, tuple[int, str]] = {}
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        parameters = [a.arg for a in function.args.posonlyargs + function.args.args]
        for node in ast.walk(function):
            code = _python_c_code(node) if isinstance(node, ast.List | ast.Tuple) else None
            code = _unwrap_dedent(code) if code is not None else None
            if isinstance(code, ast.Name) and code.id in parameters:
                runners[function.name] = (parameters.index(code.id), code.id)
    return runners


def _runner_argument(call: ast.Call, names: _Names) -> ast.expr | None:
    func = call.func
    called = (
        func.id
        if isinstance(func, ast.Name)
        else func.attr
        if isinstance(func, ast.Attribute)
        else ""
    )
    if called not in names.runners:
        return None
    index, parameter = names.runners[called]
    if len(call.args) > index:
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == parameter), None)


def _code_strings(
    node: ast.expr, names: _Names, followed: frozenset[str] = frozenset()
) -> Iterator[tuple[ast.expr, str]]:
    """(string node, Python source) for every string ``node`` may stand for."""
    node = _unwrap_dedent(node)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node, node.value
    elif isinstance(node, ast.JoinedStr):
        # an f-string: each replacement field becomes a name
        yield (
            node,
            "".join(str(v.value) if isinstance(v, ast.Constant) else "_" for v in node.values),
        )
    elif isinstance(node, ast.Name) and node.id not in followed:
        # every value the name is given anywhere in the file (``code = dedent(code)`` ends here)
        for value in names.values.get(node.id, []):
            yield from _code_strings(value, names, followed | {node.id})
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
    ):
        # ``TEMPLATE.format(...)``, as tests fill in a model path
        for string_node, template in _code_strings(node.func.value, names, followed):
            yield string_node, _fill_template(template)


def _fill_template(template: str) -> str:
    """``template`` with each replacement field a name and ``{{`` as ``{`` (as Python, roughly)."""
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError:
        return template
    return "".join(text + ("_" if field is not None else "") for text, field, _, _ in fields)


def _subprocess_findings(
    node: ast.expr, names: _Names, path: str, seen: set[int]
) -> Iterator[Finding]:
    """Findings in the code a subprocess runs, at the lines of the string that holds it."""
    for string_node, code in _code_strings(node, names):
        if id(string_node) in seen:
            continue
        seen.add(id(string_node))
        code = textwrap.dedent(code)
        try:
            inner = list(scan_source(code, path, names.runners))
        except (SyntaxError, ValueError):
            # a field we filled with a name stood for more (``f(x=1, {kwargs})``): scan the
            # lines that parse on their own, in place
            lines = [line.strip() if _parses(line.strip()) else "" for line in code.split("\n")]
            inner = list(scan_source("\n".join(lines), path, names.runners))
        first, last = string_node.lineno, string_node.end_lineno or string_node.lineno
        # a multi-line literal keeps the code's lines; a one-line one holds them all
        spans = last - first == code.count("\n")
        for finding in inner:
            line = first + (finding.ours.line if finding.ours else 1) - 1 if spans else first
            yield dataclasses.replace(finding, ours=Location(path, line))


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


# -- the walker ------------------------------------------------------------------------------


def scan_source(
    text: str, path: str, runners: Mapping[str, tuple[int, str]] | None = None
) -> Iterator[Finding]:
    """Findings for one file's source; ``runners``: helpers of other files that run ``python -c``."""
    tree = ast.parse(text)
    names = _bind_names(tree, {**_python_runners(tree), **(runners or {})})
    seen: set[int] = set()
    for node in ast.walk(tree):
        where = Location(path, getattr(node, "lineno", 0))
        if isinstance(node, ast.AnnAssign) and node.value is None:
            continue  # an annotation assigns nothing
        if isinstance(node, ast.Assign | ast.Delete | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in targets:
                for leaf, kind, message in _target_findings(target, names):
                    yield Finding(kind, Severity.BLOCK, ast.unparse(leaf), message, where)
        elif isinstance(node, ast.Call):
            for kind, message in _call_findings(node, names):
                yield Finding(kind, Severity.BLOCK, ast.unparse(node.func), message, where)
            code = _runner_argument(node, names)
            if code is not None:
                yield from _subprocess_findings(code, names, path, seen)
        elif isinstance(node, ast.List | ast.Tuple):
            code = _python_c_code(node)
            if code is not None:
                yield from _subprocess_findings(code, names, path, seen)


def scan(repo_root: Path) -> list[Finding]:
    sources = {
        path.relative_to(repo_root).as_posix(): path.read_text(encoding="utf-8")
        for path in project_files(repo_root)
    }
    # helpers such as tests.engine.run_python are defined in one file and called in others
    runners: dict[str, tuple[int, str]] = {}
    for text in sources.values():
        runners.update(_python_runners(ast.parse(text)))
    findings: list[Finding] = []
    for relative, text in sources.items():
        findings.extend(scan_source(text, relative, runners))
    return findings
