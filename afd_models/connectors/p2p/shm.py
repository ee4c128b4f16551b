"""The same-host data plane: a group's layers through shared memory instead of gloo over TCP
(docs/design.md, section "Same-host data plane").

Each direction between the FFN worker and one Attention peer is a :class:`Ring`: a file in
``/dev/shm`` (mode 0600, unlinked once both sides mapped it) of fixed slots, written by one side
and read by the other, with a FIFO next to it as a doorbell. A message (one tensor, with the tag
:func:`~afd_models.connectors.p2p.plane.layer_tag` gave it) fills as many slots as its bytes need.
The reader spins on the ring's write count for ``SPIN_S``, then sleeps on the FIFO; a writer rings
the doorbell only while its reader sleeps. The FIFO also tells the reader that its writer's process
ended (end of file), so a vanished peer surfaces at once, as gloo's closed sockets do.

:func:`negotiate` chooses the plane when a group forms: the FFN worker creates the rings and offers
them through the group's store, each Attention peer answers whether it mapped them and read back the
nonce written in them (which only a process on the same host, sharing ``/dev/shm`` and the user, can
do), and the FFN worker announces shared memory only if every peer did.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import secrets
import select
import struct
import threading
import time
from collections.abc import Sequence

import torch
from torch.distributed import PrefixStore, Store

from afd_models.connectors.base import AFDConnectionError, AFDPeerGoneError
from afd_models.connectors.p2p.plane import DataPlane, Transfer, Wait
from afd_models.connectors.p2p.wire import byte_view

#: where the rings live: a tmpfs on Linux (a host without it gets gloo)
SHM_DIR = "/dev/shm"
#: slots per ring, and payload bytes per slot: 1 MiB a direction, a message of any size crossing
#: in chunks
SLOTS = 8
SLOT_BYTES = 128 * 1024
#: how long a reader polls the ring (yielding its core to any other runnable process between
#: polls) before it sleeps on the doorbell: longer than a layer's compute on the other side, as a
#: sleeping core can take a millisecond to wake (a virtual machine's idle vCPU)
SPIN_S = 1e-3
#: the longest a sleeping reader goes without looking at the ring (a lost wake-up costs at most
#: this), and a writer's pause while its ring is full
NAP_S = 0.01
FULL_NAP_S = 50e-6

#: control block: u64 counters, each on a cache line of its own; then the nonce; then the slots
_WRITTEN, _READ, _SLEEPING, _CLOSED = 0, 8, 16, 24
_NONCE_AT, _NONCE_BYTES = 256, 16
_CONTROL_BYTES = 512
#: a slot: tag, the message's bytes, this chunk's offset in it and its length; then the chunk
_SLOT_HEAD = struct.Struct("<QQQQ")
_SLOT_PAYLOAD_AT = 64
_STRIDE = _SLOT_PAYLOAD_AT + SLOT_BYTES
RING_BYTES = _CONTROL_BYTES + SLOTS * _STRIDE

# An uncontended lock's acquire and release are atomic instructions: a full memory fence, which
# orders a side's flag store before its load of the other side's counter (and payload before
# counter on weakly ordered CPUs).
_FENCE = threading.Lock()


def _fence() -> None:
    _FENCE.acquire()
    _FENCE.release()


class Ring:
    """One direction between two processes: ``writer`` says which end this process holds.

    Messages are read in the order they were written; one read for a tag that is not next keeps
    the messages before it for their own reads (two micro-batches' threads share a ring).
    """

    def __init__(self, path: str, *, writer: bool, nonce: bytes, create: bool):
        self.path, self.writer = path, writer
        self._fd = -1  # the doorbell, opened by open_bell
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        made = [path] if create else []
        try:
            if create:
                os.posix_fallocate(fd, 0, RING_BYTES)  # no SIGBUS later on a full tmpfs
                os.mkfifo(self.bell_path, 0o600)
                made.append(self.bell_path)
            elif os.fstat(fd).st_size != RING_BYTES:
                raise OSError(f"{path} holds {os.fstat(fd).st_size} bytes, not {RING_BYTES}")
            self._map = mmap.mmap(fd, RING_BYTES)
        except BaseException:
            for name in made:  # half made: leave nothing in /dev/shm
                os.unlink(name)
            raise
        finally:
            os.close(fd)
        nonce_at = slice(_NONCE_AT, _NONCE_AT + _NONCE_BYTES)
        if create:
            self._map[nonce_at] = nonce
        elif self._map[nonce_at] != nonce:
            self._map.close()
            raise OSError(f"{path} does not hold the nonce offered with it")
        #: written into the ring by its creator, and checked by the other end
        self.nonce = nonce
        self._view = memoryview(self._map)
        self._control = self._view[:_CONTROL_BYTES].cast("Q")
        #: slots this end wrote (writer) or consumed (reader)
        self._count = 0
        self._lock = threading.Lock()
        #: messages read ahead of the one wanted, by tag (reader)
        self._kept: dict[int, bytearray] = {}

    @property
    def bell_path(self) -> str:
        return self.path + ".bell"

    def open_bell(self) -> None:
        """Open this end of the doorbell: a reader's at any time, a writer's once its reader's
        is open (a FIFO refuses a writer without a reader)."""
        mode = os.O_WRONLY if self.writer else os.O_RDONLY
        self._fd = os.open(self.bell_path, mode | os.O_NONBLOCK)

    def unlink(self) -> None:
        """Remove the ring's names; the mappings and the open doorbells stay."""
        for path in (self.path, self.bell_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def write(self, tag: int, data: memoryview, deadline: float) -> None:
        """Write one message; waits (until ``deadline``) while the ring is full."""
        total, offset = len(data), 0
        control, view = self._control, self._view
        with self._lock:
            while True:
                length = min(SLOT_BYTES, total - offset)
                while self._count - control[_READ] >= SLOTS:
                    self._check(deadline)
                    time.sleep(FULL_NAP_S)
                at = _CONTROL_BYTES + (self._count % SLOTS) * _STRIDE
                _SLOT_HEAD.pack_into(self._map, at, tag, total, offset, length)
                start = at + _SLOT_PAYLOAD_AT
                view[start : start + length] = data[offset : offset + length]
                _fence()
                self._count += 1
                control[_WRITTEN] = self._count
                _fence()
                if control[_SLEEPING]:
                    self._ring()
                offset += length
                if offset >= total:
                    return

    def _ring(self) -> None:
        try:
            os.write(self._fd, b"\0")
        except BlockingIOError:  # the FIFO is full of unread rings: the reader wakes anyway
            pass
        except OSError as exc:
            raise AFDPeerGoneError(f"the peer process ended ({exc})") from None

    def read(self, tag: int, out: memoryview, deadline: float, what: str) -> None:
        """Read the message tagged ``tag`` into ``out``, which must be its size."""
        with self._lock:
            kept = self._kept.pop(tag, None)
            if kept is not None:
                self._fits(tag, len(kept), out)
                out[:] = kept
                return
            while True:
                found = self._read_next(tag, out, deadline, what)
                if found:
                    return

    def _read_next(self, wanted: int, out: memoryview, deadline: float, what: str) -> bool:
        """Read the next message: into ``out`` if it is tagged ``wanted`` (True), else keep it."""
        control, view = self._control, self._view
        target: memoryview | bytearray | None = None
        while True:
            if control[_WRITTEN] <= self._count:
                self._wait_written(deadline)
            _fence()
            at = _CONTROL_BYTES + (self._count % SLOTS) * _STRIDE
            tag: int
            total: int
            tag, total, offset, length = _SLOT_HEAD.unpack_from(self._map, at)
            if target is None:
                if offset != 0:
                    raise AFDConnectionError(f"{what}: a message began at byte {offset}")
                if tag == wanted:
                    self._fits(tag, total, out)
                    target = out
                else:
                    target = self._kept[tag] = bytearray(total)
            start = at + _SLOT_PAYLOAD_AT
            target[offset : offset + length] = view[start : start + length]
            self._count += 1
            control[_READ] = self._count
            if offset + length >= total:
                return tag == wanted

    @staticmethod
    def _fits(tag: int, total: int, out: memoryview) -> None:
        if total != len(out):
            raise AFDConnectionError(
                f"a message tagged {tag} of {total} bytes, but its receive expects {len(out)} "
                "(do both sides agree on the step's shapes?)"
            )

    def _wait_written(self, deadline: float) -> None:
        """Wait for the writer's next slot: spin, then sleep on the doorbell."""
        control = self._control
        spin_until = time.monotonic() + SPIN_S
        while time.monotonic() < spin_until:
            if control[_WRITTEN] > self._count:
                return
            os.sched_yield()
        while True:
            control[_SLEEPING] = 1
            _fence()
            if control[_WRITTEN] > self._count:
                control[_SLEEPING] = 0
                return
            self._check(deadline)
            ready, _, _ = select.select(
                [self._fd], [], [], max(0.0, min(NAP_S, deadline - time.monotonic()))
            )
            control[_SLEEPING] = 0
            if ready:
                try:
                    rung = os.read(self._fd, 4096)
                except BlockingIOError:  # drained by a spurious wake-up
                    continue
                if not rung and control[_WRITTEN] <= self._count:
                    raise AFDPeerGoneError("the peer process ended (its end of the ring closed)")

    def _check(self, deadline: float) -> None:
        """Raise if the other end closed the ring, or ``deadline`` passed."""
        if self._control[_CLOSED]:
            raise AFDPeerGoneError("the peer closed the ring")
        if time.monotonic() >= deadline:
            raise AFDPeerGoneError("the peer sent nothing in time")

    def close(self) -> None:
        """Tell the other end, and release the mapping and the doorbell; safe to call twice."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._map.closed:
            return
        self._control[_CLOSED] = 1
        self._control.release()
        self._view.release()
        with contextlib.suppress(BufferError):  # a read in another thread still holds it
            self._map.close()


class SharedMemoryPlane(DataPlane):
    """Transfers through the rings to and from each peer (by group rank), each batch waited at
    most ``timeout_s``."""

    name = "shm"
    first_layer_on_step_channel = True

    def __init__(self, timeout_s: float, outgoing: dict[int, Ring], incoming: dict[int, Ring]):
        super().__init__(torch.device("cpu"), timeout_s)
        self._outgoing, self._incoming = outgoing, incoming

    def form(self, store: Store, group_rank: int, size: int) -> None:
        """Formed by :func:`negotiate` already."""

    def rings(self, peer: int) -> tuple[Ring, Ring]:
        """The rings to and from group rank ``peer`` (for the raw benchmark)."""
        return self._outgoing[peer], self._incoming[peer]

    def start(self, transfers: Sequence[Transfer], what: str) -> Wait:
        deadline = time.monotonic() + self.timeout_s
        receives = []
        for transfer in transfers:
            if transfer.tensor.device.type != "cpu":
                raise AFDConnectionError(
                    f"AFD gloo connector at {self.where} (shared memory): a tensor on "
                    f"{transfer.tensor.device}; it moves CPU tensors only"
                )
            if not transfer.send:
                receives.append(transfer)
                continue
            data = byte_view(transfer.tensor)
            try:
                self._outgoing[transfer.peer].write(transfer.tag, data, deadline)
            except (AFDPeerGoneError, OSError, ValueError) as exc:  # or a closed ring
                raise self._failed(what, transfer.peer, exc) from None

        def wait() -> None:
            deadline = time.monotonic() + self.timeout_s
            for transfer in receives:
                out = byte_view(transfer.tensor)
                try:
                    self._incoming[transfer.peer].read(transfer.tag, out, deadline, what)
                except (AFDPeerGoneError, OSError, ValueError) as exc:
                    raise self._failed(what, transfer.peer, exc) from None

        return wait

    def _failed(self, what: str, peer: int, exc: Exception) -> AFDPeerGoneError:
        return AFDPeerGoneError(
            f"AFD gloo connector at {self.where} (shared memory): {what} with rank {peer} "
            f"failed: {exc} (timeout_s={self.timeout_s:g})"
        )

    def close(self) -> None:
        for ring in [*self._outgoing.values(), *self._incoming.values()]:
            ring.close()


#: store keys of the negotiation, under the "shm" prefix
_OFFER, _ANSWER, _CHOICE = "offer/{rank}", "answer/{rank}", "choice"
YES = "yes"


def negotiate(
    store: Store, group_rank: int, size: int, timeout_s: float, allowed: bool
) -> SharedMemoryPlane | str:
    """The shared-memory plane of this member, or why the group does without it (every member
    calls this together once the handshake admitted them all; the FFN worker is group rank 0)."""
    keys = PrefixStore("shm", store)
    if group_rank == 0:
        return _offer(keys, size, timeout_s, allowed)
    return _accept(keys, group_rank, timeout_s, allowed)


def _offer(keys: Store, size: int, timeout_s: float, allowed: bool) -> SharedMemoryPlane | str:
    made: list[Ring] = []
    outgoing: dict[int, Ring] = {}
    incoming: dict[int, Ring] = {}
    refused = None if allowed else "shared_memory is false on the FFN worker"
    if refused is None:
        try:
            stem = os.path.join(SHM_DIR, f"afd-{os.getpid()}-{secrets.token_hex(8)}")
            for rank in range(1, size):
                nonce = secrets.token_bytes(_NONCE_BYTES)
                incoming[rank] = Ring(f"{stem}-{rank}-in", writer=False, nonce=nonce, create=True)
                made.append(incoming[rank])
                incoming[rank].open_bell()
                outgoing[rank] = Ring(f"{stem}-{rank}-out", writer=True, nonce=nonce, create=True)
                made.append(outgoing[rank])
        except OSError as exc:
            refused = f"the FFN worker cannot create shared memory in {SHM_DIR}: {exc}"
    try:
        for rank in range(1, size):
            offer = (
                {"refused": refused}
                if refused is not None
                else {
                    "to_ffn": incoming[rank].path,
                    "from_ffn": outgoing[rank].path,
                    "nonce": incoming[rank].nonce.hex(),
                }
            )
            keys.set(_OFFER.format(rank=rank), json.dumps(offer))
        answers = [keys.get(_ANSWER.format(rank=rank)).decode() for rank in range(1, size)]
        refused = refused or next((a for a in answers if a != YES), None)
        if refused is None:
            for ring in outgoing.values():
                ring.open_bell()
    except BaseException:
        for ring in made:
            ring.unlink()
            ring.close()
        raise
    for ring in made:
        ring.unlink()
    keys.set(_CHOICE, YES if refused is None else refused)
    if refused is not None:
        for ring in made:
            ring.close()
        return refused
    return SharedMemoryPlane(timeout_s, outgoing, incoming)


def _accept(keys: Store, rank: int, timeout_s: float, allowed: bool) -> SharedMemoryPlane | str:
    offer = json.loads(keys.get(_OFFER.format(rank=rank)))
    rings: list[Ring] = []
    if "refused" in offer:
        answer = "no offer"
    elif not allowed:
        answer = f"shared_memory is false on the Attention peer of group rank {rank}"
    else:
        try:
            nonce = bytes.fromhex(offer["nonce"])
            to_ffn = Ring(offer["to_ffn"], writer=True, nonce=nonce, create=False)
            rings.append(to_ffn)
            from_ffn = Ring(offer["from_ffn"], writer=False, nonce=nonce, create=False)
            rings.append(from_ffn)
            from_ffn.open_bell()
            to_ffn.open_bell()
            answer = YES
        except OSError as exc:
            answer = (
                f"the Attention peer of group rank {rank} cannot map the FFN worker's shared "
                f"memory (another host, container or user?): {exc}"
            )
    try:
        keys.set(_ANSWER.format(rank=rank), answer)
        choice: str = keys.get(_CHOICE).decode()
    except BaseException:
        for ring in rings:
            ring.close()
        raise
    if choice != YES:
        for ring in rings:
            ring.close()
        return choice
    return SharedMemoryPlane(timeout_s, {0: rings[0]}, {0: rings[1]})
