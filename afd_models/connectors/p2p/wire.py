"""The step channel's wire format: the handshake's messages, their codec and raw reads
(docs/design.md, section "Wire protocol")."""

from __future__ import annotations

import socket
import struct
import time

import torch

from afd_models.connectors.base import AFDConnectionError, Fingerprint


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes, as a flat uint8 view (every dtype round-trips bit for bit)."""
    return tensor.detach().contiguous().view(torch.uint8)


def byte_view(tensor: torch.Tensor) -> memoryview:
    """``tensor``'s bytes as a flat memoryview: of the tensor itself when it is contiguous (a
    receive fills it), else of a contiguous copy (enough to send)."""
    return memoryview(as_bytes(tensor).numpy()).cast("B")


#: an Attention peer's group rank, the first thing it sends on its step channel
RANK = struct.Struct("!q")
#: an FFN worker's answer on a step channel during the handshake: a kind, then a UTF-8 text
ANSWER = struct.Struct("!cI")
#: the peer is accepted (no text)
ACCEPTED = b"A"
#: the peer is refused; the text says why
REFUSED = b"R"
#: every peer is accepted: form the data plane (no text)
READY = b"G"
#: the FFN worker gave up after accepting this peer; the text says why
GAVE_UP = b"X"


def send_answer(channel: socket.socket, kind: bytes, text: str = "") -> None:
    data = text.encode()
    channel.sendall(ANSWER.pack(kind, len(data)) + data)


def tell(channel: socket.socket, kind: bytes, text: str) -> None:
    """Best effort: a peer that is already gone cannot be told."""
    try:
        send_answer(channel, kind, text)
    except OSError:
        pass


def read_answer(channel: socket.socket) -> tuple[bytes, str]:
    head = bytearray(ANSWER.size)
    read_into(channel, memoryview(head))
    kind, length = ANSWER.unpack(head)
    if kind not in (ACCEPTED, REFUSED, READY, GAVE_UP) or length > Fingerprint.MAX_BYTES:
        raise AFDConnectionError(
            f"received a malformed handshake answer {bytes(head)!r} (is the FFN side an AFD "
            "connector of the same vllm-afd-overlay version?)"
        )
    text = bytearray(length)
    read_into(channel, memoryview(text))
    return kind, text.decode(errors="replace")


def read_fingerprint(channel: socket.socket, deadline: float | None = None) -> Fingerprint:
    prefix = bytearray(Fingerprint.LENGTH.size)
    read_into(channel, memoryview(prefix), deadline)
    (length,) = Fingerprint.LENGTH.unpack(prefix)
    if length > Fingerprint.MAX_BYTES:  # not read: decode names the announced length
        return Fingerprint.decode(bytes(prefix))
    payload = bytearray(length)
    read_into(channel, memoryview(payload), deadline)
    return Fingerprint.decode(bytes(prefix + payload))


def read_into(channel: socket.socket, buffer: memoryview, deadline: float | None = None) -> None:
    """Fill ``buffer`` from ``channel``, by ``deadline`` (``time.monotonic()``) when given, else
    within the channel's timeout per read; a closed connection is an error, not a short read.

    Raises:
        TimeoutError: ``deadline`` passed first (a slow sender cannot stretch it byte by byte).
    """
    view = buffer.cast("B")
    filled = 0
    while filled < len(view):
        if deadline is not None:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                raise TimeoutError(f"{filled} of {len(view)} bytes by the deadline")
            channel.settimeout(left_s)
        received = channel.recv_into(view[filled:])
        if not received:
            raise ConnectionError("the peer closed the connection")
        filled += received
