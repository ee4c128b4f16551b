"""The AFD section of ``--additional-config``: parsed and validated once, at the edge.

    vllm serve MODEL ... --additional-config '{"afd": {"role": "ffn", "port": 29650}}'

Every bad value is an :class:`AFDConfigError` naming the key, the value and what is allowed,
raised before any model or process group is built. Unknown keys are errors. Connector-specific
settings live under ``connector_extra_config`` and are checked against the chosen connector's
closed schema. What each connector allows comes from its row of the connector table
(:mod:`afd_models.connectors.specs`). Combinations are checked here too, naming both keys: the
connector against the role, ``num_attention_ranks`` against ``num_ffn_ranks`` (the rule of
:func:`afd_models.topology.check_topology`), ``port`` against ``num_ffn_ranks`` (FFN rank k
listens on ``port + k``), ``rank_offset`` against the role's rank count, and
``peer_restart_timeout_s`` against the connector.

The deployment's shared secret (:func:`shared_secret`) comes from ``AFD_AUTH_TOKEN`` or from the
file ``auth_token_file`` names, which is checked here (only its owner may read it); whether a
deployment without one may start is decided when a worker connects, from its addresses.
"""

from __future__ import annotations

import enum
import ipaddress
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from afd_models.connectors.specs import (
    AUTH_TOKEN_ENV,
    CONNECTORS,
    PLATFORM_DEFAULTS,
    SPECS,
    Gate,
    Value,
    settings,
)
from afd_models.topology import MAX_PORT, TopologyError, check_ports, check_topology

AFD_KEY = "afd"

#: the longest timeout a setting may ask for (one year): far below what ``datetime.timedelta``,
#: ``select`` and the gloo/TCPStore millisecond timeouts can hold
MAX_TIMEOUT_S = 365 * 24 * 3600.0
#: the most AIV cores a CAM kernel may ask for (an Ascend 910 die has 48)
MAX_CORE_NUM = 48

#: the fewest bytes a shared secret may have (a random 128-bit token, hex: 32)
MIN_SECRET_BYTES = 16
#: the most bytes a secret file may hold (a token, not a key store)
MAX_SECRET_BYTES = 4096

#: one label of an RFC 1123 host name: letters, digits and inner hyphens, 1 to 63 characters
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


class AFDConfigError(ValueError):
    """A bad AFD setting; the message names the key, the value and what is allowed."""


class Role(enum.Enum):
    ATTENTION = "attention"
    FFN = "ffn"


@dataclass(frozen=True)
class AFDConfig:
    """Validated AFD settings of one engine."""

    #: which half of the model this engine serves
    role: Role
    #: connector name, a key of afd_models.connectors.specs.CONNECTORS; by default the
    #: platform's (PLATFORM_DEFAULTS)
    connector: str = "GlooAFDConnector"
    #: address the connector's rendezvous listens on (FFN rank k hosts group k's): an IP
    #: literal or an RFC 1123 host name
    host: str = "127.0.0.1"
    #: one address per FFN rank, for FFN ranks on different nodes: FFN rank k hosts group k's
    #: rendezvous on ffn_hosts[k] (instead of ``host``); empty: every group on ``host``
    ffn_hosts: tuple[str, ...] = ()
    #: rendezvous port of FFN rank 0; FFN rank k's TP rank t uses port + k * TP + t, so
    #: port + num_ffn_ranks * TP - 1 <= 65535 (afd_models.topology.group_port)
    port: int = 29650
    #: Attention DP ranks in the deployment (the DP sizes of the Attention engines summed; TP
    #: ranks are lanes); any number >= num_ffn_ranks, Attention rank a being served by FFN rank
    #: a * num_ffn_ranks // num_attention_ranks
    num_attention_ranks: int = 1
    #: FFN ranks in the deployment (one FFN engine each)
    num_ffn_ranks: int = 1
    #: role rank of this engine's first DP rank: an engine's DP ranks take the role ranks
    #: rank_offset ... rank_offset + DP - 1, so several engines of one role each name their own
    rank_offset: int = 0
    #: run the MoE gate on Attention and send router logits with the hidden states
    compute_gate_on_attention: bool = False
    #: Attention role: split large enough steps into two micro-batches whose exchanges overlap
    #: the other's compute (vLLM's DBO, thresholds from its ``--dbo-*-token-threshold`` flags);
    #: the FFN role follows each step's header and takes no setting
    dbo: bool = False
    #: seconds a worker waits for a restarted peer role when its peer goes away: the Attention
    #: role holds the step in flight and runs it again once a new FFN engine passed the
    #: handshake; the FFN role waits for a new Attention engine. 0 (the default): the worker fails
    #: at once, as it always did
    peer_restart_timeout_s: float = 0.0
    #: a file holding the deployment's shared secret (only its owner may read it), instead of
    #: ``AFD_AUTH_TOKEN`` in the environment; None: the environment's, if any
    auth_token_file: str | None = None
    #: start without a shared secret even where a peer could connect from another host (the
    #: worker refuses that by default); a deployment with a secret leaves it false
    allow_unauthenticated: bool = False
    #: the connector's own settings, already validated (an instance of its spec's extra_config)
    connector_extra_config: Any = field(default=None)

    @property
    def is_attention(self) -> bool:
        return self.role is Role.ATTENTION

    @property
    def is_ffn(self) -> bool:
        return self.role is Role.FFN

    @property
    def role_ranks_key(self) -> str:
        """The key counting this role's ranks (what ``rank_offset`` is checked against)."""
        return "num_attention_ranks" if self.is_attention else "num_ffn_ranks"

    @property
    def num_role_ranks(self) -> int:
        return self.num_attention_ranks if self.is_attention else self.num_ffn_ranks

    def group_host(self, ffn_rank: int) -> str:
        """The address FFN rank ``ffn_rank`` hosts its group's rendezvous on."""
        return self.ffn_hosts[ffn_rank] if self.ffn_hosts else self.host


def _where(key: str) -> str:
    return f"additional_config.{AFD_KEY}.{key}"


def read_secret_file(key: str, value: object) -> bytes:
    """The secret in the file ``value`` (setting ``key``), its surrounding whitespace stripped,
    after checking that it is a regular file only its owner can read or write.

    Raises:
        AFDConfigError: naming the setting, the file and what is wrong.
    """
    if not isinstance(value, str) or not value:
        raise AFDConfigError(f"{_where(key)}={value!r} is not allowed; allowed: a file path")
    try:
        status = os.stat(value)
    except OSError as exc:
        raise AFDConfigError(
            f"{_where(key)}={value!r} cannot be read ({exc.strerror}); allowed: an existing file "
            "only its owner can read"
        ) from None
    if not stat.S_ISREG(status.st_mode):
        raise AFDConfigError(
            f"{_where(key)}={value!r} is not a regular file; allowed: a file holding the secret"
        )
    if status.st_mode & 0o077:
        raise AFDConfigError(
            f"{_where(key)}={value!r} has mode {stat.S_IMODE(status.st_mode):04o}: others than its "
            "owner may use it; allowed: a file only its owner can read (chmod 600 or 400; "
            "a Kubernetes Secret volume with defaultMode 0400)"
        )
    if status.st_size > MAX_SECRET_BYTES:
        raise AFDConfigError(
            f"{_where(key)}={value!r} holds {status.st_size} bytes; allowed: a secret of "
            f"{MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes"
        )
    try:
        with open(value, "rb") as file:
            secret = file.read().strip()
    except OSError as exc:
        raise AFDConfigError(
            f"{_where(key)}={value!r} cannot be read ({exc.strerror}); allowed: a file its owner "
            "(this engine's user) can read"
        ) from None
    return _long_enough(f"{_where(key)}={value!r}", secret)


def _long_enough(source: str, secret: bytes) -> bytes:
    """``secret``, once it is at least MIN_SECRET_BYTES long (``source`` names where it came
    from in the error)."""
    if len(secret) < MIN_SECRET_BYTES:
        raise AFDConfigError(
            f"{source} holds a secret of {len(secret)} bytes; allowed: at least "
            f"{MIN_SECRET_BYTES} (for example the output of: openssl rand -hex 32)"
        )
    return secret


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP literal or a host name) names this machine's loopback: only
    peers on this machine can reach it. Names other than ``localhost`` are not resolved, so they
    count as reachable from elsewhere."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def shared_secret(config: AFDConfig, environ: Mapping[str, str]) -> bytes | None:
    """The deployment's shared secret, from ``auth_token_file`` or ``AFD_AUTH_TOKEN`` in
    ``environ``, or None where the deployment may run without one: every group's rendezvous on a
    loopback address, or ``allow_unauthenticated``.

    Raises:
        AFDConfigError: both sources set, a secret too short, or no secret where one is required,
            naming the ways to set one and the key that allows a deployment without.
    """
    token = environ.get(AUTH_TOKEN_ENV)
    secret: bytes | None = None
    if config.auth_token_file is not None:
        if token is not None:
            raise AFDConfigError(
                f"{_where('auth_token_file')}={config.auth_token_file!r} with {AUTH_TOKEN_ENV} "
                "set in the environment is not allowed: both give the shared secret; allowed: "
                "one of them"
            )
        secret = read_secret_file("auth_token_file", config.auth_token_file)
    elif token is not None:
        secret = _long_enough(AUTH_TOKEN_ENV, token.strip().encode())
    if secret is not None:
        if config.allow_unauthenticated:
            raise AFDConfigError(
                f"{_where('allow_unauthenticated')}=true with a shared secret set is not "
                "allowed: the peers authenticate with it; allowed: false, or no secret"
            )
        return secret
    exposed = [host for host in config.ffn_hosts or (config.host,) if not is_loopback(host)]
    if exposed and not config.allow_unauthenticated:
        key = "ffn_hosts" if config.ffn_hosts else "host"
        raise AFDConfigError(
            f"{_where(key)} puts a rendezvous on {', '.join(exposed)}, which other machines can "
            f"reach, and no shared secret is set: anyone who reaches it could join as a peer. "
            f"Allowed: the same secret on every engine, in {AUTH_TOKEN_ENV} or in the file "
            f"{_where('auth_token_file')} names; or {_where('allow_unauthenticated')}=true to "
            "run without one on a network you trust"
        )
    return None


def _choice(key: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise AFDConfigError(
            f"{_where(key)}={value!r} is not allowed; allowed: {', '.join(allowed)}"
        )
    return value


def _integer(key: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise AFDConfigError(
            f"{_where(key)}={value!r} is not allowed; allowed: an integer in {low}..{high}"
        )
    return value


def _boolean(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise AFDConfigError(f"{_where(key)}={value!r} is not allowed; allowed: true or false")
    return value


def _is_host_name(value: str) -> bool:
    """An RFC 1123 host name (at most 253 characters of dot-separated labels), not all-numeric
    at the end, so a malformed IPv4 address such as ``256.1.1.1`` is not taken for a name."""
    labels = value.split(".")
    return (
        len(value) <= 253
        and all(_HOST_LABEL.fullmatch(label) for label in labels)
        and not labels[-1].isdigit()
    )


def _host(key: str, value: object) -> str:
    if isinstance(value, str):
        try:
            ipaddress.ip_address(value)
            return value
        except ValueError:
            if _is_host_name(value):
                return value
    raise AFDConfigError(
        f"{_where(key)}={value!r} is not allowed; allowed: an IPv4 or IPv6 address "
        "(127.0.0.1, ::1) or an RFC 1123 host name (localhost, ffn-0.cluster.local)"
    )


def _hosts(key: str, value: object, count: int) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or len(value) != count:
        raise AFDConfigError(
            f"{_where(key)}={value!r} with {_where('num_ffn_ranks')}={count} is not allowed; "
            f"allowed: a list of {count} address(es), FFN rank k's at index k"
        )
    return tuple(_host(f"{key}[{k}]", host) for k, host in enumerate(value))


def _seconds(key: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        # a range test, not math.isfinite: it refuses NaN and infinities, and an integer too
        # large for a float cannot overflow it
        or not 0 < value <= MAX_TIMEOUT_S
    ):
        raise AFDConfigError(
            f"{_where(key)}={value!r} is not allowed; allowed: a finite number of seconds > 0 "
            f"and <= {MAX_TIMEOUT_S:.0f} (one year)"
        )
    return float(value)


def _seconds_or_off(key: str, value: object) -> float:
    if value == 0 and not isinstance(value, bool):
        return 0.0
    try:
        return _seconds(key, value)
    except AFDConfigError:
        raise AFDConfigError(
            f"{_where(key)}={value!r} is not allowed; allowed: 0 (off) or a finite number of "
            f"seconds > 0 and <= {MAX_TIMEOUT_S:.0f} (one year)"
        ) from None


def _core_num(key: str, value: object) -> int:
    return _integer(key, value, 1, MAX_CORE_NUM)


def _expert_count(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AFDConfigError(
            f"{_where(key)}={value!r} is not allowed; allowed: an integer >= 0 (0: spread over "
            "all experts)"
        )
    return value


#: how each kind of connector_extra_config setting is checked
_VALUE_CHECKS: dict[Value, Callable[[str, object], object]] = {
    Value.SECONDS: _seconds,
    Value.BOOLEAN: _boolean,
    Value.CORE_NUM: _core_num,
    Value.EXPERT_COUNT: _expert_count,
}


def _extra(connector: str, value: object) -> Any:
    schema = CONNECTORS[connector].extra_config
    fields = settings(schema)
    if not isinstance(value, Mapping):
        raise AFDConfigError(
            f"{_where('connector_extra_config')}={value!r} is not allowed; allowed: a JSON object"
        )
    unknown = sorted(set(value) - set(fields))
    if unknown:
        allowed = ", ".join(sorted(fields)) or "no keys"
        raise AFDConfigError(
            f"{_where('connector_extra_config')} has unknown key(s) {unknown} for {connector}; allowed: {allowed}"
        )
    return schema(
        **{k: _VALUE_CHECKS[fields[k]](f"connector_extra_config.{k}", v) for k, v in value.items()}
    )


_FIELDS = (
    "role",
    "connector",
    "host",
    "ffn_hosts",
    "port",
    "num_attention_ranks",
    "num_ffn_ranks",
    "rank_offset",
    "compute_gate_on_attention",
    "dbo",
    "peer_restart_timeout_s",
    "auth_token_file",
    "allow_unauthenticated",
    "connector_extra_config",
)


def current_device_type() -> str:
    """The device type of vLLM's platform in this process (``cpu``, ``cuda``, ...)."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def _default_connector(platform: str | None) -> str:
    device_type = current_device_type() if platform is None else platform
    if device_type not in PLATFORM_DEFAULTS:
        raise AFDConfigError(
            f"{_where('connector')} is required on platform {device_type!r}, which has no default "
            f"connector; allowed: {', '.join(CONNECTORS)} (the defaults: "
            + ", ".join(f"{c} on {p}" for p, c in PLATFORM_DEFAULTS.items())
            + ")"
        )
    return PLATFORM_DEFAULTS[device_type]


def check_connector_platform(config: AFDConfig, device_type: str) -> None:
    """Refuse a connector that cannot move this platform's tensors (gloo on CUDA, NCCL on CPU).

    Raises:
        AFDConfigError: naming the connector, the platform and the connectors it allows.
    """
    platforms = CONNECTORS[config.connector].platforms
    if device_type not in platforms:
        allowed = [spec.name for spec in SPECS if device_type in spec.platforms]
        raise AFDConfigError(
            f"{_where('connector')}={config.connector!r} moves {' and '.join(platforms)} tensors "
            f"only, and this engine runs on vLLM's {device_type!r} platform; allowed there: "
            f"{', '.join(allowed) or 'none'}"
            + (
                f" (leave {_where('connector')} out for {PLATFORM_DEFAULTS[device_type]})"
                if device_type in PLATFORM_DEFAULTS
                else ""
            )
        )


def parse_afd_config(section: object, *, platform: str | None = None) -> AFDConfig:
    """Validate the ``afd`` object of ``--additional-config``.

    A section that names no connector gets its platform's
    (:data:`~afd_models.connectors.specs.PLATFORM_DEFAULTS`):
    ``platform`` if given, else vLLM's platform in this process.

    Raises:
        AFDConfigError: on the first bad key or value.
    """
    if not isinstance(section, Mapping):
        raise AFDConfigError(
            f"additional_config.{AFD_KEY}={section!r} is not allowed; allowed: a JSON object"
        )
    unknown = sorted(set(section) - set(_FIELDS))
    if unknown:
        raise AFDConfigError(
            f"additional_config.{AFD_KEY} has unknown key(s) {unknown}; allowed: {', '.join(_FIELDS)} "
            "(connector settings go under connector_extra_config)"
        )
    if "role" not in section:
        raise AFDConfigError(f"{_where('role')} is required; allowed: attention, ffn")
    role = Role(_choice("role", section["role"], tuple(r.value for r in Role)))
    connector = (
        _choice("connector", section["connector"], tuple(CONNECTORS))
        if "connector" in section
        else _default_connector(platform)
    )
    spec = CONNECTORS[connector]
    if role is Role.FFN and spec.attention_only:
        allowed = ", ".join(other.name for other in SPECS if not other.attention_only)
        raise AFDConfigError(
            f"{_where('connector')}={connector!r} with {_where('role')}='ffn' is not allowed: this "
            f"connector runs the FFN half inside the Attention engine, so no FFN engine is started "
            f"with it; allowed for role ffn: {allowed}"
        )
    config = AFDConfig(
        role=role,
        connector=connector,
        host=_host("host", section.get("host", AFDConfig.host)),
        port=_integer("port", section.get("port", AFDConfig.port), 1, MAX_PORT),
        num_attention_ranks=_integer(
            "num_attention_ranks", section.get("num_attention_ranks", 1), 1, 4096
        ),
        num_ffn_ranks=_integer("num_ffn_ranks", section.get("num_ffn_ranks", 1), 1, 4096),
        rank_offset=_integer("rank_offset", section.get("rank_offset", 0), 0, 4095),
        compute_gate_on_attention=_boolean(
            "compute_gate_on_attention", section.get("compute_gate_on_attention", False)
        ),
        dbo=_boolean("dbo", section.get("dbo", False)),
        peer_restart_timeout_s=_seconds_or_off(
            "peer_restart_timeout_s", section.get("peer_restart_timeout_s", 0)
        ),
        allow_unauthenticated=_boolean(
            "allow_unauthenticated", section.get("allow_unauthenticated", False)
        ),
        connector_extra_config=_extra(connector, section.get("connector_extra_config", {})),
    )
    if "auth_token_file" in section:
        read_secret_file("auth_token_file", section["auth_token_file"])
        config = replace(config, auth_token_file=section["auth_token_file"])
    if "ffn_hosts" in section:
        if "host" in section:
            raise AFDConfigError(
                f"{_where('host')}={section['host']!r} with "
                f"{_where('ffn_hosts')}={section['ffn_hosts']!r} is not allowed: both say where the "
                "rendezvous listens; allowed: one of them (ffn_hosts for FFN ranks on several nodes)"
            )
        config = replace(
            config, ffn_hosts=_hosts("ffn_hosts", section["ffn_hosts"], config.num_ffn_ranks)
        )
    if config.dbo and role is Role.FFN:
        raise AFDConfigError(
            f"{_where('dbo')}=true with {_where('role')}='ffn' is not allowed: the Attention role "
            "decides which steps to split, and the FFN role follows each step's header; allowed for "
            "role ffn: leave dbo out (or false)"
        )
    if config.dbo and not spec.dbo:
        raise AFDConfigError(
            f"{_where('dbo')}=true with {_where('connector')}={connector!r} is not allowed: the "
            "micro-batches overlap their exchanges with an FFN engine of its own, on CUDA; "
            f"allowed connectors: {', '.join(sorted(s.name for s in SPECS if s.dbo))}"
        )
    if config.peer_restart_timeout_s and not spec.peer_restart:
        raise AFDConfigError(
            f"{_where('peer_restart_timeout_s')}={config.peer_restart_timeout_s:g} with "
            f"{_where('connector')}={connector!r} is not allowed: only a connector whose waits end "
            "when the peer goes away can wait for a restarted one; allowed: 0 with this "
            f"connector, or the connector {', '.join(sorted(s.name for s in SPECS if s.peer_restart))}"
        )
    if config.is_attention and getattr(config.connector_extra_config, "force_load_balance", False):
        raise AFDConfigError(
            f"{_where('connector_extra_config.force_load_balance')}=true is not allowed with "
            f"{_where('role')}='attention': the experts, and so their load, are the FFN role's; "
            "allowed: false (set it on the FFN engine)"
        )
    gate = config.compute_gate_on_attention
    if (spec.gate is Gate.ATTENTION and not gate) or (spec.gate is Gate.FFN and gate):
        raise AFDConfigError(
            f"{_where('compute_gate_on_attention')}={'true' if gate else 'false'} with "
            f"{_where('connector')}={connector!r} is not allowed: {spec.gate.value}; allowed: "
            + ("true" if spec.gate is Gate.ATTENTION else "false")
        )
    a, f, port = config.num_attention_ranks, config.num_ffn_ranks, config.port
    try:
        check_topology(a, f)
    except TopologyError as exc:
        raise AFDConfigError(
            f"{_where('num_attention_ranks')}={a} with {_where('num_ffn_ranks')}={f} is not allowed; "
            "allowed: num_attention_ranks >= num_ffn_ranks, divisible or not (e.g. 2A1F, 3A2F, 4A2F)"
        ) from exc
    try:
        check_ports(port, f)
    except TopologyError as exc:
        raise AFDConfigError(
            f"{_where('port')}={port} with {_where('num_ffn_ranks')}={f} is not allowed: FFN rank k "
            f"hosts its group on port + k, up to {port + f - 1}; allowed: port <= {MAX_PORT + 1 - f}"
        ) from exc
    ranks = config.num_role_ranks
    if config.rank_offset >= ranks:
        raise AFDConfigError(
            f"{_where('rank_offset')}={config.rank_offset} with {_where(config.role_ranks_key)}={ranks} is not "
            f"allowed for role {role.value}: the engine's first worker would have no role rank; "
            f"allowed: rank_offset <= {ranks - 1}"
        )
    return config


def afd_config_from(additional_config: object) -> AFDConfig | None:
    """The AFD config inside a ``VllmConfig.additional_config``, or None when AFD is off."""
    if not isinstance(additional_config, Mapping) or AFD_KEY not in additional_config:
        return None
    return parse_afd_config(additional_config[AFD_KEY])


def require_afd_config(additional_config: object, *, role: Role | None = None) -> AFDConfig:
    """Like :func:`afd_config_from`, but AFD must be on (and, if given, in ``role``)."""
    config = afd_config_from(additional_config)
    if config is None:
        raise AFDConfigError(
            f'this AFD component needs --additional-config \'{{"{AFD_KEY}": {{"role": "attention"|"ffn", ...}}}}\''
        )
    if role is not None and config.role is not role:
        raise AFDConfigError(
            f"{_where('role')}={config.role.value!r} is not allowed here; allowed: {role.value!r}"
        )
    return config
