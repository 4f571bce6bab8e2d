"""summary.json as documented: strict JSON, the fields every run has and its design's
ledgers only, and docs/modes.md's tables true to the registry and the Summary."""

from __future__ import annotations

import json
import re

import pytest

from conftest import ROOT, TINY_ASYNC as ASYNC, TINY_SYNC_2R as SYNC_2R
from mpirl import registry
from mpirl.kit.common import Summary

DOC = (ROOT / "docs" / "modes.md").read_text()
SECTION = DOC[DOC.index("## summary.json"):]


def rows_of(after: str) -> list[list[str]]:
    text = SECTION[SECTION.index(after):].split("\n\n")[1]
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()[2:]]


def test_the_doc_lists_every_common_field():
    named = {f for row in rows_of("Every run:") for f in re.findall(r"`(\w+)`", row[0])}
    assert named == set(Summary.COMMON)


def test_the_doc_ledger_table_is_the_registry():
    for row in rows_of("Ledgers:"):
        ledger, designs = re.fullmatch(r"(\w+) \(([^)]*)\)", row[0]).groups()
        assert set(designs.split(", ")) == {d.name for d in registry.DESIGNS.values()
                                            if ledger in d.ledgers}, ledger
        fields = set(re.findall(r"`(\w+)`", row[1]))
        assert fields == set(registry.LEDGERS[ledger]), ledger


def _no_nan(text: str):
    raise ValueError(f"summary.json holds {text}: not strict JSON")


@pytest.mark.parametrize("name", [SYNC_2R, ASYNC])
def test_a_real_summary_is_strict_json_with_its_design_fields_only(tiny_sweep, name):
    text = (tiny_sweep / name / "summary.json").read_text()
    summary = json.loads(text, parse_constant=_no_nan)
    design = registry.design(summary["mode"])
    assert list(summary) == [*Summary.COMMON, *design.summary_fields()]
    assert summary["startup_s"] > 0.1 and summary["wall_s"] > 0
    if summary["mode"] == "sync":
        assert summary["mean_staleness"] is None          # no server: not applicable
