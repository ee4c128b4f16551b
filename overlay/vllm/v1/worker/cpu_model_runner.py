"""AFD edits to vLLM's model runners: the CPU runner and the GPU runner it derives from.

One declaration per role generates a subclass of each base. The Attention runner prepares its
connector before loading the model (config checks; a loopback connector builds its FFN half
first), connects to the FFN role once the model is loaded (the handshake compares the loaded
models; the FFN role computes during vLLM's profiling forward, which comes later) and binds the
connector to the model's remote proxies; the FFN runner loads the FFN half, connects and serves
steps.
"""

from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.distributed import get_tensor_model_parallel_rank
from vllm.v1.worker.cpu_model_runner import CPUModelRunner

from afd_models.connectors.factory import connect_ffn, prepare_attention
from afd_models.ffn_server import FFNServer
from afd_models.generated import generated_subclass
from afd_models.graphs import AttentionGraphSteps, CudaGraphs, FFNGraphs
from afd_models.log import exit_process
from afd_models.models.remote import bind_connector
from codegen.markers import delta, extend, override, subclass

RUNNER_BASES = ("CPUModelRunner", "vllm.v1.worker.gpu_model_runner:GPUModelRunner")
LOAD_SPANS = (
    delta(
        "decorators",
        upstream="@instrument(span_name='Loading (CPU)')",
        ours=None,
        base="CPUModelRunner",
        why="calls super().load_model(), which opens the tracing span",
    ),
    delta(
        "decorators",
        upstream="@instrument(span_name='Loading (GPU)')",
        ours=None,
        base="GPUModelRunner",
        why="calls super().load_model(), which opens the tracing span",
    ),
)


@subclass(bases=RUNNER_BASES, name="AFDAttention{base}")
class AFDAttentionModelRunner(CPUModelRunner):
    """vLLM's runner with the AFD Attention model and its connector."""

    @override(deltas=LOAD_SPANS)
    def load_model(self, load_dummy_weights: bool = False) -> None:
        connect = prepare_attention(self.vllm_config, get_tensor_model_parallel_rank(), self.device)
        super().load_model(load_dummy_weights=load_dummy_weights)
        self.afd_connector = connect(self.get_model())
        self.afd_connector.set_layers(bind_connector(self.get_model(), self.afd_connector))
        # vLLM's GPU runner budgets the weights it measured while loading; an in-process FFN
        # half was built before, so it counts here, or the KV cache would take its memory
        if hasattr(self, "model_memory_usage"):
            self.model_memory_usage += self.afd_connector.in_process_weight_bytes()
        self.afd_graph_steps = AttentionGraphSteps(self.afd_connector)
        if type(self.model) is CUDAGraphWrapper:
            # vLLM's FULL-graph wrapper, replaced by the AFD one that announces replays
            wrapper = generated_subclass("AFDCUDAGraphWrapper", CUDAGraphWrapper)
            self.model = wrapper(
                self.model.unwrap(), self.vllm_config, runtime_mode=self.model.runtime_mode
            )
            self.model.bind_afd_steps(self.afd_graph_steps)

    @override
    def shutdown(self) -> None:
        steps = getattr(self, "afd_graph_steps", None)
        if steps is not None:
            steps.report()
        # the connector first: vLLM's shutdown synchronizes the device, which would wait forever
        # on a transfer still pending on a peer that is gone (closing aborts it)
        connector = getattr(self, "afd_connector", None)
        try:
            if connector is not None:
                connector.close()
        finally:
            super().shutdown()

    @extend
    def afd_connector_stats(self) -> dict[str, float]:
        """Round trips through the connector so far (for the demo and benchmarks)."""
        return self.afd_connector.stats.as_dict()

    @extend
    def afd_counters(self) -> dict[str, int]:
        """Graph captures and replays, and micro-batch splits, of this runner's steps."""
        return self.afd_graph_steps.counters.as_dict()


@subclass(bases=RUNNER_BASES, name="AFDFFN{base}")
class AFDFFNModelRunner(CPUModelRunner):
    """vLLM's runner loading the FFN half of the model; it serves steps instead of batches."""

    @override(deltas=LOAD_SPANS)
    def load_model(self, load_dummy_weights: bool = False) -> None:
        super().load_model(load_dummy_weights=load_dummy_weights)
        self.afd_connector = connect_ffn(
            self.vllm_config, get_tensor_model_parallel_rank(), self.get_model(), self.device
        )
        self.afd_server: FFNServer | None = None

    @extend
    def start_afd_server(self, cuda_graphs: bool) -> FFNServer:
        """Start serving the Attention peers in a background thread; a failure ends the process.

        With ``cuda_graphs`` on a CUDA device, steps every peer replays from a graph run from
        FFN graphs (afd_models.graphs); otherwise every step runs eagerly.
        """
        graphs = FFNGraphs(CudaGraphs()) if cuda_graphs and self.device.type == "cuda" else None
        self.afd_server = FFNServer(
            self.get_model(),
            self.vllm_config,
            self.afd_connector,
            hidden_size=self.model_config.get_hidden_size(),
            dtype=self.model_config.dtype,
            device=self.device,
            graphs=graphs,
            on_failure=exit_process,
        )
        self.afd_server.start()
        return self.afd_server

    @override
    def shutdown(self) -> None:
        server = getattr(self, "afd_server", None)
        connector = getattr(self, "afd_connector", None)
        try:
            if server is not None:
                server.stop()
            if connector is not None:  # before vLLM's device synchronize, as on Attention
                connector.close()
        finally:
            super().shutdown()
