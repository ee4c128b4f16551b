"""The Ascend NPU connectors: CAMP2P (synchronous, the point-to-point protocol) and CAM async
(the MoE dispatch and combine of the CAM kernels, gate on Attention).

**CAMP2P** is the point-to-point protocol of :mod:`afd_models.connectors.p2p` (same groups,
handshake, fingerprints, step headers on the step channel, timeouts) over a data plane of the
A2E and E2A kernels (:class:`CamP2PDataPlane`). Those kernels move bfloat16 hidden states only
(no router logits: the gate runs on the FFN side) and pair a world's Attention rank ``r`` with
FFN rank ``r mod F``; the FFN side reads an equal share of its batch from each Attention rank.
Neither fits this project's topology (contiguous groups, any A >= F) and step headers (each peer
its own token count), so the plane forms one two-member HCCL world per Attention peer: the FFN
worker is rank 0 of each, the peer rank 1, and each exchange carries exactly one peer's rows.
Per layer, the Attention worker runs A2E (send) at its send and E2A (receive) at its receive;
the FFN worker runs A2E for each peer in peer order, then, with the layer computed, E2A for each
peer in peer order. A peer whose step has no tokens takes no kernel on either side (both know
its count from the step header): its rows are empty. DBO is not offered (one world per peer,
not per micro-batch).

**CAM async** has no step header and no groups: the kernels route each token to the FFN ranks
owning its experts. One HCCL world holds every Attention worker, then every FFN worker (world
rank ``A + f`` for FFN rank ``f``), per TP lane; FFN rank 0 hosts its store on the lane's port
of FFN rank 0. The Attention worker routes each MoE layer's tokens itself (``route``: the
model's top-k selection), dispatches them (``dispatch_send``) at its send and combines the
experts' results (``combine_recv``) at its receive. The FFN worker serves the dispatches as they
come (:meth:`CAMAsyncFFNConnector.recv_work`), in whatever order the Attention ranks send them;
the layer travels with the tokens. An FFN rank whose experts got no token answers with one
placeholder row (the combine kernel refuses an empty routed output). Eager only: a graph
capture is refused.

Both load their kernels before anything else (:mod:`afd_models.connectors.cam_ops`): off an NPU
the constructor raises :class:`~afd_models.connectors.cam_ops.CamOpsUnavailableError` naming
what is missing before it opens a port.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import PrefixStore, Store, TCPStore

from afd_models.connectors.base import AFDConnectionError, AFDConnector, Fingerprint, StepHeader
from afd_models.connectors.build import ConnectAttention, ConnectFFN, Site
from afd_models.connectors.cam_ops import (
    CamAsyncOps,
    CamAsyncShape,
    CamComm,
    CamP2POps,
    load_cam_async_ops,
    load_cam_p2p_ops,
)
from afd_models.connectors.p2p.attention import P2PAttentionConnector
from afd_models.connectors.p2p.ffn import P2PFFNConnector
from afd_models.connectors.p2p.plane import DataPlane, Part, Transfer, Wait, tag_part
from afd_models.connectors.specs import CAMAsyncExtraConfig, CAMP2PExtraConfig
from afd_models.log import exit_process
from afd_models.topology import Group

#: the only dtype the CAM kernels move
CAM_DTYPE = torch.bfloat16


class CamP2PDataPlane(DataPlane):
    """A2E/E2A exchanges in two-member worlds: on the FFN worker one per Attention peer (keyed by
    its group rank), on an Attention worker one with its FFN worker (keyed 0)."""

    name = "camp2p"
    waits_on_device = True

    def __init__(self, device: torch.device, timeout_s: float, ops: CamP2POps):
        super().__init__(device, timeout_s)
        self._ops = ops
        self._comms: dict[int, CamComm] = {}
        #: this member's rank in its worlds: 0 on the FFN worker, 1 on an Attention worker
        self._rank = 0
        #: what each peer's A2E left for its E2A
        self._handles: dict[int, Any] = {}

    def form(self, store: Store, group_rank: int, size: int) -> None:
        self._rank = 0 if group_rank == 0 else 1
        peers = range(1, size) if group_rank == 0 else [group_rank]
        for peer in peers:  # the FFN worker forms its worlds in peer order, as the peers wait
            world = PrefixStore(f"afd-camp2p-{peer}", store)
            self._comms[0 if group_rank else peer] = self._ops.connect(
                world, self._rank, self.timeout_s
            )

    def start(self, transfers: Sequence[Transfer], what: str) -> Wait:
        for transfer in transfers:
            self._check(transfer, what)
        ffn = self._rank == 0
        # A2E first (an Attention send, an FFN receive); an FFN send is E2A after its A2E; an
        # Attention receive is E2A, run at the wait, after the A2E of its send
        first = [t for t in transfers if t.send != ffn]
        later = [t for t in transfers if t.send == ffn]
        for transfer in (*first, *later) if ffn else first:
            self._run(transfer)

        def wait() -> None:
            if not ffn:
                for transfer in later:
                    self._run(transfer)
            if not self._ops.wait(self.timeout_s):
                raise AFDConnectionError(
                    f"AFD camp2p connector at {self.where}: {what} failed: the peer is gone, or "
                    f"sent nothing for {self.timeout_s:.0f} s"
                )

        return wait

    def _check(self, transfer: Transfer, what: str) -> None:
        tensor = transfer.tensor
        part = tag_part(transfer.tag)
        problem = (
            f"{part.name.lower().replace('_', ' ')} (the CAM kernels carry hidden states only)"
            if part is not Part.HIDDEN
            else f"a tensor on {tensor.device}, this connector moves tensors on {self.device}"
            if tensor.device != self.device
            else f"a {tensor.dtype} tensor, the CAM kernels move {CAM_DTYPE} only"
            if tensor.dtype != CAM_DTYPE
            else None
        )
        if problem is not None:
            raise AFDConnectionError(f"AFD camp2p connector at {self.where}: {what}: {problem}")

    def _run(self, transfer: Transfer) -> None:
        tensor, peer = transfer.tensor, transfer.peer
        rows = tensor.shape[0]
        if not rows:  # a peer without tokens: no kernel on either side
            return
        comm = self._comms.get(peer)
        if comm is None:
            raise AFDConnectionError(f"AFD camp2p connector at {self.where} is closed")
        a2e = transfer.send != (self._rank == 0)
        if a2e:
            received, self._handles[peer] = self._ops.a2e(tensor, rows, self._rank, comm.name)
            if not transfer.send:
                tensor.copy_(received)
            return
        handle = self._handles.pop(peer)
        returned = self._ops.e2a(tensor.contiguous(), handle, rows, self._rank, comm.name)
        if not transfer.send:
            tensor.copy_(returned)

    def close(self) -> None:
        comms, self._comms = self._comms, {}
        self._handles.clear()
        for comm in comms.values():
            comm.close()


class CAMP2PAFDConnector(P2PAttentionConnector):
    """Attention side of CAMP2P on ``device`` (its worker's NPU); ``ops`` are the kernels
    (loaded from torch_npu and the A2E/E2A extension when not given)."""

    def __init__(
        self,
        host: str,
        group: Group,
        attention_rank: int,
        extra: CAMP2PExtraConfig,
        fingerprint: Fingerprint | None = None,
        *,
        device: torch.device,
        ops: CamP2POps | None = None,
        on_peer_gone: Callable[[BaseException], None] | None = None,
        secret: bytes | None = None,
    ):
        ops = load_cam_p2p_ops(extra.core_num) if ops is None else ops
        plane = CamP2PDataPlane(device, extra.timeout_s, ops)
        super().__init__(
            host,
            group,
            attention_rank,
            extra,
            fingerprint,
            plane=plane,
            on_peer_gone=on_peer_gone,
            secret=secret,
        )


class CAMP2PFFNConnector(P2PFFNConnector):
    """FFN side of CAMP2P on ``device`` (its worker's NPU)."""

    def __init__(
        self,
        host: str,
        group: Group,
        extra: CAMP2PExtraConfig,
        fingerprint: Fingerprint | None = None,
        *,
        device: torch.device,
        ops: CamP2POps | None = None,
        secret: bytes | None = None,
    ):
        ops = load_cam_p2p_ops(extra.core_num) if ops is None else ops
        plane = CamP2PDataPlane(device, extra.timeout_s, ops)
        super().__init__(host, group, extra, fingerprint, plane=plane, secret=secret)


def prepare_attention(site: Site) -> ConnectAttention:
    """The CAMP2P Attention side of ``site`` (the spec's builder): its kernels load now, so off
    an NPU this fails before any weight is read; a vanished FFN worker ends the process."""
    ops = load_cam_p2p_ops(site.extra.core_num)

    def connect(fingerprint: Fingerprint) -> CAMP2PAFDConnector:
        return CAMP2PAFDConnector(
            site.host,
            site.group,
            site.rank,
            site.extra,
            fingerprint,
            device=site.device,
            ops=ops,
            on_peer_gone=exit_process,
            secret=site.secret,
        )

    return connect


def prepare_ffn(site: Site) -> ConnectFFN:
    """The CAMP2P FFN side of ``site`` (the spec's builder; it takes no restart): its kernels
    load now, so off an NPU this fails before any weight is read."""
    ops = load_cam_p2p_ops(site.extra.core_num)

    def connect(
        fingerprint: Fingerprint,
        *,
        connect_timeout_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> CAMP2PFFNConnector:
        return CAMP2PFFNConnector(
            site.host,
            site.group,
            site.extra,
            fingerprint,
            device=site.device,
            ops=ops,
            secret=site.secret,
        )

    return connect


#: CAM async store prefix (the lane's store is FFN rank 0's)
CAM_ASYNC_WORLD = "afd-cam-async"


def cam_async_world_rank(attention: bool, role_rank: int, num_attention_ranks: int) -> int:
    """A worker's rank in the CAM async world: Attention ranks first, then FFN ranks."""
    return role_rank if attention else num_attention_ranks + role_rank


def experts_per_rank(num_experts: int, num_ffn_ranks: int) -> int:
    """Routed experts each FFN rank owns; the kernels need an even split."""
    if num_experts < 1 or num_experts % num_ffn_ranks:
        raise AFDConnectionError(
            f"CAMAsyncAFDConnector splits the model's {num_experts} routed experts evenly over "
            f"num_ffn_ranks={num_ffn_ranks}; allowed: a num_ffn_ranks that divides {num_experts}"
        )
    return num_experts // num_ffn_ranks


class _CamWorld:
    """The lane's store (hosted by FFN rank 0) and this worker's communicator in the world."""

    def __init__(
        self, host: str, port: int, shape: CamAsyncShape, timeout_s: float, ops: CamAsyncOps
    ):
        self.where = f"{host}:{port}"
        size = shape.num_attention_ranks + shape.num_ffn_ranks
        try:
            self._store: TCPStore | None = TCPStore(
                host,
                port,
                is_master=shape.rank == shape.num_attention_ranks,
                timeout=timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
            self.comm: CamComm | None = ops.connect(
                PrefixStore(CAM_ASYNC_WORLD, self._store), shape.rank, size, timeout_s
            )
        except (RuntimeError, OSError) as exc:
            self._store = None
            raise AFDConnectionError(
                f"AFD cam-async: rank {shape.rank} of {size} found no CAM world at {self.where} "
                f"within {timeout_s:.0f} s (are all {size} workers starting with the same "
                f"host/port?): {exc}"
            ) from None

    @property
    def name(self) -> str:
        if self.comm is None:
            raise AFDConnectionError(f"AFD cam-async connector at {self.where} is closed")
        return self.comm.name

    def close(self) -> None:
        comm, self.comm, self._store = self.comm, None, None
        if comm is not None:
            comm.close()


#: ``route(layer_idx, hidden_states, router_logits) -> (topk_ids int32, topk_weights float32)``,
#: each ``[tokens, top_k]``: the model's expert selection, run on Attention
Route = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class CAMAsyncAFDConnector(AFDConnector):
    """Attention side of CAM async: routes each MoE layer's tokens with ``route``, dispatches
    them to the FFN ranks owning their experts and combines what comes back."""

    def __init__(
        self,
        host: str,
        port: int,
        shape: CamAsyncShape,
        extra: CAMAsyncExtraConfig,
        *,
        route: Route,
        device: torch.device,
        ops: CamAsyncOps | None = None,
    ):
        ops = load_cam_async_ops(shape, device) if ops is None else ops
        super().__init__()
        self._ops = ops
        self._shape = shape
        self._route = route
        #: each exchange's routing, by (micro-batch, layer), for its combine
        self._routing: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._world = _CamWorld(host, port, shape, extra.connect_timeout_s, ops)

    def _send_header(self, header: StepHeader) -> None:
        """Nothing to announce: each dispatch carries its token counts and layer."""

    def _capture_header(self, header: StepHeader) -> None:
        raise AFDConnectionError(
            "CAMAsyncAFDConnector runs eager only: run the Attention engine with --enforce-eager"
        )

    def _send_layer(
        self,
        layer_idx: int,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor | None,
        ubatch: int,
        token_ids: torch.Tensor | None,
    ) -> None:
        if token_ids is not None:
            raise AFDConnectionError(
                f"CAMAsyncAFDConnector: layer {layer_idx} came with token ids; the CAM dispatch "
                "carries none (a model routing by token id needs another connector)"
            )
        if router_logits is None:
            raise AFDConnectionError(
                f"CAMAsyncAFDConnector: layer {layer_idx} came without router logits; the CAM "
                "dispatch routes on Attention (compute_gate_on_attention=true, MoE layers only)"
            )
        topk_ids, topk_weights = self._route(layer_idx, hidden_states, router_logits)
        expected = (hidden_states.shape[0], self._shape.top_k)
        for name, tensor in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
            if tuple(tensor.shape) != expected:
                raise AFDConnectionError(
                    f"CAMAsyncAFDConnector: layer {layer_idx}: the route gave {name} of shape "
                    f"{tuple(tensor.shape)}, expected {expected} (tokens, top_k)"
                )
        self._ops.dispatch_send(hidden_states, topk_ids, layer_idx, self._world.name)
        self._routing[(ubatch, layer_idx)] = (topk_ids, topk_weights)

    def _recv_layer(self, layer_idx: int, like: torch.Tensor, ubatch: int) -> torch.Tensor:
        topk_ids, topk_weights = self._routing.pop((ubatch, layer_idx))
        return self._ops.combine_recv(like, topk_ids, topk_weights, self._world.name)

    def close(self) -> None:
        self._routing.clear()
        self._world.close()


@dataclass
class CamWork:
    """One dispatch an FFN rank serves: its experts' tokens of one MoE layer."""

    layer_idx: int
    #: routed tokens grouped by local expert, ``sum(group_list)`` rows (possibly none)
    hidden_states: torch.Tensor
    #: routed tokens per local expert
    group_list: torch.Tensor
    #: the shared experts' tokens
    shared_hidden_states: torch.Tensor
    #: per-token scales with dynamic quantization, else None
    scales: torch.Tensor | None
    shared_scales: torch.Tensor | None
    #: what the combine needs to route the results back
    handle: Any


class CAMAsyncFFNConnector:
    """FFN side of CAM async: serves dispatches one by one (:meth:`recv_work`, then
    :meth:`send_work` with the experts' results)."""

    def __init__(
        self,
        host: str,
        port: int,
        shape: CamAsyncShape,
        extra: CAMAsyncExtraConfig,
        *,
        device: torch.device,
        ops: CamAsyncOps | None = None,
    ):
        ops = load_cam_async_ops(shape, device) if ops is None else ops
        self._ops = ops
        self._shape = shape
        self._world = _CamWorld(host, port, shape, extra.connect_timeout_s, ops)

    def recv_work(self) -> CamWork:
        """The next dispatch to this rank. It waits on the device, where no host timeout reaches:
        :meth:`close` (on stop) ends the wait."""
        received = self._ops.dispatch_recv(self._shape.max_tokens, self._world.name)
        routed = int(received.group_list.sum().item())
        shared = received.shared_tokens
        return CamWork(
            layer_idx=received.layer_idx,
            hidden_states=received.hidden_states[:routed],
            group_list=received.group_list,
            shared_hidden_states=received.shared_hidden_states[:shared],
            scales=None if received.scales is None else received.scales[:routed],
            shared_scales=None
            if received.shared_scales is None
            else received.shared_scales[:shared],
            handle=received.handle,
        )

    def send_work(self, work: CamWork, routed: torch.Tensor, shared: torch.Tensor) -> None:
        """Return ``work``'s results: ``routed`` (a row per routed token) and ``shared``."""
        if routed.shape[0] != work.hidden_states.shape[0]:
            raise AFDConnectionError(
                f"CAMAsyncFFNConnector: layer {work.layer_idx}: {routed.shape[0]} routed output "
                f"rows for {work.hidden_states.shape[0]} routed tokens"
            )
        if not routed.shape[0]:  # the combine kernel refuses an empty routed output
            routed = torch.zeros(1, self._shape.hidden_size, dtype=CAM_DTYPE, device=routed.device)
        self._ops.combine_send(routed, shared, work.handle, self._world.name)

    def close(self) -> None:
        self._world.close()
