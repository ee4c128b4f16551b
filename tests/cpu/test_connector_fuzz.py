"""Fuzzing the FFN worker's listening port, stage by stage (issue 35), with hypothesis: strangers
sending bytes where the shared secret's proof goes, peers with the secret sending malformed rank
and fingerprint frames, and an admitted peer sending malformed store requests; each sent at once,
dribbled past ``timeout_s`` by a slow sender, or by many connections at once.

Every connection is dropped within ``timeout_s`` (plus slack) and logged with the reason its
bytes call for, told why only where it sent a whole malformed fingerprint; no opening or store
thread outlives it or dies of an exception; the process's peak memory does not follow an
announced length; and the FFN worker's real Attention peer is then admitted and served.

The example budget is fixed and derandomized here (CI); ``AFD_FUZZ_EXAMPLES=N`` searches N random
examples per property instead (docs/testing.md). Nothing is written to an example database.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from afd_models.cli.serve import free_port
from afd_models.connectors.base import AFDConnectionError, Fingerprint
from afd_models.connectors.p2p.auth import HELLO, MAGIC, NONCE_BYTES, PROOF_BYTES, respond
from afd_models.connectors.p2p.channel_store import FIELD, HEAD, MAX_MESSAGE_BYTES, Op
from afd_models.connectors.p2p.ffn import MAX_OPENINGS
from afd_models.connectors.p2p.wire import ACCEPTED, ANSWER, RANK, READY, REFUSED, read_answer
from afd_models.connectors.specs import GlooExtraConfig
from tests import probes
from tests.logs import AFDLines
from tests.probes import FFNInThread

SECRET = b"s3cret-token-of-the-deployment-0123"
#: each opening's deadline, short so that silent connections cost little
TIMEOUT_S = 1.0
#: what a loaded machine may add to a deadline; below SLOW_S, so a slow sender that stretched
#: the deadline byte by byte would be caught
SLACK_S = 2.0
#: how long a slow sender dribbles its bytes (pauses under ``timeout_s`` for 8 bytes or more)
SLOW_S = 4 * TIMEOUT_S
#: how much an example may raise the process's peak resident memory: an announced length of up
#: to 4 GiB must not be allocated (a whole fingerprint, at most 1 MiB, may)
PEAK_GROWTH_BYTES = 64 << 20

#: the example budget: AFD_FUZZ_EXAMPLES=N for N random examples per property, else CI's fixed,
#: derandomized one (so CI runs the same examples every time)
DEEP_EXAMPLES = int(os.environ.get("AFD_FUZZ_EXAMPLES", "0"))
settings.register_profile(
    "afd-fuzz-ci",
    max_examples=12,
    derandomize=True,
    database=None,
    deadline=None,  # an example waits for the FFN side's deadlines
    # no shrinking: its many slow examples would take minutes (hypothesis stops it after five)
    # before a failure is reported, and pytest's timeout, raised inside an example, would only
    # look like one more failure to shrink
    phases=[Phase.explicit, Phase.generate],
)
settings.register_profile(
    "afd-fuzz-deep",
    parent=settings.get_profile("afd-fuzz-ci"),
    max_examples=max(DEEP_EXAMPLES, 1),
    derandomize=False,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    print_blob=True,
)
FUZZ = settings.get_profile("afd-fuzz-deep" if DEEP_EXAMPLES else "afd-fuzz-ci")
#: examples of the store property, each forming a group of its own (a few seconds each)
STORE_EXAMPLES = max(FUZZ.max_examples // 3, 1)
#: the most one example takes (a slow sender's dribble, the deadline, the slack, a thread's end)
EXAMPLE_S = SLOW_S + TIMEOUT_S + 2 * SLACK_S
#: a hosting FFN connector waits for its real peer while every example of a property runs
HOSTING = GlooExtraConfig(connect_timeout_s=60 + FUZZ.max_examples * EXAMPLE_S, timeout_s=TIMEOUT_S)
#: a group whose admitted peer sends malformed store requests fails once this runs out
FORMING = GlooExtraConfig(connect_timeout_s=2 * TIMEOUT_S, timeout_s=TIMEOUT_S)
#: pytest's limit for a property (its examples, then the real peer)
TEST_TIMEOUT_S = int(HOSTING.connect_timeout_s + 120)

#: why the FFN side drops a connection, as it logs it
NO_WHOLE = f"it sent no whole handshake within {TIMEOUT_S:.0f} s"
LEFT = "it left during the handshake"
FAILED_AUTH = "it failed authentication"
MALFORMED = "received a malformed fingerprint"
TURNED_AWAY = "handshakes in progress already"


@dataclass(frozen=True)
class Visitor:
    """A connection to the FFN worker's listener: what it sends once it read the hello (a
    stranger: in place of the secret's proof; ``proves_secret``: after a real proof, where its
    group rank and fingerprint go), and how."""

    proves_secret: bool
    sends: bytes
    #: ``sends`` holds a whole message of its stage: the FFN side judges it without waiting
    whole: bool
    #: dribbled over SLOW_S, past the deadline
    slow: bool = False
    #: half-closed once sent (else silent until dropped)
    closes: bool = False

    def __str__(self) -> str:  # for assertion messages: the bytes may be many
        who = "a peer with the secret" if self.proves_secret else "a stranger"
        how = ", ".join(k for k in ("whole", "slow", "closes") if getattr(self, k)) or "at once"
        return f"{who} sending {len(self.sends)} bytes {self.sends[:24]!r}... ({how})"

    def reasons(self) -> set[str | None]:
        """The reasons the FFN side may log for dropping it (None: nothing, a mere probe)."""
        judged = MALFORMED if self.proves_secret else FAILED_AUTH
        if self.slow:  # it ends past the deadline: judged only if its message came whole by then
            return {NO_WHOLE, judged} if self.whole else {NO_WHOLE}
        if self.whole:
            return {judged}
        if not self.closes:
            return {NO_WHOLE}
        return {LEFT} if self.sends or self.proves_secret else {None}


@dataclass
class Visit:
    """What happened to a :class:`Visitor`."""

    visitor: Visitor
    #: its address's port, as the FFN side logs it
    port: int
    #: turned away before the hello (the FFN side ran MAX_OPENINGS openings)
    turned_away: bool = False
    #: what the FFN side sent after its hello (and its proof, to a peer with the secret)
    received: bytes = b""
    #: seconds from connecting to the FFN side closing it (None: it did not within the bound)
    closed_after_s: float | None = None


def _proof_stand_ins() -> st.SearchStrategy[Visitor]:
    """A stranger's bytes where the proof goes: random bytes (none, truncated, whole or more), a
    hello sent back with any magic, or the next stage's rank and fingerprint without a proof."""
    proof = NONCE_BYTES + PROOF_BYTES
    sends = st.one_of(
        st.binary(max_size=3 * proof),
        st.builds(
            HELLO.pack,
            st.binary(min_size=8, max_size=8),
            st.booleans(),
            st.binary(min_size=32, max_size=32),
        ),
        st.just(RANK.pack(1) + Fingerprint.bare(0).encode()),
    )
    return st.builds(
        lambda data, slow, closes: Visitor(False, data, len(data) >= proof, slow, closes),
        sends,
        st.booleans(),
        st.booleans(),
    )


#: any JSON value (floats finite: JSON has no others; integers past 64 bits, yet short enough
#: for Python to print)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
#: the fields of a fingerprint as a real (bare) one encodes them
BARE = json.loads(Fingerprint.bare(0).encode()[Fingerprint.LENGTH.size :])


def _same_kind(value: object, like: object) -> bool:
    """Whether ``value`` would pass for a fingerprint field that holds ``like``."""

    def is_int(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if isinstance(like, bool):
        return isinstance(value, bool)
    if isinstance(like, int):
        return is_int(value)
    if isinstance(like, list):
        return isinstance(value, list) and all(map(is_int, value))
    return isinstance(value, str) and (like != Fingerprint.FORMAT or value == like)


def _malformed_payloads() -> st.SearchStrategy[bytes]:
    """Fingerprint payloads none of which decodes: not UTF-8 or not JSON, JSON of another shape,
    a real fingerprint with one field of the wrong kind, one missing or one unknown, nesting
    deeper than the decoder's recursion."""
    wrong_kind = st.sampled_from(sorted(BARE)).flatmap(
        lambda name: JSON.filter(lambda v: not _same_kind(v, BARE[name])).map(
            lambda v: {**BARE, name: v}
        )
    )
    missing = st.sampled_from(sorted(BARE)).map(
        lambda name: {k: v for k, v in BARE.items() if k != name}
    )
    unknown = st.dictionaries(st.text().filter(lambda k: k not in BARE), JSON, min_size=1)
    return st.one_of(
        st.binary(max_size=256),
        JSON.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
        st.one_of(wrong_kind, missing, unknown.map(lambda extra: {**BARE, **extra})).map(
            lambda fields: json.dumps(fields).encode()
        ),
        st.integers(2_000, 200_000).map(lambda depth: b"[" * depth + b"]" * depth),
    )


@st.composite
def _malformed_fingerprints(draw: st.DrawFn) -> Visitor:
    """A peer with the secret sending any group rank and a fingerprint frame that is malformed,
    announces more than it carries, or more than a fingerprint may be (up to 4 GiB), whole or
    cut anywhere."""
    rank = RANK.pack(draw(st.integers(-(1 << 63), (1 << 63) - 1)))
    payload = draw(_malformed_payloads())
    announced = draw(
        st.one_of(
            st.just(len(payload)),
            st.integers(len(payload) + 1, Fingerprint.MAX_BYTES),
            st.integers(Fingerprint.MAX_BYTES + 1, (1 << 32) - 1),
        )
    )
    oversized = announced > Fingerprint.MAX_BYTES
    # an oversized frame is judged by its length alone: what follows stays unread
    frame = rank + Fingerprint.LENGTH.pack(announced) + (b"" if oversized else payload)
    needed = len(rank) + Fingerprint.LENGTH.size + (0 if oversized else announced)
    sends = frame[: draw(st.integers(0, len(frame)))] if draw(st.booleans()) else frame
    return Visitor(True, sends, len(sends) >= needed, draw(st.booleans()), draw(st.booleans()))


VISITORS = st.one_of(_proof_stand_ins(), _malformed_fingerprints())


def _status_bytes(key: str) -> int:
    """A memory figure of this process's /proc/self/status (``VmRSS``, ``VmHWM``), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/self/status")


class PeakMemory:
    """How far this process's resident memory peaks above what it holds at the start: the
    kernel's peak (VmHWM) is reset to now, so what hypothesis itself takes before an example
    (its caches, on a first run) does not count."""

    def __init__(self) -> None:
        Path("/proc/self/clear_refs").write_text("5")
        self._start = _status_bytes("VmRSS")

    def growth(self) -> int:
        return _status_bytes("VmHWM") - self._start


def _openings() -> int:
    """The FFN side's opening threads alive now."""
    return sum(thread.name == "afd-step-opening" for thread in threading.enumerate())


def _settled(threads: int, within_s: float) -> int:
    """The number of threads once it fell back to ``threads`` (or ``within_s`` passed)."""
    deadline = time.monotonic() + within_s
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.02)
    return threading.active_count()


def _hosting(port: int) -> int:
    """This process's threads once the FFN side at ``port`` listens and runs no opening."""
    probes.connect_when_listening(port).close()  # a probe: dropped without a word
    deadline = time.monotonic() + SLACK_S
    while _openings() and time.monotonic() < deadline:
        time.sleep(0.02)
    return threading.active_count()


def _dribbled(sends: bytes, slow: bool) -> list[tuple[float, bytes]]:
    """(pause, bytes) to send: all at once, or spread over SLOW_S and ending there."""
    if not slow:
        return [(0.0, sends)]
    pieces = max(min(len(sends), 8), 1)
    size = -(-len(sends) // pieces)
    pause = SLOW_S / (pieces + 1)
    return [(pause, sends[i * size : (i + 1) * size]) for i in range(pieces)] + [(pause, b"")]


def _visit(channel: socket.socket, visit: Visit, connected: float) -> None:
    """Play ``visit``'s visitor on ``channel`` (connected at ``connected``), recording what the
    FFN side sends and when it closes the channel (within the deadline and the slack)."""
    visitor = visit.visitor
    try:
        if visitor.proves_secret:
            respond(channel, SECRET)
        else:
            hello = probes.hello_of(channel)
            assert not hello or HELLO.unpack(hello)[:2] == (MAGIC, True), hello
            visit.turned_away = not hello
    except ConnectionError:  # closed before its hello: turned away
        visit.turned_away = True
    for pause, chunk in [] if visit.turned_away else _dribbled(visitor.sends, visitor.slow):
        # a pause ends once the FFN side answers or closes: it stops reading then
        if select.select([channel], [], [], pause)[0]:
            break
        try:
            channel.sendall(chunk)
        except OSError:  # dropped meanwhile
            break
    if visitor.closes:
        try:
            channel.shutdown(socket.SHUT_WR)
        except OSError:  # dropped already
            pass
    channel.settimeout(max(connected + TIMEOUT_S + SLACK_S - time.monotonic(), 0.01))
    try:
        visit.received = probes.received_until_closed(channel)
    except TimeoutError:
        return
    visit.closed_after_s = time.monotonic() - connected


def _visited(port: int, visitors: list[Visitor], threads: int) -> tuple[list[Visit], list[str]]:
    """The visits of ``visitors`` to the FFN side at ``port``, all connected at once, and the
    lines it logged; at most MAX_OPENINGS opening threads ran at once (sampled), and the threads
    fell back to ``threads``."""
    with AFDLines() as lines:
        channels = [probes.connect_when_listening(port) for _ in visitors]
        connected = time.monotonic()
        visits = [
            Visit(visitor, channel.getsockname()[1])
            for visitor, channel in zip(visitors, channels, strict=True)
        ]
        players = [
            threading.Thread(target=_visit, args=(channel, visit, connected), daemon=True)
            for channel, visit in zip(channels, visits, strict=True)
        ]
        most = 0
        try:
            for player in players:
                player.start()
            while any(player.is_alive() for player in players):
                assert time.monotonic() < connected + EXAMPLE_S, "a visit did not end"
                most = max(most, _openings())
                time.sleep(0.01)
        finally:
            for channel in channels:
                channel.close()
        # an opening logs once it closed its channel: wait for its thread to end
        assert _settled(threads, SLACK_S) == threads, threading.enumerate()
    assert most <= MAX_OPENINGS
    return visits, list(lines)


def _check(visit: Visit, lines: list[str]) -> None:
    """``visit`` ended as its visitor's bytes call for."""
    visitor = visit.visitor
    assert visit.closed_after_s is not None, f"{visitor} not dropped within the deadline"
    about = [line for line in lines if f" from 127.0.0.1:{visit.port}: " in line]
    if visit.turned_away:
        assert visit.received == b"" and len(about) == 1 and TURNED_AWAY in about[0], about
        return
    reasons = visitor.reasons()
    if about == []:
        assert None in reasons, f"{visitor}: not logged"
        return
    assert len(about) == 1 and any(r and r in about[0] for r in reasons), f"{visitor}: {about}"
    if MALFORMED in about[0]:  # told why, in an answer's frame: what it logged
        kind, length = ANSWER.unpack_from(visit.received)
        text = visit.received[ANSWER.size :].decode()
        assert (kind, length, text) == (REFUSED, len(text.encode()), about[0].split(": ", 2)[2])
    else:
        assert visit.received == b"", f"{visitor}: {visit.received!r}"


def _dropped(port: int, visitors: list[Visitor], threads: int) -> None:
    """``visitors`` at once at the FFN side at ``port``: each dropped as its bytes call for, the
    threads back to ``threads``, the memory's peak near what it was."""
    memory = PeakMemory()
    visits, lines = _visited(port, visitors, threads)
    for visit in visits:
        _check(visit, lines)
    assert memory.growth() <= PEAK_GROWTH_BYTES


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_each_hostile_opening_is_dropped_and_the_real_peer_served() -> None:
    """One connection per example, a stranger or a peer with the secret and a malformed
    fingerprint; the same FFN worker hosts them all, and then admits and serves its real peer."""
    port = free_port()
    ffn = FFNInThread(port, SECRET, HOSTING)
    threads = _hosting(port)

    @FUZZ
    @given(visitor=VISITORS)
    # always run: nesting deeper than the JSON decoder's recursion (a regression), a length the
    # FFN side must not allocate, slow senders whose bytes come within each read's timeout
    @example(Visitor(True, RANK.pack(1) + Fingerprint.LENGTH.pack(4000) + b"[" * 4000, True))
    @example(Visitor(True, RANK.pack(1) + Fingerprint.LENGTH.pack((1 << 32) - 1), True))
    @example(Visitor(True, RANK.pack(1) + Fingerprint.LENGTH.pack(100) + b"x" * 100, True, True))
    @example(Visitor(False, bytes(NONCE_BYTES + PROOF_BYTES), True, slow=True))
    def dropped(visitor: Visitor) -> None:
        _dropped(port, [visitor], threads)

    dropped()
    assert ffn.thread.is_alive(), ffn.error
    assert probes.real_peer_served(ffn, SECRET, HOSTING)


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_many_hostile_openings_at_once_hold_few_threads_and_the_real_peer_is_served() -> None:
    """Up to MAX_OPENINGS + 8 such connections at once: at most MAX_OPENINGS opening threads run,
    the rest are turned away at once, each is dropped as it would be alone, and then the real
    peer is admitted and served."""
    port = free_port()
    ffn = FFNInThread(port, SECRET, HOSTING)
    threads = _hosting(port)

    @settings(FUZZ, max_examples=max(FUZZ.max_examples // 3, 2))
    @given(visitors=st.lists(VISITORS, min_size=2, max_size=MAX_OPENINGS + 8))
    @example([Visitor(False, b"", False)] * (MAX_OPENINGS + 8))  # silent: some turned away
    def dropped(visitors: list[Visitor]) -> None:
        _dropped(port, visitors, threads)

    dropped()
    assert ffn.thread.is_alive(), ffn.error
    assert probes.real_peer_served(ffn, SECRET, HOSTING)


@dataclass(frozen=True)
class StoreRequests:
    """What an admitted peer sends where its store requests go, and how (as :class:`Visitor`)."""

    sends: bytes
    slow: bool = False
    closes: bool = False

    def fault(self) -> str | None:
        """What the FFN side's error must name, when this begins with a whole request that ends
        the store's service at once (None: it need not, or its first request is not one)."""
        if self.slow or len(self.sends) < HEAD.size:
            return None
        kind, length = HEAD.unpack_from(self.sends)
        if length > MAX_MESSAGE_BYTES:
            return f"more than the {MAX_MESSAGE_BYTES} allowed"
        body = self.sends[HEAD.size : HEAD.size + length]
        if len(body) < length:
            return None
        at, fields = 0, 0
        while at < length:
            if (
                at + FIELD.size > length
                or at + FIELD.size + FIELD.unpack_from(body, at)[0] > length
            ):
                return "a malformed store request"
            at += FIELD.size + FIELD.unpack_from(body, at)[0]
            fields += 1
        known = {op.value for op in Op}
        return None if kind in known else f"a store request of kind {kind} with {fields} field(s)"


def _store_requests() -> st.SearchStrategy[StoreRequests]:
    """Requests of any kind with any fields (the kinds a store knows among them), a length beyond
    MAX_MESSAGE_BYTES, fields running past their request, random bytes; at once or slowly."""
    fields = st.lists(st.binary(max_size=64), max_size=4).map(
        lambda values: b"".join(FIELD.pack(len(v)) + v for v in values)
    )
    kinds = st.one_of(
        st.sampled_from([op.value for op in Op if op != Op.DONE]), st.integers(0, 255)
    )
    framed = st.builds(lambda kind, body: HEAD.pack(kind, len(body)) + body, kinds, fields)
    oversized = st.builds(HEAD.pack, kinds, st.integers(MAX_MESSAGE_BYTES + 1, (1 << 32) - 1))
    overrun = st.builds(
        lambda kind, tail, over: (
            HEAD.pack(kind, FIELD.size + len(tail)) + FIELD.pack(len(tail) + over) + tail
        ),
        kinds,
        st.binary(max_size=8),
        st.integers(1, 1 << 31),
    )
    requests = st.lists(
        st.one_of(framed, oversized, overrun, st.binary(min_size=1, max_size=64)),
        min_size=1,
        max_size=4,
    ).map(b"".join)
    return st.builds(StoreRequests, requests, st.booleans(), st.booleans())


def _open_for(channel: socket.socket, seconds: float) -> bool:
    """Whether ``channel`` stays open for ``seconds`` (what comes meanwhile is read and dropped)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if select.select([channel], [], [], left)[0]:
            try:
                if not channel.recv(1 << 16):
                    return False
            except OSError:
                return False
    return True


@dataclass(frozen=True)
class Failure:
    """How the FFN side of a group failed."""

    error: str
    seconds: float
    #: how far the process's memory peaked above where it was once the FFN side started
    memory_growth: int


def _ffn_fails(port: int, requests: StoreRequests) -> Failure:
    """How the FFN side fails with a peer admitted as its group's one (the right rank and
    fingerprint, the secret proven) that then sends ``requests``."""
    ffn = FFNInThread(port, SECRET, FORMING)
    # measured from here: the process's first FFN side imports vLLM
    memory, started = PeakMemory(), time.monotonic()
    with probes.connect_when_listening(port) as channel:
        respond(channel, SECRET)
        channel.sendall(RANK.pack(1) + Fingerprint.bare(0).encode())
        assert (read_answer(channel), read_answer(channel)) == ((ACCEPTED, ""), (READY, ""))
        for pause, chunk in _dribbled(requests.sends, requests.slow):
            try:
                if not _open_for(channel, pause):
                    break
                channel.sendall(chunk)
            except OSError:  # closed meanwhile
                break
        if requests.closes:
            try:
                channel.shutdown(socket.SHUT_WR)
            except OSError:  # closed already
                pass
        ffn.thread.join(FORMING.connect_timeout_s + SLACK_S)
        assert not ffn.thread.is_alive(), "the FFN side did not give up"
        elapsed = time.monotonic() - started
        assert not _open_for(channel, SLACK_S), "the FFN side did not close the channel"
    assert isinstance(ffn.error, AFDConnectionError), ffn.error
    return Failure(str(ffn.error), elapsed, memory.growth())


@pytest.mark.timeout(60 + STORE_EXAMPLES * (EXAMPLE_S + FORMING.connect_timeout_s))
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_admitted_peer_with_malformed_store_requests_fails_its_group_only() -> None:
    """A peer admitted as its group's one that sends malformed store requests, at once or
    slowly: the group fails with a connection error within the connect timeout, naming a request
    that ended the store's service at once; every thread it started ends, the peak memory does
    not follow an announced length; and the next group of this process forms and serves."""
    threads = threading.active_count()

    @settings(FUZZ, max_examples=STORE_EXAMPLES)
    @given(requests=_store_requests())
    # the regression of a store thread dying of an add beyond 64 bits, and a length the FFN
    # side must not allocate
    @example(
        StoreRequests(HEAD.pack(Op.ADD, 30) + FIELD.pack(1) + b"k" + FIELD.pack(21) + b"9" * 21)
    )
    @example(StoreRequests(HEAD.pack(Op.SET, (1 << 32) - 1)))
    def fails(requests: StoreRequests) -> None:
        port = free_port()
        failure = _ffn_fails(port, requests)
        error = failure.error
        assert error.startswith("AFD gloo ffn: ") and "did not form" in error, error
        fault = requests.fault()
        assert fault is None or fault in error, error
        assert failure.seconds < FORMING.connect_timeout_s + SLACK_S
        # a store thread may wait on in the store until its timeout, the connect timeout
        assert _settled(threads, FORMING.connect_timeout_s + SLACK_S) == threads
        assert failure.memory_growth <= PEAK_GROWTH_BYTES
        assert probes.port_is_free(port)

    fails()
    port = free_port()
    extra = dataclasses.replace(HOSTING, connect_timeout_s=60)
    assert probes.real_peer_served(FFNInThread(port, SECRET, extra), SECRET, extra)
