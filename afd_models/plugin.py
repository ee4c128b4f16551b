"""The ``vllm.general_plugins`` entry point: register the AFD model classes under AFD names.

vLLM calls :func:`register` in every process it starts. Native architecture names keep resolving
to vLLM's own classes; the AFD workers ask for the ``AFD``-prefixed names below. Registration is
by ``"module:Class"`` string, so nothing is imported until a worker builds the model. This module
imports nothing generated and checks nothing: a checkout whose generated code is missing or stale
never breaks, or logs into, a vLLM run that does not use AFD. The AFD workers check it at start.
"""

from __future__ import annotations

from afd_models.release_order import minor_release, release_key

#: the package of the generated modules: each mirrors the upstream module it subclasses
GENERATED = "afd_models._generated.vllm"

#: native architecture -> (AFD architecture name, ``module:Class`` under GENERATED).
#: A new model family is one overlay file plus its entries here (docs/maintainers.md).
AFD_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "DeepseekForCausalLM": (
        "AFDDeepseekForCausalLM",
        "model_executor.models.deepseek_v2:AFDDeepseekForCausalLM",
    ),
    "DeepseekV2ForCausalLM": (
        "AFDDeepseekV2ForCausalLM",
        "model_executor.models.deepseek_v2:AFDDeepseekV2ForCausalLM",
    ),
    "DeepseekV3ForCausalLM": (
        "AFDDeepseekV3ForCausalLM",
        "model_executor.models.deepseek_v2:AFDDeepseekV3ForCausalLM",
    ),
    # before 0.30 vLLM serves V3.2 with its V3 class (the sparse indexer is switched by the
    # config); from 0.30 AFD serves its overlay of V3.2's own class (OWN_CLASS_SINCE)
    "DeepseekV32ForCausalLM": (
        "AFDDeepseekV32ForCausalLM",
        "model_executor.models.deepseek_v2:AFDDeepseekV3ForCausalLM",
    ),
    # vLLM picks V4's implementation by platform (vllm/models/deepseek_v4/__init__.py); AFD
    # has an overlay of the CPU one
    "DeepseekV4ForCausalLM": (
        "AFDDeepseekV4ForCausalLM",
        "models.deepseek_v4.cpu.model:AFDDeepseekV4ForCausalLM",
    ),
    "Qwen3MoeForCausalLM": (
        "AFDQwen3MoeForCausalLM",
        "model_executor.models.qwen3_moe:AFDQwen3MoeForCausalLM",
    ),
}


#: native architecture -> (the first vLLM release that gives it a model class of its own, the
#: ``module:Class`` under GENERATED of AFD's overlay of that class, the platforms (as
#: :func:`model_platform` names them) vLLM picks that class on): AFD serves it as
#: AFD_ARCHITECTURES says on the releases before, with the overlay from then on, and refuses it
#: by name on the other platforms
OWN_CLASS_SINCE: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # vLLM 0.30's vllm/models/deepseek_v32/__init__.py: the DSA class on CUDA, the V3 class elsewhere
    "DeepseekV32ForCausalLM": (
        "0.30",
        "models.deepseek_v32.nvidia.model:AFDDeepseekV32ForCausalLM",
        ("cuda",),
    ),
}

#: native architecture -> the first vLLM release with the implementation AFD's class is generated
#: from (V4: vLLM has it on CUDA, ROCm and XPU before 0.30; its CPU implementation is new in 0.30)
FIRST_RELEASE: dict[str, str] = {
    "DeepseekV4ForCausalLM": "0.30",
}

#: native architecture -> the platforms (:func:`model_platform` names) whose implementation AFD's
#: class is generated from; an architecture not named here is served on every platform
PLATFORMS: dict[str, tuple[str, ...]] = {
    "DeepseekV4ForCausalLM": ("cpu",),
}


#: (native architecture, platform) -> (the vLLM releases, as ``major.minor``, whose own model
#: of it fails on that platform, why): AFD refuses it there by name, before an engine starts
UPSTREAM_CANNOT_RUN: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("DeepseekV4ForCausalLM", "cpu"): (
        ("0.30", "0.32"),
        "vLLM's own DeepSeek-V4 fails its first step on the CPU platform: its attention metadata "
        "kernels are Triton-only (docs/reports/deepseek-v4-on-cpu.md)",
    ),
}


#: AFD class (``module:Class`` under GENERATED) -> why it serves one tensor-parallel lane per role:
#: the AFD workers refuse ``--tensor-parallel-size`` above 1 for it, before an engine starts
SINGLE_LANE: dict[str, str] = {
    "models.deepseek_v32.nvidia.model:AFDDeepseekV32ForCausalLM": (
        "vLLM's DeepSeek-V3.2 decoder layers leave their MoE and dense MLP outputs unreduced "
        "across tensor-parallel ranks and fold the all-reduce into the next layer's norm, while "
        "AFD's exchange hands every lane the whole output, which that all-reduce would add up "
        "once per lane"
    ),
}


def served_on(vllm_version: str) -> dict[str, tuple[str, str]]:
    """The entries of AFD_ARCHITECTURES that vLLM ``vllm_version`` is served with (AFD name,
    ``module:Class`` under GENERATED), on any platform."""
    release = release_key(vllm_version)
    served = {}
    for native, (afd_name, path) in AFD_ARCHITECTURES.items():
        if native in FIRST_RELEASE and release < release_key(FIRST_RELEASE[native]):
            continue
        if native in OWN_CLASS_SINCE and release >= release_key(OWN_CLASS_SINCE[native][0]):
            path = OWN_CLASS_SINCE[native][1]
        served[native] = (afd_name, path)
    return served


def served_platforms(native: str, vllm_version: str) -> tuple[str, ...] | None:
    """The platforms (:func:`model_platform` names) whose implementation of ``native`` AFD's
    class on vLLM ``vllm_version`` is generated from; None: every platform."""
    own = OWN_CLASS_SINCE.get(native)
    if own is not None and release_key(vllm_version) >= release_key(own[0]):
        return own[2]
    return PLATFORMS.get(native)


def registrations(vllm_version: str) -> dict[str, str]:
    """AFD architecture name -> ``module:Class`` path, as registered on vLLM ``vllm_version``."""
    return {afd: f"{GENERATED}.{path}" for afd, path in served_on(vllm_version).values()}


def model_platform(device_type: str, *, is_rocm: bool) -> str:
    """The platform a model package's per-platform pick sees (vLLM's
    ``current_platform.is_<name>()``, as ``codegen.drift.model_registry.PLATFORMS`` names them):
    the device type, except on ROCm, whose device type is ``cuda`` but whose model packages pick
    their ``amd`` implementations."""
    return "rocm" if is_rocm else device_type


def afd_architecture(
    native: str, vllm_version: str, platform: str, *, tensor_parallel_size: int = 1
) -> str:
    """The AFD architecture name for a native one on vLLM ``vllm_version``, on ``platform`` (see
    :func:`model_platform`), for engines of ``tensor_parallel_size``.

    Raises:
        ValueError: the architecture has no AFD model on that release or platform, or not for
            that many tensor-parallel ranks.
    """
    if native in FIRST_RELEASE and native not in served_on(vllm_version):
        raise ValueError(
            f"architecture {native!r} has an AFD model from vLLM {FIRST_RELEASE[native]}, the "
            f"first release with vLLM's {', '.join(PLATFORMS[native])} implementation of it, "
            f"which AFD's class is generated from; not on vLLM {vllm_version}"
        )
    if native not in AFD_ARCHITECTURES:
        raise ValueError(
            f"architecture {native!r} has no AFD model; supported: {', '.join(sorted(AFD_ARCHITECTURES))}"
        )
    platforms = served_platforms(native, vllm_version)
    if platforms is not None and platform not in platforms:
        raise ValueError(
            f"architecture {native!r} has an AFD model for vLLM's {', '.join(platforms)} "
            f"implementation only, not for this platform ({platform!r})"
        )
    releases, why = UPSTREAM_CANNOT_RUN.get((native, platform), ((), ""))
    if minor_release(vllm_version) in {minor_release(r) for r in releases}:
        raise ValueError(
            f"architecture {native!r} cannot be served on vLLM {vllm_version} ({platform}): "
            f"{why}; AFD's classes for it are generated and checked, and serve once a vLLM "
            "release runs it there"
        )
    single_lane = SINGLE_LANE.get(served_on(vllm_version)[native][1])
    if single_lane is not None and tensor_parallel_size > 1:
        raise ValueError(
            f"--tensor-parallel-size={tensor_parallel_size} is not supported with AFD for "
            f"architecture {native!r} on vLLM {vllm_version}: {single_lane}; allowed: 1"
        )
    return AFD_ARCHITECTURES[native][0]


def register() -> None:
    """Register every AFD architecture once; safe to call again (vLLM may, per process).

    Raises:
        RuntimeError: another plugin registered one of our names with a different class
            (vLLM would silently let the later registration win).
    """
    from vllm import ModelRegistry, __version__

    try:
        served = registrations(__version__)
    except ValueError:
        # a vLLM build that does not know its release (``__version__`` "dev"): nothing is
        # registered, never an error here; the AFD workers refuse it, naming the version
        return
    existing = ModelRegistry.models
    for name, path in served.items():
        current = existing.get(name)
        if current is not None:
            current_path = (
                f"{getattr(current, 'module_name', '')}:{getattr(current, 'class_name', '')}"
            )
            if current_path != path:
                raise RuntimeError(
                    f"architecture {name!r} is already registered as {current_path}, not {path}"
                )
            continue
        ModelRegistry.register_model(name, path)
