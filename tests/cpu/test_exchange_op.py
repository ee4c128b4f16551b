"""The exchange custom op (afd_models.ops) and the worker config that splits the graph at it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.engine import run_python


def test_exchange_op_is_opaque_to_a_fullgraph_compile(vllm_env: dict[str, str]) -> None:
    """``torch.compile(fullgraph=True)`` (vLLM's setting) keeps ``afd::exchange`` as one call in the
    graph, never tracing the proxy behind it; the compiled function calls the proxy found by the
    layer name in the forward context, with and without router logits and token ids, and equals
    eager; a layer name nobody registered fails with a message naming it."""
    env = {key: value for key, value in vllm_env.items() if key != "TORCHDYNAMO_DISABLE"}
    result = run_python(
        """
        import json, socket, torch
        from vllm.config import VllmConfig
        from vllm.forward_context import set_forward_context
        from afd_models.ops import EXCHANGE, exchange

        class Proxy:  # what the op needs of a remote proxy; a socket call Dynamo cannot trace
            calls = 0
            def exchange(self, hidden, logits, token_ids):
                Proxy.calls += 1
                socket.gethostname()
                extra = 0 if logits is None else logits.sum(-1, keepdim=True)
                ids = 0 if token_ids is None else token_ids.unsqueeze(-1).to(hidden.dtype)
                return hidden * 2 + extra + ids

        config = VllmConfig()
        config.compilation_config.static_forward_context["model.layers.1.mlp.experts"] = Proxy()

        def forward(x, logits, ids=None):
            y = torch.relu(x) + 1
            return exchange(y, logits, ids, "model.layers.1.mlp.experts") - 1

        graphs = []
        def recording(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        x, logits, ids = torch.randn(5, 8), torch.randn(5, 3), torch.arange(5, dtype=torch.int32)
        results = {}
        with set_forward_context(None, config):
            for name, backend in (("recorded", recording), ("inductor", "inductor")):
                compiled = torch.compile(forward, fullgraph=True, backend=backend, dynamic=False)
                results[name] = [
                    torch.equal(compiled(x, logits), forward(x, logits)),
                    torch.equal(compiled(x, None), forward(x, None)),
                    torch.equal(compiled(x, None, ids), forward(x, None, ids)),
                ]
                torch._dynamo.reset()
            try:
                exchange(x, None, None, "model.layers.9.mlp.experts")
                missing = "no error"
            except RuntimeError as exc:
                missing = str(exc)
        targets = [str(node.target) for gm in graphs for node in gm.graph.nodes if node.op == "call_function"]
        print(json.dumps({"results": results, "targets": targets, "calls": Proxy.calls,
                          "missing": missing, "op": EXCHANGE}))
        """,
        env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["results"] == {"recorded": [True] * 3, "inductor": [True] * 3}
    assert out["op"] == "afd::exchange"
    assert out["targets"].count("afd.exchange") == 3  # one graph per logits and ids variant
    assert not any("Proxy" in target for target in out["targets"])
    assert out["calls"] == 12  # each call of each compiled and eager function reached the proxy
    assert "'model.layers.9.mlp.experts'" in out["missing"] and "afd::exchange" in out["missing"]


def test_worker_config_copies_split_at_the_exchange(
    tiny_v2: Path, vllm_env: dict[str, str]
) -> None:
    """The Attention worker's config copy lists the exchange among its splitting ops; the FFN
    worker's runs eagerly and reserves no KV cache; the engine's own config keeps vLLM's values. A real engine
    config with --pipeline-parallel-size 2 is refused before anything is built, naming the flag."""
    # no VLLM_CPU_KVCACHE_SPACE: vLLM's CPU platform would size every config's KV cache from it
    env = {key: value for key, value in vllm_env.items() if key != "VLLM_CPU_KVCACHE_SPACE"}
    result = run_python(
        f"""
        import json
        from vllm.engine.arg_utils import EngineArgs
        from afd_models.config import AFDConfigError, Role
        from afd_models.worker_config import prepare_worker_config

        def engine_config(role, **kwargs):
            return EngineArgs(model={str(tiny_v2)!r}, max_model_len=256, enable_prefix_caching=False,
                              additional_config={{"afd": {{"role": role}}}}, **kwargs).create_engine_config()

        attention = engine_config("attention")
        attention_copy, _ = prepare_worker_config(attention, Role.ATTENTION)
        ffn = engine_config("ffn")
        ffn_copy, _ = prepare_worker_config(ffn, Role.FFN)
        try:
            prepare_worker_config(engine_config("attention", pipeline_parallel_size=2), Role.ATTENTION)
            refused = "accepted"
        except AFDConfigError as exc:
            refused = str(exc)
        print(json.dumps({{
            "engine_ops": attention.compilation_config.splitting_ops,
            "copy_ops": attention_copy.compilation_config.splitting_ops,
            "copy_arch": attention_copy.model_config.hf_config.architectures,
            "engine_arch": attention.model_config.hf_config.architectures,
            "ffn_kv": [ffn.cache_config.kv_cache_memory_bytes, ffn_copy.cache_config.kv_cache_memory_bytes],
            "ffn_mode": [ffn.compilation_config.mode.name, ffn_copy.compilation_config.mode.name],
            "ffn_eager": [ffn.model_config.enforce_eager, ffn_copy.model_config.enforce_eager],
            "attention_mode": attention_copy.compilation_config.mode.name,
            "refused": refused,
        }}))
        """,
        env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.splitlines()[-1])
    assert "afd::exchange" in out["copy_ops"] and "afd::exchange" not in out["engine_ops"]
    assert (out["copy_arch"], out["engine_arch"]) == (
        ["AFDDeepseekV2ForCausalLM"],
        ["DeepseekV2ForCausalLM"],
    )
    assert out["ffn_kv"] == [None, 0]
    assert out["ffn_mode"] == ["DYNAMO_TRACE_ONCE", "NONE"] and out["ffn_eager"] == [False, True]
    assert out["attention_mode"] == "DYNAMO_TRACE_ONCE"
    assert "--pipeline-parallel-size=2" in out["refused"] and "allowed: 1" in out["refused"]


def test_remote_experts_send_token_ids_for_their_token_id_layers_only() -> None:
    """A model's forward may hand the tokens' ids to every MoE layer (DeepSeek-V4's does): the
    proxy of a token-id layer sends them, any other proxy drops them."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config

    from afd_models.models.remote import RemoteExperts, bind_connector
    from tests.unit.test_connector_interface import Recording

    with set_current_vllm_config(VllmConfig()):
        proxies = torch.nn.ModuleList(
            RemoteExperts(f"model.layers.{layer}.ffn.experts", gate=None) for layer in (1, 2)
        )
    connector = Recording()
    connector.set_layers(bind_connector(proxies, connector), token_id_layers=[2])
    hidden, ids = torch.ones(3, 4), torch.tensor([4, 5, 6])
    for proxy in proxies:
        proxy.exchange(hidden, None, ids)
    sent = connector.token_ids[2]
    assert connector.token_ids[1] is None
    assert sent is not None and sent.tolist() == [4, 5, 6]
