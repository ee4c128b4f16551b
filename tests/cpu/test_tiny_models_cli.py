"""``python -m afd_models.cli.tiny_models``: the command the user guide gives to make a model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

# the command line of AFD's own builder, on the primary release; the builder itself runs on
# every supported release, under every e2e and verify test
COMMAND = [sys.executable, "-m", "afd_models.cli.tiny_models"]


def test_cli_writes_a_checkpoint_with_the_requested_margin_scale(tmp_path: Path) -> None:
    """Same seed, --margin-scale 50 vs 1: the output head and the routers are 50x, the rest equal."""
    outputs = {}
    for scale in ("1", "50"):
        out = tmp_path / f"scale-{scale}"
        result = subprocess.run(
            [*COMMAND, str(out), "--dtype", "float32", "--margin-scale", scale],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip() == str(out)
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
            p.name for p in out.iterdir()
        }
        outputs[scale] = load_file(out / "model.safetensors")
    plain, scaled = outputs["1"], outputs["50"]
    assert (scaled["lm_head.weight"] == plain["lm_head.weight"] * 50).all()
    assert (
        scaled["model.layers.1.mlp.gate.weight"] == plain["model.layers.1.mlp.gate.weight"] * 50
    ).all()
    assert (scaled["model.embed_tokens.weight"] == plain["model.embed_tokens.weight"]).all()


def test_cli_refuses_a_margin_scale_that_is_not_positive(tmp_path: Path) -> None:
    result = subprocess.run(
        [*COMMAND, str(tmp_path / "m"), "--margin-scale", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3  # a usage error (docs/maintainers.md, "Exit codes")
    assert "--margin-scale=0.0 is not allowed; allowed: a number > 0" in result.stderr
    assert not (tmp_path / "m").exists()
