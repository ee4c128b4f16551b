"""Which release drift and audit compare a vLLM target with when ``--from`` is not given."""

from __future__ import annotations

from pathlib import Path

import pytest

from afd_models.release_order import release_key
from codegen.drift_run import default_base
from codegen.generate import PINS_PATH
from codegen.sources import Pin, load_pins

REPO = Path(__file__).resolve().parents[2]
WINDOW = Pin("vllm", "0.26.0", (), also_supported=("0.28.0", "0.30.0", "0.32.0"))
BELOW = "the newest supported release below {} (overlay/pins.toml)"
BEFORE = "the supported release before {} (overlay/pins.toml)"
PRIMARY = "the primary release; no supported release is older than {}"


@pytest.mark.parametrize(
    ("target", "base", "why"),
    [
        ("0.33.0", "0.32.0", BELOW),
        ("0.29.0", "0.28.0", BELOW),
        ("0.32.0rc1", "0.30.0", BELOW),
        ("0.28.0", "0.26.0", BEFORE),
        ("0.30.0", "0.28.0", BEFORE),
        ("0.32.0", "0.30.0", BEFORE),
        ("0.26.0", "0.26.0", PRIMARY),
        ("0.20.0", "0.26.0", PRIMARY),
        ("0.34.0.dev3", "0.32.0", BELOW),
        ("dev", "0.26.0", "the primary release; {} is not a release number"),
    ],
)
def test_base_is_the_newest_supported_release_below_the_target(
    target: str, base: str, why: str
) -> None:
    """The overlay handles every supported release, so a target is compared with the nearest one
    below it; a target at or below the primary, or one without a release number, with the
    primary."""
    assert default_base(WINDOW, target) == (base, why.format(target))


def test_base_reads_the_committed_window() -> None:
    """run_drift passes overlay/pins.toml's vLLM pin (the window tools/cpu_env reads)."""
    pin = load_pins(REPO / PINS_PATH)["vllm"]
    assert default_base(pin, "99.0.0")[0] == max(pin.supported, key=release_key)
    assert default_base(pin, "0.0.1")[0] == pin.version
