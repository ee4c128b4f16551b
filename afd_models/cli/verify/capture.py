"""One run of ``verify``: vLLM in-process on two prompts, every decoder layer's output recorded.

:func:`run_capture` (the parent) starts ``python -m afd_models.cli.verify.capture`` in a
subprocess, so that each run gets a fresh vLLM, and reads back what :func:`capture` (the child)
saved. The child runs vLLM's native model, or the generated AFD Attention model whose FFN half
runs in-process behind the loopback connector (the same proxies and connector interface as a
deployment), with the gate on either role; eager on both sides, since layer hooks need it.
"""

from __future__ import annotations

import enum
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from afd_models.cli.verify.errors import VerifyError
from afd_models.commandline import CommandParser
from afd_models.config import Role
from afd_models.launch import worker_class

if TYPE_CHECKING:
    import torch


class Mode(enum.Enum):
    """What a run runs: vLLM's native model, or AFD with the gate on one role."""

    NATIVE = "native"
    AFD_GATE_ON_FFN = "afd-ffn"
    AFD_GATE_ON_ATTENTION = "afd-attention"

    @staticmethod
    def afd(gate: Role) -> Mode:
        """The AFD run with the gate on the ``gate`` role."""
        return Mode(f"afd-{gate.value}")


@dataclass(frozen=True)
class Capture:
    """What one run recorded (saved by the child with ``torch.save`` as a plain dict)."""

    #: per forward pass: decoder layer index -> its (hidden states, residual) output
    calls: list[dict[int, tuple[torch.Tensor, torch.Tensor]]]
    #: the greedy output tokens of each prompt
    tokens: list[list[int]]
    #: role (``attention``, and ``ffn`` for an AFD run) -> the names of its model's parameters
    params: dict[str, list[str]]

    @staticmethod
    def load(path: Path) -> Capture:
        import torch

        data: dict[str, Any] = torch.load(path)
        return Capture(data["calls"], data["tokens"], data["params"])


@dataclass(frozen=True)
class RunSettings:
    """The settings every run of one verification shares."""

    #: prompt length of the prefill batch (the second prompt is 3 tokens longer)
    tokens: int
    #: decode steps after the prefill
    decode_steps: int
    seed: int
    dtype: str


def capture(model_dir: str, mode: Mode, settings: RunSettings, out: str) -> None:
    """Run vLLM in-process on two prompts; save every decoder layer output of every forward."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    tokens, decode_steps, seed = settings.tokens, settings.decode_steps, settings.seed
    kwargs: dict[str, Any] = dict(
        model=model_dir,
        dtype=settings.dtype,
        max_model_len=max(512, tokens + decode_steps + 8),
        enforce_eager=True,
        seed=seed,
        max_num_batched_tokens=max(512, 2 * tokens),
        max_num_seqs=4,
    )
    if mode is not Mode.NATIVE:
        kwargs.update(
            worker_cls=worker_class("cpu", Role.ATTENTION).path,
            additional_config={
                "afd": {
                    "role": Role.ATTENTION.value,
                    "connector": "LoopbackAFDConnector",
                    "compute_gate_on_attention": mode is Mode.AFD_GATE_ON_ATTENTION,
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


def run_capture(
    model_dir: Path, mode: Mode, settings: RunSettings, work: Path, timeout_s: float
) -> Capture:
    """:func:`capture` in a subprocess with vLLM's in-process engine, allowed ``timeout_s``
    seconds; what it recorded.

    Raises:
        VerifyError: the run failed (its stderr's tail is in the message).
    """
    out = work / f"{mode.value}.pt"
    command = [
        sys.executable,
        "-m",
        "afd_models.cli.verify.capture",
        mode.value,
        str(model_dir),
        str(out),
        "--tokens",
        str(settings.tokens),
        "--decode-steps",
        str(settings.decode_steps),
        "--seed",
        str(settings.seed),
        "--dtype",
        settings.dtype,
    ]
    print(f"[verify] running {mode.value} ...", file=sys.stderr, flush=True)
    # Eager on both sides (layer hooks need it); with Dynamo off, vLLM's lazily compiled helpers
    # run as plain PyTorch rather than compiling on their first call.
    env = {
        **os.environ,
        "TORCHDYNAMO_DISABLE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        raise VerifyError(
            f"the {mode.value} run failed (exit {result.returncode}):\n{result.stderr[-4000:]}"
        )
    return Capture.load(out)


def main(argv: list[str] | None = None) -> int:
    """The child's command line (started by :func:`run_capture`, not by users)."""
    parser = CommandParser(
        prog="python -m afd_models.cli.verify.capture", description=__doc__.splitlines()[0]
    )
    parser.add_argument("mode", choices=[m.value for m in Mode])
    parser.add_argument("model_dir")
    parser.add_argument("out")
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--decode-steps", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--dtype", required=True)
    args = parser.parse_args(argv)
    settings = RunSettings(args.tokens, args.decode_steps, args.seed, args.dtype)
    capture(args.model_dir, Mode(args.mode), settings, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
