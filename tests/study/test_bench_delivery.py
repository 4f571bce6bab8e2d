"""experiments/bench_delivery.py's link model and its --layout check, in one process,
and bench_delivery_training.py's tables and --layout check (no cluster: --rewrite).

The model is what its tables print beside each measured delivery; its counts are
checked here against the schedules worked out by hand for each layout the tables hold
(docs/figures/delivery/results*.md), and a bad ``--layout`` stops it at start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mpirun import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import bench_delivery as bench  # noqa: E402


@pytest.mark.parametrize("text, nodes, hops, ring, tree", [
    # 8 x 1: every hop crosses; the learner's binomial sends 4, 2, 1 each cross
    ("8x1", [0, 1, 2, 3, 4, 5, 6, 7], 7, 1, 3),
    # blocks: the chain crosses between nodes only; the tree's mask-1 round stays inside
    ("4x2", [0, 0, 1, 1, 2, 2, 3, 3], 3, 1, 2),
    ("2x4", [0, 0, 0, 0, 1, 1, 1, 1], 1, 1, 1),
    # round robin: every hop crosses, and a node's ranks share its link: node 0 sends
    # 0 -> 1 and 4 -> 5 at 4 x 2, 0 -> 1, 2 -> 3, 4 -> 5 and 6 -> 7 at 2 x 4
    ("4x2:cyclic", [0, 1, 2, 3, 0, 1, 2, 3], 7, 2, 4),
    ("2x4:cyclic", [0, 1, 0, 1, 0, 1, 0, 1], 7, 4, 4),
])
def test_link_counts(text, nodes, hops, ring, tree):
    node = bench.node_of(*bench.layout(text))
    assert node == nodes
    assert (bench.link_hops(node), bench.ring_copies(node), bench.tree_copies(node)) == \
        (hops, ring, tree)


def test_model_seconds_at_100_mbit():
    mib4 = 4 * 2 ** 20
    rate = 100e6 / 8
    flat = bench.predicted("100mbit", mib4, bench.layout("8x1"))
    # the 8 x 1 table's model: push 7 copies, ring n + 6 segments, tree 3 copies
    assert flat["push"] == pytest.approx(7 * mib4 / rate)
    assert flat["ring"] == pytest.approx((mib4 + 6 * 2 ** 18) / rate)
    assert flat["tree"] == pytest.approx(3 * mib4 / rate)
    cyclic = bench.predicted("100mbit", mib4, bench.layout("4x2:cyclic"))
    blocks = bench.predicted("100mbit", mib4, bench.layout("4x2"))
    # in blocks the flat ways cross the link as the two-level ones over 4 leaders do
    assert blocks["ring"] == blocks["hierarchical:ring"] == \
        pytest.approx((mib4 + 2 * 2 ** 18) / rate)
    assert blocks["tree"] == blocks["hierarchical:tree"] == pytest.approx(2 * mib4 / rate)
    assert cyclic["ring"] == pytest.approx((2 * mib4 + 6 * 2 ** 18) / rate)
    assert cyclic["tree"] == pytest.approx(4 * mib4 / rate)
    assert cyclic["push"] == blocks["push"] == pytest.approx(6 * mib4 / rate)
    wide = bench.predicted("100mbit", mib4, bench.layout("2x4:cyclic"))
    assert wide["ring"] == pytest.approx((4 * mib4 + 6 * 2 ** 18) / rate)
    assert wide["hierarchical:tree"] == pytest.approx(mib4 / rate)


@pytest.mark.parametrize("text", ["3x3", "1x8", "8x1:cyclic", "4x2:blocks", "x8"])
def test_a_bad_layout_is_one_line_and_exit_2(tmp_path, text):
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench_delivery.py"),
                           "--rewrite", "--out", str(tmp_path), "--layout", text],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0] and "NODESxPER" in lines[0], done.stderr


@pytest.mark.parametrize("mode, text, table", [
    ("impala", "8x1", "training"), ("apex", "8x1", "training-apex"),
    ("impala", "4x2:cyclic", "training-4x2-cyclic"),
    ("impala", "2x4:cyclic", "training-2x4-cyclic"),
    ("impala", "4x2", "training-4x2"), ("impala", "2x4", "training-2x4"),
    ("apex", "4x2:cyclic", "training-apex-4x2-cyclic"),
    ("apex", "2x4:cyclic", "training-apex-2x4-cyclic"), ("apex", "2x4", "training-apex-2x4"),
    ("apex", "4x2", "training-apex-4x2"),
    # measured with --ways push,push-calls (push: the thread, then the default)
    ("apex", "2x4", "reply-progress/training-apex-2x4"),
    # --ways push-thread,push-calls
    ("apex", "2x4:cyclic", "reply-progress/training-apex-2x4-cyclic"),
    # the 2 x 4 blocks table as measured before the thread (stop 48's)
    ("apex", "2x4", "before-thread/training-apex-2x4"),
    ("apex", "8x1", "reply-progress/training-apex")])
def test_training_tables_rewrite_byte_for_byte_from_their_json(tmp_path, mode, text, table):
    """experiments/bench_delivery_training.py --rewrite on a copy of a committed table's
    JSON writes the committed table (each layout and mode its own files)."""
    figures = ROOT / "docs" / "figures" / "delivery"
    figures, table = (figures / table).parent, Path(table).name
    (tmp_path / f"{table}.json").write_bytes((figures / f"{table}.json").read_bytes())
    done = subprocess.run([sys.executable, str(ROOT / "experiments" /
                                               "bench_delivery_training.py"),
                           "--rewrite", "--out", str(tmp_path), "--mode", mode,
                           "--layout", text], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / f"{table}.md").read_text() == (figures / f"{table}.md").read_text()


def test_a_training_json_of_another_layout_is_refused(tmp_path):
    """A table's JSON records its mode and layout; --rewrite under other flags (here a
    4 x 2 blocks JSON copied under the cyclic table's name) says what it holds."""
    figures = ROOT / "docs" / "figures" / "delivery"
    (tmp_path / "training-4x2-cyclic.json").write_bytes(
        (figures / "training-4x2.json").read_bytes())
    done = subprocess.run([sys.executable, str(ROOT / "experiments" /
                                               "bench_delivery_training.py"),
                           "--rewrite", "--out", str(tmp_path), "--layout", "4x2:cyclic"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ("bench_delivery_training: training-4x2-cyclic.json holds "
                                   "mode impala, layout 4x2: give --mode impala --layout 4x2")
    assert not (tmp_path / "training-4x2-cyclic.md").exists()


def test_a_bad_training_layout_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "experiments" /
                                               "bench_delivery_training.py"),
                           "--rewrite", "--out", str(tmp_path), "--layout", "8x1:cyclic"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'8x1:cyclic'" in lines[0] and "NODESxPER" in lines[0]


def test_an_unknown_way_is_one_line_and_exit_2(tmp_path):
    """--ways names only the mode's and layout's ways (push-calls with --push-calls)."""
    done = subprocess.run([sys.executable, str(ROOT / "experiments" /
                                               "bench_delivery_training.py"),
                           "--rewrite", "--out", str(tmp_path), "--mode", "apex",
                           "--ways", "push,push-calls"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no way 'push-calls' here" in lines[0], done.stderr
    assert "allowed: push, ring, ring-every-4" in lines[0], done.stderr
