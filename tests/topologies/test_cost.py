"""Every topology's stated cost against an independent transcription of its formula, and
the cost model finding a new topology through the registry alone."""

from __future__ import annotations

import math

import numpy as np
import pytest

import topologies
from mpirl.study import costmodel
from topologies.base import NO_COST, Cost, Topology
from topologies.native import MPICH_ALGORITHMS, Native
from topologies.ring import DEFAULT_SEGMENT_BYTES

S = DEFAULT_SEGMENT_BYTES
RANKS = range(1, 10)
SIZES = [0.0, 4.0, 1000.0, float(S), 3.5 * S]


def fold(p):
    q = 2 ** math.floor(math.log2(p))
    r = p - q
    return q, r, 1 if r > 0 else 0


def L(p):
    return math.ceil(math.log2(p))


def expected(name, op, p, n):
    """(messages, bytes moved, bytes reduced) from the formulas, written afresh."""
    q, r, x = fold(p)
    lq = math.log2(q)
    table = {
        ("butterfly", "allreduce"): (lq + 2 * x, (lq + 2 * x) * n, (lq + x) * n),
        ("ring", "allreduce"): (2 * (p - 1), 2 * (p - 1) / p * n, (p - 1) / p * n),
        ("tree", "allreduce"): (2 * L(p), 2 * L(p) * n, L(p) * n),
        ("star", "allreduce"): (2 * (p - 1), 2 * (p - 1) * n, (p - 1) * n),
        ("tree", "bcast"): (L(p), L(p) * n, 0),
        ("butterfly", "bcast"): (L(p), L(p) * n, 0),
        ("rabenseifner", "bcast"): (L(p), L(p) * n, 0),
        # one node of p ranks (nodes by shared memory): the node level alone
        ("hierarchical", "allreduce"): (2 * L(p), 2 * L(p) * n, L(p) * n),
        ("hierarchical", "bcast"): (L(p), L(p) * n, 0),
        ("star", "bcast"): (p - 1, (p - 1) * n, 0),
        ("reduce_scatter_allgather", "allreduce"):
            (2 * lq + 2 * x, 2 * (q - 1) / q * n + 2 * x * n, (q - 1) / q * n + x * n),
        ("rabenseifner", "allreduce"):
            (2 * lq + 2 * x, 2 * (q - 1) / q * n + 2 * x * n, (q - 1) / q * n + x * n),
        ("scatter_ring_allgather", "bcast"): (lq + p - 1, 2 * (p - 1) / p * n, 0),
    }
    if (name, op) == ("ring", "bcast"):
        a = p - 2 + max(1, math.ceil(n / S))
        return a, a * min(n, S), 0
    return table[name, op]


#: MPICH algorithm -> the formula it shares
MPICH_AS = {"recursive_doubling": "butterfly", "ring": "ring", "tree": "tree",
            "binomial": "tree", "reduce_scatter_allgather": "reduce_scatter_allgather",
            "scatter_ring_allgather": "scatter_ring_allgather"}

#: the topologies with a formula of their own (auto's is the one it picks: tested apart)
PYTHON_TOPOLOGIES = [name for name in topologies.REGISTRY if name not in ("native", "auto")]


def terms(cost: Cost):
    return cost.messages, cost.bytes_moved, cost.bytes_reduced


def assert_terms(got, want):
    assert got == pytest.approx(tuple(float(v) for v in want), rel=1e-12, abs=1e-9)


def test_the_registry_is_what_these_formulas_cover():
    assert set(PYTHON_TOPOLOGIES) == {"butterfly", "ring", "tree", "star", "rabenseifner",
                                      "hierarchical"}
    assert set(MPICH_AS) == {a for algs in MPICH_ALGORITHMS.values() for a in algs}


@pytest.mark.parametrize("name", PYTHON_TOPOLOGIES)
@pytest.mark.parametrize("op", ["allreduce", "bcast"])
def test_cost_matches_its_formula(name, op):
    cls = topologies.REGISTRY[name]
    for p in RANKS:
        for n in SIZES:
            got = terms(cls.cost(op, p, n))
            if p == 1:
                assert got == (0.0, 0.0, 0.0)
            else:
                assert_terms(got, expected(name, op, p, n))


@pytest.mark.parametrize("op", ["allreduce", "bcast"])
def test_native_cost_of_each_mpich_algorithm_matches_its_formula(op):
    for algorithm in MPICH_ALGORITHMS[op]:
        for p in RANKS:
            for n in SIZES:
                got = terms(Native.cost(op, p, n, algorithm))
                if p == 1:
                    assert got == (0.0, 0.0, 0.0), algorithm
                else:
                    assert_terms(got, expected(MPICH_AS[algorithm], op, p, n))


def test_link_phases_are_two_where_the_root_receives_then_sends():
    """star and tree allreduce use the root's link in two phases (all in, then all
    out); every other exchange keeps its links busy throughout (one phase)."""
    for p in (2, 5, 8):
        for name, cls in topologies.REGISTRY.items():
            if name in ("native", "auto"):
                continue
            want = 2 if name in ("star", "tree", "hierarchical") else 1
            assert cls.cost("allreduce", p, 64.0).link_phases == want, name
            assert cls.cost("bcast", p, 64.0).link_phases == 1, name
        for algorithm in MPICH_ALGORITHMS["allreduce"]:
            want = 2 if algorithm == "tree" else 1
            assert Native.cost("allreduce", p, 64.0, algorithm).link_phases == want


def test_some_formula_values_by_hand():
    n = 100.0
    assert terms(topologies.get("butterfly").cost("allreduce", 6, n)) == (4.0, 400.0, 300.0)
    assert terms(topologies.get("ring").cost("allreduce", 4, n)) == (6.0, 150.0, 75.0)
    assert terms(topologies.get("tree").cost("allreduce", 5, n)) == (6.0, 600.0, 300.0)
    assert terms(topologies.get("ring").cost("bcast", 3, 2.5 * S)) == (4.0, 4.0 * S, 0.0)
    assert terms(Native.cost("allreduce", 6, 8.0, "reduce_scatter_allgather")) == \
        (6.0, 2 * 3 / 4 * 8 + 16, 3 / 4 * 8 + 8)


@pytest.mark.parametrize("name", list(topologies.REGISTRY))
def test_unknown_op_raises_key_error(name):
    cls = topologies.REGISTRY[name]
    for p in (2, 5):
        with pytest.raises(KeyError, match="gather"):
            cls.cost("gather", p, 8.0)


@pytest.mark.parametrize("algorithm", [None, "binomial", "nope"])
def test_native_allreduce_without_a_valid_algorithm_names_them(algorithm):
    with pytest.raises(KeyError) as err:
        Native.cost("allreduce", 4, 8.0, algorithm)
    for name in MPICH_ALGORITHMS["allreduce"]:
        assert name in str(err.value)


def test_only_native_sends_without_python():
    for name, cls in topologies.REGISTRY.items():
        assert cls.name == name
        assert cls.from_python is (name != "native"), name


def test_coefficients_and_predict_of_each_registered_topology():
    params = costmodel.Params(alpha=2e-6, beta=1e-9, gamma=3e-10, delta=5e-6)
    for name in PYTHON_TOPOLOGIES:
        a, b, c = expected(name, "allreduce", 6, 1024.0)
        phases = 2 if name in ("star", "tree", "hierarchical") else 1
        assert costmodel.coefficients("allreduce", name, 6, 1024.0) == \
            pytest.approx((a, b, c, True, phases))
        assert costmodel.predict(params, "allreduce", name, 6, 1024.0) == pytest.approx(
            a * (2e-6 + 5e-6) + b * 1e-9 + c * 3e-10, rel=1e-12)
    assert costmodel.coefficients("allreduce", "butterfly", 1, 1024.0)[3] is False


def test_native_predicts_the_cheapest_mpich_algorithm():
    params = costmodel.Params(alpha=2e-6, beta=1e-9, gamma=3e-10, delta=5e-6)
    for p in (2, 3, 6, 8):
        for n in (8.0, 1e6):
            options = [terms(Native.cost("allreduce", p, n, a))
                       for a in MPICH_ALGORITHMS["allreduce"]]
            cheapest = min(a * 2e-6 + b * 1e-9 + c * 3e-10 for a, b, c in options)
            assert costmodel.predict(params, "allreduce", "native", p, n) == \
                pytest.approx(cheapest, rel=1e-12)


class Dummy(Topology):
    """A topology added by one class and one registry row."""

    name = "dummy"

    @classmethod
    def cost(cls, op, p, n):
        if op != "allreduce":
            raise KeyError(f"no cost model for {op} dummy")
        return Cost(7.0 * p, 11.0 * n, 13.0 * n)

    def _allreduce_sum(self, buf: np.ndarray) -> None:
        pass

    def _bcast(self, buf: np.ndarray, root: int) -> None:
        pass


def test_cost_model_walks_the_registry(monkeypatch):
    with pytest.raises(KeyError):
        costmodel.coefficients("allreduce", "dummy", 4, 64.0)
    monkeypatch.setitem(topologies.REGISTRY, "dummy", Dummy)
    assert costmodel.coefficients("allreduce", "dummy", 4, 64.0) == \
        (28.0, 704.0, 832.0, True, 1)
    params = costmodel.Params(alpha=1.0, beta=0.5, gamma=0.25, delta=2.0)
    assert costmodel.predict(params, "allreduce", "dummy", 4, 64.0) == \
        pytest.approx(28 * (1.0 + 2.0) + 704 * 0.5 + 832 * 0.25)
    with pytest.raises(KeyError):                       # its own missing op
        costmodel.coefficients("bcast", "dummy", 4, 64.0)


def test_unknown_exchange_is_a_key_error():
    with pytest.raises(KeyError):
        costmodel.coefficients("allreduce", "nosuch", 4, 64.0)
    with pytest.raises(KeyError):
        costmodel.coefficients("allreduce", "ring:ring", 4, 64.0)


@pytest.mark.parametrize("inner", ["ring", "butterfly", "rabenseifner", "star"])
def test_hierarchical_cost_is_its_two_levels(inner):
    """A node level (binomial reduce and broadcast over k ranks) and the inner topology's
    allreduce over the m node leaders, for emulated nodes of k ranks."""
    for k in (1, 2, 3):
        cls = topologies.get(f"hierarchical:{inner}:{k}")
        for p in range(2, 10):
            m, per = math.ceil(p / k), min(p, k)
            for n in SIZES:
                node = expected("tree", "allreduce", per, n) if per > 1 else (0, 0, 0)
                link = expected(inner, "allreduce", m, n) if m > 1 else (0, 0, 0)
                assert_terms(terms(cls.cost("allreduce", p, n)),
                             tuple(a + b for a, b in zip(node, link, strict=True)))
                levels = cls.levels("allreduce", m, per, n)
                assert_terms(terms(levels[0]), node)
                assert_terms(terms(levels[1]), link)


def test_auto_costs_what_the_candidate_it_picks_costs_and_that_one_is_cheapest():
    """For every op, rank count and size, auto's pick is the candidate with the least
    predicted time under its parameters, and auto states that candidate's cost."""
    from topologies.auto import CANDIDATES
    from topologies.model import seconds, terms as model_terms

    auto = topologies.get("auto")
    for op in ("allreduce", "bcast"):
        for p in range(2, 10):
            for n in [*SIZES, 8192.0, float(1 << 20)]:
                picked = auto.pick(op, p, n)
                times = {c: seconds(auto.params, model_terms(op, c, p, n)) for c in CANDIDATES}
                assert times[picked] == min(times.values())
                assert terms(auto.cost(op, p, n)) == terms(picked.cost(op, p, n))
    # the built-in fit (shared memory, 2 ranks): a butterfly for 1 KiB, ring or
    # rabenseifner (the same bytes in fewer rounds) for 8 MiB
    assert auto.pick("allreduce", 4, 1024.0).name == "butterfly"
    assert auto.pick("allreduce", 4, 8.0 * 2**20).name == "rabenseifner"


def test_auto_reads_fitted_parameters_and_refuses_a_bad_file(tmp_path):
    good = tmp_path / "params.json"
    good.write_text('{"alpha": 1e-3, "beta": 1e-12, "gamma": 0.0, "delta": 0.0}')
    fitted = topologies.get(f"auto:{good}")
    assert fitted.params.alpha == 1e-3 and fitted.source == str(good)
    # a latency of 1 ms and a free wire: the fewest messages win at every size
    assert fitted.pick("allreduce", 8, float(1 << 20)).name == "butterfly"
    bad = tmp_path / "bad.json"
    bad.write_text('{"alfa": 1}')
    for path in (bad, tmp_path / "missing.json"):
        with pytest.raises(topologies.TopologyError, match="cannot read cost-model"):
            topologies.get(f"auto:{path}")


def schedule(name, p, n):
    """The rounds of ``name``'s allreduce over ``p`` ranks (a power of two), written out
    message by message: per round, (source, destination, bytes, bytes the destination
    adds)."""
    lg = int(math.log2(p))
    if name == "butterfly":
        return [[(r, r ^ (1 << k), n, n) for r in range(p)] for k in range(lg)]
    if name == "rabenseifner":           # halving with distance doubling, then its mirror
        halving = [[(r, r ^ (1 << k), n / 2 ** (k + 1), n / 2 ** (k + 1)) for r in range(p)]
                   for k in range(lg)]
        doubling = [[(r, r ^ (1 << k), n / 2 ** (k + 1), 0.0) for r in range(p)]
                    for k in reversed(range(lg))]
        return halving + doubling
    if name == "tree":                   # binomial reduce to rank 0, then broadcast
        reduce = [[(r, r - (1 << k), n, n) for r in range(p) if r % (2 << k) == 1 << k]
                  for k in range(lg)]
        bcast = [[(d, s, b, 0.0) for s, d, b, _ in rnd] for rnd in reversed(reduce)]
        return reduce + bcast
    assert name == "ring"
    return [[(r, (r + 1) % p, n / p, n / p if step < p - 1 else 0.0) for r in range(p)]
            for step in range(2 * (p - 1))]


def by_levels(rounds, per_node):
    """Sum each level's terms from the schedule: a round is inside a node when every
    message stays in its node; a round that crosses is paid at the link, with the bytes
    that one node's ranks send over its link in that round added up (they share it)."""
    node, link = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    for rnd in rounds:
        crossing = [m for m in rnd if m[0] // per_node != m[1] // per_node]
        level = link if crossing else node
        out: dict[int, float] = {}
        for src, _, b, _ in crossing or rnd:
            out[src // per_node if crossing else src] = \
                out.get(src // per_node if crossing else src, 0.0) + b
        level[0] += 1
        level[1] += max(out.values())
        level[2] += max(m[3] for m in rnd)
    return tuple(node), tuple(link)


@pytest.mark.parametrize("name", ["butterfly", "rabenseifner", "tree", "ring"])
def test_a_flat_exchanges_two_levels_are_its_rounds_split_by_where_partners_are(name):
    cls = topologies.get(name)
    for nodes in (1, 2, 4, 8):
        for per in (1, 2, 4, 8):
            p = nodes * per
            if p == 1:
                continue
            for n in (0.0, 1000.0, 3.5 * S):
                node, link = by_levels(schedule(name, p, n), per)
                got = cls.levels("allreduce", nodes, per, n)
                assert_terms(terms(got[0]), node)
                assert_terms(terms(got[1]), link)
                # one node: all of it inside; one rank per node: all of it over the link
                whole = terms(cls.cost("allreduce", p, n))
                if nodes == 1:
                    assert_terms(terms(got[0]), whole)
                if per == 1:
                    assert_terms(terms(got[1]), whole)


def test_two_levels_send_over_each_link_what_the_cluster_measured():
    """MiB each node sent over its link per 4 MiB allreduce on the emulated cluster
    (docs/figures/nodes/results.md): 4 x 2 ring 7.0, butterfly 16.0, rabenseifner 6.0;
    2 x 4 ring 7.0, butterfly 16.0, rabenseifner 4.0."""
    n = 4.0
    measured = {(4, 2): {"ring": 7.0, "butterfly": 16.0, "rabenseifner": 6.0},
                (2, 4): {"ring": 7.0, "butterfly": 16.0, "rabenseifner": 4.0}}
    for (nodes, per), sent in measured.items():
        for name, mib in sent.items():
            link = topologies.get(name).levels("allreduce", nodes, per, n)[1]
            # what one node sends over its link (ring: one crossing rank per step;
            # butterfly and rabenseifner: all of its ranks at once, sharing it)
            assert link.bytes_moved == pytest.approx(mib), (name, nodes, per)


FLAT = ["butterfly", "rabenseifner", "tree", "ring"]


@pytest.mark.parametrize("name", FLAT)
def test_every_layout_splits_the_whole_cost_between_the_levels(name):
    """At any node and rank counts, folds included: every round lands in one level, so
    the two levels' messages add up to the one-level cost's; one node is all node level,
    one rank per node all link level."""
    cls = topologies.get(name)
    for op in ("allreduce", "bcast"):
        for nodes in range(1, 7):
            for per in range(1, 7):
                p = nodes * per
                for n in (0.0, 1000.0, 3.0 * S):
                    node, link = cls.levels(op, nodes, per, n)
                    whole = cls.cost(op, p, n)
                    assert node.messages + link.messages == whole.messages, (op, nodes, per)
                    if nodes == 1:
                        assert_terms(terms(node), terms(whole))
                        assert link == NO_COST
                    if per == 1:
                        assert_terms(terms(link), terms(whole))
                        assert node == NO_COST


def test_the_fold_is_priced_where_its_partners_sit():
    """Butterfly at six ranks: the even ranks 0 and 2 fold into 1 and 3; the core runs on
    ranks 1, 3, 4, 5 (1-3 and 4-5 at distance 1, 1-4 and 3-5 at distance 2)."""
    n = 1.0
    butterfly = topologies.get("butterfly")
    # 3 nodes x 2: the fold's pairs share a node; at distance 1 ranks 1 and 3 cross (one
    # buffer per link), at distance 2 node 2's ranks 4 and 5 both cross (two on its link)
    node, link = butterfly.levels("allreduce", 3, 2, n)
    assert terms(node) == (2, 2 * n, n) and terms(link) == (2, 3 * n, 2 * n)
    # 2 nodes x 3: rank 2 (node 0) folds into rank 3 (node 1), so the fold crosses too,
    # and so does every core round: all four rounds at the link, one buffer each
    node, link = butterfly.levels("allreduce", 2, 3, n)
    assert node == NO_COST and terms(link) == (4, 4 * n, 3 * n)
    # rabenseifner, 3 x 2: the same fold, then halves of n/2 (1-3 crosses) and n/4 (both
    # of node 2's ranks cross: n/2 on its link), and their mirror
    node, link = topologies.get("rabenseifner").levels("allreduce", 3, 2, n)
    assert terms(node) == (2, 2 * n, n)
    assert terms(link) == (4, 2 * (n / 2 + n / 2), n / 2 + n / 4)


def test_a_tree_broadcast_crosses_each_link_once_per_round():
    """Binomial broadcast from rank 0 over 4 nodes x 2: distances 4 and 2 cross (one
    sender per node), distance 1 stays inside every node."""
    node, link = topologies.get("tree").levels("bcast", 4, 2, 8.0)
    assert terms(node) == (1, 8.0, 0.0) and terms(link) == (2, 16.0, 0.0)


def test_only_the_exchanges_with_a_schedule_have_two_levels():
    for name in ("native", "star", "auto"):
        with pytest.raises(KeyError, match="one level"):
            topologies.get(name).levels("allreduce", 4, 2, 1.0)
    with pytest.raises(KeyError, match="no two-level model"):
        topologies.get("ring").levels("allreduce", 0, 2, 1.0)
