"""The connector contract without a network: step headers, layer order, stats (afd_models.connectors.base)."""

from __future__ import annotations

import pytest
import torch

from afd_models.connectors.base import DTYPES, AFDConnectionError, AFDConnector, StepHeader


class Recording(AFDConnector):
    """A connector whose FFN side doubles the activations, recording what crossed."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, object]] = []
        self._out: dict[int, torch.Tensor] = {}

    def _send_header(self, header: StepHeader) -> None:
        self.sent.append(("header", header))

    def _send_layer(
        self, layer_idx: int, hidden_states: torch.Tensor, router_logits: torch.Tensor | None
    ) -> None:
        self.sent.append(("layer", (layer_idx, router_logits is not None)))
        self._out[layer_idx] = hidden_states * 2

    def _recv_layer(self, layer_idx: int, like: torch.Tensor) -> torch.Tensor:
        return self._out.pop(layer_idx)


@pytest.mark.parametrize("dtype", DTYPES)
def test_header_round_trip(dtype: torch.dtype) -> None:
    """A header survives encode/decode for every wire dtype."""
    header = StepHeader(7, 33, 256, dtype, 64, torch.float32)
    assert StepHeader.decode(header.encode()) == header


def test_malformed_header_is_refused() -> None:
    with pytest.raises(AFDConnectionError, match="malformed step header"):
        StepHeader.decode(torch.zeros(7, dtype=torch.int64))


def test_first_remote_layer_opens_a_step() -> None:
    """The first remote layer of a forward sends a header with the step's shape; later ones do not."""
    connector = Recording()
    connector.set_layers([1, 2])
    x = torch.ones(5, 8, dtype=torch.bfloat16)
    logits = torch.zeros(5, 4, dtype=torch.float32)
    for _ in range(2):
        for layer in (1, 2):
            connector.send(layer, x, logits if layer == 2 else None)
            assert torch.equal(connector.recv(layer, x), x * 2)
    headers = [item for kind, item in connector.sent if kind == "header"]
    assert [h.step for h in headers] == [0, 1]  # type: ignore[union-attr]
    assert headers[0] == StepHeader(0, 5, 8, torch.bfloat16, 0, torch.float32)
    assert connector.stats.as_dict()["exchanges"] == 4


def test_out_of_order_layer_is_an_error() -> None:
    """Sending layers out of forward order fails loudly instead of mixing layers."""
    connector = Recording()
    connector.set_layers([1, 2, 3])
    x = torch.ones(2, 4)
    connector.send(1, x, None)
    with pytest.raises(
        AFDConnectionError, match="layer 3 sent out of order; the FFN side expects layer 2"
    ):
        connector.send(3, x, None)


def test_unbound_connector_refuses() -> None:
    with pytest.raises(AFDConnectionError, match="set_layers"):
        Recording().send(0, torch.ones(1, 1), None)
    with pytest.raises(ValueError, match="no remote layers"):
        Recording().set_layers([])
