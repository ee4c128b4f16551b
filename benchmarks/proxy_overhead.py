"""What the remote-experts proxy costs: the generated AFD model in loopback vs the native model.

    python benchmarks/proxy_overhead.py [--repeat 3]

Both in vLLM's default compiled mode (on CPU: the whole forward traced once by Dynamo and compiled
by Inductor; the AFD model's exchange is the opaque ``afd::exchange`` op).
Same tiny DeepSeek-V2 config, same weights, vLLM's engine with its worker process bound to a core
(the in-process engine leaves threads unbound and its timings noisy); the time of every model
forward is summed with forward hooks in the worker (scheduling and sampling excluded). Batch 1: one request
decoding 256 tokens; batch 32: 32 requests decoding 64 tokens; native and AFD runs alternate. AFD runs its FFN half in-process
behind the loopback connector, so the difference is the proxies, the connector interface and the
second model's dispatch. Target: < 5% at batch 1 and 32.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import write_section

from afd_models.config import Role
from afd_models.launch import worker_class

RUN = r"""
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt


def install(worker):
    import time
    model = worker.model_runner.get_model()
    model.bench_spent = [0.0, 0.0]  # total, start of the running forward
    model.register_forward_pre_hook(lambda m, a: m.bench_spent.__setitem__(1, time.perf_counter()))
    model.register_forward_hook(lambda m, a, o: m.bench_spent.__setitem__(0, m.bench_spent[0] + time.perf_counter() - m.bench_spent[1]))


def reset(worker):
    worker.model_runner.get_model().bench_spent[0] = 0.0


def spent(worker):
    return worker.model_runner.get_model().bench_spent[0]


if __name__ == "__main__":
    model, mode, batch, tokens, worker = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    kwargs = dict(model=model, dtype="bfloat16", max_model_len=512, seed=0,
                  max_num_batched_tokens=2048, max_num_seqs=64)
    if mode == "afd":
        kwargs.update(worker_cls=worker,
                      additional_config={"afd": {"role": "attention", "connector": "LoopbackAFDConnector"}})
    llm = LLM(**kwargs)
    llm.collective_rpc(install)
    prompts = [TokensPrompt(prompt_token_ids=[5 + (i * 7 + j) % 400 for j in range(16)]) for i in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    llm.collective_rpc(reset)
    llm.generate(prompts, params, use_tqdm=False)
    print("RESULT", json.dumps(llm.collective_rpc(spent)[0]), flush=True)
"""

#: the AFD Attention worker of the CPU platform (afd_models/launch.py)
ATTENTION_WORKER = worker_class("cpu", Role.ATTENTION).path
ENV = {
    "VLLM_MLA_DISABLE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    # the hooks are functions sent to the engine's worker process
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
}


def run(model: Path, mode: str, batch: int, tokens: int, script: Path) -> float:
    result = subprocess.run(
        [sys.executable, str(script), str(model), mode, str(batch), str(tokens), ATTENTION_WORKER],
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(
            f"{mode} batch {batch} failed ({result.returncode}):\n{result.stderr[-3000:]}"
        )
    return float(json.loads(lines[-1].split(" ", 1)[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from afd_models.cli.tiny_models import write_tiny_model

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_model(Path(tmp) / "model", "v2", seed=0)
        script = Path(tmp) / "run.py"  # a file: the engine's worker process re-imports __main__
        script.write_text(RUN)
        for batch, tokens in ((1, 256), (32, 64)):
            natives, afds = [], []
            for _ in range(args.repeat):  # alternate, so that machine noise hits both alike
                natives.append(run(model, "native", batch, tokens, script))
                afds.append(run(model, "afd", batch, tokens, script))
            native, afd = min(natives), min(afds)
            rows.append(
                f"| {batch} | {tokens} | {native * 1e3:.1f} | {afd * 1e3:.1f} | {(afd / native - 1) * 100:+.1f}% | < +5% |"
            )
    write_section(
        "proxy_overhead",
        "Both compiled (vLLM's default mode).\n\n"
        "| batch | decode tokens | native forward ms | AFD loopback forward ms | overhead | target |\n"
        "| --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n\n"
        "Best of the repeats, summed model forward time of the measured `generate` (after a warm-up).",
    )


if __name__ == "__main__":
    main()
