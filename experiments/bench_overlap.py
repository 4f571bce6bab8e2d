"""--overlap measured: how much of the gradient exchange backward hides, on the emulated
cluster at 100 Mbit/s and 1 Gbit/s.

    python experiments/bench_overlap.py          # ~10 min on 2 cores, as root

On its own emulated cluster (``mpirlover``, 2 nodes x 1 rank, taken down at the end,
also on error), each rank builds an MLP of about 2.2 MB of float32 parameters
(64 -> 512 -> 512 -> 512 -> 8), and per step zeroes the flat gradient, runs forward and
backward on a batch (256, and 2048 for a backward as long as a slow link's exchange),
and averages the gradient through ring with mpirl's own pieces
(``FlatParams``, ``Exchange``, and ``mpirl.kit.overlap``'s ``Whole`` or ``Overlap``).
The two alternate step by step (ABAB: the same conditions for both), ``--steps`` each.
Per step: the backward time, the time left waiting after backward, the whole step.

Writes ``results.md`` (medians, side by side) and ``timeline.png`` (one step of each:
backward, and each bucket's exchange, on one time axis) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAME = "mpirlover"
SUBNET = "10.231.96.0/24"
NODES = 2
RATES = ["100mbit", "1gbit"]
HIDDEN = [512, 512, 512]
OBS, ACTIONS = 64, 8


def worker(steps: int, batch: int, bucket_mb: float) -> None:
    """One rank's part (under mpiexec): rank 0 prints one JSON line."""
    from mpirl.launch import apply_mpi_defaults

    apply_mpi_defaults()
    import numpy as np
    import torch
    from mpi4py import MPI

    from mpirl.kit.overlap import Overlap, Whole
    from mpirl.parts.learner.flat import FlatParams
    from mpirl.resilience.exchange import Exchange

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    torch.manual_seed(0)
    sizes = [OBS, *HIDDEN, ACTIONS]
    layers = []
    for a, b in zip(sizes, sizes[1:], strict=False):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    net = torch.nn.Sequential(*layers[:-1])
    flat = FlatParams(net)
    exchange = Exchange("ring", comm)
    ways = {"whole": Whole(exchange, flat.grad_np), "overlap": Overlap(exchange, flat, bucket_mb)}
    x = torch.randn(batch, OBS, generator=torch.Generator().manual_seed(comm.Get_rank()))
    rows: dict[str, list] = {name: [] for name in ways}
    timelines: dict[str, list] = {name: [] for name in ways}
    for step in range(2 * steps + 4):                   # 4 warm-up steps, not kept
        name = "whole" if step % 2 == 0 else "overlap"
        comm.Barrier()
        t0 = time.perf_counter()
        pending = ways[name].start(step + 1)
        flat.zero_grad()
        net(x).pow(2).mean().backward()
        t_backward = time.perf_counter() - t0
        pending.wait()
        t_step = time.perf_counter() - t0
        if step >= 4:
            rows[name].append((t_backward, t_step - t_backward, t_step))
            spans = list(ways[name].times) if name == "overlap" else [(t_backward, t_step)]
            timelines[name].append({"backward": t_backward, "step": t_step, "buckets": spans})
    # the figure's step: the one of median length
    timeline = {name: sorted(steps_, key=lambda t: t["step"])[len(steps_) // 2]
                for name, steps_ in timelines.items()}
    if comm.Get_rank() == 0:
        print(json.dumps({"params": int(flat.count), "buckets": len(ways["overlap"].plan),
                          "median": {k: np.median(v, axis=0).tolist() for k, v in rows.items()},
                          "timeline": timeline}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/figures/overlap")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 2048],
                        help="batch sizes: backward's length against the exchange's")
    parser.add_argument("--bucket-mb", type=float, default=0.5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.batches[0], args.bucket_mb)
        return 0
    from mpirl.cluster import lifecycle
    from mpirl.cluster.launch import json_points

    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    points = {f"batch {batch}": ["python", str(Path(__file__).resolve()), "--worker",
                                 "--steps", str(args.steps), "--batches", str(batch),
                                 "--bucket-mb", str(args.bucket_mb)]
              for batch in args.batches}
    with lifecycle.owned(NAME, NODES, SUBNET) as spec:
        results = json_points(spec, RATES, points, NODES, 1, "bench_overlap", timeout_s=900)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write(out, results, args)
    return 0


def write(out: Path, results: dict, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = next(iter(results.values()))
    lines = ["# Overlap: the exchange hidden behind backward (experiments/bench_overlap.py)", "",
             f"Emulated cluster, {NODES} nodes x 1 rank, ring; an MLP of {first['params']} "
             f"float32 parameters ({first['params'] * 4 / 2**20:.2f} MiB), batches of "
             f"{' and '.join(map(str, args.batches))} (backward's length against the "
             f"exchange's), one torch thread; `--bucket-mb {args.bucket_mb}` gives "
             f"{first['buckets']} buckets. Whole and overlapped steps alternate, "
             f"{args.steps} of each; medians, ms. 'Left after backward': the wait between "
             "backward's end and the last bucket's (whole: the entire exchange). 'Hidden': "
             "whole's step less overlap's, as a share of whole's exchange.", "",
             "| link, batch | exchange | backward | left after backward | step | "
             "step / whole's | hidden |", "|---|---|---|---|---|---|---|"]
    for rate, r in results.items():
        whole_step, whole_left = r["median"]["whole"][2], r["median"]["whole"][1]
        for name in ("whole", "overlap"):
            b, left, step = (v * 1e3 for v in r["median"][name])
            hidden = (whole_step * 1e3 - step) / (whole_left * 1e3)
            lines.append(f"| {rate} | {name} | {b:.1f} | {left:.1f} | {step:.1f} | "
                         f"{step / (whole_step * 1e3):.2f} | "
                         + ("" if name == "whole" else f"{hidden:.0%}") + " |")
    (out / "results.md").write_text("\n".join(lines) + "\n\nTimeline of the median step of "
                                    "each: [timeline.png](timeline.png).\n")
    fig, axes = plt.subplots(len(results), 1, figsize=(8, 2.2 * len(results)), squeeze=False)
    for ax, (rate, r) in zip(axes[:, 0], results.items(), strict=True):
        for y, name in enumerate(("whole", "overlap")):
            t = r["timeline"][name]
            ax.barh(y + 0.2, t["backward"] * 1e3, left=0, height=0.35, color="tab:blue",
                    label="backward" if y == 0 else None)
            for j, (s, e) in enumerate(t["buckets"]):
                ax.barh(y - 0.2, (e - s) * 1e3, left=s * 1e3, height=0.35,
                        color="tab:orange" if j % 2 == 0 else "tab:red",
                        label="allreduce (bucket)" if y == 1 and j == 0 else None)
        ax.set_yticks([0, 1], ["whole", "overlap"])
        ax.set_title(f"{rate}: the median step", fontsize=9)
        ax.set_xlabel("ms after the step's start")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="upper center", ncol=2,
               fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(out / "timeline.png", dpi=110)
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
