"""The AFD section of --additional-config: every key, every bad value (afd_models.config)."""

from __future__ import annotations

import pytest

from afd_models.config import (
    AFDConfigError,
    GlooExtraConfig,
    Role,
    afd_config_from,
    parse_afd_config,
    require_afd_config,
)


def test_defaults() -> None:
    """Only the role is required; the rest has documented defaults."""
    config = parse_afd_config({"role": "ffn"})
    assert config.role is Role.FFN and config.connector == "GlooAFDConnector"
    assert (config.host, config.port, config.num_attention_ranks, config.num_ffn_ranks) == (
        "127.0.0.1",
        29650,
        1,
        1,
    )
    assert config.compute_gate_on_attention is False
    assert config.connector_extra_config == GlooExtraConfig()


def test_full_config() -> None:
    """Every key is read into the frozen config."""
    config = parse_afd_config(
        {
            "role": "attention",
            "connector": "GlooAFDConnector",
            "host": "10.0.0.1",
            "port": 1239,
            "num_attention_ranks": 4,
            "num_ffn_ranks": 2,
            "compute_gate_on_attention": True,
            "connector_extra_config": {"timeout_s": 5, "connect_timeout_s": 30.5},
        }
    )
    assert config.is_attention and config.compute_gate_on_attention
    assert config.connector_extra_config == GlooExtraConfig(connect_timeout_s=30.5, timeout_s=5.0)


@pytest.mark.parametrize(
    ("section", "fragment"),
    [
        ({}, "additional_config.afd.role is required"),
        (
            {"role": "decoder"},
            "additional_config.afd.role='decoder' is not allowed; allowed: attention, ffn",
        ),
        ({"role": "ffn", "rank": 0}, "unknown key(s) ['rank']"),
        (
            {"role": "ffn", "connector": "P2pNccl"},
            "connector='P2pNccl' is not allowed; allowed: GlooAFDConnector, LoopbackAFDConnector",
        ),
        ({"role": "ffn", "port": 0}, "port=0 is not allowed; allowed: an integer in 1..65535"),
        ({"role": "ffn", "port": "80"}, "port='80' is not allowed"),
        ({"role": "ffn", "port": True}, "port=True is not allowed"),
        ({"role": "ffn", "host": ""}, "host='' is not allowed; allowed: a non-empty string"),
        ({"role": "ffn", "num_ffn_ranks": 0}, "num_ffn_ranks=0 is not allowed"),
        (
            {"role": "ffn", "num_attention_ranks": 3, "num_ffn_ranks": 2},
            "num_attention_ranks=3 with",
        ),
        (
            {"role": "ffn", "num_attention_ranks": 1, "num_ffn_ranks": 2},
            "num_attention_ranks >= num_ffn_ranks",
        ),
        (
            {"role": "ffn", "compute_gate_on_attention": "yes"},
            "compute_gate_on_attention='yes' is not allowed; allowed: true or false",
        ),
        (
            {"role": "ffn", "connector_extra_config": []},
            "connector_extra_config=[] is not allowed; allowed: a JSON object",
        ),
        (
            {"role": "ffn", "connector_extra_config": {"core_num": 8}},
            "unknown key(s) ['core_num'] for GlooAFDConnector",
        ),
        (
            {"role": "ffn", "connector_extra_config": {"timeout_s": 0}},
            "connector_extra_config.timeout_s=0 is not allowed",
        ),
        (
            {
                "role": "ffn",
                "connector": "LoopbackAFDConnector",
                "connector_extra_config": {"timeout_s": 1},
            },
            "allowed: no keys",
        ),
    ],
)
def test_bad_values_name_key_value_and_allowed(section: dict, fragment: str) -> None:
    """Each bad value is rejected with a message naming key, value and what is allowed."""
    with pytest.raises(AFDConfigError) as raised:
        parse_afd_config(section)
    assert fragment in str(raised.value)


def test_absent_section_means_afd_off() -> None:
    """Without an afd section AFD is off; AFD components then refuse to start."""
    assert afd_config_from({"other": 1}) is None
    assert afd_config_from(None) is None
    with pytest.raises(AFDConfigError, match="needs --additional-config"):
        require_afd_config({})
    with pytest.raises(
        AFDConfigError, match="role='ffn' is not allowed here; allowed: 'attention'"
    ):
        require_afd_config({"afd": {"role": "ffn"}}, role=Role.ATTENTION)
