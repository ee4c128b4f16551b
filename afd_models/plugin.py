"""The ``vllm.general_plugins`` entry point: register the AFD model classes under AFD names.

vLLM calls :func:`register` in every process it starts. Native architecture names keep resolving
to vLLM's own classes; the AFD workers ask for the ``AFD``-prefixed names of the architecture
table (:data:`ARCHITECTURES`, one frozen row per native architecture). Registration is
by ``"module:Class"`` string, so nothing is imported until a worker builds the model. This module
imports nothing generated and checks nothing: a checkout whose generated code is missing or stale
never breaks, or logs into, a vLLM run that does not use AFD. The AFD workers check it at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from afd_models.release_order import minor_release, release_key

#: the package of the generated modules: each mirrors the upstream module it subclasses
GENERATED = "afd_models._generated.vllm"


@dataclass(frozen=True, kw_only=True)
class AFDClass:
    """One AFD model class an architecture is served with, from a vLLM release on."""

    #: the class, ``module:Class`` under GENERATED
    path: str
    #: the first vLLM release (``major.minor``) served with it; None: every release
    since: str | None = None
    #: the platforms (:func:`model_platform` names) whose implementation it is generated from,
    #: where vLLM picks one per platform; AFD refuses the architecture by name on the others.
    #: None: every platform
    platforms: tuple[str, ...] | None = None
    #: why it serves one tensor-parallel lane per role (the AFD workers refuse
    #: ``--tensor-parallel-size`` above 1 for it, before an engine starts); None: any number
    single_lane: str | None = None


@dataclass(frozen=True, kw_only=True)
class UpstreamCannotRun:
    """vLLM releases whose own model of an architecture fails on a platform: AFD refuses it there
    by name, before an engine starts."""

    #: the platform (a :func:`model_platform` name)
    platform: str
    #: the releases, as ``major.minor``
    releases: tuple[str, ...]
    #: why, for the refusal
    why: str


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """One native architecture AFD serves: a row of the architecture table."""

    #: vLLM's name of it (``architectures`` in the model's config)
    native: str
    #: the name AFD registers its model under, which the AFD workers ask vLLM for
    afd_name: str
    #: its AFD classes, oldest first: a release is served with the last one whose ``since`` it
    #: reached, and not at all before the first one's
    classes: tuple[AFDClass, ...]
    #: where vLLM's own model of it cannot run
    upstream_cannot_run: tuple[UpstreamCannotRun, ...] = ()

    def served_class(self, vllm_version: str) -> AFDClass | None:
        """The class vLLM ``vllm_version`` is served with (None: not served on that release)."""
        release = release_key(vllm_version)
        reached = [c for c in self.classes if c.since is None or release >= release_key(c.since)]
        return reached[-1] if reached else None


#: every architecture AFD serves, one row each. A new model family is one overlay file plus its
#: rows here (docs/maintainers.md, "Adding a model family").
ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture(
        native="DeepseekForCausalLM",
        afd_name="AFDDeepseekForCausalLM",
        classes=(AFDClass(path="model_executor.models.deepseek_v2:AFDDeepseekForCausalLM"),),
    ),
    Architecture(
        native="DeepseekV2ForCausalLM",
        afd_name="AFDDeepseekV2ForCausalLM",
        classes=(AFDClass(path="model_executor.models.deepseek_v2:AFDDeepseekV2ForCausalLM"),),
    ),
    Architecture(
        native="DeepseekV3ForCausalLM",
        afd_name="AFDDeepseekV3ForCausalLM",
        classes=(AFDClass(path="model_executor.models.deepseek_v2:AFDDeepseekV3ForCausalLM"),),
    ),
    Architecture(
        native="DeepseekV32ForCausalLM",
        afd_name="AFDDeepseekV32ForCausalLM",
        classes=(
            # before 0.30 vLLM serves V3.2 with its V3 class (the sparse indexer is switched by
            # the config)
            AFDClass(path="model_executor.models.deepseek_v2:AFDDeepseekV3ForCausalLM"),
            # vLLM 0.30's vllm/models/deepseek_v32/__init__.py: the DSA class on CUDA, the V3
            # class elsewhere; AFD serves its overlay of the CUDA class, and refuses V3.2
            # elsewhere by name
            AFDClass(
                path="models.deepseek_v32.nvidia.model:AFDDeepseekV32ForCausalLM",
                since="0.30",
                platforms=("cuda",),
                single_lane=(
                    "vLLM's DeepSeek-V3.2 decoder layers leave their MoE and dense MLP outputs "
                    "unreduced across tensor-parallel ranks and fold the all-reduce into the next "
                    "layer's norm, while AFD's exchange hands every lane the whole output, which "
                    "that all-reduce would add up once per lane"
                ),
            ),
        ),
    ),
    Architecture(
        native="DeepseekV4ForCausalLM",
        afd_name="AFDDeepseekV4ForCausalLM",
        # vLLM picks V4's implementation by platform (vllm/models/deepseek_v4/__init__.py): AFD
        # has an overlay of the CPU one, new in 0.30 (vLLM has V4 on CUDA, ROCm and XPU before)
        classes=(
            AFDClass(
                path="models.deepseek_v4.cpu.model:AFDDeepseekV4ForCausalLM",
                since="0.30",
                platforms=("cpu",),
            ),
        ),
        upstream_cannot_run=(
            UpstreamCannotRun(
                platform="cpu",
                releases=("0.30", "0.32"),
                why="vLLM's own DeepSeek-V4 fails its first step on the CPU platform: its "
                "attention metadata kernels are Triton-only (docs/reports/deepseek-v4-on-cpu.md)",
            ),
        ),
    ),
    Architecture(
        native="Qwen3MoeForCausalLM",
        afd_name="AFDQwen3MoeForCausalLM",
        classes=(AFDClass(path="model_executor.models.qwen3_moe:AFDQwen3MoeForCausalLM"),),
    ),
)
#: native architecture -> its row
BY_NATIVE: Mapping[str, Architecture] = MappingProxyType({a.native: a for a in ARCHITECTURES})


def served_on(vllm_version: str) -> dict[str, tuple[str, str]]:
    """The architectures vLLM ``vllm_version`` is served with: native -> (AFD name,
    ``module:Class`` under GENERATED), on any platform."""
    served = {}
    for row in ARCHITECTURES:
        found = row.served_class(vllm_version)
        if found is not None:
            served[row.native] = (row.afd_name, found.path)
    return served


def served_platforms(native: str, vllm_version: str) -> tuple[str, ...] | None:
    """The platforms (:func:`model_platform` names) whose implementation of ``native`` AFD's
    class on vLLM ``vllm_version`` (its first one, before it is served) is generated from; None:
    every platform."""
    row = BY_NATIVE[native]
    return (row.served_class(vllm_version) or row.classes[0]).platforms


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
    row = BY_NATIVE.get(native)
    if row is None:
        raise ValueError(
            f"architecture {native!r} has no AFD model; supported: {', '.join(sorted(BY_NATIVE))}"
        )
    served = row.served_class(vllm_version)
    if served is None:
        first = row.classes[0]
        implementation = ", ".join(first.platforms) + " " if first.platforms else ""
        raise ValueError(
            f"architecture {native!r} has an AFD model from vLLM {first.since}, the "
            f"first release with vLLM's {implementation}implementation of it, "
            f"which AFD's class is generated from; not on vLLM {vllm_version}"
        )
    if served.platforms is not None and platform not in served.platforms:
        raise ValueError(
            f"architecture {native!r} has an AFD model for vLLM's {', '.join(served.platforms)} "
            f"implementation only, not for this platform ({platform!r})"
        )
    for cannot in row.upstream_cannot_run:
        if cannot.platform == platform and minor_release(vllm_version) in {
            minor_release(r) for r in cannot.releases
        }:
            raise ValueError(
                f"architecture {native!r} cannot be served on vLLM {vllm_version} ({platform}): "
                f"{cannot.why}; AFD's classes for it are generated and checked, and serve once a "
                "vLLM release runs it there"
            )
    if served.single_lane is not None and tensor_parallel_size > 1:
        raise ValueError(
            f"--tensor-parallel-size={tensor_parallel_size} is not supported with AFD for "
            f"architecture {native!r} on vLLM {vllm_version}: {served.single_lane}; allowed: 1"
        )
    return row.afd_name


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
