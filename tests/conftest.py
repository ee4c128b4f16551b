"""Test tiers.

Every test lives in ``tests/<tier>/`` and gets that tier's marker here, so selection by marker
(``-m cpu``) and by path agree. A tier whose requirement is missing is skipped with the reason,
unless ``AFD_REQUIRED_TIERS`` names it (``nox -s tests`` does, for the tiers this machine must
run): then the missing requirement is an error, so CI can never pass by skipping.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

TIERS = ("unit", "upstream", "cpu", "e2e_cpu", "gpu", "npu")
TESTS_ROOT = Path(__file__).resolve().parent


def _tier_of(path: Path) -> str | None:
    try:
        first = path.resolve().relative_to(TESTS_ROOT).parts[0]
    except (ValueError, IndexError):
        return None
    return first if first in TIERS else None


def _missing_requirement(tier: str) -> str | None:
    """Why ``tier`` cannot run on this machine, or None if it can."""
    if tier in ("cpu", "e2e_cpu"):
        if importlib.util.find_spec("vllm") is None:
            return "vLLM is not installed (run through `nox -s tests`, which builds the CPU env)"
        return None
    if tier == "gpu":
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed"
        import torch

        return None if torch.cuda.is_available() else "no CUDA device on this machine"
    if tier == "npu":
        missing = [
            name for name in ("torch_npu", "vllm_ascend") if not importlib.util.find_spec(name)
        ]
        return f"{' and '.join(missing)} not installed (no Ascend NPU stack)" if missing else None
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    required = {t for t in os.environ.get("AFD_REQUIRED_TIERS", "").split(",") if t}
    unknown = required - set(TIERS)
    if unknown:
        raise pytest.UsageError(
            f"AFD_REQUIRED_TIERS has unknown tiers {sorted(unknown)}; allowed: {TIERS}"
        )
    reasons: dict[str, str | None] = {}
    for item in items:
        tier = _tier_of(Path(str(item.path)))
        if tier is None:
            raise pytest.UsageError(
                f"{item.nodeid}: tests must live under tests/<tier>/, tiers: {TIERS}"
            )
        item.add_marker(getattr(pytest.mark, tier))
        if tier not in reasons:
            reasons[tier] = _missing_requirement(tier)
        reason = reasons[tier]
        if reason is None:
            continue
        if tier in required:
            raise pytest.UsageError(f"tier {tier!r} is required here but cannot run: {reason}")
        item.add_marker(pytest.mark.skip(reason=f"{tier}: {reason}"))
