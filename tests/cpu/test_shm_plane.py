"""The same-host data plane's rings and their negotiation: messages of any size cross in order,
a read for a later tag keeps the earlier messages for their own reads, a wrong size is refused,
a peer that closes or whose process ends surfaces at once, and a group whose peer cannot map the
FFN worker's memory (another host), or that turns shared memory off, falls back to gloo with the
reason said, leaving no file in /dev/shm either way."""

from __future__ import annotations

import glob
import json
import multiprocessing
import os
import threading
import time
from datetime import timedelta

import pytest
import torch
from torch.distributed import PrefixStore, TCPStore

from afd_models.connectors.base import AFDConnectionError, AFDPeerGoneError
from afd_models.connectors.p2p import shm
from afd_models.connectors.p2p.plane import Transfer
from afd_models.connectors.p2p.shm import Ring, SharedMemoryPlane, negotiate
from afd_models.connectors.p2p.wire import byte_view

TIMEOUT_S = 20.0


def _ours() -> list[str]:
    """The rings this process created and has not unlinked."""
    return glob.glob(os.path.join(shm.SHM_DIR, f"afd-{os.getpid()}-*"))


def _pair(tmp_path) -> tuple[Ring, Ring]:
    """A writer and a reader end of one ring, in this process."""
    path, nonce = str(tmp_path / "ring"), os.urandom(16)
    reader = Ring(path, writer=False, nonce=nonce, create=True)
    reader.open_bell()
    writer = Ring(path, writer=True, nonce=nonce, create=False)
    writer.open_bell()
    return writer, reader


def _deadline() -> float:
    return time.monotonic() + TIMEOUT_S


def test_messages_larger_than_the_ring_cross_in_chunks(tmp_path) -> None:
    writer, reader = _pair(tmp_path)
    # 3 ring's worth: the writer waits for the reader to free slots, many times over
    sent = torch.randint(0, 256, (3 * shm.SLOTS * shm.SLOT_BYTES + 5,), dtype=torch.uint8)
    got = torch.zeros_like(sent)
    thread = threading.Thread(target=lambda: reader.read(7, byte_view(got), _deadline(), "read"))
    thread.start()
    writer.write(7, byte_view(sent), _deadline())
    thread.join(TIMEOUT_S)
    assert not thread.is_alive() and torch.equal(got, sent)
    empty = torch.zeros(0, dtype=torch.uint8)  # an empty message takes a slot and crosses
    writer.write(8, byte_view(empty), _deadline())
    reader.read(8, byte_view(empty), _deadline(), "read")
    writer.close()
    reader.close()


def test_a_read_for_a_later_tag_keeps_the_earlier_messages(tmp_path) -> None:
    """Two micro-batches' threads share a ring: each read gets its own tag's bytes."""
    writer, reader = _pair(tmp_path)
    first, second = (
        torch.full((100,), 1, dtype=torch.uint8),
        torch.full((300,), 2, dtype=torch.uint8),
    )
    writer.write(1, byte_view(first), _deadline())
    writer.write(2, byte_view(second), _deadline())
    got_second, got_first = torch.zeros_like(second), torch.zeros_like(first)
    reader.read(2, byte_view(got_second), _deadline(), "read")
    reader.read(1, byte_view(got_first), _deadline(), "read")
    assert torch.equal(got_first, first) and torch.equal(got_second, second)


def test_a_message_of_the_wrong_size_is_refused(tmp_path) -> None:
    writer, reader = _pair(tmp_path)
    writer.write(3, byte_view(torch.zeros(10, dtype=torch.uint8)), _deadline())
    with pytest.raises(
        AFDConnectionError, match="tagged 3 of 10 bytes, but its receive expects 12"
    ):
        reader.read(3, byte_view(torch.zeros(12, dtype=torch.uint8)), _deadline(), "read")


def test_silence_ends_at_the_deadline_and_a_closed_writer_at_once(tmp_path) -> None:
    writer, reader = _pair(tmp_path)
    out = byte_view(torch.zeros(4, dtype=torch.uint8))
    started = time.monotonic()
    with pytest.raises(AFDPeerGoneError, match="sent nothing in time"):
        reader.read(0, out, time.monotonic() + 0.3, "layer 0")
    assert 0.3 <= time.monotonic() - started < 2
    closer = threading.Timer(0.3, writer.close)
    closer.start()
    started = time.monotonic()
    with pytest.raises(AFDPeerGoneError, match="the peer"):
        reader.read(0, out, _deadline(), "layer 0")
    assert time.monotonic() - started < 2


def _write_then_die(path: str, nonce: bytes) -> None:
    ring = Ring(path, writer=True, nonce=nonce, create=False)
    ring.open_bell()
    ring.write(0, memoryview(b"answer"), time.monotonic() + TIMEOUT_S)
    os._exit(0)  # no close: a crashed process tells nobody


def test_a_writer_whose_process_ends_surfaces_at_once(tmp_path) -> None:
    path, nonce = str(tmp_path / "ring"), os.urandom(16)
    reader = Ring(path, writer=False, nonce=nonce, create=True)
    reader.open_bell()
    process = multiprocessing.get_context("spawn").Process(
        target=_write_then_die, args=(path, nonce)
    )
    process.start()
    got = bytearray(6)
    reader.read(0, memoryview(got), _deadline(), "read")  # what it wrote before it ended
    assert got == b"answer"
    process.join(TIMEOUT_S)
    started = time.monotonic()
    with pytest.raises(AFDPeerGoneError, match="process ended"):
        reader.read(1, memoryview(bytearray(6)), _deadline(), "read")
    assert time.monotonic() - started < 2


def test_a_ring_without_the_offered_nonce_is_refused(tmp_path) -> None:
    path = str(tmp_path / "ring")
    Ring(path, writer=False, nonce=b"a" * 16, create=True)
    with pytest.raises(OSError, match="does not hold the nonce"):
        Ring(path, writer=True, nonce=b"b" * 16, create=False)


def _store(port: int, hosting: bool) -> TCPStore:
    return TCPStore(
        "127.0.0.1",
        port,
        is_master=hosting,
        timeout=timedelta(seconds=TIMEOUT_S),
        wait_for_workers=False,
    )


def _negotiated(size: int, allowed: dict[int, bool]) -> dict[int, SharedMemoryPlane | str]:
    """Every member of a group of ``size`` negotiating in a thread of this process."""
    host = _store(0, True)
    stores = {0: host, **{r: _store(host.port, False) for r in range(1, size)}}
    chosen: dict[int, SharedMemoryPlane | str] = {}

    def member(rank: int) -> None:
        chosen[rank] = negotiate(stores[rank], rank, size, TIMEOUT_S, allowed.get(rank, True))

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)
    assert len(chosen) == size
    return chosen


def test_a_group_on_one_host_moves_its_layers_through_shared_memory() -> None:
    chosen = _negotiated(3, {})
    assert all(isinstance(plane, SharedMemoryPlane) for plane in chosen.values())
    assert not _ours()  # unlinked once mapped: nothing to leak if a process dies
    ffn, peer = chosen[0], chosen[2]
    assert isinstance(ffn, SharedMemoryPlane) and isinstance(peer, SharedMemoryPlane)
    hidden = torch.randn(5, 16).bfloat16()
    received, answer = torch.empty_like(hidden), torch.empty_like(hidden)
    wait_answer = peer.start(
        [Transfer(False, answer, 0, 4), Transfer(True, hidden, 0, 3)], "layer 1"
    )
    ffn.start([Transfer(False, received, 2, 3)], "receive")()
    ffn.start([Transfer(True, received * 2, 2, 4)], "send")()
    wait_answer()
    assert torch.equal(received, hidden) and torch.equal(answer, hidden * 2)
    for plane in chosen.values():
        assert isinstance(plane, SharedMemoryPlane)
        plane.close()


@pytest.mark.parametrize(
    ("allowed", "reason"),
    [
        ({0: False}, "shared_memory is false on the FFN worker"),
        ({2: False}, "shared_memory is false on the Attention peer of group rank 2"),
    ],
)
def test_shared_memory_turned_off_on_any_member_means_gloo(
    allowed: dict[int, bool], reason: str
) -> None:
    chosen = _negotiated(3, allowed)
    assert chosen == {0: reason, 1: reason, 2: reason}
    assert not _ours()


def test_a_peer_that_cannot_map_the_offered_memory_answers_why() -> None:
    """As a peer on another host would: the FFN worker's rings do not exist where it looks."""
    host = _store(0, True)
    keys = PrefixStore("shm", host)
    missing = os.path.join(shm.SHM_DIR, f"afd-{os.getpid()}-elsewhere")
    keys.set(
        "offer/1",
        json.dumps({"to_ffn": missing + "-in", "from_ffn": missing + "-out", "nonce": "00" * 16}),
    )
    keys.set("choice", "gloo, as the FFN worker decides")
    chosen = negotiate(_store(host.port, False), 1, 2, TIMEOUT_S, allowed=True)
    assert chosen == "gloo, as the FFN worker decides"
    answer = keys.get("answer/1").decode()
    assert answer.startswith(
        "the Attention peer of group rank 1 cannot map the FFN worker's shared"
    )
    assert "No such file" in answer


def test_a_ring_that_cannot_be_made_leaves_no_file(tmp_path) -> None:
    path = str(tmp_path / "ring")
    os.mkfifo(path + ".bell")  # its doorbell's name is taken
    with pytest.raises(FileExistsError):
        Ring(path, writer=False, nonce=b"a" * 16, create=True)
    assert not os.path.exists(path) and os.path.exists(path + ".bell")
