"""Check that AFD computes exactly what native vLLM computes, for a DeepSeek or Qwen3-MoE config of yours.

    VLLM_MLA_DISABLE=1 python -m afd_models.cli.verify --hf-config path/to/config.json \\
        [--gate-on attention|ffn|both] [--tokens N] [--decode-steps D] [--seed S] \\
        [--dtype float32|bfloat16|float16] [--shrink] [--json OUT]

It writes random weights for the config (fixed seed, local tokenizer), runs a prefill batch and
decode steps through vLLM's native model and through the generated AFD Attention model whose
FFN half runs in-process behind the loopback connector (the same proxies and connector interface
as a deployment), captures every decoder layer's output on every forward, and prints the largest
absolute and relative difference per layer and overall. Exit 0 only within the dtype's tolerance:
bitwise for float32 (the computation order is the same), relative 1e-3 / 1.6e-2 for float16 /
bfloat16; 2 past it, 3 for a config it refuses (docs/maintainers.md, "Exit codes"). Each run happens in a subprocess with vLLM's in-process engine.

``--shrink`` keeps the config's structure (DeepSeek: routing method, groups, correction bias,
shared experts, dense-layer count, scaling; Qwen3-MoE: top-k normalization, sparse step, dense
layers) but makes it small enough for a CPU; without it, configs over ~1e9 parameters are refused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from afd_models.cli.tiny_models import write_checkpoint
from afd_models.cli.verify.capture import Mode, RunSettings, run_capture
from afd_models.cli.verify.compare import TOLERANCE, PlacementReport, compare, split_parameters
from afd_models.cli.verify.errors import VerifyError
from afd_models.cli.verify.shrink import shrink
from afd_models.cli.verify.validate import check_fields, check_size, load_config, validate
from afd_models.commandline import CommandParser, ExitCode
from afd_models.config import Role


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="python -m afd_models.cli.verify", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--hf-config", type=Path)
    parser.add_argument(
        "--gate-on", choices=[*(gate.value for gate in Role), "both"], default="both"
    )
    parser.add_argument("--tokens", type=int, default=16, help="prompt length of the prefill batch")
    parser.add_argument("--decode-steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="float32")
    parser.add_argument(
        "--shrink", action="store_true", help="verify a small config with the same structure"
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds each run may take")
    args = parser.parse_args(argv)
    if args.hf_config is None:
        parser.error("--hf-config is required")
    if args.tokens < 1 or args.decode_steps < 1:
        parser.error(f"--tokens={args.tokens} and --decode-steps={args.decode_steps} must be >= 1")
    try:
        return _verify(args)
    except VerifyError as exc:
        print(f"verify: {exc}", file=sys.stderr)
        return ExitCode.ERROR


def _verify(args: argparse.Namespace) -> int:
    config = load_config(args.hf_config)
    if args.shrink:
        check_fields(config)
        config = shrink(config)
    validate(config, mla_disabled=os.environ.get("VLLM_MLA_DISABLE", "0") not in ("", "0"))
    check_size(config)
    placements = [Role.FFN, Role.ATTENTION] if args.gate_on == "both" else [Role(args.gate_on)]
    settings = RunSettings(args.tokens, args.decode_steps, args.seed, args.dtype)
    reports: dict[Role, PlacementReport] = {}
    with tempfile.TemporaryDirectory(prefix="afd-verify-") as tmp:
        work = Path(tmp)
        model_dir = write_checkpoint(work / "model", config, seed=args.seed, dtype=args.dtype)
        native = run_capture(model_dir, Mode.NATIVE, settings, work, args.timeout)
        for gate in placements:
            afd = run_capture(model_dir, Mode.afd(gate), settings, work, args.timeout)
            reports[gate] = PlacementReport(
                compare(native, afd), split_parameters(native.params["attention"], afd.params)
            )
    tolerance = TOLERANCE[args.dtype]
    ok = all([_print(gate, report, args.dtype, tolerance) for gate, report in reports.items()])
    if args.json:
        results: dict[str, Any] = {
            "config": str(args.hf_config),
            "dtype": args.dtype,
            "tolerance": tolerance,
            **{f"gate_on_{gate.value}": report.as_dict() for gate, report in reports.items()},
        }
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return ExitCode.CLEAN if ok else ExitCode.BLOCK


def _print(gate: Role, report: PlacementReport, dtype: str, tolerance: float) -> bool:
    """Print one placement's table and verdict; whether it passed."""
    comparison, split = report.comparison, report.params
    print(f"\ngate on {gate.value}: {comparison.forwards} forward passes, dtype {dtype}")
    print(f"  {'layer':>5}  {'prefill max|Δ|':>15}  {'decode max|Δ|':>15}  {'max rel':>10}")
    for layer, entry in comparison.layers.items():
        print(
            f"  {layer:>5}  {entry.prefill_abs:>15.3e}  {entry.decode_abs:>15.3e}  {entry.rel:>10.3e}"
        )
    passed = report.passed(tolerance)
    if split.missing or split.extra:
        print(
            f"  parameters missing from both roles: {list(split.missing)}; "
            f"extra: {list(split.extra)}"
        )
    verdict = "PASS" if passed else "FAIL"
    exact = "bitwise" if tolerance == 0 else f"rel <= {tolerance:g}"
    print(
        f"  overall max|Δ| {comparison.max_abs:.3e}, max rel {comparison.max_rel:.3e} ({exact} required); "
        f"tokens equal: {comparison.tokens_equal}; params attention {len(split.attention)}, "
        f"ffn {len(split.ffn)}, both {len(split.both)} -> {verdict}"
    )
    return passed
