"""Check that AFD computes exactly what native vLLM computes, for a DeepSeek or Qwen3-MoE config of yours.

    VLLM_MLA_DISABLE=1 python -m afd_models.verify --hf-config path/to/config.json \\
        [--gate-on attention|ffn|both] [--tokens N] [--decode-steps D] [--seed S] \\
        [--dtype float32|bfloat16|float16] [--shrink] [--json OUT]

It writes random weights for the config (fixed seed, local tokenizer), runs a prefill batch and
decode steps through vLLM's native model and through the generated AFD Attention model whose
FFN half runs in-process behind the loopback connector (the same proxies and connector contract
as a deployment), captures every decoder layer's output on every forward, and prints the largest
absolute and relative difference per layer and overall. Exit 0 only within the dtype's tolerance:
bitwise for float32 (the computation order is the same), relative 1e-3 / 1.6e-2 for float16 /
bfloat16. Each run happens in a subprocess with vLLM's in-process engine.

``--shrink`` keeps the config's structure (DeepSeek: routing method, groups, correction bias,
shared experts, dense-layer count, scaling; Qwen3-MoE: top-k normalization, sparse step, dense
layers) but makes it small enough for a CPU; without it, configs over ~1e9 parameters are refused.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from afd_models.plugin import AFD_ARCHITECTURES
from afd_models.testing.tiny_models import (
    effective_config,
    is_moe_layer,
    is_qwen3_moe,
    routed_experts,
    uses_mha,
    write_checkpoint,
)

TOLERANCE = {"float32": 0.0, "float16": 1e-3, "bfloat16": 1.6e-2}
#: attention head sizes vLLM's CPU attention backend supports
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
MAX_PARAMS = 1_000_000_000
_COMMON = (
    "architectures",
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "intermediate_size",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "rms_norm_eps",
)
REQUIRED = (*_COMMON, "n_routed_experts", "first_k_dense_replace")
QWEN3_MOE_REQUIRED = (*_COMMON, "num_experts")
MLA_FIELDS = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank")


class VerifyError(ValueError):
    """The config cannot be verified; the message says why and what to change."""


def load_config(path: Path) -> dict[str, Any]:
    file = path / "config.json" if path.is_dir() else path
    try:
        config: dict[str, Any] = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise VerifyError(f"--hf-config {path}: cannot read a JSON config: {exc}") from exc
    return config


def check_fields(config: dict[str, Any]) -> None:
    """Refuse an architecture without an AFD model, or a config without the fields its family
    needs (before ``--shrink``, which reads them)."""
    architectures = config.get("architectures") or []
    if len(architectures) != 1 or architectures[0] not in AFD_ARCHITECTURES:
        raise VerifyError(
            f"architectures={architectures!r} is not an architecture with an AFD model; "
            f"allowed: one of {sorted(AFD_ARCHITECTURES)}"
        )
    qwen3 = architectures[0] == "Qwen3MoeForCausalLM"
    if qwen3 != is_qwen3_moe(config):
        raise VerifyError(
            f"model_type={config.get('model_type')!r} does not match architectures={architectures!r}"
            + ("; allowed: 'qwen3_moe'" if qwen3 else "")
        )
    if qwen3:
        missing = [key for key in QWEN3_MOE_REQUIRED if key not in config]
    else:
        missing = [key for key in REQUIRED if key not in config]
        if not uses_mha(config):
            missing += [key for key in MLA_FIELDS if key not in config]
    if missing:
        family = "Qwen3-MoE" if qwen3 else f"DeepSeek {config.get('model_type')!r}"
        raise VerifyError(f"the config lacks {missing}, which a {family} config needs")


def validate(config: dict[str, Any], *, mla_disabled: bool) -> None:
    """Refuse what cannot be verified on the CPU platform, naming the field and the fix."""
    check_fields(config)
    if is_qwen3_moe(config):
        _validate_qwen3_moe(config)
        return
    if "index_topk" in config:
        raise VerifyError(
            "index_topk is set: DeepSeek-V3.2 sparse attention cannot run on vLLM's CPU platform"
        )
    if config["n_routed_experts"] is None:
        raise VerifyError(
            "n_routed_experts=None: the model has no MoE layers, AFD has nothing to split"
        )
    transformers_accepts(config)
    if not uses_mha(config):
        if not mla_disabled:
            raise VerifyError(
                "this is an MLA config, which vLLM's CPU platform cannot run: set VLLM_MLA_DISABLE=1"
            )
        head = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
        if head not in CPU_HEAD_SIZES:
            raise VerifyError(
                f"qk_nope_head_dim + qk_rope_head_dim = {head} is not a head size CPU attention supports "
                f"({', '.join(map(str, CPU_HEAD_SIZES))}); use --shrink"
            )
    experts, group = config["n_routed_experts"], config.get("n_group") or 1
    if experts % group:
        raise VerifyError(f"n_routed_experts={experts} is not a multiple of n_group={group}")
    if (config.get("topk_group") or 1) > group:
        raise VerifyError(f"topk_group={config.get('topk_group')} exceeds n_group={group}")


def _validate_qwen3_moe(config: dict[str, Any]) -> None:
    transformers_accepts(config)
    experts, top_k = config["num_experts"], config["num_experts_per_tok"]
    if not experts:
        raise VerifyError(
            f"num_experts={experts!r}: the model has no MoE layers, AFD has nothing to split"
        )
    if not 1 <= top_k <= experts:
        raise VerifyError(
            f"num_experts_per_tok={top_k} is not allowed; allowed: 1 to num_experts={experts}"
        )
    step = config.get("decoder_sparse_step", 1)
    if step < 1:
        raise VerifyError(f"decoder_sparse_step={step} is not allowed; allowed: an integer >= 1")
    layers = config["num_hidden_layers"]
    outside = [i for i in config.get("mlp_only_layers") or [] if not 0 <= i < layers]
    if outside:
        raise VerifyError(
            f"mlp_only_layers={config['mlp_only_layers']} names layers {outside} the model does not "
            f"have; allowed: 0 to {layers - 1}"
        )
    if not any(is_moe_layer(config, i) for i in range(layers)):
        raise VerifyError(
            f"decoder_sparse_step={step} and mlp_only_layers={config.get('mlp_only_layers')} leave "
            f"no MoE layer in {layers} layers: AFD has nothing to split"
        )
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if head not in CPU_HEAD_SIZES:
        raise VerifyError(
            f"head_dim={head} is not a head size CPU attention supports "
            f"({', '.join(map(str, CPU_HEAD_SIZES))}); use --shrink"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise VerifyError(
            f"hidden_act={config['hidden_act']!r} is not allowed (vLLM's Qwen3-MoE MLP); allowed: 'silu'"
        )


def transformers_accepts(config: dict[str, Any]) -> None:
    """Refuse, in one line naming the field, a config transformers' own config class rejects."""
    from huggingface_hub.errors import StrictDataclassError

    try:
        effective_config(config)
    except (ValueError, TypeError, KeyError, StrictDataclassError) as exc:
        reason = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        if len(reason) > 300:  # an unknown model_type lists every one transformers knows
            reason = reason[:300] + " ..."
        raise VerifyError(f"transformers rejects the config: {reason}") from None


def parameter_estimate(config: dict[str, Any]) -> int:
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    expert = 3 * hidden * config["moe_intermediate_size"]
    moe_layers = sum(is_moe_layer(config, i) for i in range(layers))
    per_moe = expert * ((routed_experts(config) or 0) + (config.get("n_shared_experts") or 0))
    dense = 3 * hidden * config["intermediate_size"] * (layers - moe_layers)
    return (
        2 * config["vocab_size"] * hidden
        + moe_layers * per_moe
        + dense
        + layers * 4 * hidden * hidden
    )


def shrink(config: dict[str, Any]) -> dict[str, Any]:
    """A small config with the same routing structure (see the module docstring)."""
    if is_qwen3_moe(config):
        return _shrink_qwen3_moe(config)
    small = dict(config)
    groups = config.get("n_group") or 1
    experts = max(groups * 2, min(config["n_routed_experts"], 16) // groups * groups)
    small.update(
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=512,
        n_routed_experts=experts,
        num_experts_per_tok=min(config["num_experts_per_tok"], experts // 2),
        num_hidden_layers=min(config["num_hidden_layers"], config["first_k_dense_replace"] + 2),
        max_position_embeddings=2048,
        rope_scaling=None,
    )
    if not uses_mha(config):
        small.update(qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32, kv_lora_rank=64)
        if config.get("q_lora_rank") is not None:
            small["q_lora_rank"] = 96
    small.pop("quantization_config", None)
    return small


def _shrink_qwen3_moe(config: dict[str, Any]) -> dict[str, Any]:
    experts = max(2, min(config["num_experts"], 16))
    step = config.get("decoder_sparse_step", 1)
    layers = min(config["num_hidden_layers"], max(4, 2 * step))
    grouped = config.get("num_key_value_heads", 4) < config["num_attention_heads"]
    small = {
        **config,
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2 if grouped else 4,
        "head_dim": 64,
        "vocab_size": 512,
        "num_experts": experts,
        "num_experts_per_tok": min(config["num_experts_per_tok"], experts // 2),
        "num_hidden_layers": layers,
        "mlp_only_layers": [i for i in config.get("mlp_only_layers") or [] if i < layers],
        "max_position_embeddings": 2048,
        "rope_scaling": None,
    }
    small.pop("quantization_config", None)
    return small


# --------------------------------------------------------------------------- one run (subprocess)


def capture(
    model_dir: str, mode: str, tokens: int, decode_steps: int, seed: int, dtype: str, out: str
) -> None:
    """Run vLLM in-process on two prompts; save every decoder layer output of every forward."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs: dict[str, Any] = dict(
        model=model_dir,
        dtype=dtype,
        max_model_len=max(512, tokens + decode_steps + 8),
        enforce_eager=True,
        seed=seed,
        max_num_batched_tokens=max(512, 2 * tokens),
        max_num_seqs=4,
    )
    if mode != "native":
        gate_on_attention = mode == "afd-attention"
        kwargs.update(
            worker_cls="afd_models.workers.AFDAttentionCPUWorker",
            additional_config={
                "afd": {
                    "role": "attention",
                    "connector": "LoopbackAFDConnector",
                    "compute_gate_on_attention": gate_on_attention,
                }
            },
        )
    llm = LLM(**kwargs)
    calls: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = []
    recording = {"on": False}

    def install(worker: Any) -> dict[str, list[str]]:
        model = worker.model_runner.get_model()
        for index, layer in enumerate(model.model.layers):

            def hook(module: Any, args: Any, output: Any, index: int = index) -> None:
                if not recording["on"]:
                    return
                if index == 0:
                    calls.append({})
                calls[-1][index] = (
                    output[0].detach().float().clone(),
                    output[1].detach().float().clone(),
                )

            layer.register_forward_hook(hook)
        roles = {"attention": sorted(n for n, _ in model.named_parameters())}
        connector = getattr(worker.model_runner, "afd_connector", None)
        if connector is not None and connector.ffn_model is not None:
            roles["ffn"] = sorted(n for n, _ in connector.ffn_model.named_parameters())
        return roles

    roles = llm.collective_rpc(install)[0]
    generator = torch.Generator().manual_seed(seed)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    prompts = [
        TokensPrompt(
            prompt_token_ids=torch.randint(4, vocab, (tokens + k,), generator=generator).tolist()
        )
        for k in (0, 3)
    ]
    recording["on"] = True
    outputs = llm.generate(
        prompts,
        SamplingParams(temperature=0, max_tokens=decode_steps + 1, ignore_eos=True),
        use_tqdm=False,
    )
    recording["on"] = False
    torch.save(
        {
            "calls": calls,
            "tokens": [list(o.outputs[0].token_ids) for o in outputs],
            "params": roles,
        },
        out,
    )


# --------------------------------------------------------------------------- compare


def compare(native: dict[str, Any], afd: dict[str, Any]) -> dict[str, Any]:
    """Largest differences per layer (prefill = first forward, decode = the rest) and overall."""
    calls_n, calls_a = native["calls"], afd["calls"]
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
    return {
        "layers": {str(k): v for k, v in sorted(layers.items())},
        "max_abs": max(
            (max(v["prefill_abs"], v["decode_abs"]) for v in layers.values()), default=0.0
        ),
        "max_rel": max((v["rel"] for v in layers.values()), default=0.0),
        "tokens_equal": native["tokens"] == afd["tokens"],
        "forwards": len(calls_n),
    }


def _run(args: argparse.Namespace, model_dir: Path, mode: str, work: Path) -> dict[str, Any]:
    import torch

    out = work / f"{mode}.pt"
    command = [
        sys.executable,
        "-m",
        "afd_models.verify",
        "--_capture",
        mode,
        "--_model",
        str(model_dir),
        "--_out",
        str(out),
        "--tokens",
        str(args.tokens),
        "--decode-steps",
        str(args.decode_steps),
        "--seed",
        str(args.seed),
        "--dtype",
        args.dtype,
    ]
    print(f"[verify] running {mode} ...", file=sys.stderr, flush=True)
    # Eager on both sides (layer hooks need it); with Dynamo off, vLLM's lazily compiled helpers
    # run as plain PyTorch rather than compiling on their first call.
    env = {
        **os.environ,
        "TORCHDYNAMO_DISABLE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    if result.returncode != 0:
        raise VerifyError(
            f"the {mode} run failed (exit {result.returncode}):\n{result.stderr[-4000:]}"
        )
    data: dict[str, Any] = torch.load(out)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m afd_models.verify", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--hf-config", type=Path)
    parser.add_argument("--gate-on", choices=["attention", "ffn", "both"], default="both")
    parser.add_argument("--tokens", type=int, default=16, help="prompt length of the prefill batch")
    parser.add_argument("--decode-steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="float32")
    parser.add_argument(
        "--shrink", action="store_true", help="verify a small config with the same structure"
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds each run may take")
    parser.add_argument("--_capture", help=argparse.SUPPRESS)
    parser.add_argument("--_model", help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._capture:
        capture(
            args._model,
            args._capture,
            args.tokens,
            args.decode_steps,
            args.seed,
            args.dtype,
            args._out,
        )
        return 0
    if args.hf_config is None:
        parser.error("--hf-config is required")
    if args.tokens < 1 or args.decode_steps < 1:
        parser.error(f"--tokens={args.tokens} and --decode-steps={args.decode_steps} must be >= 1")
    try:
        return _verify(args)
    except VerifyError as exc:
        print(f"verify: {exc}", file=sys.stderr)
        return 2


def _verify(args: argparse.Namespace) -> int:
    config = load_config(args.hf_config)
    if args.shrink:
        check_fields(config)
        config = shrink(config)
    validate(config, mla_disabled=os.environ.get("VLLM_MLA_DISABLE", "0") not in ("", "0"))
    estimate = parameter_estimate(config)
    if estimate > MAX_PARAMS:
        raise VerifyError(
            f"about {estimate / 1e9:.1f}e9 parameters is too big to verify on a CPU; add --shrink"
        )
    placements = ["ffn", "attention"] if args.gate_on == "both" else [args.gate_on]
    results: dict[str, Any] = {
        "config": str(args.hf_config),
        "dtype": args.dtype,
        "tolerance": TOLERANCE[args.dtype],
    }
    with tempfile.TemporaryDirectory(prefix="afd-verify-") as tmp:
        work = Path(tmp)
        model_dir = write_checkpoint(work / "model", config, seed=args.seed, dtype=args.dtype)
        native = _run(args, model_dir, "native", work)
        for gate in placements:
            afd = _run(args, model_dir, f"afd-{gate}", work)
            report = compare(native, afd)
            report["params"] = _role_split(native["params"]["attention"], afd["params"])
            results[f"gate_on_{gate}"] = report
    ok = _print(results, placements)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if ok else 1


def _role_split(native: list[str], roles: dict[str, list[str]]) -> dict[str, Any]:
    attention, ffn = set(roles.get("attention", [])), set(roles.get("ffn", []))
    return {
        "attention": sorted(attention),
        "ffn": sorted(ffn),
        "both": sorted(attention & ffn),
        "missing": sorted(set(native) - attention - ffn),
        "extra": sorted((attention | ffn) - set(native)),
    }


def _print(results: dict[str, Any], placements: list[str]) -> bool:
    tolerance = results["tolerance"]
    ok = True
    for gate in placements:
        report = results[f"gate_on_{gate}"]
        print(f"\ngate on {gate}: {report['forwards']} forward passes, dtype {results['dtype']}")
        print(f"  {'layer':>5}  {'prefill max|Δ|':>15}  {'decode max|Δ|':>15}  {'max rel':>10}")
        for layer, entry in report["layers"].items():
            print(
                f"  {layer:>5}  {entry['prefill_abs']:>15.3e}  {entry['decode_abs']:>15.3e}  {entry['rel']:>10.3e}"
            )
        passed = report["max_rel"] <= tolerance and (tolerance > 0 or report["tokens_equal"])
        split = report["params"]
        if split["missing"] or split["extra"]:
            passed = False
            print(
                f"  parameters missing from both roles: {split['missing']}; extra: {split['extra']}"
            )
        verdict = "PASS" if passed else "FAIL"
        exact = "bitwise" if tolerance == 0 else f"rel <= {tolerance:g}"
        print(
            f"  overall max|Δ| {report['max_abs']:.3e}, max rel {report['max_rel']:.3e} ({exact} required); "
            f"tokens equal: {report['tokens_equal']}; params attention {len(split['attention'])}, "
            f"ffn {len(split['ffn'])}, both {len(split['both'])} -> {verdict}"
        )
        ok = ok and passed
    return ok


if __name__ == "__main__":
    sys.exit(main())
