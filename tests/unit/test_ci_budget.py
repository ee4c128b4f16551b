"""The CI budget: docs/testing.md's table and the lines `nox -s tests` prints its steps against
(``noxfile.BUDGET_MIN``) are the same numbers, and with the reserved lines they fit 45 minutes."""

from __future__ import annotations

import re
from pathlib import Path

import noxfile
from codegen.sources import load_pins

REPO = Path(__file__).resolve().parents[2]
TABLE = re.compile(r"<!-- budget:start -->\n(.*?)<!-- budget:end -->", re.S)
#: the whole run's ceiling, reserved lines included (the developers' guide)
CEILING_MIN = 45


def _rows() -> list[tuple[str, float, str]]:
    """(key, minutes, what) of each row of the table."""
    (table,) = TABLE.findall((REPO / "docs" / "testing.md").read_text())
    rows = []
    for line in table.splitlines()[2:]:
        _, key, minutes, what = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append((key.strip("`"), float(minutes), what))
    return rows


def test_the_documented_budget_is_the_one_the_sessions_print() -> None:
    steps = {key: minutes for key, minutes, _ in _rows() if key != "reserved"}
    assert steps == noxfile.BUDGET_MIN


def test_the_budget_keeps_the_next_tiers_room_within_the_ceiling() -> None:
    """Each other release has its leg; the Model Runner V2 CPU tier (8) and the operator e2e
    tests (4) have their reserved lines, and drift's new cases 2 of the upstream tier's."""
    rows = _rows()
    releases = len(load_pins(REPO / "overlay" / "pins.toml")["vllm"].supported)
    total = sum(m * (releases - 1 if key == "release" else 1) for key, m, _ in rows)
    assert total <= CEILING_MIN, total
    assert sorted(m for key, m, _ in rows if key == "reserved") == [4, 8]
    (upstream,) = [what for key, _, what in rows if key == "unit+upstream"]
    assert "2 of these minutes are reserved for drift round 3" in upstream
