"""The AFD section of --additional-config: every key, every bad value (afd_models.config)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest

from afd_models.config import (
    AFDConfigError,
    Role,
    afd_config_from,
    check_connector_platform,
    parse_afd_config,
    require_afd_config,
    shared_secret,
)
from afd_models.connectors.specs import (
    AUTH_TOKEN_ENV,
    CAMAsyncExtraConfig,
    CAMP2PExtraConfig,
    GlooExtraConfig,
)
from afd_models.topology import check_attention_engine


def test_defaults() -> None:
    """Only the role is required; the rest has documented defaults (the connector: this
    platform's, vLLM's CPU platform here)."""
    config = parse_afd_config({"role": "ffn"})
    assert config.role is Role.FFN and config.connector == "GlooAFDConnector"
    assert (config.host, config.port, config.num_attention_ranks, config.num_ffn_ranks) == (
        "127.0.0.1",
        29650,
        1,
        1,
    )
    assert config.compute_gate_on_attention is False and config.rank_offset == 0
    assert config.connector_extra_config == GlooExtraConfig()
    assert config.connector_extra_config.shared_memory is True


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
            "rank_offset": 2,
            "compute_gate_on_attention": True,
            "connector_extra_config": {
                "timeout_s": 5,
                "connect_timeout_s": 30.5,
                "shared_memory": False,
            },
        }
    )
    assert config.is_attention and config.compute_gate_on_attention and config.rank_offset == 2
    assert config.connector_extra_config == GlooExtraConfig(
        connect_timeout_s=30.5, timeout_s=5.0, shared_memory=False
    )


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
            "connector='P2pNccl' is not allowed; allowed: GlooAFDConnector, NcclAFDConnector, "
            "LoopbackAFDConnector, CAMP2PAFDConnector, CAMAsyncAFDConnector",
        ),
        ({"role": "ffn", "port": 0}, "port=0 is not allowed; allowed: an integer in 1..65535"),
        ({"role": "ffn", "port": "80"}, "port='80' is not allowed"),
        ({"role": "ffn", "port": True}, "port=True is not allowed"),
        ({"role": "ffn", "num_ffn_ranks": 0}, "num_ffn_ranks=0 is not allowed"),
        (
            {"role": "ffn", "num_attention_ranks": 1, "num_ffn_ranks": 2},
            "additional_config.afd.num_attention_ranks=1 with additional_config.afd.num_ffn_ranks=2 "
            "is not allowed; allowed: num_attention_ranks >= num_ffn_ranks, divisible or not",
        ),
        (
            {"role": "ffn", "compute_gate_on_attention": "yes"},
            "compute_gate_on_attention='yes' is not allowed; allowed: true or false",
        ),
        (
            {"role": "attention", "dbo": "yes"},
            "additional_config.afd.dbo='yes' is not allowed; allowed: true or false",
        ),
        (
            {"role": "ffn", "dbo": True},
            "additional_config.afd.dbo=true with additional_config.afd.role='ffn' is not allowed",
        ),
        (
            {"role": "attention", "connector": "GlooAFDConnector", "dbo": True},
            "dbo=true with additional_config.afd.connector='GlooAFDConnector' is not allowed: the "
            "micro-batches overlap their exchanges with an FFN engine of its own, on CUDA; "
            "allowed connectors: NcclAFDConnector",
        ),
        (
            {"role": "attention", "connector": "LoopbackAFDConnector", "dbo": True},
            "dbo=true with additional_config.afd.connector='LoopbackAFDConnector' is not allowed",
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
                "role": "attention",
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


@pytest.mark.parametrize(("a", "f"), [(3, 2), (5, 2), (7, 3), (2, 1), (4, 4)])
def test_any_ratio_with_at_least_as_many_attention_ranks_parses(a: int, f: int) -> None:
    """Non-divisible ratios are allowed: Attention rank r is served by FFN rank r * F // A."""
    config = parse_afd_config({"role": "ffn", "num_attention_ranks": a, "num_ffn_ranks": f})
    assert (config.num_attention_ranks, config.num_ffn_ranks) == (a, f)


@pytest.mark.parametrize(("port", "f"), [(65535, 1), (65534, 2), (65000, 536)])
def test_the_last_port_may_be_65535(port: int, f: int) -> None:
    parse_afd_config({"role": "ffn", "port": port, "num_attention_ranks": f, "num_ffn_ranks": f})


@pytest.mark.parametrize(("port", "f"), [(65535, 2), (65000, 537), (62000, 4096)])
def test_ports_past_65535_name_port_and_num_ffn_ranks(port: int, f: int) -> None:
    """FFN rank k listens on port + k: the check names both keys, the last port and the limit."""
    section = {"role": "attention", "port": port, "num_attention_ranks": f, "num_ffn_ranks": f}
    with pytest.raises(AFDConfigError) as raised:
        parse_afd_config(section)
    assert str(raised.value) == (
        f"additional_config.afd.port={port} with additional_config.afd.num_ffn_ranks={f} is not "
        f"allowed: FFN rank k hosts its group on port + k, up to {port + f - 1}; "
        f"allowed: port <= {65536 - f}"
    )


@pytest.mark.parametrize(("role", "offset"), [("attention", 2), ("ffn", 1), ("attention", 0)])
def test_rank_offset_up_to_the_last_rank_of_the_role_parses(role: str, offset: int) -> None:
    section = {"role": role, "num_attention_ranks": 3, "num_ffn_ranks": 2, "rank_offset": offset}
    assert parse_afd_config(section).rank_offset == offset


@pytest.mark.parametrize(
    ("role", "offset", "key", "ranks"),
    [("attention", 3, "num_attention_ranks", 3), ("ffn", 2, "num_ffn_ranks", 2)],
)
def test_rank_offset_past_the_role_ranks_names_both_keys(
    role: str, offset: int, key: str, ranks: int
) -> None:
    """An FFN engine is checked against num_ffn_ranks, an Attention engine against num_attention_ranks."""
    section = {"role": role, "num_attention_ranks": 3, "num_ffn_ranks": 2, "rank_offset": offset}
    with pytest.raises(AFDConfigError) as raised:
        parse_afd_config(section)
    assert str(raised.value) == (
        f"additional_config.afd.rank_offset={offset} with additional_config.afd.{key}={ranks} is "
        f"not allowed for role {role}: the engine's first worker would have no role rank; "
        f"allowed: rank_offset <= {ranks - 1}"
    )


@pytest.mark.parametrize("value", [-1, 4096, 1.0, "1", True])
def test_rank_offset_must_be_an_integer_in_range(value: object) -> None:
    with pytest.raises(AFDConfigError) as raised:
        parse_afd_config({"role": "ffn", "rank_offset": value})
    assert str(raised.value) == (
        f"additional_config.afd.rank_offset={value!r} is not allowed; allowed: an integer in 0..4095"
    )


TIMEOUT_KEYS = ["timeout_s", "connect_timeout_s", "idle_timeout_s"]


@pytest.mark.parametrize("key", TIMEOUT_KEYS)
@pytest.mark.parametrize(
    "value", [0, -1, 1e300, 10**400, float("inf"), float("nan"), 31536000.5, True, "60"]
)
def test_timeouts_must_be_finite_positive_and_at_most_a_year(key: str, value: object) -> None:
    """Each timeout is refused unless 0 < x <= one year, so datetime.timedelta cannot overflow."""
    with pytest.raises(AFDConfigError) as raised:
        parse_afd_config({"role": "ffn", "connector_extra_config": {key: value}})
    assert str(raised.value) == (
        f"additional_config.afd.connector_extra_config.{key}={value!r} is not allowed; "
        "allowed: a finite number of seconds > 0 and <= 31536000 (one year)"
    )


@pytest.mark.parametrize("key", TIMEOUT_KEYS)
@pytest.mark.parametrize("value", [0.001, 1, 31536000])
def test_timeouts_up_to_a_year_fit_a_timedelta(key: str, value: float) -> None:
    config = parse_afd_config({"role": "ffn", "connector_extra_config": {key: value}})
    seconds = getattr(config.connector_extra_config, key)
    assert seconds == value and timedelta(seconds=seconds).total_seconds() == value


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "::1",
        "fe80::1%eth0",
        "localhost",
        "ffn-0.cluster.local",
        "10.0.0.1",
        "0ffn",
        "a" * 63 + ".example",
    ],
)
def test_ip_literals_and_rfc_1123_host_names_are_accepted(host: str) -> None:
    assert parse_afd_config({"role": "ffn", "host": host}).host == host


@pytest.mark.parametrize(
    "host",
    [
        "bad host!",
        "",
        " ",
        "a..b",
        ".local",
        "local.",
        "-ffn",
        "ffn-",
        "ffn_0",
        "256.1.1.1",
        "1.2.3",
        "[::1]",
        "127.0.0.1:29650",
        "a" * 64,
        ".".join(["a" * 63] * 4),
        None,
        7,
    ],
)
def test_malformed_hosts_are_refused_naming_the_value(host: object) -> None:
    with pytest.raises(AFDConfigError) as raised:
        parse_afd_config({"role": "ffn", "host": host})
    assert str(raised.value) == (
        f"additional_config.afd.host={host!r} is not allowed; allowed: an IPv4 or IPv6 address "
        "(127.0.0.1, ::1) or an RFC 1123 host name (localhost, ffn-0.cluster.local)"
    )


def test_the_loopback_connector_is_refused_for_the_ffn_role_at_parse_time() -> None:
    """The loopback connector runs the FFN half inside the Attention engine: no FFN engine takes it."""
    assert parse_afd_config({"role": "attention", "connector": "LoopbackAFDConnector"}).is_attention
    with pytest.raises(AFDConfigError) as raised:
        parse_afd_config({"role": "ffn", "connector": "LoopbackAFDConnector"})
    assert str(raised.value) == (
        "additional_config.afd.connector='LoopbackAFDConnector' with additional_config.afd.role='ffn' "
        "is not allowed: this connector runs the FFN half inside the Attention engine, so no FFN "
        "engine is started with it; allowed for role ffn: GlooAFDConnector, NcclAFDConnector, "
        "CAMP2PAFDConnector, CAMAsyncAFDConnector"
    )


@pytest.mark.parametrize(
    ("platform", "connector"),
    [("cpu", "GlooAFDConnector"), ("cuda", "NcclAFDConnector"), ("npu", "CAMP2PAFDConnector")],
)
def test_the_default_connector_is_the_platforms(platform: str, connector: str) -> None:
    config = parse_afd_config({"role": "ffn"}, platform=platform)
    assert config.connector == connector
    check_connector_platform(config, platform)  # and that platform takes it


def test_a_platform_without_a_default_needs_a_connector() -> None:
    with pytest.raises(AFDConfigError) as raised:
        parse_afd_config({"role": "ffn"}, platform="xpu")
    assert str(raised.value) == (
        "additional_config.afd.connector is required on platform 'xpu', which has no default "
        "connector; allowed: GlooAFDConnector, NcclAFDConnector, LoopbackAFDConnector, "
        "CAMP2PAFDConnector, CAMAsyncAFDConnector (the defaults: GlooAFDConnector on cpu, "
        "NcclAFDConnector on cuda, CAMP2PAFDConnector on npu)"
    )


@pytest.mark.parametrize(
    ("connector", "platform", "message"),
    [
        (
            "GlooAFDConnector",
            "cuda",
            "additional_config.afd.connector='GlooAFDConnector' moves cpu tensors only, and this "
            "engine runs on vLLM's 'cuda' platform; allowed there: NcclAFDConnector, "
            "LoopbackAFDConnector (leave additional_config.afd.connector out for NcclAFDConnector)",
        ),
        (
            "NcclAFDConnector",
            "cpu",
            "additional_config.afd.connector='NcclAFDConnector' moves cuda tensors only, and this "
            "engine runs on vLLM's 'cpu' platform; allowed there: GlooAFDConnector, "
            "LoopbackAFDConnector (leave additional_config.afd.connector out for GlooAFDConnector)",
        ),
    ],
)
def test_a_connector_of_another_platform_is_refused(
    connector: str, platform: str, message: str
) -> None:
    config = parse_afd_config({"role": "attention", "connector": connector})
    with pytest.raises(AFDConfigError) as raised:
        check_connector_platform(config, platform)
    assert str(raised.value) == message


@pytest.mark.parametrize("platform", ["cpu", "cuda", "npu"])
def test_loopback_runs_on_either_platform(platform: str) -> None:
    config = parse_afd_config({"role": "attention", "connector": "LoopbackAFDConnector"})
    check_connector_platform(config, platform)


def test_dbo_is_an_attention_setting_of_the_nccl_connector() -> None:
    section = {"role": "attention", "connector": "NcclAFDConnector", "dbo": True}
    assert parse_afd_config(section, platform="cuda").dbo
    assert not parse_afd_config({"role": "attention"}, platform="cuda").dbo


CAM = {"CAMP2PAFDConnector": False, "CAMAsyncAFDConnector": True}


def _cam(connector: str, extra: dict) -> dict:
    return {
        "role": "ffn",
        "connector": connector,
        "compute_gate_on_attention": CAM[connector],
        "connector_extra_config": extra,
    }


@pytest.mark.parametrize("connector", CAM)
def test_cam_connectors_run_on_npu_only(connector: str) -> None:
    config = parse_afd_config(_cam(connector, {}))
    check_connector_platform(config, "npu")
    with pytest.raises(AFDConfigError, match=f"{connector}' moves npu tensors only"):
        check_connector_platform(config, "cuda")


def test_cam_schemas_and_their_defaults() -> None:
    p2p = parse_afd_config(
        _cam("CAMP2PAFDConnector", {"core_num": 16, "timeout_s": 5, "force_load_balance": True})
    ).connector_extra_config
    assert p2p == CAMP2PExtraConfig(core_num=16, timeout_s=5.0, force_load_balance=True)
    assert p2p.force_load_balance_topn_per_rank == 0
    cam = parse_afd_config(
        _cam("CAMAsyncAFDConnector", {"dynamic_quant": True, "force_load_balance_topn_per_rank": 2})
    ).connector_extra_config
    assert cam == CAMAsyncExtraConfig(dynamic_quant=True, force_load_balance_topn_per_rank=2)
    assert cam.force_load_balance is False


EXTRA_KEY = "additional_config.afd.connector_extra_config"


@pytest.mark.parametrize(
    ("connector", "extra", "message"),
    [
        (
            "CAMP2PAFDConnector",
            {"quant_mode": 0},
            f"{EXTRA_KEY} has unknown key(s) ['quant_mode'] for CAMP2PAFDConnector; allowed: "
            "connect_timeout_s, core_num, force_load_balance, force_load_balance_topn_per_rank, "
            "idle_timeout_s, timeout_s",
        ),
        (
            "CAMAsyncAFDConnector",
            {"dynamicQuant": 1},
            f"{EXTRA_KEY} has unknown key(s) ['dynamicQuant'] for CAMAsyncAFDConnector; allowed: "
            "connect_timeout_s, dynamic_quant, force_load_balance, force_load_balance_topn_per_rank",
        ),
        (
            "CAMP2PAFDConnector",
            {"core_num": 0},
            f"{EXTRA_KEY}.core_num=0 is not allowed; allowed: an integer in 1..48",
        ),
        (
            "CAMAsyncAFDConnector",
            {"dynamic_quant": 1},
            f"{EXTRA_KEY}.dynamic_quant=1 is not allowed; allowed: true or false",
        ),
        (
            "CAMP2PAFDConnector",
            {"force_load_balance": "yes"},
            f"{EXTRA_KEY}.force_load_balance='yes' is not allowed; allowed: true or false",
        ),
        (
            "CAMP2PAFDConnector",
            {"force_load_balance_topn_per_rank": -1},
            f"{EXTRA_KEY}.force_load_balance_topn_per_rank=-1 is not allowed; allowed: an integer "
            ">= 0 (0: spread over all experts)",
        ),
        (
            "CAMAsyncAFDConnector",
            {"force_load_balance_topn_per_rank": True},
            f"{EXTRA_KEY}.force_load_balance_topn_per_rank=True is not allowed",
        ),
    ],
)
def test_cam_schemas_are_closed_and_typed(connector: str, extra: dict, message: str) -> None:
    with pytest.raises(AFDConfigError) as raised:
        parse_afd_config(_cam(connector, extra))
    assert message in str(raised.value)


def test_gloo_shared_memory_is_true_or_false() -> None:
    with pytest.raises(AFDConfigError) as raised:
        parse_afd_config({"role": "ffn", "connector_extra_config": {"shared_memory": "auto"}})
    assert f"{EXTRA_KEY}.shared_memory='auto' is not allowed; allowed: true or false" in str(
        raised.value
    )


@pytest.mark.parametrize(
    ("connector", "gate"), [("CAMP2PAFDConnector", True), ("CAMAsyncAFDConnector", False)]
)
def test_cam_connectors_fix_where_the_gate_runs(connector: str, gate: bool) -> None:
    """CAMP2P moves hidden states only (gate on FFN); CAM async routes on Attention."""
    section = {**_cam(connector, {}), "compute_gate_on_attention": gate}
    with pytest.raises(AFDConfigError) as raised:
        parse_afd_config(section)
    value = "true" if gate else "false"
    assert str(raised.value).startswith(
        f"additional_config.afd.compute_gate_on_attention={value} with "
        f"additional_config.afd.connector='{connector}' is not allowed: "
    )
    assert str(raised.value).endswith(f"allowed: {'false' if gate else 'true'}")


def test_force_load_balance_on_the_attention_role_is_refused() -> None:
    """The switch balances the FFN role's experts; on Attention it would be silently ignored."""
    section = {
        "role": "attention",
        "connector": "CAMP2PAFDConnector",
        "connector_extra_config": {"force_load_balance": True},
    }
    with pytest.raises(AFDConfigError) as error:
        parse_afd_config(section)
    assert str(error.value) == (
        "additional_config.afd.connector_extra_config.force_load_balance=true is not allowed "
        "with additional_config.afd.role='attention': the experts, and so their load, are the "
        "FFN role's; allowed: false (set it on the FFN engine)"
    )
    assert parse_afd_config({**section, "role": "ffn"}).connector_extra_config.force_load_balance


def test_ffn_hosts_put_each_ffn_ranks_group_on_its_own_address() -> None:
    """Multi-node: FFN rank k hosts (and its peers join) group k at ffn_hosts[k]; without
    ffn_hosts every group is on ``host``."""
    section = {"role": "attention", "num_attention_ranks": 4, "num_ffn_ranks": 2}
    spread = parse_afd_config({**section, "ffn_hosts": ["10.0.0.2", "ffn-1.cluster.local"]})
    assert spread.ffn_hosts == ("10.0.0.2", "ffn-1.cluster.local")
    assert [spread.group_host(k) for k in range(2)] == ["10.0.0.2", "ffn-1.cluster.local"]
    one = parse_afd_config({**section, "host": "10.0.0.9"})
    assert one.ffn_hosts == () and [one.group_host(k) for k in range(2)] == ["10.0.0.9"] * 2


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"ffn_hosts": ["10.0.0.2"]},
            "additional_config.afd.ffn_hosts=['10.0.0.2'] with additional_config.afd.num_ffn_ranks=2 "
            "is not allowed; allowed: a list of 2 address(es), FFN rank k's at index k",
        ),
        (
            {"ffn_hosts": "10.0.0.2"},
            "additional_config.afd.ffn_hosts='10.0.0.2' with additional_config.afd.num_ffn_ranks=2 "
            "is not allowed; allowed: a list of 2 address(es), FFN rank k's at index k",
        ),
        (
            {"ffn_hosts": ["10.0.0.2", "bad host!"]},
            "additional_config.afd.ffn_hosts[1]='bad host!' is not allowed; allowed: an IPv4 or "
            "IPv6 address (127.0.0.1, ::1) or an RFC 1123 host name (localhost, "
            "ffn-0.cluster.local)",
        ),
        (
            {"ffn_hosts": ["10.0.0.2", "10.0.0.3"], "host": "10.0.0.2"},
            "additional_config.afd.host='10.0.0.2' with additional_config.afd.ffn_hosts="
            "['10.0.0.2', '10.0.0.3'] is not allowed: both "
            "say where the rendezvous listens; allowed: one of them (ffn_hosts for FFN ranks on "
            "several nodes)",
        ),
    ],
)
def test_bad_ffn_hosts_name_the_keys(changes: dict, message: str) -> None:
    section = {"role": "ffn", "num_attention_ranks": 2, "num_ffn_ranks": 2, **changes}
    with pytest.raises(AFDConfigError) as raised:
        parse_afd_config(section)
    assert str(raised.value) == message


def _multi_node_recipes() -> list[tuple[str, list[tuple[dict, int]]]]:
    """Each command block of docs/user-guide.md's Multi-node section: its text, and per ``vllm
    serve`` its ``afd`` section and ``--data-parallel-size``."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "user-guide.md").read_text()
    section = guide.split("### Multi-node", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    recipes = []
    for block in re.findall(r"```bash\n(.*?)\n```", section, re.S):
        engines = []
        for command in block.replace("\\\n", " ").splitlines():
            if "vllm serve" not in command:
                continue
            afd = json.loads(re.search(r"--additional-config '(.*?)'", command).group(1))["afd"]
            dp = re.search(r"--data-parallel-size (\d+)", command)
            engines.append((afd, int(dp.group(1)) if dp else 1))
        recipes.append((block, engines))
    return recipes


def test_the_multi_node_recipes_are_whole_deployments() -> None:
    """Every engine of each documented recipe parses, all agree on the deployment, and their
    ranks cover each role exactly once, in engines the start-up check accepts; each recipe sets
    the shared secret its addresses require."""
    recipes = _multi_node_recipes()
    assert [len(engines) for _, engines in recipes] == [2, 4]
    for block, engines in recipes:
        configs = [(parse_afd_config(afd, platform="cpu"), dp) for afd, dp in engines]
        assert 'export AFD_AUTH_TOKEN="$(cat ~/.afd-token)"' in block
        for config, _ in configs:
            assert shared_secret(config, {AUTH_TOKEN_ENV: "t" * 64}) == b"t" * 64
            with pytest.raises(AFDConfigError, match="no shared secret is set"):
                shared_secret(config, {})
        shared = {
            (c.port, c.num_attention_ranks, c.num_ffn_ranks, c.host, c.ffn_hosts)
            for c, _ in configs
        }
        assert len(shared) == 1, shared
        a, f = configs[0][0].num_attention_ranks, configs[0][0].num_ffn_ranks
        attention = [(c.rank_offset, dp) for c, dp in configs if c.is_attention]
        ffn = sorted(c.rank_offset for c, dp in configs if c.is_ffn)
        assert ffn == list(range(f)), ffn
        covered = sorted(r for first, dp in attention for r in range(first, first + dp))
        assert covered == list(range(a)), covered
        for first, dp in attention:
            check_attention_engine(first, dp, a, f)


def test_peer_restart_timeout_is_off_by_default_and_gloo_only() -> None:
    """0 (off) unless set; a positive number of seconds with the gloo connector; refused with a
    connector whose waits a vanished peer does not end, or with a bad value, naming the keys."""
    assert parse_afd_config({"role": "ffn"}).peer_restart_timeout_s == 0
    assert (
        parse_afd_config({"role": "ffn", "peer_restart_timeout_s": 0}).peer_restart_timeout_s == 0
    )
    on = parse_afd_config({"role": "attention", "peer_restart_timeout_s": 120})
    assert on.peer_restart_timeout_s == 120.0
    with pytest.raises(AFDConfigError) as raised:
        parse_afd_config(
            {"role": "attention", "connector": "NcclAFDConnector", "peer_restart_timeout_s": 60}
        )
    assert str(raised.value) == (
        "additional_config.afd.peer_restart_timeout_s=60 with additional_config.afd.connector="
        "'NcclAFDConnector' is not allowed: only a connector whose waits end when the peer goes "
        "away can wait for a restarted one; allowed: 0 with this connector, or the connector "
        "GlooAFDConnector"
    )
    # an FFN rank with two Attention peers (2A1F) holds steps too; which Attention engines may
    # is the workers' check (tests/cpu/test_peer_restart.py)
    assert (
        parse_afd_config(
            {"role": "ffn", "num_attention_ranks": 2, "peer_restart_timeout_s": 60}
        ).peer_restart_timeout_s
        == 60
    )
    assert (
        parse_afd_config(
            {
                "role": "ffn",
                "num_attention_ranks": 2,
                "num_ffn_ranks": 2,
                "peer_restart_timeout_s": 60,
            }
        ).peer_restart_timeout_s
        == 60
    )
    for bad in (-1, True, "60", float("inf")):
        with pytest.raises(AFDConfigError) as raised:
            parse_afd_config({"role": "ffn", "peer_restart_timeout_s": bad})
        assert str(raised.value) == (
            f"additional_config.afd.peer_restart_timeout_s={bad!r} is not allowed; allowed: 0 "
            "(off) or a finite number of seconds > 0 and <= 31536000 (one year)"
        )


def _secret_file(
    tmp_path: Path, content: bytes = b"0123456789abcdef0123\n", mode: int = 0o600
) -> str:
    path = tmp_path / "token"
    path.write_bytes(content)
    path.chmod(mode)
    return str(path)


def test_a_secret_file_only_its_owner_can_read_is_read_stripped(tmp_path: Path) -> None:
    path = _secret_file(tmp_path)
    config = parse_afd_config({"role": "ffn", "auth_token_file": path})
    assert config.auth_token_file == path
    assert shared_secret(config, {}) == b"0123456789abcdef0123"


@pytest.mark.parametrize(
    ("content", "mode", "message"),
    [
        (b"0123456789abcdef", 0o640, "has mode 0640: others than its owner may use it; allowed: "),
        (b"0123456789abcdef", 0o604, "has mode 0604: others than its owner may use it"),
        (b"short\n", 0o600, "holds a secret of 5 bytes; allowed: at least 16"),
        (b"x" * 5000, 0o600, "holds 5000 bytes; allowed: a secret of 16 to 4096 bytes"),
    ],
    ids=["group-readable", "world-readable", "too-short", "too-long"],
)
def test_a_bad_secret_file_is_refused_at_parse_time(
    tmp_path: Path, content: bytes, mode: int, message: str
) -> None:
    path = _secret_file(tmp_path, content, mode)
    with pytest.raises(AFDConfigError) as raised:
        parse_afd_config({"role": "ffn", "auth_token_file": path})
    assert str(raised.value).startswith(f"additional_config.afd.auth_token_file={path!r} ")
    assert message in str(raised.value)


def test_a_missing_or_odd_secret_file_is_refused(tmp_path: Path) -> None:
    for value, message in [
        (str(tmp_path / "absent"), "cannot be read (No such file or directory)"),
        (str(tmp_path), "is not a regular file"),
        ("", "is not allowed; allowed: a file path"),
        (7, "is not allowed; allowed: a file path"),
    ]:
        with pytest.raises(AFDConfigError, match=re.escape(message)):
            parse_afd_config({"role": "attention", "auth_token_file": value})


@pytest.mark.parametrize(
    "section",
    [
        {"role": "ffn"},
        {"role": "ffn", "host": "localhost"},
        {"role": "ffn", "host": "::1"},
        {"role": "attention", "host": "127.0.0.2"},
        {"role": "ffn", "host": "10.0.0.1", "allow_unauthenticated": True},
    ],
)
def test_a_deployment_without_a_secret_starts_on_loopback_or_when_allowed(section: dict) -> None:
    assert shared_secret(parse_afd_config(section), {}) is None


@pytest.mark.parametrize(
    ("section", "exposed"),
    [
        ({"role": "ffn", "host": "10.0.0.1"}, "host puts a rendezvous on 10.0.0.1"),
        ({"role": "attention", "host": "0.0.0.0"}, "host puts a rendezvous on 0.0.0.0"),
        (
            {
                "role": "attention",
                "num_ffn_ranks": 2,
                "num_attention_ranks": 2,
                "ffn_hosts": ["127.0.0.1", "ffn-1.cluster.local"],
            },
            "ffn_hosts puts a rendezvous on ffn-1.cluster.local",
        ),
    ],
)
def test_a_reachable_deployment_without_a_secret_is_refused(section: dict, exposed: str) -> None:
    """Secure by default: the message names the two ways to set a secret and the key that
    allows running without one."""
    with pytest.raises(AFDConfigError) as raised:
        shared_secret(parse_afd_config(section), {})
    assert str(raised.value) == (
        f"additional_config.afd.{exposed}, which other machines can reach, and no shared secret "
        "is set: anyone who reaches it could join as a peer. Allowed: the same secret on every "
        "engine, in AFD_AUTH_TOKEN or in the file additional_config.afd.auth_token_file names; "
        "or additional_config.afd.allow_unauthenticated=true to run without one on a network "
        "you trust"
    )
    assert shared_secret(parse_afd_config(section), {AUTH_TOKEN_ENV: "t" * 16}) == b"t" * 16


def test_secret_sources_that_conflict_or_are_too_short_are_refused(tmp_path: Path) -> None:
    path = _secret_file(tmp_path)
    with_file = parse_afd_config({"role": "ffn", "auth_token_file": path})
    with pytest.raises(
        AFDConfigError, match="with AFD_AUTH_TOKEN set in the environment is not allowed"
    ):
        shared_secret(with_file, {AUTH_TOKEN_ENV: "t" * 16})
    with pytest.raises(AFDConfigError, match="AFD_AUTH_TOKEN holds a secret of 3 bytes"):
        shared_secret(parse_afd_config({"role": "ffn"}), {AUTH_TOKEN_ENV: "abc"})
    allowed = parse_afd_config({"role": "ffn", "allow_unauthenticated": True})
    with pytest.raises(AFDConfigError, match="allow_unauthenticated=true with a shared secret"):
        shared_secret(allowed, {AUTH_TOKEN_ENV: "t" * 16})
    with pytest.raises(AFDConfigError, match=r"allow_unauthenticated='yes' is not allowed"):
        parse_afd_config({"role": "ffn", "allow_unauthenticated": "yes"})


def test_the_documented_secret_commands_make_a_secret_both_ways_accept(tmp_path: Path) -> None:
    """The user guide's Security block, run as written with ``tmp_path`` for a home: the file it
    writes passes as ``auth_token_file``, and what it exports as ``AFD_AUTH_TOKEN``."""
    from tests.e2e_cpu.test_documented_launch import GUIDE, documented_blocks, run_block

    script = documented_blocks(GUIDE, ("secret",))["secret"]
    done = run_block(script + '\necho "$AFD_AUTH_TOKEN"', 30, env={"HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    token = tmp_path / ".afd-token"
    assert token.stat().st_mode & 0o777 == 0o600
    exported = done.stdout.strip()
    assert re.fullmatch("[0-9a-f]{64}", exported) and token.read_text().strip() == exported
    from_file = parse_afd_config({"role": "ffn", "host": "10.0.0.1", "auth_token_file": str(token)})
    assert shared_secret(from_file, {}) == exported.encode()
    from_env = parse_afd_config({"role": "ffn", "host": "10.0.0.1"})
    assert shared_secret(from_env, {AUTH_TOKEN_ENV: exported}) == exported.encode()
