"""The store a connector group forms its data plane with, reached only through the handshaken
step channels (docs/design.md, section "Authentication").

The data planes meet through a ``torch.distributed.Store`` (gloo's rendezvous, the shared-memory
offer, NCCL's unique id). A ``TCPStore`` would listen on every interface and answer anyone, so the
FFN worker keeps the group's keys in an in-process ``HashStore`` and each Attention peer reaches
it through a :class:`ChannelStore`: every operation a request on the peer's step channel, which
already passed the handshake (and the shared secret's challenge), served by a
:class:`StoreServer` thread of the FFN worker until the peer says its plane formed.
"""

from __future__ import annotations

import enum
import socket
import struct
import threading
from collections.abc import Sequence
from datetime import timedelta

from torch.distributed import Store

from afd_models.connectors.base import AFDConnectionError
from afd_models.connectors.p2p.wire import read_into

#: a request's or an answer's head: what it is, and how many bytes of fields follow
HEAD = struct.Struct("!BI")
#: a field's length prefix
FIELD = struct.Struct("!I")
#: the most bytes of fields one message may carry (the largest value a plane stores is a few KiB)
MAX_MESSAGE_BYTES = 16 << 20


class Op(enum.IntEnum):
    """What a request asks of the store (``DONE``: the peer's data plane formed)."""

    SET = 1
    GET = 2
    ADD = 3
    CHECK = 4
    WAIT = 5
    DELETE_KEY = 6
    COMPARE_SET = 7
    NUM_KEYS = 8
    DONE = 9


#: an answer's kinds
OK, FAILED = 0, 1


def _encode(kind: int, fields: Sequence[bytes]) -> bytes:
    body = b"".join(FIELD.pack(len(field)) + field for field in fields)
    return HEAD.pack(kind, len(body)) + body


def _read(channel: socket.socket, what: str) -> tuple[int, list[bytes]]:
    head = bytearray(HEAD.size)
    read_into(channel, memoryview(head))
    kind, length = HEAD.unpack(head)
    if length > MAX_MESSAGE_BYTES:
        raise AFDConnectionError(
            f"a store {what} of {length} bytes, more than the {MAX_MESSAGE_BYTES} allowed"
        )
    body = bytearray(length)
    read_into(channel, memoryview(body))
    fields, at = [], 0
    while at < length:
        if at + FIELD.size > length:
            raise AFDConnectionError(f"a malformed store {what}: a field's length is cut off")
        (size,) = FIELD.unpack_from(body, at)
        at += FIELD.size
        if at + size > length:
            raise AFDConnectionError(f"a malformed store {what}: a field runs past its end")
        fields.append(bytes(body[at : at + size]))
        at += size
    return kind, fields


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class ChannelStore(Store):
    """An Attention peer's view of the group's store: each operation asks the FFN worker over
    ``channel`` and waits for its answer (within the channel's timeout)."""

    def __init__(self, channel: socket.socket):
        super().__init__()
        self._channel = channel

    def _ask(self, op: Op, *fields: bytes) -> list[bytes]:
        self._channel.sendall(_encode(op, fields))
        kind, answer = _read(self._channel, "answer")
        if kind != OK:
            message = answer[0].decode(errors="replace") if answer else "no reason given"
            raise RuntimeError(f"the FFN worker's store refused {op.name.lower()}: {message}")
        return answer

    def set(self, key: str, value: str | bytes) -> None:
        self._ask(Op.SET, key.encode(), _as_bytes(value))

    def get(self, key: str) -> bytes:
        return self._ask(Op.GET, key.encode())[0]

    def add(self, key: str, value: int) -> int:
        return int(self._ask(Op.ADD, key.encode(), str(value).encode())[0])

    def check(self, keys: list[str]) -> bool:
        return self._ask(Op.CHECK, *(key.encode() for key in keys))[0] == b"1"

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._ask(Op.WAIT, *(key.encode() for key in keys))

    def delete_key(self, key: str) -> bool:
        return self._ask(Op.DELETE_KEY, key.encode())[0] == b"1"

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        return self._ask(Op.COMPARE_SET, key.encode(), _as_bytes(expected), _as_bytes(desired))[0]

    def num_keys(self) -> int:
        return int(self._ask(Op.NUM_KEYS)[0])

    def set_timeout(self, timeout: timedelta) -> None:
        """The FFN worker's store bounds every wait (the connect timeout's remainder)."""

    def done(self) -> None:
        """Tell the FFN worker that this peer's data plane formed: the channel carries steps
        from here on."""
        self._channel.sendall(_encode(Op.DONE, ()))


def _int64(field: bytes) -> int:
    """``field`` as the store's counters take it, a decimal int64 (a ValueError otherwise: the
    store itself would raise a TypeError, which no answer reports)."""
    value = int(field)
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"{value} is beyond the store's 64-bit counters")
    return value


def _serve(store: Store, op: int, fields: list[bytes]) -> list[bytes]:
    """What ``op`` on ``fields`` (keys first, then values) answers from ``store``."""
    if op == Op.SET and len(fields) == 2:
        store.set(fields[0].decode(), fields[1])
        return []
    if op == Op.GET and len(fields) == 1:
        return [store.get(fields[0].decode())]
    if op == Op.ADD and len(fields) == 2:
        return [str(store.add(fields[0].decode(), _int64(fields[1]))).encode()]
    if op == Op.CHECK:
        return [b"1" if store.check([field.decode() for field in fields]) else b"0"]
    if op == Op.WAIT:
        store.wait([field.decode() for field in fields])
        return []
    if op == Op.DELETE_KEY and len(fields) == 1:
        return [b"1" if store.delete_key(fields[0].decode()) else b"0"]
    if op == Op.COMPARE_SET and len(fields) == 3:
        return [store.compare_set(fields[0].decode(), fields[1], fields[2])]
    if op == Op.NUM_KEYS and not fields:
        return [str(store.num_keys()).encode()]
    raise AFDConnectionError(f"a store request of kind {op} with {len(fields)} field(s)")


class StoreServer:
    """The FFN worker's side of one peer's :class:`ChannelStore`: a thread answering its
    requests from ``store`` until the peer is done (or the channel fails: :attr:`error`)."""

    def __init__(self, channel: socket.socket, store: Store, peer: str):
        self._channel = channel
        self._store = store
        #: why serving ended before the peer was done, if it did
        self.error: str | None = None
        self._thread = threading.Thread(
            target=self._run, args=(peer,), name="AFD-group-store", daemon=True
        )
        self._thread.start()

    def _run(self, peer: str) -> None:
        try:
            while True:
                op, fields = _read(self._channel, f"request from {peer}")
                if op == Op.DONE:
                    return
                try:
                    answer = _encode(OK, _serve(self._store, op, fields))
                except (RuntimeError, ValueError) as exc:  # the store's own errors (a timeout)
                    answer = _encode(FAILED, [str(exc).encode()])
                self._channel.sendall(answer)
        except (AFDConnectionError, OSError) as exc:
            self.error = f"{peer}: {exc}"

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        if self._thread.is_alive() and self.error is None:
            self.error = "still forming its data plane"

    def stop(self) -> None:
        """End serving now (the group will not form): wakes a thread blocked on the channel."""
        try:
            self._channel.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
