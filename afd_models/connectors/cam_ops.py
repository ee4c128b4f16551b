"""The Ascend operators the CAM connectors call, behind two small interfaces.

The connectors in :mod:`afd_models.connectors.cam` are written against :class:`CamP2POps` and
:class:`CamAsyncOps` and take an implementation as an argument: on an NPU the ones here, which
call the CAM kernels through ``torch.ops``; in tests, fakes. Nothing here imports ``torch_npu``
or a CAM library at module import: :func:`load_cam_p2p_ops` and :func:`load_cam_async_ops` do,
and they first look each module up without importing it, so that a machine without them gets
one error naming everything missing and what to install, before any port or device is touched.

- CAMP2P: ``torch.ops.afd_ascend.a2e`` / ``e2a``, registered by the public AFD plugin's Ascend
  extension ``afd_plugin._C_ascend`` (built from its repository in a CANN and torch_npu
  environment; docs/npu.md, "Install").
- CAM async: ``torch.ops.umdk_cam_op_lib.async_{dispatch,combine}_{send,recv}``, registered by
  the ``umdk_cam_op_lib`` wheel of the CAM package.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import torch
from torch.distributed import Store

#: the modules each connector needs, with what installs them
TORCH_NPU = ("torch_npu", "the torch_npu build matching this torch (pip install torch-npu)")
CAM_P2P_LIBRARY = (
    "afd_plugin._C_ascend",
    "the public AFD plugin's Ascend A2E/E2A extension (built from "
    "github.com/vllm-project/afd-plugin with AFD_BUILD_ASCEND_OPS=1; docs/npu.md, Install)",
)
CAM_ASYNC_LIBRARY = (
    "umdk_cam_op_lib",
    "the CAM operator wheel umdk_cam_op_lib (and its CAM .run package)",
)
#: the ``torch.ops`` each connector calls, by namespace
CAM_P2P_OPS = ("afd_ascend", ("a2e", "e2a"))
CAM_ASYNC_OPS = (
    "umdk_cam_op_lib",
    ("async_dispatch_send", "async_dispatch_recv", "async_combine_send", "async_combine_recv"),
)

FindSpec = Callable[[str], object]
#: how often a bounded wait looks at the device (seconds)
POLL_S = 50e-6


class CamOpsUnavailableError(RuntimeError):
    """This process cannot run a CAM connector: a module or operator is missing."""


class CamComm(Protocol):
    """One HCCL communicator: the CAM kernels address it by name."""

    name: str

    def close(self) -> None: ...


class CamP2POps(Protocol):
    """What the CAMP2P connector calls: worlds of one FFN worker (rank 0) and one Attention worker
    (rank 1), each exchange an A2E (Attention to FFN) and an E2A (back), all bfloat16."""

    def connect(self, store: Store, rank: int, timeout_s: float) -> CamComm: ...

    def a2e(self, x: torch.Tensor, rows: int, rank: int, comm: str) -> tuple[torch.Tensor, Any]:
        """Attention (rank 1): send ``x``; FFN (rank 0): receive ``rows`` rows shaped like ``x``.
        Returns the rows received (FFN) and the handle the matching :meth:`e2a` needs."""

    def e2a(self, x: torch.Tensor, handle: Any, rows: int, rank: int, comm: str) -> torch.Tensor:
        """FFN (rank 0): send ``x`` back; Attention (rank 1): return the ``rows`` rows received
        (``x`` gives their shape)."""

    def wait(self, timeout_s: float) -> bool:
        """Wait until the device has run the kernels enqueued so far; False past ``timeout_s``."""


@dataclass
class DispatchReceived:
    """What one CAM dispatch brought an FFN rank: its experts' share of one MoE layer."""

    #: the MoE layer, as the Attention side dispatched it
    layer_idx: int
    #: routed tokens, grouped by local expert (capacity rows; the first ``sum(group_list)`` hold data)
    hidden_states: torch.Tensor
    #: routed tokens per local expert
    group_list: torch.Tensor
    #: the shared experts' tokens (capacity rows; the first ``shared_tokens`` hold data)
    shared_hidden_states: torch.Tensor
    shared_tokens: int
    #: per-token scales of the routed and shared tokens with dynamic quantization, else None
    scales: torch.Tensor | None
    shared_scales: torch.Tensor | None
    #: what the matching combine needs to route the results back
    handle: Any


class CamAsyncOps(Protocol):
    """What the CAM async connector calls: one world of every Attention then every FFN worker."""

    def connect(self, store: Store, rank: int, size: int, timeout_s: float) -> CamComm: ...

    def dispatch_send(
        self, hidden: torch.Tensor, topk_ids: torch.Tensor, layer_idx: int, comm: str
    ) -> None: ...

    def combine_recv(
        self, like: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, comm: str
    ) -> torch.Tensor: ...

    def dispatch_recv(self, capacity: int, comm: str) -> DispatchReceived: ...

    def combine_send(
        self, routed: torch.Tensor, shared: torch.Tensor, handle: Any, comm: str
    ) -> None: ...


def require_modules(
    connector: str, modules: Sequence[tuple[str, str]], find_spec: FindSpec | None = None
) -> None:
    """Raise unless every module can be imported, naming all that cannot and what installs them;
    looks them up without importing them."""
    find = importlib.util.find_spec if find_spec is None else find_spec
    missing = []
    for name, install in modules:
        try:
            found = find(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            missing.append(f"{name} ({install})")
    if missing:
        raise CamOpsUnavailableError(
            f"{connector} runs on Ascend NPUs only, and this process cannot import "
            f"{'; '.join(missing)}; install them, or choose a connector of this platform"
        )


def require_ops(connector: str, namespace: str, names: Sequence[str]) -> Any:
    """The ``torch.ops`` namespace holding ``names``, or an error naming those missing."""
    ops = getattr(torch.ops, namespace)
    missing = [name for name in names if not hasattr(ops, name)]
    if missing:
        raise CamOpsUnavailableError(
            f"{connector}: torch.ops.{namespace} lacks {', '.join(missing)} after its library "
            "was imported (a build of another version?)"
        )
    return ops


class _HcclComm:
    """An HCCL communicator of its own store, outside torch.distributed's world."""

    def __init__(self, store: Store, rank: int, size: int, timeout_s: float):
        from torch_npu._C._distributed_c10d import ProcessGroupHCCL

        options = ProcessGroupHCCL.Options()
        options._timeout = timedelta(seconds=timeout_s)
        self._group: Any = ProcessGroupHCCL(store, rank, size, options)
        self.name = str(self._group.get_hccl_comm_name(rank))

    def close(self) -> None:
        # the communicator is released with its process group's last reference
        self._group = None


class AscendCamP2POps:
    """:class:`CamP2POps` on the A2E/E2A kernels, in worlds of one FFN and one Attention worker."""

    #: world sizes the kernels are told: one FFN worker, one Attention worker
    EXPERT_RANKS = 1
    ATTENTION_RANKS = 1

    def __init__(self, ops: Any, core_num: int):
        self._ops = ops
        self._core_num = core_num

    def connect(self, store: Store, rank: int, timeout_s: float) -> CamComm:
        return _HcclComm(store, rank, self.EXPERT_RANKS + self.ATTENTION_RANKS, timeout_s)

    def a2e(self, x: torch.Tensor, rows: int, rank: int, comm: str) -> tuple[torch.Tensor, Any]:
        # topk 1, no expert ids or scales: the gate runs on the FFN side (compute_gate 0)
        received, _, _, handle, _ = self._ops.a2e(
            x, None, None, rows, x.shape[-1], 1, self.EXPERT_RANKS,
            self.ATTENTION_RANKS, rank, comm, self._core_num, 0,
        )  # fmt: skip
        return received, handle

    def e2a(self, x: torch.Tensor, handle: Any, rows: int, rank: int, comm: str) -> torch.Tensor:
        return self._ops.e2a(
            x, handle, rows, x.shape[-1], 1, self.EXPERT_RANKS, self.ATTENTION_RANKS,
            rank, comm, self._core_num,
        )  # fmt: skip

    def wait(self, timeout_s: float) -> bool:
        # a graph being captured records the kernels: they run at replay
        if torch.npu.is_current_stream_capturing():
            return True
        done = torch.npu.Event()
        done.record()
        deadline = time.monotonic() + timeout_s
        while not done.query():
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return True


def load_cam_p2p_ops(core_num: int, find_spec: FindSpec | None = None) -> AscendCamP2POps:
    """The CAMP2P kernels of this process; raises :class:`CamOpsUnavailableError` (before
    importing anything) when torch_npu or the A2E/E2A extension is missing."""
    connector = "CAMP2PAFDConnector"
    require_modules(connector, [TORCH_NPU, CAM_P2P_LIBRARY], find_spec)
    importlib.import_module(TORCH_NPU[0])
    importlib.import_module(CAM_P2P_LIBRARY[0])
    return AscendCamP2POps(require_ops(connector, *CAM_P2P_OPS), core_num)


@dataclass(frozen=True)
class CamAsyncShape:
    """What the CAM async kernels are told of the model and the world."""

    hidden_size: int
    top_k: int
    num_attention_ranks: int
    num_ffn_ranks: int
    #: routed experts per FFN rank
    experts_per_rank: int
    #: this worker's rank in the world (Attention ranks first)
    rank: int
    #: rows a dispatch may carry (the scheduler's ``max_num_batched_tokens``, equal on all ranks)
    max_tokens: int
    dynamic_quant: bool


class AscendCamAsyncOps:
    """:class:`CamAsyncOps` on the ``umdk_cam_op_lib`` kernels."""

    #: one communicator per world: the kernels' communication id 0
    COMM_ID = 0
    #: Attention ranks per DP replica that the kernels split a replica's tokens over (no
    #: context parallelism on vLLM-Ascend 0.26: 1)
    TP_SIZE = 1

    def __init__(self, ops: Any, shape: CamAsyncShape, device: torch.device):
        self._ops = ops
        self._shape = shape
        # the kernels' scratch argument, and the placeholder a receive is shaped from
        self._comm_args = torch.empty(1, dtype=torch.float16, device=device)
        self._placeholder = torch.empty(1, dtype=torch.bfloat16, device=device)

    def _world(self) -> tuple[int, ...]:
        s = self._shape
        size = s.num_attention_ranks + s.num_ffn_ranks
        return (s.num_ffn_ranks, s.num_attention_ranks, s.experts_per_rank, s.rank, size)

    def connect(self, store: Store, rank: int, size: int, timeout_s: float) -> CamComm:
        return _HcclComm(store, rank, size, timeout_s)

    def dispatch_send(
        self, hidden: torch.Tensor, topk_ids: torch.Tensor, layer_idx: int, comm: str
    ) -> None:
        s = self._shape
        self._ops.async_dispatch_send(
            hidden, topk_ids, self._comm_args, self.COMM_ID, s.max_tokens, hidden.shape[0],
            s.hidden_size, s.top_k, *self._world(), layer_idx, self.TP_SIZE,
            int(s.dynamic_quant), comm,
        )  # fmt: skip

    def combine_recv(
        self, like: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, comm: str
    ) -> torch.Tensor:
        s = self._shape
        return self._ops.async_combine_recv(
            like.new_empty(1), topk_ids, topk_weights, self._comm_args, self.COMM_ID,
            like.shape[0], s.hidden_size, s.top_k, *self._world(), comm,
        )  # fmt: skip

    def dispatch_recv(self, capacity: int, comm: str) -> DispatchReceived:
        s = self._shape
        hidden, shared, scales, shared_scales, counts, group_list, shared_counts = (
            self._ops.async_dispatch_recv(
                self._placeholder, self._comm_args, self.COMM_ID, capacity, s.hidden_size,
                s.top_k, *self._world(), self.TP_SIZE, int(s.dynamic_quant), comm,
            )
        )  # fmt: skip
        # counts: total tokens, sending rank, layer (the kernels' TokenNums_Rankid_Layeridx)
        return DispatchReceived(
            layer_idx=int(counts[2].item()),
            hidden_states=hidden,
            group_list=group_list,
            shared_hidden_states=shared,
            shared_tokens=int(shared_counts[0].item()),
            scales=scales if s.dynamic_quant else None,
            shared_scales=shared_scales if s.dynamic_quant else None,
            handle=(counts, capacity),
        )

    def combine_send(
        self, routed: torch.Tensor, shared: torch.Tensor, handle: Any, comm: str
    ) -> None:
        s = self._shape
        counts, capacity = handle
        self._ops.async_combine_send(
            routed, shared, self._comm_args, counts, self.COMM_ID, capacity, s.hidden_size,
            s.top_k, *self._world(), self.TP_SIZE, comm,
        )  # fmt: skip


def load_cam_async_ops(
    shape: CamAsyncShape, device: torch.device, find_spec: FindSpec | None = None
) -> AscendCamAsyncOps:
    """The CAM async kernels of this process; raises :class:`CamOpsUnavailableError` (before
    importing anything) when torch_npu or the CAM operator library is missing."""
    connector = "CAMAsyncAFDConnector"
    require_modules(connector, [TORCH_NPU, CAM_ASYNC_LIBRARY], find_spec)
    importlib.import_module(TORCH_NPU[0])
    importlib.import_module(CAM_ASYNC_LIBRARY[0])
    return AscendCamAsyncOps(require_ops(connector, *CAM_ASYNC_OPS), shape, device)
