"""Look up generated classes through the generated registry (plain data, no imports until asked)."""

from __future__ import annotations

from vllm.utils.import_utils import resolve_obj_by_qualname

from afd_models._generated import CLASSES


def generated_subclass(overlay_class: str, upstream: type) -> type:
    """The class generated from overlay class ``overlay_class`` for upstream base ``upstream``.

    Raises:
        LookupError: the overlay declares no such class for that base.
    """
    base = f"{upstream.__module__}:{upstream.__qualname__}"
    for generated, upstream_base, _, declared in CLASSES:
        if declared == overlay_class and upstream_base == base:
            module, name = generated.split(":")
            found: type = resolve_obj_by_qualname(f"{module}.{name}")
            return found
    raise LookupError(
        f"no class generated from {overlay_class} for base {base}; see afd_models/_generated/__init__.py"
    )
