"""The gloo connector: CPU tensors over a process group formed between the two engines' workers.

One group per FFN rank (see :mod:`afd_models.topology`): the FFN worker is group rank 0 and hosts
the rendezvous store on ``host:port + ffn_rank``; its Attention peers connect to it. Either side
may start first: the store accepts the peers for ``connect_timeout_s``. The group is built with
vLLM's stateless gloo helper on a public ``TCPStore``, so it never touches either engine's own
torch.distributed world.

Per step each Attention peer sends a :class:`StepHeader`; then, per remote layer, hidden states
(and router logits) travel as raw bytes, tagged with the layer so that a mismatch in layer order
times out loudly instead of mixing layers, and the FFN side answers each peer with its rows. Bytes
round-trip every dtype bit for bit. Every transfer waits at most ``timeout_s``; the FFN side waits
for the next step up to ``idle_timeout_s``, and a stop interrupts that wait by aborting the group.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import torch
from torch.distributed import PrefixStore, ProcessGroup, TCPStore, Work
from vllm.distributed.utils import init_gloo_process_group

from afd_models.config import GlooExtraConfig
from afd_models.connectors.base import AFDConnectionError, AFDConnector, FFNConnector, StepHeader
from afd_models.log import get_logger
from afd_models.topology import Group

logger = get_logger(__name__)

HEADER_TAG = 1 << 20


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(torch.uint8)


def _layer_tag(layer_idx: int, logits: bool = False) -> int:
    return 2 * layer_idx + (1 if logits else 0)


class _GlooGroup:
    """The rendezvous store and process group of one connector group.

    The group's default timeout is the idle timeout (how long the FFN side waits for the next
    step); every transfer inside a step waits at most ``timeout_s``.
    """

    def __init__(self, host: str, group: Group, group_rank: int, extra: GlooExtraConfig, role: str):
        self.where = f"{host}:{group.port}"
        self.group = group
        self.group_rank = group_rank
        self.timeout = timedelta(seconds=extra.timeout_s)
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
                timedelta(seconds=extra.idle_timeout_s),
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

    @property
    def live(self) -> ProcessGroup:
        if self.pg is None:
            raise AFDConnectionError(f"AFD gloo connector at {self.where} is closed")
        return self.pg

    def wait(self, work: Work, what: str, timeout: timedelta | None = None) -> None:
        """Wait for one transfer, within ``timeout`` (default: the transfer timeout)."""
        try:
            work.wait(timeout or self.timeout)
        except RuntimeError as exc:
            limit = (timeout or self.timeout).total_seconds()
            raise AFDConnectionError(
                f"AFD gloo connector at {self.where}: {what} failed (peer gone or silent for {limit:.0f} s): {exc}"
            ) from exc

    def post_send(self, tensor: torch.Tensor, peer: int, tag: int) -> Work:
        return self.live.send([_as_bytes(tensor)], peer, tag)

    def post_recv(self, out: torch.Tensor, peer: int, tag: int) -> Work:
        return self.live.recv([out.view(torch.uint8)], peer, tag)

    def close(self) -> None:
        """Abort pending transfers (a waiting FFN loop wakes up) and release sockets and ports."""
        pg, self.pg = self.pg, None
        if pg is not None:
            try:
                pg.abort()
            except RuntimeError:
                pass
        self.store = None


class GlooAttentionConnector(AFDConnector):
    """Attention side: one worker, talking to the FFN rank of its group (group rank 0).

    The receive of a layer's output is posted before its activations are sent, so the answer can
    land as soon as the FFN side sends it.
    """

    def __init__(self, host: str, group: Group, attention_rank: int, extra: GlooExtraConfig):
        super().__init__()
        self._group = _GlooGroup(
            host, group, group.group_rank_of_attention(attention_rank), extra, "attention"
        )
        self._pending: dict[int, tuple[torch.Tensor, Work]] = {}

    def _send_header(self, header: StepHeader) -> None:
        self._group.wait(
            self._group.post_send(header.encode(), 0, HEADER_TAG), f"step {header.step} header"
        )

    def _send_layer(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: torch.Tensor | None
    ) -> None:
        out = torch.empty_like(hidden_states, memory_format=torch.contiguous_format)
        self._pending[layer_idx] = (out, self._group.post_recv(out, 0, _layer_tag(layer_idx)))
        self._group.wait(
            self._group.post_send(hidden_states, 0, _layer_tag(layer_idx)),
            f"send of layer {layer_idx}",
        )
        if router_logits is not None:
            logits = self._group.post_send(router_logits, 0, _layer_tag(layer_idx, logits=True))
            self._group.wait(logits, f"send of layer {layer_idx} logits")

    def _recv_layer(self, layer_idx: int, like: torch.Tensor) -> torch.Tensor:
        out, work = self._pending.pop(layer_idx)
        self._group.wait(work, f"receive of layer {layer_idx}")
        return out

    def close(self) -> None:
        self._group.close()


class GlooFFNConnector(FFNConnector):
    """FFN side: group rank 0, serving the Attention peers of its group."""

    def __init__(self, host: str, group: Group, extra: GlooExtraConfig):
        self._group = _GlooGroup(host, group, 0, extra, "ffn")
        self.idle = timedelta(seconds=extra.idle_timeout_s)
        self.peers = list(range(1, group.size))
        self.headers: list[StepHeader] = []

    def wait_step(self, stop: threading.Event) -> list[StepHeader] | None:
        buffers = [StepHeader.empty() for _ in self.peers]
        try:
            works = [
                self._group.post_recv(b, p, HEADER_TAG)
                for b, p in zip(buffers, self.peers, strict=True)
            ]
            for work in works:
                self._group.wait(work, "waiting for the next step", self.idle)
        except AFDConnectionError:
            if stop.is_set():
                return None  # interrupted by close(): a clean stop
            raise
        self.headers = [StepHeader.decode(b) for b in buffers]
        return self.headers

    def recv(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        posted = []
        for peer, header in zip(self.peers, self.headers, strict=True):
            hidden = torch.empty(header.num_tokens, header.hidden_size, dtype=header.dtype)
            logits = (
                torch.empty(header.num_tokens, header.logits_width, dtype=header.logits_dtype)
                if header.logits_width
                else None
            )
            works = [self._group.post_recv(hidden, peer, _layer_tag(layer_idx))]
            if logits is not None:
                works.append(
                    self._group.post_recv(logits, peer, _layer_tag(layer_idx, logits=True))
                )
            posted.append((hidden, logits, works))
        for _, _, works in posted:
            for work in works:
                self._group.wait(work, f"receive of layer {layer_idx}")
        hidden_all = [h for h, _, _ in posted]
        logits_all = [lg for _, lg, _ in posted if lg is not None]
        merged_hidden = hidden_all[0] if len(hidden_all) == 1 else torch.cat(hidden_all)
        merged_logits = (
            (logits_all[0] if len(logits_all) == 1 else torch.cat(logits_all))
            if logits_all
            else None
        )
        return merged_hidden, merged_logits

    def send(self, layer_idx: int, output: torch.Tensor) -> None:
        works, start = [], 0
        for peer, header in zip(self.peers, self.headers, strict=True):
            works.append(
                self._group.post_send(
                    output[start : start + header.num_tokens], peer, _layer_tag(layer_idx)
                )
            )
            start += header.num_tokens
        for work in works:
            self._group.wait(work, f"send of layer {layer_idx}")

    def interrupt(self) -> None:
        self.close()

    def close(self) -> None:
        self._group.close()
