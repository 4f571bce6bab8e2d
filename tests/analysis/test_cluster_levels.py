"""analysis.cluster's two-level rows: hierarchical and the flat exchanges with several
ranks per node priced by the fit of one node (shared memory) and the fit of one rank per
node (the link); native keeps its layout's one-level fit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import cluster
from mpirl.study.costmodel import Params, predict_levels

NODE = Params(alpha=2e-6, beta=2e-10, gamma=1e-10, delta=4e-6)
LINK = Params(alpha=1e-4, beta=8e-9, gamma=1e-10, delta=4e-6, duplex_links=True)


def rows(*cells) -> pd.DataFrame:
    return pd.DataFrame([{"op": "allreduce", "nodes": n, "ranks": r, "rate": rate,
                          "topology": topo, "bytes": size, "avg_s": 0.5,
                          "predicted_s": 0.25, "rel_error": -0.5}
                         for n, r, rate, topo, size in cells])


def test_two_level_exchanges_are_priced_by_both_fits_and_nothing_else_changes():
    table = rows((4, 8, "1gbit", "hierarchical", 1 << 20),      # both fits: predicted
                 (2, 8, "1gbit", "hierarchical", 1 << 20),      # no 1x4 fit: NaN
                 (4, 8, "1gbit", "butterfly", 1 << 20),         # flat, two levels too
                 (4, 8, "1gbit", "native", 1 << 20),            # MPI's: its own fit kept
                 (4, 4, "1gbit", "hierarchical", 1 << 20))      # one per node: kept
    fits = {(1, 2, cluster.SHM): NODE, (4, 4, "1gbit"): LINK, (2, 2, "1gbit"): LINK}
    out = cluster.two_level(table, fits)
    assert out["model"].tolist() == ["two-level", "two-level", "two-level", "one-level",
                                     "one-level"]
    for i, name in ((0, "hierarchical"), (2, "butterfly")):
        want = predict_levels(NODE, LINK, "allreduce", name, 4, 2, float(1 << 20))
        assert out.loc[i, "predicted_s"] == pytest.approx(want)
        assert out.loc[i, "rel_error"] == pytest.approx(want / 0.5 - 1.0)
    assert np.isnan(out.loc[1, "predicted_s"])
    assert out.loc[3:, "predicted_s"].tolist() == [0.25, 0.25]
    # butterfly's two link rounds carry both ranks' buffers: dearer than hierarchical's
    assert out.loc[2, "predicted_s"] > out.loc[0, "predicted_s"]


def test_the_levels_table_shows_measured_against_predicted():
    table = rows((4, 8, "1gbit", "hierarchical", 64 << 10),
                 (4, 8, "1gbit", "hierarchical", 1 << 20),
                 (1, 2, cluster.SHM, "hierarchical", 1 << 20))   # the node fit's own run
    out = cluster.two_level(table, {(1, 2, cluster.SHM): NODE, (4, 4, "1gbit"): LINK})
    multi = cluster.several_per_node(out)
    assert set(multi["nodes"]) == {4}                 # the one-node run is no layout here
    text = cluster.levels_table(multi)
    line = [x for x in text.splitlines() if x.startswith("| 4 x 2 | 1gbit | hierarchical |")]
    predicted = out.loc[1, "predicted_s"] * 1e3
    assert len(line) == 1 and f"500.0 / {predicted:.1f}" in line[0], text
