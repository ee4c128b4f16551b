"""How two upstream releases compare: the one comparator of the project.

A release is its numbers, missing ones counting as 0 (``0.28`` is ``0.28.0``), then optionally a
pre-release (``a1``, ``b1``, ``rc1``: before its release), a post-release (``.post1``: after it)
and a development release (``.dev3``: before what it precedes), ordered as PEP 440 orders them;
a local label (``0.26.0+cpu``) is ignored::

    0.26.0.dev1 < 0.26.0rc1 < 0.26.0 == 0.26.0+cpu < 0.26.0.post1 < 0.28

Standard library only and importing nothing of the project (no third-party parser: the overlay
vocabulary loads without one): the generator's pins and ``when=`` ranges
(:mod:`codegen.releases`), the runtime's choices per installed release (model classes, runners)
and the tools all compare through :func:`release_key`.
"""

from __future__ import annotations

import re

_RELEASE = re.compile(
    r"(?P<numbers>\d+(?:\.\d+)*)"
    r"(?:(?P<pre>a|b|rc)(?P<pre_n>\d+))?"
    r"(?:\.post(?P<post>\d+))?"
    r"(?:\.dev(?P<dev>\d+))?"
)
#: the order of the pre-release kinds; a release without one sorts after them (FINAL)
_PRE = {"a": 0, "b": 1, "rc": 2}
_FINAL = 3
#: where a development release of the release itself sorts: before its pre-releases
_DEV_OF_RELEASE = -1

#: a sortable key: numbers (four at least), pre-release, post-release, development release
ReleaseKey = tuple[tuple[int, ...], tuple[int, int], int, float]


def release_key(release: str) -> ReleaseKey:
    """A sortable key of ``release``.

    Raises:
        ValueError: ``release`` is not a release such as 0.28.0 or 0.26.0rc1.
    """
    match = _RELEASE.fullmatch(release.split("+", 1)[0])
    if match is None:
        raise ValueError(f"{release!r} is not a release such as 0.28.0 or 0.26.0rc1")
    numbers = tuple(int(n) for n in match["numbers"].split("."))
    numbers += (0,) * (4 - len(numbers))
    post = int(match["post"]) if match["post"] is not None else -1
    dev = float(match["dev"]) if match["dev"] is not None else float("inf")
    if match["pre"] is not None:
        pre = (_PRE[match["pre"]], int(match["pre_n"]))
    elif match["dev"] is not None and match["post"] is None:
        pre = (_DEV_OF_RELEASE, 0)
    else:
        pre = (_FINAL, 0)
    return numbers, pre, post, dev


def minor_release(release: str) -> tuple[int, int]:
    """``0.30.2+cpu`` -> ``(0, 30)``: the release line ``release`` belongs to.

    Raises:
        ValueError: ``release`` is not a release (:func:`release_key`).
    """
    major, minor = release_key(release)[0][:2]
    return major, minor
