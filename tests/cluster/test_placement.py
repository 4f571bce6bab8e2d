"""Where the emulated cluster's launcher puts each rank (``--placement block|cyclic``)
and the benchmarks' ``--layout``, in one process: no cluster needed.  The placement
itself is checked on the cluster (test_cluster.py: hostnames of a cyclic job)."""

from __future__ import annotations

import pytest

from mpirl.cluster.launch import PLACEMENTS, layout, node_of, ranks_on
from mpirl.cluster.net import ClusterError
from mpirl.study import sweep


@pytest.mark.parametrize("order", ["block", "cyclic"])
@pytest.mark.parametrize(("nodes", "per_node"), [(8, 1), (4, 2), (2, 4), (3, 2), (2, 3)])
def test_ranks_on_a_node_and_each_ranks_node_agree(nodes, per_node, order):
    nranks = nodes * per_node
    # each rank's node by Slurm's rule for its --distribution (block or cyclic)
    where = [r // per_node if order == "block" else r % nodes for r in range(nranks)]
    assert node_of(nodes, per_node, order) == where
    lists = [ranks_on(i, nodes, per_node, nranks, order) for i in range(nodes)]
    assert sorted(r for ranks in lists for r in ranks) == list(range(nranks))
    assert all(len(ranks) == per_node for ranks in lists)
    assert all(where[r] == i for i, ranks in enumerate(lists) for r in ranks)


def test_block_and_cyclic_number_as_slurm_does():
    assert ranks_on(1, 4, 2, 8) == [2, 3] and ranks_on(1, 4, 2, 8, "cyclic") == [1, 5]
    assert [ranks_on(i, 2, 4, 8, "cyclic") for i in range(2)] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert ranks_on(2, 3, 2, 5) == [4]            # a short last node, in blocks
    assert [ranks_on(i, 3, 2, 5, "cyclic") for i in range(3)] == [[0, 3], [1, 4], [2]]


@pytest.mark.parametrize("order", PLACEMENTS)
def test_the_sweep_takes_every_placement_of_the_launcher(order, capsys):
    # mpirl.sweep writes the choices out (it loads the cluster package only when used):
    # each is accepted (refused here for the local launcher, past argparse)
    assert sweep.main(["x.yaml", "--placement", order]) == 2
    assert f"--placement {order} with --launcher local" in capsys.readouterr().err


def test_layouts():
    assert layout("8x1", 8) == (8, 1, "block")
    assert layout("2x4:cyclic", 8) == (2, 4, "cyclic")


@pytest.mark.parametrize("text", ["3x3", "1x8", "8x1:cyclic", "4x2:blocks", "x8", "4x2:",
                                  "\u00b2x4"])
def test_a_bad_layout_says_what_is_allowed(text):
    with pytest.raises(ClusterError) as err:
        layout(text, 8)
    assert repr(text) in str(err.value) and "(8x1, 4x2, 2x4, 4x2:cyclic, 2x4:cyclic)" \
        in str(err.value)
