"""The one release comparator (``afd_models.release_order``): the order of releases, as codegen's
ranges, the runtime's choices per release and the tools read it."""

from __future__ import annotations

import re

import pytest

from afd_models.release_order import minor_release, release_key


def test_release_order() -> None:
    """Numbers compare as numbers and missing ones are 0; a development release sorts before the
    pre-releases of its release, they before the release, a post-release after it; a local
    label is ignored."""
    ordered = [
        "0.9",
        "0.26.0.dev3",
        "0.26.0a1",
        "0.26.0b2",
        "0.26.0rc1.dev2",
        "0.26.0rc1",
        "0.26.0rc2",
        "0.26.0",
        "0.26.0.post1.dev1",
        "0.26.0.post1",
        "0.26.1",
        "0.28",
        "0.30.0",
        "1.0",
    ]
    keys = [release_key(r) for r in ordered]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert release_key("0.28") == release_key("0.28.0")
    assert release_key("0.26.0+cpu") == release_key("0.26.0")
    assert release_key("0.30.1.dev12+g0abc.cpu") < release_key("0.30.1")


@pytest.mark.parametrize("release", ["", "next", "0.28-1", "v0.28", "0.28.", "0.26.0rc"])
def test_a_string_that_is_no_release_is_refused_by_name(release: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"{release!r} is not a release such as 0.28.0")):
        release_key(release)


@pytest.mark.parametrize(
    ("release", "line"),
    [("0.30.2+cpu", (0, 30)), ("0.28", (0, 28)), ("1", (1, 0)), ("0.26.0rc1", (0, 26))],
)
def test_minor_release(release: str, line: tuple[int, int]) -> None:
    assert minor_release(release) == line
