"""The connector table: one frozen :class:`ConnectorSpec` per connector, read by config parsing
(:mod:`afd_models.config`), the worker checks (:mod:`afd_models.worker_config`) and the connect
steps (:mod:`afd_models.wiring.connect`). Adding a connector is one row of :data:`SPECS` (and, for
settings of a new shape, its ``connector_extra_config`` dataclass).

Import-light: no torch, no vLLM. A row names its builders as ``"module:function"`` strings, which
the connect steps import when a worker connects (the way vLLM registers models), so parsing a
config never imports a data plane.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from types import MappingProxyType
from typing import Any, TypeVar

_T = TypeVar("_T")

#: the environment variable that may hold the deployment's shared secret, which the step channels
#: of the point-to-point connectors authenticate with (the other source is the AFD section's
#: ``auth_token_file``, :func:`afd_models.config.shared_secret`)
AUTH_TOKEN_ENV = "AFD_AUTH_TOKEN"


class Value(enum.Enum):
    """How a ``connector_extra_config`` setting is checked (:mod:`afd_models.config` holds one
    check per kind)."""

    #: a finite number of seconds > 0, at most one year
    SECONDS = "seconds"
    #: true or false
    BOOLEAN = "boolean"
    #: the AIV cores of one kernel launch, 1 to MAX_CORE_NUM
    CORE_NUM = "core_num"
    #: a number of experts >= 0 (0: every expert)
    EXPERT_COUNT = "expert_count"


def _setting(default: _T, value: Value) -> _T:
    """A ``connector_extra_config`` field with its default and how its value is checked."""
    made: _T = field(default=default, metadata={"value": value})
    return made


def settings(schema: type) -> dict[str, Value]:
    """The settings of a ``connector_extra_config`` dataclass, each with how it is checked."""
    found: tuple[Field[Any], ...] = fields(schema)
    return {f.name: f.metadata["value"] for f in found}


@dataclass(frozen=True)
class P2PExtraConfig:
    """``connector_extra_config`` of the point-to-point connectors (gloo and NCCL)."""

    #: seconds to wait for the peer engine at start-up (either side may start first)
    connect_timeout_s: float = _setting(300.0, Value.SECONDS)
    #: seconds any single send/receive may wait; a dead peer surfaces within this
    timeout_s: float = _setting(60.0, Value.SECONDS)
    #: seconds the FFN role waits for the next step before it gives up and exits (one week)
    idle_timeout_s: float = _setting(7 * 24 * 3600.0, Value.SECONDS)


@dataclass(frozen=True)
class GlooExtraConfig(P2PExtraConfig):
    """``connector_extra_config`` of the gloo connector: the point-to-point timeouts, and whether a
    group whose peers all share the FFN worker's host moves its layers through shared memory."""

    #: true: shared memory when every peer of the group can map it (same host, same ``/dev/shm``,
    #: same user), gloo over TCP otherwise; false: gloo over TCP always
    shared_memory: bool = _setting(True, Value.BOOLEAN)


@dataclass(frozen=True)
class LoopbackExtraConfig:
    """``connector_extra_config`` of the in-process loopback connector (no settings)."""


@dataclass(frozen=True)
class CAMP2PExtraConfig(P2PExtraConfig):
    """``connector_extra_config`` of the CAMP2P connector (Ascend NPU): the point-to-point
    timeouts, the vector cores its A2E/E2A kernels run on, and the FFN role's force load balance
    (read by :mod:`afd_models.force_load_balance`)."""

    #: AIV (vector) cores each A2E/E2A kernel launch uses
    core_num: int = _setting(8, Value.CORE_NUM)
    #: FFN role: replace the router's choice by an evenly spread expert cycle (profiling only)
    force_load_balance: bool = _setting(False, Value.BOOLEAN)
    #: 0: the cycle spans every expert; N > 0: each EP rank's first N local experts
    force_load_balance_topn_per_rank: int = _setting(0, Value.EXPERT_COUNT)


@dataclass(frozen=True)
class CAMAsyncExtraConfig:
    """``connector_extra_config`` of the CAM async connector (Ascend NPU, gate on Attention)."""

    #: seconds to wait for every rank of the CAM world at start-up
    connect_timeout_s: float = _setting(300.0, Value.SECONDS)
    #: the CAM dispatch quantizes routed activations to int8 with per-token scales
    dynamic_quant: bool = _setting(False, Value.BOOLEAN)
    #: FFN role: replace the router's choice by an evenly spread expert cycle (profiling only)
    force_load_balance: bool = _setting(False, Value.BOOLEAN)
    #: 0: the cycle spans every expert; N > 0: each EP rank's first N local experts
    force_load_balance_topn_per_rank: int = _setting(0, Value.EXPERT_COUNT)


class Plane(enum.Enum):
    """What moves a connector's tensors between the roles."""

    #: CPU tensors from Python: through shared memory between peers on one host, tagged gloo
    #: sends and receives otherwise
    GLOO = "gloo"
    #: NCCL sends and receives of CUDA tensors (vLLM's PyNcclCommunicator)
    NCCL = "nccl"
    #: the CAM A2E/E2A kernels, one HCCL world per Attention peer
    CAM_P2P = "cam-p2p"
    #: the CAM MoE dispatch and combine kernels, one HCCL world per TP lane
    CAM_DISPATCH = "cam-dispatch"
    #: a function call: the FFN half runs inside the Attention engine, and no FFN engine is
    #: started with it (the FFN role refuses it)
    IN_PROCESS = "in-process"


class Gate(enum.Enum):
    """Where a connector lets the MoE gate run; the value says why when it is not free."""

    #: on either role (``compute_gate_on_attention`` as configured)
    EITHER = "either role"
    #: on Attention only: the exchange carries the routing
    ATTENTION = "its dispatch routes each token to its experts on Attention"
    #: on the FFN role only: the exchange carries no router logits
    FFN = "its kernels carry hidden states only, no router logits"


@dataclass(frozen=True, kw_only=True)
class ConnectorSpec:
    """What a connector is and can do: one row of the connector table."""

    #: the name operators give as ``additional_config.afd.connector``
    name: str
    #: vLLM platforms (``current_platform.device_type``) whose tensors it moves
    platforms: tuple[str, ...]
    #: platforms on which a section that names no connector gets this one
    default_on: tuple[str, ...] = ()
    #: what moves its tensors
    plane: Plane
    #: the type of its ``connector_extra_config``: a frozen dataclass of ``_setting`` fields
    extra_config: type
    #: where the MoE gate may run
    gate: Gate = Gate.EITHER
    #: whether a CUDA graph may capture its exchange (NCCL transfers are recorded with the
    #: graph, its steps announced before each replay; the in-process FFN half is captured with
    #: it; gloo moves CPU tensors from Python, which no graph records)
    graph_capturable: bool = False
    #: whether it serves DBO micro-batches: an FFN half in another process, on CUDA. In-process
    #: it would compute inside vLLM's micro-batch threads, where vLLM's MoE kernels refuse to
    #: run (``assert not dbo_enabled()`` without an async all2all), and gloo moves no CUDA tensors
    dbo: bool = False
    #: whether its exchange carries token ids, for models whose layers route by them
    #: (DeepSeek-V4's hash layers): not the CAM kernels, which move hidden states only
    token_ids: bool = True
    #: whether it survives a restart of the peer role (``peer_restart_timeout_s``): gloo, whose
    #: waits end with the peer's sockets. An NCCL or CAM transfer pending on a vanished peer
    #: waits on the device, where only an abort ends it, and their watchdogs end the process
    peer_restart: bool = False
    #: ``"module:function"`` preparing the Attention side: for a peer connector a
    #: :class:`~afd_models.connectors.build.PrepareAttention`, for the in-process plane an
    #: :class:`~afd_models.wiring.connect.InProcessAttention`; None: not served
    attention: str | None
    #: ``"module:function"`` preparing the FFN side, a
    #: :class:`~afd_models.connectors.build.PrepareFFN`; None: no FFN engine, or not served
    ffn: str | None = None
    #: why the AFD workers do not serve it yet; None: they do
    not_served: str | None = None

    @property
    def attention_only(self) -> bool:
        """Whether it runs the FFN half inside the Attention engine (refused for role ffn)."""
        return self.plane is Plane.IN_PROCESS


#: every connector, in the order messages list them
SPECS: tuple[ConnectorSpec, ...] = (
    ConnectorSpec(
        name="GlooAFDConnector",
        platforms=("cpu",),
        default_on=("cpu",),
        plane=Plane.GLOO,
        extra_config=GlooExtraConfig,
        peer_restart=True,
        attention="afd_models.connectors.gloo:prepare_attention",
        ffn="afd_models.connectors.gloo:prepare_ffn",
    ),
    ConnectorSpec(
        name="NcclAFDConnector",
        platforms=("cuda",),
        default_on=("cuda",),
        plane=Plane.NCCL,
        extra_config=P2PExtraConfig,
        graph_capturable=True,
        dbo=True,
        attention="afd_models.connectors.nccl:prepare_attention",
        ffn="afd_models.connectors.nccl:prepare_ffn",
    ),
    ConnectorSpec(
        name="LoopbackAFDConnector",
        platforms=("cpu", "cuda", "npu"),
        plane=Plane.IN_PROCESS,
        extra_config=LoopbackExtraConfig,
        graph_capturable=True,
        attention="afd_models.wiring.loopback:in_process_attention",
    ),
    ConnectorSpec(
        name="CAMP2PAFDConnector",
        platforms=("npu",),
        default_on=("npu",),
        plane=Plane.CAM_P2P,
        extra_config=CAMP2PExtraConfig,
        gate=Gate.FFN,
        token_ids=False,
        attention="afd_models.connectors.cam:prepare_attention",
        ffn="afd_models.connectors.cam:prepare_ffn",
    ),
    ConnectorSpec(
        name="CAMAsyncAFDConnector",
        platforms=("npu",),
        plane=Plane.CAM_DISPATCH,
        extra_config=CAMAsyncExtraConfig,
        gate=Gate.ATTENTION,
        token_ids=False,
        # its connectors exist (afd_models.connectors.cam), but no worker drives them yet
        attention=None,
        not_served="no routing hook on Attention, no expert-grouped FFN step",
    ),
)

#: connector name -> its spec
CONNECTORS: Mapping[str, ConnectorSpec] = MappingProxyType({spec.name: spec for spec in SPECS})
#: platform -> the connector of a section that names none there
PLATFORM_DEFAULTS: Mapping[str, str] = MappingProxyType(
    {platform: spec.name for spec in SPECS for platform in spec.default_on}
)
