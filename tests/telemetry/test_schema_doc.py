"""docs/log-schema.md true to the files: its schema number, and its `updates` column table
(names in file order, types, the value a row holds where a column does not apply)
against mpirl.telemetry.schema and against a real sync run's rank file."""

from __future__ import annotations

import math
import re

import h5py
import numpy as np

from conftest import ROOT, TINY_SYNC_2R as SYNC_2R
from mpirl.telemetry.schema import SCHEMA_VERSION, UPDATE_DTYPE, UPDATE_UNSET

DOC = (ROOT / "docs" / "log-schema.md").read_text()


def column_table() -> list[tuple[str, str, str]]:
    text = DOC[DOC.index("### The `updates` columns"):]
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    out = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        out.append((cells[0].strip("`"), cells[1], cells[-1]))
    return out


def test_the_doc_names_the_schema_the_files_have():
    assert f"(schema {SCHEMA_VERSION})" in DOC.splitlines()[2]
    assert f"`schema` ({SCHEMA_VERSION})" in DOC


def test_the_column_table_is_the_schema():
    table = column_table()
    assert [name for name, _, _ in table] == list(UPDATE_DTYPE.names)
    for name, kind, unset in table:
        assert kind == {"i": "int", "f": "float"}[UPDATE_DTYPE[name].kind], name
        if name in ("update", "t_s"):              # every row has them
            assert unset == "-" and name not in UPDATE_UNSET
            continue
        value = UPDATE_UNSET.get(name, 0)
        expected = "NaN" if isinstance(value, float) and math.isnan(value) else str(value)
        assert unset == expected, name


def test_a_sync_rank_file_holds_what_the_table_says(tiny_sweep):
    with h5py.File(tiny_sweep / SYNC_2R / "rank0001.h5", "r") as f:
        u = f["updates"][...]
    assert len(u)
    # what a sync worker does not have: the actor-learner and replay columns
    for name, _, unset in column_table():
        if re.match(r"(policy_lag|queue_len|batch_size|rtt_s|inserted|sampled|prio|replay_s"
                    r"|infer_wait|send_s|param_wait|batch_wait|reply_s|data_wait|publish)",
                    name):
            values = u[name]
            if unset == "NaN":
                assert np.isnan(values).all(), name
            else:
                assert (values == float(unset)).all(), name
    assert (u["staleness"] == 0).all() and (u["dropped"] == 0).all()
    assert (u["param_version"] == u["update"] - 1).all()
