"""overlay/pins.toml: the pinned upstream packages and the run-time replacements AFD accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen.sources import Distribution, Pin, SourceError, load_pins

REPO = Path(__file__).resolve().parents[2]

PIN = """
[[upstream]]
package = "vllm_ascend"
version = "0.26.0rc1"
distributions = [{ name = "vllm-ascend", kind = "sdist" }]
"""


def test_the_repositorys_pins() -> None:
    pins = load_pins(REPO / "overlay" / "pins.toml")
    assert list(pins) == ["vllm", "vllm_ascend"]
    assert pins["vllm_ascend"] == Pin(
        "vllm_ascend",
        "0.26.0rc1",
        (Distribution("vllm-ascend", "sdist"),),
        ("vllm_ascend.patch.platform.patch_fused_moe:_ascend_FusedMoE",),
    )
    assert pins["vllm"].replaces == ()


@pytest.mark.parametrize("replaces", ['"pkg.mod:name"', '["pkg.mod"]', "[1]", '["a b:c"]'])
def test_replacements_must_be_module_qualname_strings(tmp_path: Path, replaces: str) -> None:
    path = tmp_path / "pins.toml"
    path.write_text(PIN + f"replaces = {replaces}\n")
    with pytest.raises(SourceError, match="allowed: a list of 'module:qualname' strings") as error:
        load_pins(path)
    assert "vllm_ascend replaces=" in str(error.value)


def test_a_replacement_is_read(tmp_path: Path) -> None:
    path = tmp_path / "pins.toml"
    path.write_text(PIN + 'replaces = ["pkg.patch:factory"]\n')
    assert load_pins(path)["vllm_ascend"].replaces == ("pkg.patch:factory",)
