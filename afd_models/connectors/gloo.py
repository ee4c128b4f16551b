"""The gloo connector: CPU tensors over a process group formed between the two engines' workers.

One group per FFN rank (see :mod:`afd_models.topology`): the FFN worker is group rank 0 and hosts
the rendezvous store on ``host:port + ffn_rank``; its Attention peers connect to it. Either side
may start first: the store accepts the peers for ``connect_timeout_s``. The group is built with
vLLM's stateless gloo helper on a public ``TCPStore``, so it never touches either engine's own
torch.distributed world.

Per step each Attention peer announces a :class:`StepHeader` through the group's store (the FFN
side waits on it without holding a gloo operation open, so it can idle between requests and stop
at any time); then, per remote layer, hidden states (and router logits) travel over gloo as raw
bytes, tagged with the layer so that a mismatch in layer order times out loudly instead of mixing
layers, and the FFN side answers each peer with its rows. Bytes round-trip every dtype bit for bit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import torch
from torch.distributed import PrefixStore, ProcessGroup, TCPStore
from vllm.distributed.utils import init_gloo_process_group

from afd_models.config import GlooExtraConfig
from afd_models.connectors.base import AFDConnectionError, AFDConnector, FFNConnector, StepHeader
from afd_models.log import get_logger
from afd_models.topology import Group

logger = get_logger(__name__)

#: the FFN side's pause between checks for the next step grows from the first to the second value
IDLE_MIN_S = 20e-6
IDLE_MAX_S = 0.05
_T = TypeVar("_T")


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(torch.uint8)


def _layer_tag(layer_idx: int, logits: bool = False) -> int:
    return 2 * layer_idx + (1 if logits else 0)


class _GlooGroup:
    """The rendezvous store and process group of one connector group."""

    def __init__(self, host: str, group: Group, group_rank: int, extra: GlooExtraConfig, role: str):
        self.where = f"{host}:{group.port}"
        self.group = group
        self.group_rank = group_rank
        self.timeout_s = extra.timeout_s
        started = time.monotonic()
        logger.info(
            "AFD gloo %s: %s group %d at %s, waiting up to %.0f s for %d peer(s)",
            role,
            "hosting" if group_rank == 0 else "joining",
            group.ffn_rank,
            self.where,
            extra.connect_timeout_s,
            group.size - 1,
        )
        try:
            self.store: TCPStore | None = TCPStore(
                host,
                group.port,
                world_size=group.size,
                is_master=group_rank == 0,
                timeout=timedelta(seconds=extra.connect_timeout_s),
                wait_for_workers=True,
            )
            self.pg: ProcessGroup | None = init_gloo_process_group(
                PrefixStore("afd", self.store),
                group_rank,
                group.size,
                timedelta(seconds=extra.timeout_s),
            )
        except (RuntimeError, OSError) as exc:
            raise AFDConnectionError(
                f"AFD gloo {role}: no connector group at {self.where} within {extra.connect_timeout_s:.0f} s "
                f"(is the other role running with the same host/port?): {exc}"
            ) from exc
        logger.info(
            "AFD gloo %s: group %d at %s ready in %.1f s",
            role,
            group.ffn_rank,
            self.where,
            time.monotonic() - started,
        )

    def run(self, what: str, action: Callable[[ProcessGroup], _T]) -> _T:
        if self.pg is None:
            raise AFDConnectionError(f"AFD gloo connector at {self.where} is closed")
        try:
            return action(self.pg)
        except RuntimeError as exc:
            raise AFDConnectionError(
                f"AFD gloo connector at {self.where}: {what} failed (peer gone or silent for {self.timeout_s:.0f} s): {exc}"
            ) from exc

    def send(self, tensor: torch.Tensor, peer: int, tag: int, what: str) -> None:
        self.run(what, lambda pg: pg.send([_as_bytes(tensor)], peer, tag).wait())

    def recv(self, like: torch.Tensor, peer: int, tag: int, what: str) -> torch.Tensor:
        out = torch.empty_like(like, memory_format=torch.contiguous_format)
        self.run(what, lambda pg: pg.recv([out.view(torch.uint8)], peer, tag).wait())
        return out

    def header_key(self, group_rank: int, step: int) -> str:
        return f"afd/step/{group_rank}/{step}"

    def put_header(self, header: StepHeader) -> None:
        store = self.store
        if store is None:
            raise AFDConnectionError(f"AFD gloo connector at {self.where} is closed")
        try:
            store.set(
                self.header_key(self.group_rank, header.step), header.encode().numpy().tobytes()
            )
        except RuntimeError as exc:
            raise AFDConnectionError(
                f"AFD gloo connector at {self.where}: the FFN peer is gone: {exc}"
            ) from exc

    def take_header(self, group_rank: int, step: int, stop: threading.Event) -> StepHeader | None:
        """The peer's header for ``step``; None if ``stop`` is set first. Idles without a deadline.

        Polls the store (``check`` is non-blocking) with a growing pause, reset every step, so a busy
        decode loop sees its next header within microseconds and an idle server costs nothing.
        """
        key = self.header_key(group_rank, step)
        pause = IDLE_MIN_S
        while not stop.is_set():
            store = self.store
            if store is None:
                return None
            try:
                if store.check([key]):
                    values = torch.frombuffer(bytearray(store.get(key)), dtype=torch.int64)
                    store.delete_key(key)
                    return StepHeader.decode(values)
            except RuntimeError as exc:
                raise AFDConnectionError(
                    f"AFD gloo connector at {self.where}: the Attention peer is gone: {exc}"
                ) from exc
            time.sleep(pause)
            pause = min(pause * 2, IDLE_MAX_S)
        return None

    def close(self) -> None:
        pg, self.pg = self.pg, None
        if pg is not None:
            try:
                pg.abort()
            except RuntimeError:
                pass
        self.store = None


class GlooAttentionConnector(AFDConnector):
    """Attention side: one worker, talking to the FFN rank of its group (group rank 0)."""

    def __init__(self, host: str, group: Group, attention_rank: int, extra: GlooExtraConfig):
        super().__init__()
        self._group = _GlooGroup(
            host, group, group.group_rank_of_attention(attention_rank), extra, "attention"
        )

    def _send_header(self, header: StepHeader) -> None:
        self._group.put_header(header)

    def _send_layer(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: torch.Tensor | None
    ) -> None:
        self._group.send(hidden_states, 0, _layer_tag(layer_idx), f"send of layer {layer_idx}")
        if router_logits is not None:
            self._group.send(
                router_logits,
                0,
                _layer_tag(layer_idx, logits=True),
                f"send of layer {layer_idx} logits",
            )

    def _recv_layer(self, layer_idx: int, like: torch.Tensor) -> torch.Tensor:
        return self._group.recv(like, 0, _layer_tag(layer_idx), f"receive of layer {layer_idx}")

    def close(self) -> None:
        self._group.close()


class GlooFFNConnector(FFNConnector):
    """FFN side: group rank 0, serving the Attention peers of its group."""

    def __init__(self, host: str, group: Group, extra: GlooExtraConfig):
        self._group = _GlooGroup(host, group, 0, extra, "ffn")
        self.peers = list(range(1, group.size))
        self.headers: list[StepHeader] = []
        self._step = 0

    def wait_step(self, stop: threading.Event) -> list[StepHeader] | None:
        headers = []
        for peer in self.peers:
            header = self._group.take_header(peer, self._step, stop)
            if header is None:
                return None
            headers.append(header)
        self._step += 1
        self.headers = headers
        return headers

    def recv(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden, logits = [], []
        for peer, header in zip(self.peers, self.headers, strict=True):
            like = torch.empty(header.num_tokens, header.hidden_size, dtype=header.dtype)
            hidden.append(
                self._group.recv(like, peer, _layer_tag(layer_idx), f"receive of layer {layer_idx}")
            )
            if header.logits_width:
                like_logits = torch.empty(
                    header.num_tokens, header.logits_width, dtype=header.logits_dtype
                )
                logits.append(
                    self._group.recv(
                        like_logits,
                        peer,
                        _layer_tag(layer_idx, logits=True),
                        f"receive of layer {layer_idx} logits",
                    )
                )
        merged_logits = torch.cat(logits) if logits else None
        return (hidden[0] if len(hidden) == 1 else torch.cat(hidden)), merged_logits

    def send(self, layer_idx: int, output: torch.Tensor) -> None:
        start = 0
        for peer, header in zip(self.peers, self.headers, strict=True):
            rows = output[start : start + header.num_tokens]
            start += header.num_tokens
            self._group.send(rows, peer, _layer_tag(layer_idx), f"send of layer {layer_idx}")

    def close(self) -> None:
        self._group.close()
