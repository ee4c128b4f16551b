"""The real gloo connector between processes: a step with two Attention peers, an interruptible
idle wait on the FFN side, and a vanished peer surfacing at once."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
import torch

from afd_models.config import GlooExtraConfig
from afd_models.connectors.base import AFDConnectionError
from afd_models.testing.serve import free_port
from afd_models.topology import groups

EXTRA = GlooExtraConfig(connect_timeout_s=60, timeout_s=30)
LAYERS = [0, 2]
#: tokens per step sent by Attention ranks 0 and 1 (different, so the FFN side must split right)
TOKENS = (3, 5)
STEPS = 2


def _step_input(rank: int, step: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * rank + 10 * step + layer)
    hidden = torch.randn(TOKENS[rank], 16, generator=generator).to(torch.bfloat16)
    logits = torch.randn(TOKENS[rank], 4, generator=generator)
    return hidden, logits


def _expected(hidden: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
    """What the fake FFN computes: depends on both tensors, so a mixed-up logit row shows."""
    return hidden if logits is None else hidden + logits.sum(-1, keepdim=True).to(hidden.dtype)


def _attention_peer(
    rank: int, port: int, results: multiprocessing.Queue, release: multiprocessing.Event
) -> None:
    from afd_models.connectors.gloo import GlooAttentionConnector

    connector = GlooAttentionConnector("127.0.0.1", groups(2, 1, port)[0], rank, EXTRA)
    connector.set_layers(LAYERS)
    exact = True
    for step in range(STEPS):
        for layer in LAYERS:
            hidden, logits = _step_input(rank, step, layer)
            with_logits = logits if step == 0 else None  # step 0: gate on Attention
            connector.send(layer, hidden, with_logits)
            exact &= torch.equal(connector.recv(layer, hidden), _expected(hidden, with_logits))
    results.put((rank, exact, connector.stats.steps))
    release.wait(60)
    connector.close()


@pytest.fixture
def pair() -> tuple[object, list[multiprocessing.Process], multiprocessing.Queue, object]:
    from afd_models.connectors.gloo import GlooFFNConnector

    context = multiprocessing.get_context("spawn")
    results, release, port = context.Queue(), context.Event(), free_port()
    peers = [
        context.Process(target=_attention_peer, args=(rank, port, results, release))
        for rank in (0, 1)
    ]
    for peer in peers:
        peer.start()
    ffn = GlooFFNConnector("127.0.0.1", groups(2, 1, port)[0], EXTRA)
    yield ffn, peers, results, release
    release.set()
    for peer in peers:
        peer.join(30)
        if peer.is_alive():
            peer.kill()
    ffn.close()


def test_gloo_step_interruptible_idle_and_vanished_peer(pair) -> None:
    ffn, peers, results, release = pair
    for step in range(STEPS):
        headers = ffn.wait_step(threading.Event())
        assert [(h.step, h.num_tokens, h.dtype) for h in headers] == [
            (step, n, torch.bfloat16) for n in TOKENS
        ]
        for layer in LAYERS:
            hidden, logits = ffn.recv(layer)
            assert hidden.shape == (sum(TOKENS), 16)
            assert (logits is None) == (step == 1)
            ffn.send(layer, _expected(hidden, logits))
    assert sorted(results.get(timeout=60) for _ in peers) == [(0, True, STEPS), (1, True, STEPS)]

    # idle: a stop from another thread ends the wait at once
    stop, outcome = threading.Event(), {}
    waiter = threading.Thread(target=lambda: outcome.update(headers=ffn.wait_step(stop)))
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive()  # really waiting
    stopped = time.monotonic()
    stop.set()
    ffn.interrupt()
    waiter.join(5)
    assert not waiter.is_alive() and outcome == {"headers": None}
    assert time.monotonic() - stopped < 2

    # the Attention peers leave: the FFN side says so instead of waiting out its idle timeout
    release.set()
    started = time.monotonic()
    with pytest.raises(AFDConnectionError, match="step header from rank 1 failed: the peer closed"):
        ffn.wait_step(threading.Event())
    assert time.monotonic() - started < EXTRA.timeout_s


def test_attention_without_ffn_fails_clearly() -> None:
    from afd_models.connectors.gloo import GlooAttentionConnector

    port = free_port()
    started = time.monotonic()
    with pytest.raises(
        AFDConnectionError, match=f"no connector group at 127.0.0.1:{port} within 2 s"
    ):
        GlooAttentionConnector(
            "127.0.0.1", groups(1, 1, port)[0], 0, GlooExtraConfig(connect_timeout_s=2)
        )
    assert time.monotonic() - started < 10
