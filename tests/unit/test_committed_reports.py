"""The reports committed under docs/reports name where each source came from, never a path of the
machine that made them (issue 55, item 7)."""

from __future__ import annotations

import re
from pathlib import Path

REPORTS = Path(__file__).resolve().parents[2] / "docs" / "reports"
#: an absolute path into a home, a work tree or a temporary directory
MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:root|home|Users|work|tmp|var/folders)/")


def test_no_committed_report_names_a_path_of_a_machine() -> None:
    found = [
        f"{path.relative_to(REPORTS)}:{n}"
        for path in sorted(REPORTS.rglob("*"))
        if path.is_file()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if MACHINE_PATH.search(line)
    ]
    assert len(list(REPORTS.rglob("*.json"))) > 5  # the reports are where the test looks
    assert found == []
