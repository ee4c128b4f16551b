"""One tiny model and one log directory for the e2e tests that start servers from the harness."""

from __future__ import annotations

from pathlib import Path

import pytest

from afd_models.cli.tiny_models import write_tiny_model


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The float32 tiny V2 model with widened logit and router margins (docs/testing.md)."""
    return write_tiny_model(
        tmp_path_factory.mktemp("model") / "tiny", "v2", seed=0, dtype="float32", margin_scale=50.0
    )


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")
