"""Write a benchmark's results into its section of docs/benchmarks.md (between marker comments)."""

from __future__ import annotations

import platform
import re
import time
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def machine() -> str:
    import os

    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_section(name: str, body: str, command: str | None = None) -> None:
    """Replace the ``name`` section of docs/benchmarks.md (created if missing) with ``body``,
    stamped with the ``command`` that measured it (default ``python benchmarks/<name>.py``)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    command = command or f"python benchmarks/{name}.py"
    stamp = f"_Measured {time.strftime('%Y-%m-%d')} on {machine()} by `{command}`._"
    block = f"{start}\n{stamp}\n\n{body.strip()}\n{end}"
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    if start in text:
        text = re.sub(
            re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.DOTALL
        )
    else:
        text = text.rstrip() + f"\n\n{block}\n"
    DOC.write_text(text)
    print(body)
