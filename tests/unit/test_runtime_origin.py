"""``foreign_code``: a method whose live code comes from another package (as after a platform
plugin's patch) is told apart from upstream's own code, decorators included."""

from __future__ import annotations

import functools

from codegen.checks.runtime import foreign_code

#: where the "plugin" code of these tests lives: outside this package
PATCH_FILE = "/opt/other_package/patch.py"


def _foreign_function(name: str):
    namespace: dict[str, object] = {}
    exec(compile(f"def {name}(*args):\n    return 'patched'\n", PATCH_FILE, "exec"), namespace)
    return namespace[name]


class Upstream:
    def forward(self) -> str:
        return "upstream"

    @staticmethod
    def helper() -> str:
        return "upstream"


def _same_package_decorator(method):  # like vLLM's own decorators: code in the same package
    @functools.wraps(method)
    def wrapper(self):
        return method(self)

    return wrapper


class Decorated(Upstream):
    forward = _same_package_decorator(Upstream.forward)


class Patched(Upstream):
    """What a plugin's patch leaves behind: code from another package, even when it copies
    the original's metadata with ``functools.wraps``."""

    forward = functools.wraps(Upstream.forward)(_foreign_function("forward"))
    helper = staticmethod(_foreign_function("helper"))


def test_upstream_code_is_not_foreign() -> None:
    assert foreign_code(Upstream, "forward") is None
    assert foreign_code(Upstream, "helper") is None
    assert foreign_code(Decorated, "forward") is None


def test_code_from_another_package_is_named() -> None:
    assert foreign_code(Patched, "forward") == PATCH_FILE
    assert foreign_code(Patched, "helper") == PATCH_FILE


def test_members_without_code_are_skipped() -> None:
    assert foreign_code(Upstream, "missing") is None
    assert foreign_code(Upstream, "__init__") is None  # object's C slot
