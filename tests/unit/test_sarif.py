"""SARIF output (:func:`codegen.report.as_sarif`) is valid SARIF 2.1.0 located in this repository.

The schema, ``golden/sarif-schema-2.1.0.json``, is OASIS's (SARIF 2.1.0 Errata 01), copied as is
from https://github.com/oasis-tcs/sarif-spec (``sarif-2.1/schema/sarif-schema-2.1.0.json`` at
e0583813964ec43cea53b6b531b402866095ed1f), under the OASIS IPR Policy. ``jsonschema`` comes with
vLLM (a requirement of vllm and mistral_common), in every environment the tests run in.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import jsonschema

from codegen.findings import Finding, Kind, Location, Severity
from codegen.report import as_sarif

REPO = Path(__file__).resolve().parents[2]
SCHEMA = Path(__file__).parent / "golden" / "sarif-schema-2.1.0.json"
LOCK = "overlay/locks/vllm-0.32.0.lock"

#: where a finding can be in our files: a line, a whole file, nowhere known
OURS = (
    Location("overlay/vllm/v1/core/sched/scheduler.py", 28),
    Location("afd_models/plugin.py"),
    None,
)
#: upstream places, old and new: none of them is a file of this repository
UPSTREAM = (
    Location("vllm/v1/core/sched/scheduler.py", 2026),
    Location("vllm/config/vllm.py"),
    None,
)
TARGET = (Location("vllm/v1/core/sched/scheduler.py", 2259), None)


def findings() -> list[Finding]:
    """One finding per combination of locations, severities spread over them, with details and
    old/new values on some."""
    combinations = itertools.product(OURS, UPSTREAM, TARGET)
    severities = itertools.cycle(Severity)
    return [
        Finding(
            Kind.DRIFT_CONTRACT_BROKEN if n % 2 else Kind.DRIFT_BODY,
            next(severities),
            f"vllm.v1.core.sched.scheduler:Scheduler.update_from_output#{n}",
            "contract 'x' no longer holds",
            ours=ours,
            upstream=upstream,
            target=target,
            old="1" if n % 3 else None,
            new="0" if n % 3 else None,
            details=("-a", "+b") if n % 2 else (),
        )
        for n, (ours, upstream, target) in enumerate(combinations)
    ]


def uris(document: dict[str, Any]) -> list[str]:
    return [
        location["physicalLocation"]["artifactLocation"]["uri"]
        for run in document["runs"]
        for result in run["results"]
        for location in result["locations"]
    ]


def test_sarif_is_valid_and_located_in_this_repository() -> None:
    """Every result validates against the official schema and has one location, a file of this
    repository (``ours``, else the lock); the upstream places are in the message."""
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft4Validator.check_schema(schema)
    given = findings()
    document = json.loads(as_sarif(given, "0.33.0", fallback=LOCK))
    jsonschema.Draft4Validator(schema).validate(document)
    (run,) = document["runs"]
    assert len(run["results"]) == len(given)
    assert all(len(result["locations"]) == 1 for result in run["results"])
    assert all((REPO / uri).is_file() for uri in uris(document)), sorted(set(uris(document)))
    by_symbol = {r["message"]["text"].split(": ", 1)[0]: r for r in run["results"]}
    for finding in given:
        result = by_symbol[finding.symbol]
        physical = result["locations"][0]["physicalLocation"]
        ours = finding.ours or Location(LOCK)
        assert physical["artifactLocation"]["uri"] == ours.path
        assert physical.get("region") == ({"startLine": ours.line} if ours.line else None)
        text = result["message"]["text"]
        for label, place in (("before", finding.upstream), ("after", finding.target)):
            assert (f"{label} {place}" in text) == (place is not None), text


def test_sarif_without_ours_falls_back_to_the_primary_lock() -> None:
    """A finding nobody located lands on the primary lock, a file of this repository."""
    finding = next(f for f in findings() if f.ours is None)
    (uri,) = uris(json.loads(as_sarif([finding], "0.33.0")))
    assert uri == "overlay/overlay.lock" and (REPO / uri).is_file()
