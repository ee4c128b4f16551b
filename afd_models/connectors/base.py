"""The connector interface between the two roles.

Attention side (what the remote proxies call, in forward order, once per remote layer)::

    connector.send(layer_idx, hidden_states, router_logits_or_None, ubatch, token_ids=ids_or_None)
    output = connector.recv(layer_idx, like=hidden_states, ubatch=ubatch)

Token ids travel only with the layers whose routing needs them (DeepSeek-V4's hash-routed MoE
layers look their experts up by token id): the model declares those layers
(:meth:`AFDConnector.set_layers`, the fingerprint's ``token_id_layers``), the step header says
that the step's sends carry them, and any other layer sends none.

A forward step starts when the first remote layer is sent; the connector then announces the
step to the FFN side (a :class:`StepHeader`: token count, hidden size, dtype, router-logit width,
whether token ids come), so the FFN side can size its buffers. With vLLM's DBO a step runs as two micro-batches
(``ubatch`` 0 and 1, each in a thread of its own that yields between its send and its receive);
the runner says so first (:meth:`AFDConnector.split_next_step`), the header carries the split,
and the FFN side serves the micro-batches' layers in the order they reach it
(:func:`afd_models.dbo.split_step_units`). A step replayed from a CUDA graph runs no Python, so the
graph's owner announces it before the replay (:meth:`AFDConnector.announce_graph_step`), from the
header recorded while the graph was captured (:meth:`AFDConnector.capturing`: the exchange is
recorded into the graph, nothing is announced). The FFN side serves steps in a loop (a split
step unit by unit, see :mod:`afd_models.dbo`)::

    header = ffn.wait_step(stop_event)            # None once stop_event is set
    for layer_idx in layers:
        received = ffn.recv(layer_idx)            # a LayerInput, concatenated over the peers
        ffn.send(layer_idx, compute(layer_idx, received))

Every wait is bounded: a peer that stops answering raises :class:`AFDConnectionError` within
the configured timeout, never a hang.

Before any step, each Attention peer presents a :class:`Fingerprint` of its engine (topology,
gate placement, remote layers, hidden size, dtype, model identity, project version); the FFN
side compares it with its own (:func:`compare_fingerprints`) and refuses a peer that differs, so
mismatched engines fail at connect time, naming the field and both values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import struct
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from afd_models.metrics import PeerMetrics, tensor_bytes
from afd_models.topology import Group

#: dtypes a step may carry, by wire code
DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)


class AFDConnectionError(RuntimeError):
    """The peer role did not answer in time, closed the connection, or sent something unexpected."""


class AFDPeerGoneError(AFDConnectionError):
    """The peer role went away during an exchange: it closed its connection, or sent nothing
    within ``timeout_s``. With ``peer_restart_timeout_s`` a restarted peer may take its place;
    every other :class:`AFDConnectionError` (a malformed or mismatched exchange, an idle timeout)
    ends the worker as before."""


class AFDPeerLostError(AFDConnectionError):
    """The peer role went away during a step, and no restarted one passed the handshake within
    ``peer_restart_timeout_s``: the Attention runner fails the step's requests and stays up, and
    its next step waits for a peer again."""


@dataclass(frozen=True)
class StepHeader:
    """What the FFN side needs to know before a step's tensors arrive."""

    #: step number, counting from 0 per connector
    step: int
    #: tokens in the step on the sending Attention worker
    num_tokens: int
    hidden_size: int
    dtype: torch.dtype
    #: width of the router logits sent with each MoE layer, 0 when the gate runs on FFN
    logits_width: int = 0
    #: dtype of the router logits (the router may compute in float32)
    logits_dtype: torch.dtype = torch.float32
    #: the Attention side replays a captured CUDA graph for this step (the FFN side may replay
    #: one of its own for the same per-peer shapes; for any other step it runs eagerly)
    graph: bool = False
    #: tokens of the first of the step's two micro-batches (DBO); 0 when the step is not split
    ubatch_tokens: int = 0
    #: the sends of the model's token-id layers carry the tokens' ids (int32, one per row);
    #: False for a model without such layers, whose sends never carry any
    token_ids: bool = False

    MAGIC = 0xAFD0
    #: on the wire: ten little-endian int64 values
    WIRE = struct.Struct("<10q")

    @property
    def ubatches(self) -> tuple[int, ...]:
        """The tokens of each micro-batch, in order (one when the step is not split)."""
        if not self.ubatch_tokens:
            return (self.num_tokens,)
        return (self.ubatch_tokens, self.num_tokens - self.ubatch_tokens)

    def encode(self) -> bytes:
        return self.WIRE.pack(
            self.MAGIC,
            self.step,
            self.num_tokens,
            self.hidden_size,
            DTYPES.index(self.dtype),
            self.logits_width,
            DTYPES.index(self.logits_dtype),
            int(self.graph),
            self.ubatch_tokens,
            int(self.token_ids),
        )

    @classmethod
    def decode(cls, data: bytes | bytearray) -> StepHeader:
        values = cls.WIRE.unpack(data)
        magic, step, tokens, hidden, dtype_code, width, logits_code, graph, first, ids = values
        if (
            magic != cls.MAGIC
            or not all(0 <= c < len(DTYPES) for c in (dtype_code, logits_code))
            or graph not in (0, 1)
            or not (first == 0 or 0 < first < tokens)
            or ids not in (0, 1)
        ):
            raise AFDConnectionError(
                f"received a malformed step header {list(values)} (is the peer an AFD connector?)"
            )
        return cls(
            step,
            tokens,
            hidden,
            DTYPES[dtype_code],
            width,
            DTYPES[logits_code],
            bool(graph),
            first,
            bool(ids),
        )


@dataclass(frozen=True)
class Fingerprint:
    """What two engines must agree on before they exchange a step; sent once, at connect time.

    On the wire: a 4-byte big-endian length, then a JSON object of the fields plus a format tag.
    """

    #: the sender's role rank (Attention or FFN), the only field that is not compared
    role_rank: int
    #: ``num_attention_ranks`` of the sender's AFD config
    num_attention_ranks: int
    #: ``num_ffn_ranks`` of the sender's AFD config
    num_ffn_ranks: int
    #: the sender engine's ``--tensor-parallel-size``: TP rank t of one role exchanges with TP
    #: rank t of the other, so both run the same size
    tensor_parallel_size: int
    #: ``compute_gate_on_attention`` of the sender's AFD config
    compute_gate_on_attention: bool
    #: the remote layers, in forward order (Attention: its proxies; FFN: the layers it computes)
    layers: tuple[int, ...]
    #: hidden size of the model
    hidden_size: int
    #: dtype the model runs in, as torch names it without the prefix (``bfloat16``)
    dtype: str
    #: which model the engine serves (:func:`afd_models.wiring.connect.model_identity`)
    model: str
    #: version of vllm-afd-overlay the sender runs
    version: str
    #: the sender's connector (its data plane: both sides must run the same one)
    connector: str
    #: the remote layers whose sends carry token ids (their routing looks experts up by token)
    token_id_layers: tuple[int, ...] = ()

    #: format tag: a peer without it, or with another value, is not a peer of this format (5:
    #: the token-id layers named, step headers of 10 values)
    FORMAT = "afd-fingerprint/5"
    LENGTH = struct.Struct("!I")
    #: the most bytes a fingerprint may announce (a real one is well under 4 KiB)
    MAX_BYTES = 1 << 20

    @staticmethod
    def bare(role_rank: int) -> Fingerprint:
        """A fingerprint with no engine behind it (benchmarks and tests that move raw tensors);
        it matches only another bare one."""
        return Fingerprint(role_rank, 0, 0, 0, False, (), 0, "", "", "", "")

    def encode(self) -> bytes:
        payload = json.dumps(
            {"format": self.FORMAT, **{f.name: getattr(self, f.name) for f in fields(self)}},
            sort_keys=True,
        ).encode()
        return self.LENGTH.pack(len(payload)) + payload

    @classmethod
    def decode(cls, data: bytes) -> Fingerprint:
        """The fingerprint in ``data`` (length prefix included).

        Raises:
            AFDConnectionError: ``data`` is not a fingerprint of this format, saying what is wrong.
        """
        if len(data) < cls.LENGTH.size:
            raise _malformed(f"{len(data)} bytes, shorter than its length prefix")
        (length,) = cls.LENGTH.unpack_from(data)
        if length > cls.MAX_BYTES:
            raise _malformed(f"announces {length} bytes, more than the {cls.MAX_BYTES} allowed")
        if length != len(data) - cls.LENGTH.size:
            raise _malformed(f"announces {length} bytes, carries {len(data) - cls.LENGTH.size}")
        try:
            values = json.loads(data[cls.LENGTH.size :].decode())
        except (UnicodeDecodeError, ValueError) as exc:
            raise _malformed(f"not JSON ({exc})") from None
        except RecursionError:  # nested deeper than the interpreter's recursion limit
            raise _malformed("JSON nested too deeply") from None
        if not isinstance(values, dict) or values.get("format") != cls.FORMAT:
            found = values.get("format") if isinstance(values, dict) else None
            raise _malformed(f"format {found!r}, expected {cls.FORMAT!r}", values)
        expected = {f.name for f in fields(cls)} | {"format"}
        if set(values) != expected:
            raise _malformed(
                f"fields {sorted(set(values) - {'format'})}, expected {sorted(expected - {'format'})}",
                values,
            )
        problems = [
            f"{name}={values[name]!r} is not {kind}"
            for name, (kind, valid) in _FIELD_TYPES.items()
            if not valid(values[name])
        ]
        if problems:
            raise _malformed("; ".join(problems), values)
        values.pop("format")
        values["layers"] = tuple(values["layers"])
        values["token_id_layers"] = tuple(values["token_id_layers"])
        return cls(**values)


@dataclass(frozen=True)
class LayerInput:
    """What the FFN side received for one layer (of one micro-batch), every peer's rows
    concatenated in peer order."""

    hidden_states: torch.Tensor
    #: None when the gate runs on the FFN role
    router_logits: torch.Tensor | None = None
    #: the tokens' ids (int32), for a layer whose routing needs them; None for any other
    token_ids: torch.Tensor | None = None


#: the dtype of token ids on the wire (vocabularies are far below 2**31)
TOKEN_ID_DTYPE = torch.int32


def peers_with(headers: Sequence[StepHeader], ubatch: int) -> tuple[int, ...]:
    """Positions (in peer order) of the peers whose step has micro-batch ``ubatch``."""
    return tuple(p for p, h in enumerate(headers) if ubatch < len(h.ubatches))


def peer_counts(group: Group, headers: Sequence[StepHeader]) -> dict[int, int]:
    """Attention rank -> the tokens its step header announced (``headers`` in the group's peer order)."""
    return {rank: h.num_tokens for rank, h in zip(group.attention_ranks, headers, strict=True)}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: field -> (what it must be, check), for :meth:`Fingerprint.decode`
_FIELD_TYPES = {
    "role_rank": ("an integer", _is_int),
    "num_attention_ranks": ("an integer", _is_int),
    "num_ffn_ranks": ("an integer", _is_int),
    "tensor_parallel_size": ("an integer", _is_int),
    "compute_gate_on_attention": ("true or false", lambda v: isinstance(v, bool)),
    "layers": ("a list of integers", lambda v: isinstance(v, list) and all(map(_is_int, v))),
    "hidden_size": ("an integer", _is_int),
    "dtype": ("a string", lambda v: isinstance(v, str)),
    "model": ("a string", lambda v: isinstance(v, str)),
    "version": ("a string", lambda v: isinstance(v, str)),
    "connector": ("a string", lambda v: isinstance(v, str)),
    "token_id_layers": (
        "a list of integers",
        lambda v: isinstance(v, list) and all(map(_is_int, v)),
    ),
}


def _malformed(what: str, values: Any = None) -> AFDConnectionError:
    version = values.get("version") if isinstance(values, dict) else None
    runs = f"; it says it runs vllm-afd-overlay {version}" if isinstance(version, str) else ""
    return AFDConnectionError(
        f"received a malformed fingerprint: {what}{runs} (is the peer an AFD connector of the "
        "same vllm-afd-overlay version? versions before the connect handshake send none)"
    )


def _render(value: object) -> str:
    """A fingerprint value as a mismatch message shows it (layers as ranges: ``0-3,5``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        runs: list[list[int]] = []
        for layer in value:
            if runs and layer == runs[-1][-1] + 1:
                runs[-1].append(layer)
            else:
                runs.append([layer])
        text = ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
        return f"[{text}]"
    return str(value) if value != "" else "(none)"


def compare_fingerprints(attention: Fingerprint, ffn: Fingerprint) -> list[str]:
    """Every field (but the role rank) on which an Attention peer and its FFN worker differ,
    one line each: ``num_ffn_ranks: attention rank 1 has 2, the FFN rank 0 has 1``."""
    return [
        f"{f.name}: attention rank {attention.role_rank} has {_render(getattr(attention, f.name))}, "
        f"the FFN rank {ffn.role_rank} has {_render(getattr(ffn, f.name))}"
        for f in fields(Fingerprint)
        if f.name != "role_rank" and getattr(attention, f.name) != getattr(ffn, f.name)
    ]


@dataclass
class ExchangeStats:
    """Round-trip times of the Attention side (send of a layer to its recv), for reports."""

    exchanges: int = 0
    total_s: float = 0.0
    #: of ``total_s``, the time blocked waiting for the answer (the FFN side's work and the
    #: transport); the rest is this side's own connector code
    waited_s: float = 0.0
    bytes_sent: int = 0
    #: forward steps announced to the FFN side
    steps: int = 0
    #: when each exchange in flight began, by (micro-batch, layer)
    _started: dict[tuple[int, int], float] = field(default_factory=dict)

    def started(self, exchange: tuple[int, int], nbytes: int) -> None:
        self._started[exchange] = time.perf_counter()
        self.bytes_sent += nbytes

    def finished(self, exchange: tuple[int, int]) -> float | None:
        """Seconds the exchange took (None for one that was not started)."""
        began = self._started.pop(exchange, None)
        if began is None:
            return None
        seconds = time.perf_counter() - began
        self.exchanges += 1
        self.total_s += seconds
        return seconds

    def waited(self, seconds: float) -> None:
        """An exchange's receive blocked ``seconds`` for its answer."""
        self.waited_s += seconds

    def as_dict(self) -> dict[str, float]:
        count = self.exchanges or 1
        return {
            "steps": self.steps,
            "exchanges": self.exchanges,
            "mean_round_trip_s": self.total_s / count,
            "mean_wait_s": self.waited_s / count,
            "bytes_sent": self.bytes_sent,
        }


class AFDConnector(ABC):
    """Attention side of the transport."""

    def __init__(self) -> None:
        self.layers: tuple[int, ...] = ()
        #: the remote layers whose sends carry token ids
        self.token_id_layers: frozenset[int] = frozenset()
        self.stats = ExchangeStats()
        #: the Prometheus series of the connection, once a peer is connected (none in process)
        self.metrics: PeerMetrics | None = None
        self._reset_steps()
        #: a CUDA graph is being captured: the exchange is recorded, not announced
        self.is_capturing = False
        #: the header of each captured step, by token count and whether it is split (vLLM may
        #: hold a split and an unsplit graph of one size), announced at its replays
        self._captured: dict[tuple[int, bool], StepHeader] = {}
        #: why the forward in :meth:`holding_lost_steps` lost its peer (None: it did not)
        self.lost_step: str | None = None
        self._holding = False

    def _reset_steps(self) -> None:
        """No step in progress, none planned, and the next one announced as step 0 (a new
        connection, or one formed again with a restarted peer)."""
        #: position in ``layers`` of each micro-batch's next send
        self._next = [0]
        #: the split :meth:`split_next_step` planned for the next step
        self._plan: tuple[int, ...] | None = None
        #: each micro-batch's tokens in the step in progress (one entry when not split)
        self.ubatches: tuple[int, ...] = ()
        self._step = -1

    def set_layers(self, layers: Sequence[int], token_id_layers: Sequence[int] = ()) -> None:
        """The remote layers, in forward order, and those of them whose routing needs the tokens'
        ids (from :func:`afd_models.models.remote.bind_connector`)."""
        if not layers:
            raise ValueError("the model has no remote layers: is it an AFD Attention model?")
        stray = sorted(set(token_id_layers) - set(layers))
        if stray:
            raise ValueError(f"token-id layers {stray} are not remote layers {list(layers)}")
        self.layers = tuple(layers)
        self.token_id_layers = frozenset(token_id_layers)

    def split_next_step(self, ubatch_tokens: Sequence[int]) -> None:
        """The next forward runs as two micro-batches of these token counts, in order (vLLM's
        DBO); its micro-batch ``i`` sends and receives with ``ubatch=i``."""
        tokens = tuple(ubatch_tokens)
        if len(tokens) != 2 or min(tokens) < 1:
            raise ValueError(
                f"a step splits into two micro-batches of at least one token each, not {tokens}"
            )
        self._plan = tokens

    @property
    def is_split(self) -> bool:
        """Whether the step in progress runs as micro-batches."""
        return len(self.ubatches) > 1

    def send(
        self,
        layer_idx: int,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor | None,
        ubatch: int = 0,
        *,
        token_ids: torch.Tensor | None = None,
    ) -> None:
        """Send one layer's activations of micro-batch ``ubatch`` (with its tokens' ids for a
        token-id layer, and for no other); the first remote layer of a forward (of its first
        micro-batch) opens a new step."""
        if not self.layers:
            raise AFDConnectionError(
                "send before set_layers: bind the connector to the model first"
            )
        rows = hidden_states.shape[0]
        # before the step opens: a refused send leaves a planned split in place
        token_ids = self._checked_token_ids(layer_idx, rows, token_ids)
        opens = layer_idx == self.layers[0] and ubatch == 0
        if opens:
            plan, self._plan = self._plan, None
            self.ubatches = plan if plan is not None else (rows,)
            self._next = [0] * len(self.ubatches)
        if not 0 <= ubatch < len(self._next):
            raise AFDConnectionError(
                f"layer {layer_idx} sent for micro-batch {ubatch}, but the step in progress has "
                f"{len(self._next)} (split_next_step announces a split before the forward)"
            )
        position = self._next[ubatch]
        expected = self.layers[position] if position < len(self.layers) else None
        if layer_idx != expected:
            raise AFDConnectionError(
                f"layer {layer_idx} of micro-batch {ubatch} sent out of order; the FFN side "
                f"expects layer {expected}"
            )
        if rows != self.ubatches[ubatch]:  # checked before a header announces the step
            raise AFDConnectionError(
                f"layer {layer_idx} of micro-batch {ubatch} has {rows} tokens, but its step "
                f"announced {self.ubatches[ubatch]}"
            )
        if opens:
            width, logits_dtype = (
                (0, torch.float32)
                if router_logits is None
                else (router_logits.shape[-1], router_logits.dtype)
            )
            header = StepHeader(
                -1,
                sum(self.ubatches),
                hidden_states.shape[-1],
                hidden_states.dtype,
                width,
                logits_dtype,
                ubatch_tokens=self.ubatches[0] if self.is_split else 0,
                token_ids=bool(self.token_id_layers),
            )
            if self.is_capturing:
                captured = dataclasses.replace(header, graph=True)
                self._captured[(header.num_tokens, self.is_split)] = captured
                self._capture_header(header)
            else:
                self._unless_lost(self._open_step, header)
        self._next[ubatch] += 1
        if not self.is_capturing and not self._lost:  # a held step's later sends never go out
            self.stats.started((ubatch, layer_idx), hidden_states.nbytes)
            if self.metrics is not None:
                self.metrics.sent(tensor_bytes(hidden_states, router_logits, token_ids))
        self._unless_lost(
            self._send_layer, layer_idx, hidden_states, router_logits, ubatch, token_ids
        )

    def _checked_token_ids(
        self, layer_idx: int, rows: int, token_ids: torch.Tensor | None
    ) -> torch.Tensor | None:
        """``token_ids`` as they go on the wire (int32), given exactly for the token-id layers."""
        needed = layer_idx in self.token_id_layers
        if token_ids is None:
            if needed:
                raise AFDConnectionError(
                    f"layer {layer_idx} routes by token id, but was sent without token ids"
                )
            return None
        if not needed:
            raise AFDConnectionError(
                f"layer {layer_idx} was sent token ids, but only layers "
                f"{sorted(self.token_id_layers) or 'none'} of this model route by token id"
            )
        if tuple(token_ids.shape) != (rows,):
            raise AFDConnectionError(
                f"layer {layer_idx}: token ids of shape {tuple(token_ids.shape)} for {rows} tokens"
            )
        return token_ids.to(TOKEN_ID_DTYPE)

    def recv(self, layer_idx: int, like: torch.Tensor, ubatch: int = 0) -> torch.Tensor:
        """The FFN output of ``layer_idx`` for micro-batch ``ubatch``, shaped and typed like
        ``like`` (zeros once the step lost its peer in :meth:`holding_lost_steps`)."""
        if self._lost:
            return torch.zeros_like(like)
        try:
            output = self._recv_layer(layer_idx, like, ubatch)
        except AFDPeerGoneError as exc:
            if not self._holding:
                raise
            self.lost_step = str(exc)
            return torch.zeros_like(like)
        if not self.is_capturing:
            seconds = self.stats.finished((ubatch, layer_idx))
            if self.metrics is not None and seconds is not None:
                self.metrics.exchanged(layer_idx, seconds)
                self.metrics.received(tensor_bytes(output))
        return output

    @contextlib.contextmanager
    def holding_lost_steps(self) -> Iterator[None]:
        """Around a forward whose loss its partners decide on with it
        (:mod:`afd_models.step_vote`): an exchange whose peer went away does not raise
        :class:`AFDPeerGoneError`; it and every later exchange of the forward give zeros without
        touching the wire, so the forward reaches its end, and every collective its partners
        expect, and :attr:`lost_step` says what was lost."""
        self.lost_step = None
        self._holding = True
        try:
            yield
        finally:
            self._holding = False

    @property
    def _lost(self) -> bool:
        """Whether the held forward in progress lost its peer."""
        return self._holding and self.lost_step is not None

    def _unless_lost(self, transfer: Callable[..., None], *args: Any) -> None:
        """``transfer(*args)``, unless the held step lost its peer; a loss while holding is kept."""
        if self._lost:
            return
        try:
            transfer(*args)
        except AFDPeerGoneError as exc:
            if not self._holding:
                raise
            self.lost_step = str(exc)

    def _open_step(self, header: StepHeader) -> None:
        self._step += 1
        self.stats.steps += 1
        if self.metrics is not None:
            self.metrics.step(header.num_tokens)
        self._send_header(dataclasses.replace(header, step=self._step))

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """While a CUDA graph captures a forward: its exchanges are recorded into the graph, and
        its step header is kept for :meth:`announce_graph_step` instead of being announced."""
        self.is_capturing = True
        try:
            yield
        finally:
            self.is_capturing = False

    def announce_graph_step(self, num_tokens: int, *, split: bool = False) -> None:
        """Announce a step about to be replayed from the graph captured for ``num_tokens``
        (padded) tokens, as two micro-batches if ``split``; the replay itself runs the exchanges.

        Raises:
            AFDConnectionError: no such graph was captured through this connector.
        """
        header = self._captured.get((num_tokens, split))
        if header is None:
            captured = sorted(
                f"{tokens} tokens{' split' if was_split else ''}"
                for tokens, was_split in self._captured
            )
            raise AFDConnectionError(
                f"a CUDA graph replay of {num_tokens} tokens{' split' if split else ''}, but this "
                f"connector captured graphs for {', '.join(captured) or 'no size'}"
            )
        self._unless_lost(self._open_step, header)

    def _capture_header(self, header: StepHeader) -> None:
        """What a capture does with the step header it does not announce: nothing by default."""
        return None

    def in_process_weight_bytes(self) -> int:
        """Bytes of model weights the connector holds in this process (an in-process FFN half)."""
        return 0

    @abstractmethod
    def _send_header(self, header: StepHeader) -> None: ...

    @abstractmethod
    def _send_layer(
        self,
        layer_idx: int,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor | None,
        ubatch: int,
        token_ids: torch.Tensor | None,
    ) -> None: ...

    @abstractmethod
    def _recv_layer(self, layer_idx: int, like: torch.Tensor, ubatch: int) -> torch.Tensor: ...

    def close(self) -> None:
        """Release sockets and ports; safe to call twice. Nothing to release by default."""
        return None


class FFNConnector(ABC):
    """FFN side of the transport: receives steps from one or more Attention peers."""

    #: this FFN rank and its Attention peers, in the order ``wait_step`` returns their headers
    group: Group
    #: the Prometheus series of each peer, in peer order (none by default)
    metrics: Sequence[PeerMetrics] = ()
    #: whether a step whose peer went away is computed to its end on zeros instead of raising
    #: :class:`AFDPeerGoneError` (a connector that can wait for a restarted peer sets it for an
    #: FFN server with TP partners), and what the step in progress lost (None: nothing)
    holds_lost_steps: bool = False
    lost_step: str | None = None

    @abstractmethod
    def wait_step(self, stop: threading.Event) -> list[StepHeader] | None:
        """Block until every peer announced its next step (one header per peer), or ``stop`` is set."""

    #: the headers of the step in progress, in peer order (set by ``wait_step``)
    headers: list[StepHeader]

    @abstractmethod
    def start_recv(self, layer_idx: int, ubatch: int, peers: Sequence[int]) -> Callable[[], None]:
        """Post the receives of ``layer_idx``'s micro-batch ``ubatch`` from ``peers`` (positions
        in peer order); the returned callable waits for them."""

    @abstractmethod
    def received(self, layer_idx: int, ubatch: int) -> LayerInput:
        """What the receives of ``layer_idx``'s micro-batch ``ubatch`` brought: hidden states
        (router logits, token ids), every peer's rows concatenated in peer order."""

    def recv(self, layer_idx: int, ubatch: int = 0) -> LayerInput:
        """Receive ``layer_idx``'s micro-batch ``ubatch`` from every peer that has it."""
        self.start_recv(layer_idx, ubatch, peers_with(self.headers, ubatch))()
        return self.received(layer_idx, ubatch)

    @abstractmethod
    def send(self, layer_idx: int, output: torch.Tensor, ubatch: int = 0) -> None:
        """Split ``output`` (micro-batch ``ubatch`` of ``layer_idx``) by peer and send each peer
        its rows."""

    def interrupt(self) -> None:
        """Make a ``wait_step`` blocked in another thread return (called on stop, with the event set)."""
        return None

    def close(self) -> None:
        """Release sockets and ports; safe to call twice. Nothing to release by default."""
        return None
