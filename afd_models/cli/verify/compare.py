"""How far an AFD run is from the native one: per layer and overall, and where the parameters went.

Both runs made the same forward passes (the first is the prefill batch, the rest decode steps);
each decoder layer's output (hidden states and residual) is compared by its largest absolute
difference and that difference relative to the layer's largest native value. A placement passes
within its dtype's tolerance (float32: bitwise, and the same tokens) with every native parameter
on at least one role and no parameter the native model lacks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from afd_models.cli.verify.capture import Capture
from afd_models.cli.verify.errors import VerifyError

#: the largest relative difference allowed per dtype: float32 runs compute in the same order
TOLERANCE = {"float32": 0.0, "float16": 1e-3, "bfloat16": 1.6e-2}


@dataclass(frozen=True)
class LayerDifference:
    """One decoder layer's largest differences over a run's forward passes."""

    #: largest absolute difference in the prefill pass
    prefill_abs: float
    #: largest absolute difference over the decode passes
    decode_abs: float
    #: largest absolute difference relative to the layer's largest native value, over all passes
    rel: float


@dataclass(frozen=True)
class Comparison:
    """Two runs' layer outputs and tokens compared (:func:`compare`)."""

    #: decoder layer index -> its differences, in layer order
    layers: dict[int, LayerDifference]
    max_abs: float
    max_rel: float
    #: both runs produced the same greedy tokens
    tokens_equal: bool
    #: forward passes each run made
    forwards: int


@dataclass(frozen=True)
class ParameterSplit:
    """Where the native model's parameters are in an AFD run (each sorted by name)."""

    attention: tuple[str, ...]
    ffn: tuple[str, ...]
    #: on both roles (the gate, when it runs on Attention)
    both: tuple[str, ...]
    #: native parameters on neither role
    missing: tuple[str, ...]
    #: parameters of a role the native model lacks
    extra: tuple[str, ...]


@dataclass(frozen=True)
class PlacementReport:
    """The verdict material for one gate placement."""

    comparison: Comparison
    params: ParameterSplit

    def passed(self, tolerance: float) -> bool:
        """Within ``tolerance`` (bitwise also needs equal tokens), with every parameter placed."""
        close = self.comparison.max_rel <= tolerance and (
            tolerance > 0 or self.comparison.tokens_equal
        )
        return close and not self.params.missing and not self.params.extra

    def as_dict(self) -> dict[str, Any]:
        """The report as ``verify --json`` writes it."""
        comparison = self.comparison
        return {
            "layers": {str(k): asdict(v) for k, v in comparison.layers.items()},
            "max_abs": comparison.max_abs,
            "max_rel": comparison.max_rel,
            "tokens_equal": comparison.tokens_equal,
            "forwards": comparison.forwards,
            "params": {k: list(v) for k, v in asdict(self.params).items()},
        }


def compare(native: Capture, afd: Capture) -> Comparison:
    """Largest differences per layer (prefill = first forward, decode = the rest) and overall.

    Raises:
        VerifyError: the runs made different numbers of forward passes.
    """
    calls_n, calls_a = native.calls, afd.calls
    if len(calls_n) != len(calls_a):
        raise VerifyError(
            f"the runs made {len(calls_n)} and {len(calls_a)} forward passes; they must schedule alike"
        )
    layers: dict[int, dict[str, float]] = {}
    for step, (ref_call, afd_call) in enumerate(zip(calls_n, calls_a, strict=True)):
        phase = "prefill" if step == 0 else "decode"
        for layer, (ref_h, ref_r) in ref_call.items():
            got_h, got_r = afd_call[layer]
            abs_diff = max(float((ref_h - got_h).abs().max()), float((ref_r - got_r).abs().max()))
            scale = max(float(ref_h.abs().max()), float(ref_r.abs().max()), 1e-30)
            entry = layers.setdefault(layer, {"prefill_abs": 0.0, "decode_abs": 0.0, "rel": 0.0})
            entry[f"{phase}_abs"] = max(entry[f"{phase}_abs"], abs_diff)
            entry["rel"] = max(entry["rel"], abs_diff / scale)
    differences = {k: LayerDifference(**v) for k, v in sorted(layers.items())}
    return Comparison(
        layers=differences,
        max_abs=max((max(v.prefill_abs, v.decode_abs) for v in differences.values()), default=0.0),
        max_rel=max((v.rel for v in differences.values()), default=0.0),
        tokens_equal=native.tokens == afd.tokens,
        forwards=len(calls_n),
    )


def split_parameters(native: list[str], roles: dict[str, list[str]]) -> ParameterSplit:
    """Where the ``native`` parameter names went among an AFD run's ``roles``."""
    attention, ffn = set(roles.get("attention", [])), set(roles.get("ffn", []))
    return ParameterSplit(
        attention=tuple(sorted(attention)),
        ffn=tuple(sorted(ffn)),
        both=tuple(sorted(attention & ffn)),
        missing=tuple(sorted(set(native) - attention - ffn)),
        extra=tuple(sorted((attention | ffn) - set(native))),
    )
