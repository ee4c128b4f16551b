"""The gloo connector: the point-to-point protocol (:mod:`afd_models.connectors.p2p`) moving CPU
tensors through shared memory when every peer of a group shares the FFN worker's host
(:mod:`afd_models.connectors.p2p.shm`), else over a gloo process group, built with vLLM's
stateless gloo helper on the connector group's own store. vLLM's CPU platform runs it; tensors of
any other device are refused."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from datetime import timedelta

import torch
from torch.distributed import PrefixStore, ProcessGroup, Store, Work
from vllm.distributed.utils import init_gloo_process_group

from afd_models.connectors.base import AFDConnectionError, AFDPeerGoneError, Fingerprint
from afd_models.connectors.build import ConnectAttention, ConnectFFN, Site
from afd_models.connectors.p2p.attention import P2PAttentionConnector
from afd_models.connectors.p2p.ffn import P2PFFNConnector
from afd_models.connectors.p2p.plane import DataPlane, Transfer, Wait
from afd_models.connectors.p2p.shm import SharedMemoryPlane, negotiate
from afd_models.connectors.p2p.wire import as_bytes
from afd_models.connectors.specs import GlooExtraConfig
from afd_models.topology import Group

CPU = torch.device("cpu")


class GlooDataPlane(DataPlane):
    """Transfers posted as tagged gloo sends and receives, each waited at most ``timeout_s``."""

    name = "gloo"
    first_layer_on_step_channel = True

    def __init__(self, timeout_s: float):
        super().__init__(CPU, timeout_s)
        self._timeout = timedelta(seconds=timeout_s)
        self._pg: ProcessGroup | None = None

    def form(self, store: Store, group_rank: int, size: int) -> None:
        self._pg = init_gloo_process_group(
            PrefixStore("afd", store), group_rank, size, self._timeout
        )

    def start(self, transfers: Sequence[Transfer], what: str) -> Wait:
        works = [self._post(transfer) for transfer in transfers]

        def wait() -> None:
            for work in works:
                try:
                    work.wait(self._timeout)
                except RuntimeError as exc:
                    raise AFDPeerGoneError(
                        f"AFD gloo connector at {self.where}: {what} failed: the peer is gone, "
                        f"or sent nothing for {self.timeout_s:.0f} s ({exc})"
                    ) from exc

        return wait

    def _post(self, transfer: Transfer) -> Work:
        if transfer.tensor.device != CPU:
            raise AFDConnectionError(
                f"AFD gloo connector at {self.where}: a tensor on {transfer.tensor.device}; gloo "
                "moves CPU tensors only (use the NCCL connector on CUDA)"
            )
        if self._pg is None:
            raise AFDConnectionError(f"AFD gloo connector at {self.where} is closed")
        verb = "send to" if transfer.send else "receive from"
        try:
            if transfer.send:
                return self._pg.send([as_bytes(transfer.tensor)], transfer.peer, transfer.tag)
            return self._pg.recv([transfer.tensor.view(torch.uint8)], transfer.peer, transfer.tag)
        except RuntimeError as exc:
            raise AFDPeerGoneError(
                f"AFD gloo connector at {self.where}: {verb} rank {transfer.peer} failed "
                f"(peer gone): {exc}"
            ) from exc

    def close(self) -> None:
        pg, self._pg = self._pg, None
        if pg is not None:
            try:
                pg.abort()
            except RuntimeError:
                pass


class HostAwarePlane(DataPlane):
    """Shared memory when every member of the group can map it (and ``shared_memory`` allows it on
    every member), else gloo: chosen when the group forms, and said in :attr:`description`."""

    name = "gloo"
    first_layer_on_step_channel = True

    def __init__(self, timeout_s: float, shared_memory: bool):
        super().__init__(CPU, timeout_s)
        self._shared_memory = shared_memory
        self._chosen: DataPlane | None = None
        self.description = "not formed"

    def form(self, store: Store, group_rank: int, size: int) -> None:
        chosen = negotiate(store, group_rank, size, self.timeout_s, self._shared_memory)
        if isinstance(chosen, SharedMemoryPlane):
            self._chosen = chosen
            self.description = "shared memory (every peer on this host)"
        else:
            self._chosen = GlooDataPlane(self.timeout_s)
            self._chosen.form(store, group_rank, size)
            self.description = f"gloo over TCP ({chosen})"
        self._chosen.where = self.where

    def start(self, transfers: Sequence[Transfer], what: str) -> Wait:
        if self._chosen is None:
            raise AFDConnectionError(f"AFD gloo connector at {self.where} is closed")
        return self._chosen.start(transfers, what)

    def close(self) -> None:
        chosen, self._chosen = self._chosen, None
        if chosen is not None:
            chosen.close()


class GlooAttentionConnector(P2PAttentionConnector):
    """Attention side over gloo (see :class:`~afd_models.connectors.p2p.attention.P2PAttentionConnector`)."""

    def __init__(
        self,
        host: str,
        group: Group,
        attention_rank: int,
        extra: GlooExtraConfig,
        fingerprint: Fingerprint | None = None,
        *,
        secret: bytes | None = None,
    ):
        plane = HostAwarePlane(extra.timeout_s, extra.shared_memory)
        super().__init__(
            host, group, attention_rank, extra, fingerprint, plane=plane, secret=secret
        )


class GlooFFNConnector(P2PFFNConnector):
    """FFN side over gloo (see :class:`~afd_models.connectors.p2p.ffn.P2PFFNConnector`)."""

    def __init__(
        self,
        host: str,
        group: Group,
        extra: GlooExtraConfig,
        fingerprint: Fingerprint | None = None,
        *,
        stop: threading.Event | None = None,
        secret: bytes | None = None,
    ):
        plane = HostAwarePlane(extra.timeout_s, extra.shared_memory)
        super().__init__(host, group, extra, fingerprint, plane=plane, stop=stop, secret=secret)


def prepare_attention(site: Site) -> ConnectAttention:
    """The gloo Attention side of ``site`` (the spec's builder)."""

    def connect(fingerprint: Fingerprint) -> GlooAttentionConnector:
        return GlooAttentionConnector(
            site.host, site.group, site.rank, site.extra, fingerprint, secret=site.secret
        )

    return connect


def prepare_ffn(site: Site) -> ConnectFFN:
    """The gloo FFN side of ``site`` (the spec's builder); a reconnect after the peers left waits
    ``connect_timeout_s`` for them, and ends once ``stop`` is set."""

    def connect(
        fingerprint: Fingerprint,
        *,
        connect_timeout_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> GlooFFNConnector:
        waits = site.extra
        if connect_timeout_s is not None:
            waits = dataclasses.replace(site.extra, connect_timeout_s=connect_timeout_s)
        return GlooFFNConnector(
            site.host, site.group, waits, fingerprint, stop=stop, secret=site.secret
        )

    return connect
