"""``auto`` against the best fixed algorithm, on the emulated cluster, from its own fit.

    python experiments/bench_auto.py                 # ~6 min on 2 cores, as root

For each cap (1 Gbit/s and 100 Mbit/s) on 4 nodes x 1 rank (its own cluster,
``mpirlauto``, taken down at the end, also on error):

1. ``mpirl.bench`` of auto's candidates (tree, butterfly, ring, rabenseifner), 4 KiB to
   4 MiB: the measurements to fit;
2. the cost model fitted on them as ``analysis.cluster`` fits a capped link (beta and
   the token bucket from the cap, the rest by least squares): ``fit-<cap>/params.json``,
   as ``python -m mpirl.costmodel`` writes it;
3. ``mpirl.bench`` again with ``auto:fit-<cap>/params.json`` beside the four, side by
   side within each size (best of ``--rounds``): auto's time over the best fixed one,
   and the time of the candidate auto picked, measured as itself, over the best (the
   quality of the pick, apart from the noise between two measurements of one
   algorithm).

Prints one table per cap and writes ``results.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAME = "mpirlauto"
SUBNET = "10.231.98.0/24"
NODES = 4
CANDIDATES = ["tree", "butterfly", "ring", "rabenseifner"]
SIZES = ["4K", "16K", "64K", "256K", "1M", "4M"]


def bench(spec, out: Path, topologies: list[str], rounds: int) -> None:
    from mpirl.cluster.launch import run as run_on

    code = run_on(spec, NODES, 1, ["python", "-m", "mpirl.bench", "--op", "allreduce",
                                   "--sizes", *SIZES, "--topologies", *topologies,
                                   "--mpich", "--iters", "50", "--rounds", str(rounds),
                                   "--out", str(out)], timeout_s=1800)
    if code != 0:
        raise SystemExit(f"bench_auto: mpirl.bench exited {code} ({out})")


def fit_link(path: Path, rate: str) -> dict:
    """The cost model fitted as ``analysis.cluster`` fits a layout and cap: beta and the
    token bucket from the link's cap, alpha, gamma, delta and the refill from the
    measurements (64 KiB up under a cap), links used both ways at once."""
    from analysis.cluster import fitted
    from mpirl.telemetry.read import load_bench

    bench = load_bench(path)
    _, fits = fitted(bench[bench["op"] == "allreduce"])
    return fits[(NODES, NODES, rate)].as_dict()


def table(path: Path, auto: str, rate: str) -> list[str]:
    from mpirl.telemetry.read import load_bench
    import topologies

    rows = load_bench(path)
    t = rows.pivot_table(index="bytes", columns="topology", values="avg_s") * 1e3
    picks = topologies.get(auto)
    lines = [f"### 4 nodes x 1 rank, {rate}", "",
             "| size | " + " | ".join(CANDIDATES) + " | auto (its pick) | auto / best "
             "fixed | the pick's fixed time / best fixed |",
             "|---|" + "---|" * (len(CANDIDATES) + 3)]
    for size, row in t.iterrows():
        best = min(row[c] for c in CANDIDATES)
        pick = picks.pick("allreduce", NODES, float(size)).name
        lines.append(f"| {int(size) >> 10} KiB | " + " | ".join(f"{row[c]:.3f}" for c in
                                                               CANDIDATES)
                     + f" | {row[auto]:.3f} ({pick}) | {row[auto] / best:.2f} | "
                     f"{row[pick] / best:.2f} |")
    return lines + [""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/auto_bench")
    parser.add_argument("--rates", nargs="+", default=["1gbit", "100mbit"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from mpirl.cluster import lifecycle, net

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started, text = time.monotonic(), ["# auto against the best fixed allreduce "
                                       "(experiments/bench_auto.py)", "",
                                       "Allreduce in ms (mpirl.bench, best of "
                                       f"{args.rounds} rounds, all side by side within "
                                       "each size).", ""]
    with lifecycle.owned(NAME, NODES, SUBNET) as spec:
        for rate in args.rates:
            net.set_rate(spec, rate)
            print(f"== {rate} ({time.monotonic() - started:.0f} s)", flush=True)
            bench(spec, out / f"fit-{rate}.h5", CANDIDATES, 1)
            fit = out / f"fit-{rate}"
            fit.mkdir(exist_ok=True)
            (fit / "params.json").write_text(json.dumps(fit_link(out / f"fit-{rate}.h5",
                                                                 rate), indent=1))
            auto = f"auto:{fit / 'params.json'}"
            bench(spec, out / f"auto-{rate}.h5", [auto, *CANDIDATES], args.rounds)
            lines = table(out / f"auto-{rate}.h5", auto, rate)
            print("\n".join(lines), flush=True)
            text += lines
    (out / "results.md").write_text("\n".join(text) + "\n")
    print(f"done in {time.monotonic() - started:.0f} s: {out}/results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
