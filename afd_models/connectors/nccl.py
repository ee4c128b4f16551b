"""The NCCL connector: the point-to-point protocol (:mod:`afd_models.connectors.p2p`) moving CUDA
tensors with NCCL sends and receives.

The communicator is vLLM's ``PyNcclCommunicator`` on a ``StatelessProcessGroup`` over the
connector group's own store: no torch.distributed world, no torch private helper. Each side
starts a layer's transfers as one NCCL group on the current stream (so a send and the receive of
its answer never wait on each other), and NCCL pairs them by order, which the protocol fixes.
Inside a CUDA-graph capture the transfers are recorded with the graph and run at each replay.

NCCL cannot put two ranks of one communicator on one GPU, so a connector group spans at least two
GPUs; the in-process loopback connector serves one-GPU checks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch.distributed import PrefixStore, Store
from vllm.distributed.utils import StatelessProcessGroup

from afd_models.connectors.base import AFDConnectionError, Fingerprint
from afd_models.connectors.build import ConnectAttention, ConnectFFN, Site
from afd_models.connectors.p2p.attention import P2PAttentionConnector
from afd_models.connectors.p2p.ffn import P2PFFNConnector
from afd_models.connectors.p2p.plane import DataPlane, Transfer, Wait
from afd_models.connectors.specs import P2PExtraConfig
from afd_models.log import exit_process
from afd_models.topology import Group

#: how often a bounded wait looks at the stream (seconds)
POLL_S = 50e-6


class Communicator(Protocol):
    """What the NCCL plane calls of vLLM's ``PyNcclCommunicator``."""

    def send(self, tensor: torch.Tensor, dst: int, stream: object = None) -> None: ...

    def recv(self, tensor: torch.Tensor, src: int, stream: object = None) -> None: ...

    def group_start(self) -> None: ...

    def group_end(self) -> None: ...

    def destroy(self) -> None: ...


MakeCommunicator = Callable[[StatelessProcessGroup, torch.device], Communicator]


def pynccl_communicator(group: StatelessProcessGroup, device: torch.device) -> Communicator:
    """vLLM's NCCL communicator for ``group`` on ``device`` (every member calls this together)."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

    pynccl = PyNcclCommunicator(group, device)
    if pynccl.disabled:
        raise AFDConnectionError(
            f"AFD nccl connector: vLLM's NCCL communicator is disabled on {device} (no NCCL "
            "library found, or VLLM_DISABLE_PYNCCL is set)"
        )
    communicator: Communicator = pynccl
    return communicator


class NcclDataPlane(DataPlane):
    """Transfers as NCCL groups on the current stream; a wait is bounded by ``timeout_s``."""

    name = "nccl"
    waits_on_device = True

    def __init__(
        self,
        device: torch.device,
        timeout_s: float,
        make_communicator: MakeCommunicator = pynccl_communicator,
    ):
        super().__init__(device, timeout_s)
        self._make_communicator = make_communicator
        self._communicator: Communicator | None = None

    def form(self, store: Store, group_rank: int, size: int) -> None:
        group = StatelessProcessGroup(
            rank=group_rank, world_size=size, store=PrefixStore("afd-nccl", store)
        )
        self._communicator = self._make_communicator(group, self.device)

    def start(self, transfers: Sequence[Transfer], what: str) -> Wait:
        communicator = self._communicator
        if communicator is None:
            raise AFDConnectionError(f"AFD nccl connector at {self.where} is closed")
        for transfer in transfers:
            if transfer.tensor.device != self.device:
                raise AFDConnectionError(
                    f"AFD nccl connector at {self.where}: {what}: a tensor on "
                    f"{transfer.tensor.device}, but this connector moves tensors on {self.device} "
                    "(its worker's device)"
                )
            # NCCL moves numel() elements from data_ptr(): a receive must be whole
            if not transfer.send and not transfer.tensor.is_contiguous():
                raise AFDConnectionError(
                    f"AFD nccl connector at {self.where}: {what}: a receive into a "
                    "non-contiguous tensor"
                )
        communicator.group_start()
        try:
            for transfer in transfers:
                if transfer.send:
                    # a copy for a strided view; the stream orders its reuse after the send
                    communicator.send(transfer.tensor.contiguous(), transfer.peer)
                else:
                    communicator.recv(transfer.tensor, transfer.peer)
        finally:
            communicator.group_end()
        return lambda: self._wait(what)

    def _wait(self, what: str) -> None:
        """Wait until the stream has run the transfers, at most ``timeout_s``.

        Nothing to wait for while a CUDA graph is being captured (the transfers run at replay),
        nor on a CPU device (where a communicator finishes its group in ``group_end``).
        """
        if self.device.type != "cuda" or torch.cuda.is_current_stream_capturing():
            return
        done = torch.cuda.Event()
        done.record()
        deadline = time.monotonic() + self.timeout_s
        while not done.query():
            if time.monotonic() > deadline:
                raise AFDConnectionError(
                    f"AFD nccl connector at {self.where}: {what} failed: the peer is gone, or "
                    f"sent nothing for {self.timeout_s:.0f} s"
                )
            time.sleep(POLL_S)

    def close(self) -> None:
        communicator, self._communicator = self._communicator, None
        if communicator is not None:
            communicator.destroy()


class NcclAttentionConnector(P2PAttentionConnector):
    """Attention side over NCCL on ``device`` (its worker's)."""

    def __init__(
        self,
        host: str,
        group: Group,
        attention_rank: int,
        extra: P2PExtraConfig,
        fingerprint: Fingerprint | None = None,
        *,
        device: torch.device,
        make_communicator: MakeCommunicator = pynccl_communicator,
        on_peer_gone: Callable[[BaseException], None] | None = None,
        secret: bytes | None = None,
    ):
        plane = NcclDataPlane(device, extra.timeout_s, make_communicator)
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


class NcclFFNConnector(P2PFFNConnector):
    """FFN side over NCCL on ``device`` (its worker's)."""

    def __init__(
        self,
        host: str,
        group: Group,
        extra: P2PExtraConfig,
        fingerprint: Fingerprint | None = None,
        *,
        device: torch.device,
        make_communicator: MakeCommunicator = pynccl_communicator,
        secret: bytes | None = None,
    ):
        plane = NcclDataPlane(device, extra.timeout_s, make_communicator)
        super().__init__(host, group, extra, fingerprint, plane=plane, secret=secret)


def prepare_attention(site: Site) -> ConnectAttention:
    """The NCCL Attention side of ``site`` (the spec's builder): a vanished FFN worker ends the
    process (its transfers may wait on the device, where no timeout reaches them)."""

    def connect(fingerprint: Fingerprint) -> NcclAttentionConnector:
        return NcclAttentionConnector(
            site.host,
            site.group,
            site.rank,
            site.extra,
            fingerprint,
            device=site.device,
            on_peer_gone=exit_process,
            secret=site.secret,
        )

    return connect


def prepare_ffn(site: Site) -> ConnectFFN:
    """The NCCL FFN side of ``site`` (the spec's builder; it takes no restart)."""

    def connect(
        fingerprint: Fingerprint,
        *,
        connect_timeout_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> NcclFFNConnector:
        return NcclFFNConnector(
            site.host, site.group, site.extra, fingerprint, device=site.device, secret=site.secret
        )

    return connect
