"""The AFD section is parsed once per worker and the secret read where it is used, read
statically: a new call that parses the section again, or reads the secret elsewhere, fails here
until it says why it must."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the code that runs in vLLM's processes (the generated code left out) and the operator commands
ROOTS = ("afd_models", "overlay")
EXCLUDED = ("afd_models/_generated",)
#: the functions that parse an AFD section
PARSERS = ("parse_afd_config", "afd_config_from", "require_afd_config")
#: where a section may be parsed, and why there
PARSED_AT = {
    "afd_models/config.py": "the parser itself (require_afd_config, afd_config_from)",
    "afd_models/worker_config.py": "the worker's one parse (prepare_worker_config), kept by it",
    "afd_models/models/plan.py": "vLLM builds the model from the engine config alone",
    "afd_models/force_load_balance.py": "vLLM-Ascend builds its quant method from the engine "
    "config alone",
    "overlay/vllm_ascend/platform.py": "whether AFD is on, for the platform, before any worker",
    "afd_models/deploy/spec.py": "the deployment spec checks each engine's section as its "
    "workers will",
}
#: where the shared secret may be read (its file once per connect step), and why there
SECRET_READ_AT = {
    "afd_models/wiring/connect.py": "each worker's connect step, where the step channels use it",
    "afd_models/deploy/run.py": "deploy refuses a deployment its workers would refuse, first",
}


def calls(root: Path, names: tuple[str, ...]) -> Iterator[str]:
    """``path:line name`` of each call of one of ``names`` in the code under ROOTS."""
    for top in ROOTS:
        for path in sorted((root / top).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if any(relative.startswith(e + "/") for e in EXCLUDED):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), relative)):
                if isinstance(node, ast.Call):
                    func = node.func
                    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                    if name in names:
                        yield f"{relative}:{node.lineno} {name}"


def _outside(found: list[str], allowed: dict[str, str]) -> str:
    """The calls of ``found`` in files ``allowed`` does not name, one a line."""
    return "\n".join(call for call in found if call.split(":")[0] not in allowed)


def test_the_afd_section_is_parsed_once_per_worker() -> None:
    """The worker, its runner, its connector and its FFN server take the config the worker
    parsed; only the places vLLM builds from the engine config alone parse it again."""
    found = list(calls(REPO, PARSERS))
    assert any(call.startswith("afd_models/worker_config.py") for call in found)
    outside = _outside(found, PARSED_AT)
    assert not outside, f"the AFD section parsed again:\n{outside}"


def test_the_secret_is_read_where_it_is_used() -> None:
    """Each connect step reads it once; its file is not read anywhere else at run time."""
    found = list(calls(REPO, ("shared_secret",)))
    assert any(call.startswith("afd_models/wiring/connect.py") for call in found)
    outside = _outside(found, SECRET_READ_AT)
    assert not outside, f"the shared secret read elsewhere:\n{outside}"
