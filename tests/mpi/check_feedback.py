"""Checks the error-feedback wrappers (topologies.topk, topologies.powersgd); run under
mpiexec by the tests.

Usage: mpiexec -n N python tests/mpi/check_feedback.py     (N >= 2)

Rank 0 prints ``OK CASE`` or ``FAIL CASE: why`` per case; exit status 1 on any failure.
"""

from __future__ import annotations

import sys

from cases import cases, comm, rank, report, size  # first: it starts MPI

import numpy as np
from mpi4py import MPI

import topologies
from topologies import powersgd

#: a small actor-critic's tensors: two compressible matrices, biases, a thin head
SHAPES = [(64, 32), (64,), (64, 64), (64,), (2, 64), (2,)]
N = sum(int(np.prod(s)) for s in SHAPES)
SPECS = ("topk:0.1:ring", "topk:0.02:butterfly", "topk:0.05:rabenseifner",
         "powersgd:2:ring", "powersgd:1:tree", "powersgd:4:native")


def build(spec: str, described: bool = True):
    topo = topologies.get(spec)(comm)
    if described:
        topo.describe(SHAPES)
    return topo


def gradient(step: int) -> np.ndarray:
    return np.random.default_rng([step, rank]).standard_normal(N).astype(np.float32)


def check_feedback_books_balance(spec: str) -> None:
    """Over 25 calls: outputs identical on every rank, and the sum of every rank's
    gradients equals the sum of the outputs plus every rank's residual (nothing is lost,
    only delayed); each output differs from the plain sum (it is compressed)."""
    topo = build(spec)
    problems = []
    sent_in, sent_out = np.zeros(N), np.zeros(N)
    for step in range(25):
        g = gradient(step)
        exact = g.astype(np.float64)
        comm.Allreduce(MPI.IN_PLACE, exact)
        topo.allreduce(g, average=True)
        if len(set(comm.allgather(g.tobytes()))) != 1:
            problems.append(f"rank {rank}: call {step}'s output differs between ranks")
            break
        sent_in += exact
        sent_out += g.astype(np.float64) * size
        if step == 0 and np.allclose(g * size, exact, atol=1e-4):
            problems.append(f"rank {rank}: the output equals the exact sum (not compressed)")
    residual = topo.state()[f"residual_{N}"].astype(np.float64)
    comm.Allreduce(MPI.IN_PLACE, residual)
    gap = np.max(np.abs(sent_in - sent_out - residual))
    if not gap < 1e-3:
        problems.append(f"rank {rank}: gradients - outputs - residuals = {gap:.3g}, not 0")
    if topo.stats.calls != 25:
        problems.append(f"rank {rank}: {topo.stats.calls} calls counted for 25")
    # top-k's inner calls are each planned at most once (topologies.persistent), not
    # recorded again and again as the leader takes turns: the values' allreduce and a
    # broadcast per leader, those that do not fit in the kept schedules dropped for good
    recorded = topo.inner_topology._schedules.recorded
    most = 1 + size
    if spec.startswith("topk") and recorded > most:
        problems.append(f"rank {rank}: {recorded} schedules recorded in 25 calls, more "
                        f"than {most}")
    report(f"{spec}: replicas identical, nothing lost", problems)


def sent(spec: str, n: int, op: str = "allreduce") -> int:
    topo = topologies.get(spec)(comm)
    buf = np.ones(n, np.float32)
    topo.allreduce(buf) if op == "allreduce" else topo.bcast(buf, root=0)
    return topo.stats.bytes_sent


def check_bytes() -> None:
    """Exactly the inner topology's bytes for what the wrapper says it sends: top-k a
    bcast and an allreduce of k; PowerSGD an allreduce of the P's and the uncompressed
    elements, then one of the Q's."""
    problems = []
    for ratio, inner in ((0.1, "ring"), (0.02, "butterfly")):
        k = int(np.ceil(ratio * N))
        want = sent(inner, k, "bcast") + sent(inner, k)
        got = sent(f"topk:{ratio}:{inner}", N)
        if got != want:
            problems.append(f"rank {rank}: topk:{ratio}:{inner} sent {got} B, expected {want}")
    for r, inner in ((2, "ring"), (1, "tree")):
        matrices, plain = powersgd.plan(SHAPES, r)
        p_len = sum(rows * r for _, rows, _ in matrices) + plain
        q_len = sum(cols * r for _, _, cols in matrices)
        topo = build(f"powersgd:{r}:{inner}")
        topo.allreduce(np.ones(N, np.float32))
        want = sent(inner, p_len) + sent(inner, q_len)
        if topo.stats.bytes_sent != want:
            problems.append(f"rank {rank}: powersgd:{r}:{inner} sent "
                            f"{topo.stats.bytes_sent} B, expected {want}")
        if [(rows, cols) for _, rows, cols in matrices] != [(64, 32), (64, 64)]:
            problems.append(f"rank {rank}: powersgd compressed {matrices} (the (2, 64) head "
                            "and the biases save nothing)")
    full = sent("ring", N)
    if not sent("topk:0.02:ring", N) < 0.1 * full:
        problems.append(f"rank {rank}: topk:0.02 sent not under a tenth of {full} B")
    report("bytes: the inner topology's for k, or for the P's and Q's", problems)


def check_state_round_trip(spec: str) -> None:
    """A wrapper given another's state continues exactly as that one does; a state of
    another length is refused."""
    a, b = build(spec), build(spec)
    for step in range(3):
        a.allreduce(gradient(step), average=True)
    b.load_state(a.state())
    problems = []
    ga, gb = gradient(7), gradient(7)
    a.allreduce(ga, average=True)
    b.allreduce(gb, average=True)
    key = f"residual_{N}"
    if ga.tobytes() != gb.tobytes() or a.state()[key].tobytes() != b.state()[key].tobytes():
        problems.append(f"rank {rank}: the loaded state did not continue the same")
    other = np.ones(100, np.float32)          # another buffer: a residual of its own
    a.describe([(10, 10)])
    a.allreduce(other)
    if sorted(a.state()) != sorted([*b.state(), "residual_100"]
                                   + (["qs_100"] if "qs_" + str(N) in b.state() else [])):
        problems.append(f"rank {rank}: state keys {sorted(a.state())}")
    c = build(spec)
    c.load_state({**a.state(), key: a.state()[key].astype(np.float64)})
    try:
        c.allreduce(gradient(8))
        problems.append(f"rank {rank}: a float64 residual was taken for a float32 gradient")
    except topologies.TopologyError as err:
        if "residual" not in str(err) and "Q's" not in str(err):
            problems.append(f"rank {rank}: {err}")
    report(f"{spec}: its state continues exactly, one per buffer; a wrong dtype refused",
           problems)


def check_a_bad_gradient_does_not_stay(spec: str) -> None:
    """A NaN in the last rank's gradient (not a leader's pick on the first call) leaves
    its residual and Q's as they were, so the next call is finite everywhere."""
    topo = build(spec)
    topo.allreduce(gradient(0), average=True)
    before = {k: v.copy() for k, v in topo.state().items() if isinstance(v, np.ndarray)}
    g = gradient(1)
    if rank == size - 1:
        g[5] = np.nan
    topo.allreduce(g, average=True)
    problems = []
    key = f"residual_{N}"
    if rank == size - 1 and topo.state()[key].tobytes() != before[key].tobytes():
        problems.append(f"rank {rank}: the residual changed after a NaN gradient")
    g = gradient(2)
    topo.allreduce(g, average=True)
    if not np.all(np.isfinite(g)):
        problems.append(f"rank {rank}: the call after a NaN gradient is not finite")
    report(f"{spec}: a NaN gradient does not stay in the residual", problems)


def check_undescribed_and_options() -> None:
    """Without describe(), PowerSGD takes the buffer as its most nearly square matrix;
    the spec's option is kept per variant."""
    problems = []
    topo = build("powersgd:2:ring", described=False)
    g = np.random.default_rng([3, rank]).standard_normal(4096).astype(np.float32)
    topo.allreduce(g)
    if topo.stats.bytes_sent != sent("ring", 64 * 2) + sent("ring", 64 * 2):
        problems.append(f"rank {rank}: 4096 elements were not taken as one 64 x 64 matrix")
    if powersgd.square(4096) != (64, 64) or powersgd.square(13) != (1, 13):
        problems.append("square() is wrong")
    if topologies.get("topk:0.3").option != 0.3 or topologies.get("topk").option != 0.01 \
            or topologies.get("powersgd:8:tree").inner != "tree":
        problems.append("a variant lost its option")
    report("powersgd without describe(); options kept", problems)


def main() -> None:
    if size < 2:
        sys.exit("check_feedback needs at least 2 ranks: one rank exchanges nothing")
    for spec in SPECS:
        check_feedback_books_balance(spec)
    check_bytes()
    for spec in ("topk:0.1:ring", "powersgd:2:butterfly"):
        check_state_round_trip(spec)
        check_a_bad_gradient_does_not_stay(spec)
    check_undescribed_and_options()
    sys.exit(1 if cases.failed else 0)


if __name__ == "__main__":
    main()
