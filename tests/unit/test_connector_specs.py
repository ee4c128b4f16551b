"""The connector table is whole: each row's builders exist, its settings declare their checks,
and no two rows claim one name or one platform default (afd_models.connectors.specs)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from afd_models.connectors.specs import (
    CONNECTORS,
    PLATFORM_DEFAULTS,
    SPECS,
    ConnectorSpec,
    Value,
    settings,
)

ROOT = Path(__file__).resolve().parents[2]


def _functions(module: str) -> set[str]:
    """The top-level functions of ``module``, read without importing it (no torch here)."""
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    tree = ast.parse(path.read_text(), str(path))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_each_builder_a_row_names_is_a_function_of_its_module(spec: ConnectorSpec) -> None:
    """A builder reference is ``module:function`` of a top-level function of a transport, or of
    the wiring above them (the in-process loopback connector, built around an FFN model)."""
    for reference in (spec.attention, spec.ffn):
        if reference is None:
            continue
        module, _, name = reference.partition(":")
        assert module.startswith(("afd_models.connectors.", "afd_models.wiring.")), reference
        assert name in _functions(module), reference


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_a_row_without_a_side_says_why(spec: ConnectorSpec) -> None:
    """No Attention builder only for a connector the workers do not serve yet; no FFN builder
    only for that or for an in-process one (no FFN engine)."""
    assert (spec.attention is None) == (spec.not_served is not None)
    if spec.ffn is None:
        assert spec.attention_only or spec.not_served is not None
    assert set(spec.default_on) <= set(spec.platforms)


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_every_setting_declares_its_check(spec: ConnectorSpec) -> None:
    """Each field of a row's connector_extra_config is checked by a kind of value."""
    assert all(isinstance(value, Value) for value in settings(spec.extra_config).values())


def test_names_and_platform_defaults_are_unique() -> None:
    """One row per name, and at most one default connector per platform."""
    assert len(CONNECTORS) == len(SPECS)
    assert len(PLATFORM_DEFAULTS) == sum(len(spec.default_on) for spec in SPECS)
