"""Stand-ins for what a GPU host has and this machine cannot: torch seeing CUDA devices, and
vLLM's CUDA engine (``LLM``) answering the check's calls. Only the GPU check's unit tests use
them, as packages on ``PYTHONPATH`` or inside a real wheel that pip installs."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from tools.gpu_bundle.manifest import WheelInfo, WheelRole

FAKE_TORCH = {
    "torch/__init__.py": """
import os

__version__ = os.environ.get("FAKE_TORCH_VERSION", "2.11.0+cu128")


class version:
    cuda = "12.8"


class cuda:
    @staticmethod
    def is_available():
        return int(os.environ.get("FAKE_GPUS", "1")) > 0

    @staticmethod
    def device_count():
        return int(os.environ.get("FAKE_GPUS", "1"))

    @staticmethod
    def get_device_name(index):
        return f"Fake GPU {index}"
""",
}
#: ``FAKE_VLLM``: ``hang`` (writes a child's pid to ``FAKE_VLLM_PID``) or ``raise`` at import;
#: ``FAKE_VLLM_HANG``: a cudagraph mode (``PIECEWISE``, ...) whose engines hang in ``LLM()``,
#: writing their pid to ``FAKE_VLLM_PID``
FAKE_VLLM = {
    "vllm/__init__.py": '''
import os
import subprocess
import time
from types import SimpleNamespace

behaviour = os.environ.get("FAKE_VLLM", "")
if behaviour == "hang":
    child = subprocess.Popen(["sleep", "600"])
    with open(os.environ["FAKE_VLLM_PID"], "w") as out:
        out.write(str(child.pid))
    time.sleep(600)
if behaviour == "raise":
    raise RuntimeError("fake vLLM refuses to start")
__version__ = os.environ.get("FAKE_VLLM_VERSION", "0.26.0")


class ModelRegistry:
    models = {}

    @classmethod
    def register_model(cls, name, path):
        cls.models[name] = path


class SamplingParams:
    def __init__(self, temperature=1.0, max_tokens=16, ignore_eos=False):
        self.max_tokens = max_tokens


class LLM:
    """Greedy tokens that depend on the prompt only, counters that fit the engine's mode."""

    def __init__(self, model, **kwargs):
        graphs = kwargs.get("compilation_config", {}).get("cudagraph_mode", "PIECEWISE")
        self.eager = bool(kwargs.get("enforce_eager"))
        if os.environ.get("FAKE_VLLM_HANG") == ("NONE" if self.eager else graphs):
            with open(os.environ["FAKE_VLLM_PID"], "w") as out:
                out.write(str(os.getpid()))
            time.sleep(600)
        afd = str(kwargs.get("worker_cls", "")).endswith("AFDAttentionWorker")
        runner = type("AFDAttentionGPUModelRunner" if afd else "GPUModelRunner", (), {})()
        runner.model_memory_usage = 2_000_000
        runner.afd_connector = SimpleNamespace(in_process_weight_bytes=lambda: 1_000_000)
        self.worker = type("AFDAttentionWorker" if afd else "Worker", (), {})()
        self.worker.model_runner = runner
        self.steps = 0

    def generate(self, prompts, params, use_tqdm=False):
        self.steps += params.max_tokens
        return [
            SimpleNamespace(outputs=[SimpleNamespace(token_ids=[(len(p) + t) % 97 for t in
                                                                range(params.max_tokens)])])
            for p in prompts
        ]

    def collective_rpc(self, method):
        if callable(method):
            return [method(self.worker)]
        if method == "afd_counters":
            graphs = 0 if self.eager else 4
            return [{"graph_captures": graphs, "graph_replays": 10 * graphs, "ubatch_splits": 0}]
        if method == "afd_connector_stats":
            return [{"steps": self.steps, "exchanges": 2 * self.steps, "mean_round_trip_s": 1e-4}]
        raise NotImplementedError(method)
''',
    "vllm/platforms/__init__.py": """
class _Cuda:
    def is_cuda(self):
        return True


current_platform = _Cuda()
""",
}


def write_packages(directory: Path, *packages: Mapping[str, str]) -> Path:
    """The packages' files under ``directory`` (for ``PYTHONPATH``)."""
    for package in packages:
        for path, source in package.items():
            (directory / path).parent.mkdir(parents=True, exist_ok=True)
            (directory / path).write_text(source)
    return directory


def tiny_wheel(
    directory: Path,
    name: str,
    version: str,
    files: Mapping[str, str] | None = None,
    *,
    requires: Sequence[str] = (),
    executable: Collection[str] = (),
) -> WheelInfo:
    """A real wheel pip can install: ``files`` (path to text; an empty package by default), its
    metadata requiring ``requires``, the ``executable`` files with mode 755."""
    info = f"{name}-{version}.dist-info"
    sources = files or {f"{name}/__init__.py": ""}
    contents = {path: source.encode() for path, source in sources.items()}
    metadata = [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"]
    metadata += [f"Requires-Dist: {requirement}\n" for requirement in requires]
    contents[f"{info}/METADATA"] = "".join(metadata).encode()
    contents[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    contents[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in contents.items():
            entry = zipfile.ZipInfo(path, (2024, 1, 1, 0, 0, 0))
            entry.external_attr = (0o755 if path in executable else 0o644) << 16
            zf.writestr(entry, data, zipfile.ZIP_DEFLATED)
    data = wheel.read_bytes()
    return WheelInfo(
        wheel.name, name, version, hashlib.sha256(data).hexdigest(), len(data), WheelRole.REQUIRED
    )
