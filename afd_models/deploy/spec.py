"""One AFD deployment in a TOML file: the model, the Attention engines and FFN ranks, where each
runs, and the AFD settings they share.

The spec is checked whole before anything starts: each error names the key, the value and what
is allowed, and every engine's AFD section goes through the workers' own parser
(:func:`afd_models.config.parse_afd_config`) and topology rule, so a spec the runtime would
refuse is refused here. A spec (docs/deployment.md says more)::

    model = "/models/DeepSeek-V2-Lite-Chat"
    dtype = "bfloat16"
    platform = "cpu"
    tensor_parallel_size = 1

    [afd]                       # additional_config.afd keys every engine shares
    port = 29650
    compute_gate_on_attention = false

    [attention]
    engines = [2, 1]            # the DP size of each Attention engine: 3 Attention ranks
    api_port = 8000             # engine i serves on api_port + i
    cpus = ["0-3|4-7", "8-11"]  # per engine; "|" between its workers (CPU platform)
    args = ["--kv-cache-memory-bytes", "4G"]
    env = {VLLM_CPU_KVCACHE_SPACE = "4"}

    [ffn]
    ranks = 2                   # one FFN engine per FFN rank
    api_port = 8100
    cpus = ["12-13", "14-15"]
    args = []
"""

from __future__ import annotations

import enum
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from afd_models.config import AFD_KEY, AFDConfig, AFDConfigError, Role, parse_afd_config
from afd_models.topology import MAX_PORT, TopologyError, check_attention_engine, check_ports

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the CPU envs run 3.11
    import tomli as tomllib


class SpecError(ValueError):
    """A bad deployment spec; the message names the key, the value and what is allowed."""


class Platform(enum.Enum):
    """Which AFD workers the engines run (the value is vLLM's platform, a column of the
    worker-class table :data:`afd_models.launch.WORKER_CLASSES`), and how an engine is bound to
    its hardware."""

    CPU = "cpu"
    CUDA = "cuda"


#: the environment variable binding an engine's workers, by platform
BINDING_ENV = {Platform.CPU: "VLLM_CPU_OMP_THREADS_BIND", Platform.CUDA: "CUDA_VISIBLE_DEVICES"}
#: the binding key of each platform's role tables
BINDING_KEY = {Platform.CPU: "cpus", Platform.CUDA: "devices"}
#: AFD keys the spec sets per engine itself
DERIVED_AFD_KEYS = ("role", "rank_offset", "num_attention_ranks", "num_ffn_ranks")
TOP_KEYS = ("model", "dtype", "platform", "tensor_parallel_size", "served_model_name")
TABLES = ("afd", "attention", "ffn", "kubernetes")
KUBERNETES_KEYS = (
    "name",
    "image",
    "model_claim",
    "model_mount",
    "secret",
    "attention_resources",
    "ffn_resources",
    "nodes_per_engine",
)
ROLE_KEYS = {
    Role.ATTENTION: ("engines", "api_port", "host", "args", "env", *BINDING_KEY.values()),
    Role.FFN: ("ranks", "api_port", "host", "args", "env", *BINDING_KEY.values()),
}
#: variables ``deploy`` sets per engine itself (each engine its own Prometheus directory)
DERIVED_ENV = ("PROMETHEUS_MULTIPROC_DIR",)
DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Engine:
    """One ``vllm serve`` of the deployment."""

    #: ``attention<i>`` or ``ffn<k>``: its logs and its Kubernetes objects are named after it
    name: str
    role: Role
    #: role rank of its first DP rank
    rank_offset: int
    #: its DP ranks (always 1 for an FFN engine)
    dp: int
    #: where its API server listens
    host: str
    api_port: int
    #: its workers' CPUs or devices (the platform's binding variable), None: vLLM's choice
    binding: str | None
    #: its flags after the ones the spec derives
    args: tuple[str, ...]
    #: variables its role's table adds to its environment
    env: Mapping[str, str]
    #: its ``additional_config.afd`` section, as the workers parse it
    afd: Mapping[str, Any]
    #: that section parsed, as its workers will see it
    config: AFDConfig


@dataclass(frozen=True)
class Cluster:
    """The spec's ``[kubernetes]`` table: what ``deploy k8s`` renders besides the engines."""

    #: prefix of every object's name, and its instance label
    name: str
    #: the container image (vLLM and this package installed)
    image: str
    #: the PersistentVolumeClaim holding the model, and where pods mount it (read-only)
    model_claim: str
    model_mount: str
    #: the Secret whose ``token`` key is the deployment's shared secret; None: no secret
    secret: str | None
    #: resource requests of each role's pods (``cpu``, ``memory``, ``nvidia.com/gpu``, ...)
    resources: Mapping[Role, Mapping[str, str]]


@dataclass(frozen=True)
class Deployment:
    """A validated spec: every engine, FFN engines first (the order they start in)."""

    model: str
    dtype: str
    platform: Platform
    tensor_parallel_size: int
    served_model_name: str | None
    engines: tuple[Engine, ...]
    #: the ``[kubernetes]`` table, None without one
    cluster: Cluster | None = None

    @property
    def ffn_engines(self) -> tuple[Engine, ...]:
        return tuple(e for e in self.engines if e.role is Role.FFN)

    @property
    def attention_engines(self) -> tuple[Engine, ...]:
        return tuple(e for e in self.engines if e.role is Role.ATTENTION)


def load_spec(path: Path) -> Deployment:
    """The deployment ``path`` describes.

    Raises:
        SpecError: the file cannot be read or parsed, or a key or value is not allowed.
    """
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SpecError(f"{path}: cannot be read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not TOML ({exc})") from None
    try:
        return parse_spec(data)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None


def parse_spec(data: Mapping[str, Any]) -> Deployment:
    """Validate a spec's contents (a TOML document's tables)."""
    _known(data, "", (*TOP_KEYS, *TABLES))
    for required in ("model", "attention", "ffn"):
        if required not in data:
            raise SpecError(f"{required} is required")
    model = _text(data, "model")
    dtype = _choice(data, "dtype", DTYPES, default="auto")
    platform = Platform(_choice(data, "platform", tuple(p.value for p in Platform), "cpu"))
    tp = _count(data, "tensor_parallel_size", default=1)
    served = _text(data, "served_model_name") if "served_model_name" in data else None
    shared = _table(data, "afd")
    derived = sorted(set(shared) & set(DERIVED_AFD_KEYS))
    if derived:
        raise SpecError(
            f"afd.{derived[0]}={shared[derived[0]]!r} is not allowed: the spec sets "
            f"{', '.join(DERIVED_AFD_KEYS)} per engine (from attention.engines and ffn.ranks)"
        )
    attention, ffn = _table(data, "attention"), _table(data, "ffn")
    _known(attention, "attention.", ROLE_KEYS[Role.ATTENTION])
    _known(ffn, "ffn.", ROLE_KEYS[Role.FFN])
    engines_dp = _counts(attention, "attention.engines")
    num_ffn = _count(ffn, "ranks", where="ffn.", default=1)
    shared = {**shared, "num_attention_ranks": sum(engines_dp), "num_ffn_ranks": num_ffn}
    ffn_engines = _role_engines(Role.FFN, ffn, [1] * num_ffn, shared, platform)
    attention_engines = _role_engines(Role.ATTENTION, attention, engines_dp, shared, platform)
    engines = (*ffn_engines, *attention_engines)
    rendezvous = ffn_engines[0].config.port
    try:
        check_ports(rendezvous, num_ffn, tp)
    except TopologyError as exc:
        raise SpecError(f"afd.{exc} (tensor_parallel_size={tp})") from None
    _distinct_ports(engines, range(rendezvous, rendezvous + num_ffn * tp))
    cluster = _cluster(_table(data, "kubernetes")) if "kubernetes" in data else None
    return Deployment(model, dtype, platform, tp, served, engines, cluster)


def _cluster(table: Mapping[str, Any]) -> Cluster:
    _known(table, "kubernetes.", KUBERNETES_KEYS)
    for required in ("name", "image", "model_claim"):
        if required not in table:
            raise SpecError(f"kubernetes.{required} is required with a [kubernetes] table")
    name = _text(table, "name", where="kubernetes.")
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,30}[a-z0-9])?", name):
        raise SpecError(
            f"kubernetes.name={name!r} is not allowed; allowed: a DNS label of at most 32 "
            "characters (lower-case letters, digits, '-'), so that every object's name fits"
        )
    nodes = table.get("nodes_per_engine", 1)
    if type(nodes) is not int or nodes != 1:  # not True, not 1.0
        raise SpecError(
            f"kubernetes.nodes_per_engine={nodes!r} is not allowed: an engine spanning nodes "
            "(vLLM's multi-node tensor or pipeline parallel) needs a LeaderWorkerSet, which "
            "deploy k8s does not render; allowed: 1 (each engine one pod; more engines or FFN "
            "ranks spread a deployment over nodes)"
        )
    resources = {}
    for role in Role:
        key = f"{role.value}_resources"
        value = table.get(key, {})
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise SpecError(
                f"kubernetes.{key}={value!r} is not allowed; allowed: a table of quantities as "
                'strings, e.g. {cpu = "8", memory = "64Gi"}'
            )
        resources[role] = dict(value)
    return Cluster(
        name,
        _text(table, "image", where="kubernetes."),
        _text(table, "model_claim", where="kubernetes."),
        _text(table, "model_mount", where="kubernetes.") if "model_mount" in table else "/models",
        _text(table, "secret", where="kubernetes.") if "secret" in table else None,
        resources,
    )


def _role_engines(
    role: Role,
    table: Mapping[str, Any],
    dp_sizes: Sequence[int],
    shared: Mapping[str, Any],
    platform: Platform,
) -> list[Engine]:
    where = f"{role.value}."
    for other, key in BINDING_KEY.items():
        if other is not platform and key in table:
            raise SpecError(
                f"{where}{key} is not allowed with platform={platform.value!r}; allowed: "
                f"{where}{BINDING_KEY[platform]}"
            )
    bindings = _bindings(table, where + BINDING_KEY[platform], len(dp_sizes))
    api_port = _port(table, where + "api_port", default=8000 if role is Role.ATTENTION else 8100)
    host = _text(table, "host", where=where) if "host" in table else "127.0.0.1"
    args = _args(table, where + "args")
    env = _env(table, where + "env")
    engines, offset = [], 0
    for index, dp in enumerate(dp_sizes):
        afd = {**shared, "role": role.value, "rank_offset": offset}
        try:
            config = parse_afd_config(afd, platform=platform.value)
            if role is Role.ATTENTION:
                check_attention_engine(offset, dp, config.num_attention_ranks, config.num_ffn_ranks)
        except (AFDConfigError, TopologyError) as exc:
            # the workers' own message, its keys as the spec writes them
            message = str(exc).replace(f"additional_config.{AFD_KEY}.", "afd.")
            engine = (
                f"attention.engines={list(dp_sizes)}"
                if role is Role.ATTENTION
                else (f"ffn.ranks={len(dp_sizes)}")
            )
            raise SpecError(f"{engine}, {role.value} engine {index}: {message}") from None
        port = api_port + index
        if port > MAX_PORT:
            raise SpecError(
                f"{where}api_port={api_port} is not allowed with {len(dp_sizes)} engines: engine "
                f"{index} would listen on {port}; allowed: api_port + {len(dp_sizes) - 1} <= "
                f"{MAX_PORT}"
            )
        engines.append(
            Engine(
                f"{role.value}{index}",
                role,
                offset,
                dp,
                host,
                port,
                bindings[index],
                args,
                env,
                afd,
                config,
            )
        )
        offset += dp
    return engines


def _distinct_ports(engines: Sequence[Engine], rendezvous: range) -> None:
    """Every engine's API port its own, and none among the FFN ranks' rendezvous ports (one per
    FFN rank and TP lane from ``afd.port``: on one machine, or in an FFN pod, they would clash)."""
    seen = {
        port: f"the FFN ranks' rendezvous (afd.port={rendezvous.start}, {len(rendezvous)} ports)"
        for port in rendezvous
    }
    for engine in engines:
        if engine.api_port in seen:
            raise SpecError(
                f"{engine.name} and {seen[engine.api_port]} would both use port "
                f"{engine.api_port}; allowed: attention.api_port, ffn.api_port and afd.port far "
                "enough apart that each engine and each rendezvous has a port of its own"
            )
        seen[engine.api_port] = engine.name


# --- values -----------------------------------------------------------------------------------


def _known(table: Mapping[str, Any], where: str, allowed: Sequence[str]) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise SpecError(
            f"{where}{unknown[0]} is not a spec key; allowed{' in ' + where[:-1] if where else ''}: "
            f"{', '.join(allowed)}"
        )


def _table(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise SpecError(f"{key}={value!r} is not allowed; allowed: a table ([{key}])")
    return value


def _text(table: Mapping[str, Any], key: str, where: str = "") -> str:
    value = table[key]
    if not isinstance(value, str) or not value:
        raise SpecError(f"{where}{key}={value!r} is not allowed; allowed: a non-empty string")
    return value


def _choice(table: Mapping[str, Any], key: str, allowed: Sequence[str], default: str) -> str:
    value = table.get(key, default)
    if value not in allowed:
        raise SpecError(f"{key}={value!r} is not allowed; allowed: {', '.join(allowed)}")
    return str(value)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _count(table: Mapping[str, Any], key: str, *, where: str = "", default: int) -> int:
    value = table.get(key, default)
    if not _is_count(value):
        raise SpecError(f"{where}{key}={value!r} is not allowed; allowed: an integer >= 1")
    return int(value)


def _counts(table: Mapping[str, Any], where: str) -> list[int]:
    value = table.get("engines", [1])
    if not isinstance(value, list) or not value or not all(_is_count(v) for v in value):
        raise SpecError(
            f"{where}={value!r} is not allowed; allowed: a non-empty list of DP sizes, integers "
            ">= 1 (one per Attention engine)"
        )
    return [int(v) for v in value]


def _port(table: Mapping[str, Any], where: str, default: int) -> int:
    value = table.get(where.rsplit(".", 1)[1], default)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_PORT:
        raise SpecError(f"{where}={value!r} is not allowed; allowed: a port, 1..{MAX_PORT}")
    return value


def _args(table: Mapping[str, Any], where: str) -> tuple[str, ...]:
    value = table.get("args", [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{where}={value!r} is not allowed; allowed: a list of strings")
    return tuple(value)


def _env(table: Mapping[str, Any], where: str) -> Mapping[str, str]:
    value = table.get("env", {})
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
    ):
        raise SpecError(
            f"{where}={value!r} is not allowed; allowed: a table of variables and their values "
            'as strings, e.g. {VLLM_CPU_KVCACHE_SPACE = "4"}'
        )
    derived = sorted(set(value) & set(DERIVED_ENV))
    if derived:
        raise SpecError(
            f"{where}.{derived[0]}={value[derived[0]]!r} is not allowed: deploy gives each engine "
            "a directory of its own (engines sharing one mix their series); allowed: any other "
            "variable"
        )
    return dict(value)


def _bindings(table: Mapping[str, Any], where: str, engines: int) -> list[str | None]:
    key = where.rsplit(".", 1)[1]
    if key not in table:
        return [None] * engines
    value = table[key]
    if (
        not isinstance(value, list)
        or len(value) != engines
        or not all(isinstance(v, str) and v for v in value)
    ):
        raise SpecError(
            f"{where}={value!r} is not allowed; allowed: one non-empty string per engine "
            f"({engines})"
        )
    return list(value)


__all__ = ["Cluster", "Deployment", "Engine", "Platform", "SpecError", "load_spec", "parse_spec"]
