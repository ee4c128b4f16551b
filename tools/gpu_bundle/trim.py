"""What the bundle carries of vLLM's closure, what it leaves out, and what it strips from the
vllm wheel, each with why (the measurement is in docs/gpu.md).

The bundle carries the distributions the check's engine processes import, not vLLM's whole
closure: vLLM 0.26.0's CUDA wheel requires 172 distributions beside torch's, among them CUDA
compilers, CuTe-DSL and TileLang stacks and video decoders that only other models, other GPUs or
``vllm serve`` use. :data:`TRACED` is what the engines imported on vLLM 0.26.0's CPU build (the
same Python source as the CUDA wheel: the probe, the tiny model, native and AFD engines, eager
and compiled), :data:`CUDA_PATH` what vLLM's CUDA path imports on top (read from its source), and
:data:`PYTHON_312` what vLLM declares for Python > 3.11 only, which a trace on 3.11 cannot see.
Everything else is dropped, and listed in the manifest with its size and why.
"""

from __future__ import annotations

import dataclasses
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.gpu_bundle.manifest import BundleSpec, DroppedDist, Stripped, WheelInfo, WheelRole

#: imported by the check's engine processes on vLLM 0.26.0's CPU build (Python 3.11), by canonical
#: name: ``sys.modules`` at exit mapped to distributions (docs/gpu.md, "What the bundle carries")
TRACED = frozenset(
    {
        "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "annotated-types", "anyio",
        "apache-tvm-ffi", "attrs", "cachetools", "cbor2", "certifi", "charset-normalizer",
        "cloudpickle", "dill", "einops", "email-validator", "fastapi", "frozenlist",
        "googleapis-common-protos", "grpcio", "h11", "httpcore2", "httpx2", "huggingface-hub",
        "idna", "jsonschema", "jsonschema-specifications", "kernels", "llguidance",
        "mistral-common", "msgspec", "multidict", "numpy", "openai", "openai-harmony",
        "opencv-python-headless", "opentelemetry-api", "opentelemetry-exporter-http-transport",
        "opentelemetry-exporter-otlp", "opentelemetry-exporter-otlp-common",
        "opentelemetry-exporter-otlp-proto-common", "opentelemetry-exporter-otlp-proto-grpc",
        "opentelemetry-exporter-otlp-proto-http", "opentelemetry-proto", "opentelemetry-sdk",
        "opentelemetry-semantic-conventions", "opentelemetry-semantic-conventions-ai",
        "packaging", "partial-json-parser", "pillow", "prometheus-client", "propcache",
        "protobuf", "psutil", "py-cpuinfo", "pybase64", "pycountry", "pydantic", "pydantic-core",
        "pydantic-extra-types", "python-multipart", "pyyaml", "pyzmq", "referencing", "regex",
        "requests", "rpds-py", "safetensors", "sentencepiece", "setuptools", "sniffio",
        "starlette", "tiktoken", "tokenizers", "torchcodec", "torchvision", "tqdm",
        "transformers", "truststore", "typing-inspection", "urllib3", "uvloop", "vllm",
        "xgrammar", "yarl",
    }
)  # fmt: skip
#: imported by vLLM's CUDA path on top of :data:`TRACED` (not installed in the CPU build)
CUDA_PATH: Mapping[str, str] = {
    "flashinfer-python": (
        "vLLM's sampler imports its FlashInfer backend on CUDA (vllm/v1/sample/ops/"
        "topk_topp_sampler.py, flashinfer_sampler_supported), which imports flashinfer"
    ),
    "nvidia-ml-py": "flashinfer imports pynvml at import time (flashinfer/utils.py)",
}
#: declared by vLLM for Python > 3.11 only: a trace on Python 3.11 cannot see them
PYTHON_312: Mapping[str, str] = {
    "six": "vLLM requires six on Python > 3.11",
    "setuptools": "vLLM requires setuptools<81 on Python > 3.11; torch's closure has 81",
}
#: imported by the trace only because they are installed: vLLM imports them in try/except
#: ImportError and runs without them; the check never takes the path that uses them
OPTIONAL: Mapping[str, str] = {
    "opencv-python-headless": (
        "video decoding only: vllm/multimodal/video.py imports cv2 in try/except ImportError"
    ),
    "torchcodec": (
        "video decoding only: vllm/multimodal/video.py imports torchcodec in try/except ImportError"
    ),
}
TRACED_WHY = "imported by the check's engines (import trace on vLLM's CPU build)"
DROPPED_WHY = (
    "never imported by the check's engines: not in the import trace on vLLM's CPU build, not on "
    "vLLM's CUDA path for them (docs/gpu.md)"
)
#: measured for vLLM 0.26.0 (docs/gpu.md): every alternate but those of PYTHON_312 is wanted only
#: by dropped distributions; a bundle whose install then fails names the missing distribution
ALTERNATE_WHY = (
    "another version of a distribution the host has (torch's closure), wanted only by what is "
    "dropped: the host's copy serves"
)


def why_kept(name: str, role: WheelRole) -> str | None:
    """Why the check needs distribution ``name`` in the bundle, or None when it does not."""
    if name in PYTHON_312:
        return PYTHON_312[name]
    if role is WheelRole.ALTERNATE or name in OPTIONAL:
        return None
    if name in CUDA_PATH:
        return CUDA_PATH[name]
    return TRACED_WHY if name in TRACED else None


def select(wheels: Sequence[WheelInfo]) -> tuple[list[WheelInfo], list[DroppedDist]]:
    """The wheels the check needs (each with why) and the distributions it does without."""
    kept, dropped = [], []
    for wheel in wheels:
        why = why_kept(wheel.name, wheel.role)
        if why is not None:
            kept.append(dataclasses.replace(wheel, why=why))
        else:
            reason = OPTIONAL.get(wheel.name) or (
                ALTERNATE_WHY if wheel.role is WheelRole.ALTERNATE else DROPPED_WHY
            )
            dropped.append(DroppedDist(wheel.name, wheel.version, wheel.size, reason))
    return kept, dropped


# --------------------------------------------------------------------------- stripping a wheel


@dataclass(frozen=True)
class StripRule:
    """Files of a wheel a one-GPU sm_90 check never loads."""

    #: fullmatch on the file's path in the wheel
    pattern: re.Pattern[str]
    why: str


def strip_rules(spec: BundleSpec) -> Mapping[str, tuple[StripRule, ...]]:
    """The rules per distribution; the CUDA kernels' cubins for other GPUs stay: removing them
    needs cuobjdump or nvprune, which no wheel of the closure has (docs/gpu.md)."""
    python = spec.python_version.replace(".", "")
    return {
        "vllm": (
            StripRule(
                re.compile(r"vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so"),
                "FlashAttention 2: vLLM loads it in try/except ImportError and on sm_90 runs "
                "FlashAttention 3 (FA2 only for ALiBi, vllm/v1/attention/backends/fa_utils.py); "
                "the check's float32 engines run Triton attention (FlashAttention takes fp16 or "
                "bf16 only)",
            ),
            StripRule(
                re.compile(r"vllm/vllm-rs"),
                "the Rust frontend `vllm serve` can start (VLLM_RUST_FRONTEND_PATH); LLM() never "
                "starts it",
            ),
            StripRule(
                re.compile(r"vllm/third_party/fmha_sm100/.*"),
                "Blackwell (SM100) attention kernels, imported only inside MiniMax-M3's SM100 "
                "functions: an sm_90 host cannot run them",
            ),
            StripRule(
                re.compile(rf"vllm/third_party/deep_gemm/_C\.cpython-(?!{python}-)\d+-[^/]*\.so"),
                f"DeepGEMM's extension for another Python than the bundle's {spec.python_version}",
            ),
        ),
    }


def files_to_strip(wheel: Path, rules: Sequence[StripRule]) -> tuple[list[str], list[Stripped]]:
    """The files of ``wheel`` that ``rules`` remove, and what each rule removes (read from the
    wheel's central directory only)."""
    paths: list[str] = []
    by_rule: dict[StripRule, tuple[int, int]] = {}
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            rule = next((r for r in rules if r.pattern.fullmatch(info.filename)), None)
            if rule is not None:
                paths.append(info.filename)
                files, size = by_rule.get(rule, (0, 0))
                by_rule[rule] = (files + 1, size + info.compress_size)
    summary = [
        Stripped(wheel.name, rule.pattern.pattern, files, size, rule.why)
        for rule, (files, size) in by_rule.items()
    ]
    return paths, summary


def strip_wheel(source: Path, dest: Path, removed: Sequence[str]) -> None:
    """``source`` without the ``removed`` files (and their RECORD lines) at ``dest``; the other
    files keep their names, dates and permissions, so the result installs as the original."""
    gone = set(removed)
    partial = dest.with_name(f".{dest.name}.partial")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(partial, "w") as out:
        for info in src.infolist():
            if info.filename in gone:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(ln for ln in lines if ln.split(",", 1)[0] not in gone).encode()
            copy = zipfile.ZipInfo(info.filename, info.date_time)
            copy.external_attr = info.external_attr
            copy.compress_type = zipfile.ZIP_DEFLATED
            out.writestr(copy, data)
    partial.replace(dest)
