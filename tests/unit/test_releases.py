"""Release ranges (``when=`` of per-release edits): parsing, membership, errors (the order of
releases itself: ``test_release_order.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from codegen.releases import applicable, parse_range


@pytest.mark.parametrize(
    ("text", "inside", "outside"),
    [
        ("vllm<0.27", ["0.26.0", "0.26.9", "0.27.0rc1"], ["0.27.0", "0.28.0"]),
        ("vllm>=0.27", ["0.27.0", "0.28.0", "1.0"], ["0.26.0", "0.27.0rc1"]),
        ("vllm>=0.26,<0.30", ["0.26.0", "0.28.0"], ["0.25.0", "0.30.0"]),
        ("vllm_ascend==0.26.0rc1", ["0.26.0rc1"], ["0.26.0"]),
        ("vllm != 0.27.0", ["0.26.0", "0.28.0"], ["0.27"]),
    ],
)
def test_ranges(text: str, inside: list[str], outside: list[str]) -> None:
    limit = parse_range(text)
    assert all(limit.contains(r) for r in inside)
    assert not any(limit.contains(r) for r in outside)


@pytest.mark.parametrize("text", ["vllm", ">=0.28", "vllm=>0.28", "vllm>=0.28,", "vllm>=next"])
def test_bad_ranges_are_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match=rf"when={text!r}.*allowed: .*'vllm>=0.28'") as error:
        parse_range(text)
    assert text in str(error.value)


@dataclass(frozen=True)
class Item:
    name: str
    when: str | None = None


def test_applicable_keeps_order_and_unlimited_items() -> None:
    items = (
        Item("a"),
        Item("old", "vllm<0.27"),
        Item("new", "vllm>=0.27"),
        Item("npu", "vllm_ascend>=0.26.0rc1"),
    )
    assert [i.name for i in applicable(items, {"vllm": "0.26.0"})] == ["a", "old"]
    assert [i.name for i in applicable(items, {"vllm": "0.28.0"})] == ["a", "new"]
    assert [i.name for i in applicable(items, {"vllm": "0.28.0", "vllm_ascend": "0.26.0rc1"})] == [
        "a",
        "new",
        "npu",
    ]
