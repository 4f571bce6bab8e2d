"""Figures and tables of the emulated-cluster benchmark (experiments/bench_cluster.py).

    python -m analysis.cluster runs/cluster_bench -o docs/figures/cluster

Writes ``latency.png`` (allreduce time vs size per exchange, at each cap, one rank per
node, with the alpha-beta-gamma model fitted on that layout and cap drawn dashed),
``nodes.png`` (layouts with several ranks per node: the flat exchanges against the
node-aware ``hierarchical``, time against size and bytes over each link; dashed, each
exchange but native as the two-level model predicts it from the fits of a one-node
layout ``1xR`` and of one rank per node: :func:`two_level`),
``bottleneck.png`` (bytes through each node's link per 4 MiB allreduce, and the time
of each topology against its bandwidth term: star 2(N-1), tree 2 log N, butterfly
log N, ring 2(N-1)/N times n over the link's payload rate, headers counted against the
cap), ``results.md`` (the tables) and
``costmodel.csv`` (each measurement beside its prediction).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from mpirl.cluster.net import payload_s_per_byte, tbf_bucket_bytes
from mpirl.study.costmodel import coefficients, errors, fit, has_levels, predict_levels
from mpirl.telemetry.read import load_bench

TOPOLOGIES = ["star", "tree", "butterfly", "ring"]
COLOURS = {"native": "black", "star": "tab:red", "tree": "tab:orange",
           "butterfly": "tab:blue", "ring": "tab:green", "rabenseifner": "tab:purple",
           "hierarchical": "tab:brown"}
#: the exchanges compared where nodes hold several ranks (the node-aware one among them)
NODE_AWARE = ["native", "butterfly", "ring", "rabenseifner", "hierarchical"]
RATE_ORDER = {"100mbit": 0, "1gbit": 1, "off": 2, "shm": 3}
#: the "cap" of a one-node layout run without a cluster: shared memory, no link
SHM = "shm"
#: smallest message the capped fits use
FIT_FROM = 64 << 10


def bandwidth_term(topology: str, p: int, nbytes: float, rate: str) -> float:
    """Seconds for the bytes on the topology's critical path at the link cap alone."""
    moved = coefficients("allreduce", topology, p, nbytes).bytes_moved
    return moved * payload_s_per_byte(rate)


def load(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    bench = load_bench(folder)
    if bench.empty:
        raise SystemExit(f"analysis.cluster: error: no bench files under {folder} (run "
                         "experiments/bench_cluster.py)")
    bench = bench[bench["op"] == "allreduce"].copy()
    bench.loc[(bench["rate"] == "") & (bench["nodes"] == 1), "rate"] = SHM
    links_path = folder / "links.json"
    links = pd.DataFrame(json.loads(links_path.read_text())) if links_path.exists() \
        else pd.DataFrame()
    return bench, links


def fitted(bench: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Each (layout, cap) with its own fit; every row with ``predicted_s``/``rel_error``,
    and the fitted parameters by (nodes, ranks, cap)."""
    parts, fits = [], {}
    for key, part in bench.groupby(["nodes", "ranks", "rate"]):
        # hierarchical's node level is MPI's own reduce, which no one-level term counts:
        # left out of the layout's fit (the flat exchanges stay in it, as before they had
        # a two-level model, so the fit the training validation uses is unchanged)
        node_aware = part["topology"].str.startswith("hierarchical")
        one_level = part[~(two_level_rows(part) & node_aware)]
        # under a cap: beta from the link (its rate, headers included) and its token
        # bucket, the rest (alpha, gamma, delta, the bucket's refill) fitted where the
        # claim is made, from 64 KiB up; uncapped, all four fitted on everything
        if key[2] not in ("off", SHM):
            params, _ = fit(one_level[one_level["bytes"] >= FIT_FROM],
                            beta=payload_s_per_byte(key[2]), burst=tbf_bucket_bytes(key[2]))
        else:
            params, _ = fit(one_level)
        # the ranks talk over the nodes' links: each direction works at once (one node:
        # shared memory, where the ranks' CPUs do the copies)
        params = replace(params, duplex_links=key[2] != SHM)
        fits[tuple(key)] = params
        out = errors(params, part)
        out["beta_gbit"] = 8 / params.beta / 1e9 if params.beta else np.nan
        parts.append(out)
    return two_level(pd.concat(parts, ignore_index=True), fits), fits


def two_level_rows(table: pd.DataFrame) -> pd.Series:
    """Which rows are an exchange with a two-level model over nodes of several ranks
    (hierarchical, tree, butterfly, ring, rabenseifner): priced by :func:`two_level`,
    not by one layout's one-level fit, which counts every message as crossing a link."""
    return table.index.isin(several_per_node(table).index) \
        & table["topology"].map(has_levels).astype(bool)


def two_level(table: pd.DataFrame, fits: dict) -> pd.DataFrame:
    """The exchanges with a two-level model, where nodes hold several ranks, predicted
    by it (:func:`mpirl.study.costmodel.predict_levels`): the rounds inside a node with
    the fit of one node of as many ranks (``1xR``, shared memory), those over the links
    with the fit of one rank per node at the same node count and cap.  Those rows'
    ``model`` is "two-level" (NaN where either fit is missing); every other row keeps
    its layout's own one-level fit ("one-level")."""
    out = table.copy()
    out["model"] = "one-level"
    for i, r in out[two_level_rows(out)].iterrows():
        per_node = r["ranks"] // r["nodes"]
        node = fits.get((1, per_node, SHM))
        link = fits.get((r["nodes"], r["nodes"], r["rate"]))
        predicted = np.nan if node is None or link is None else predict_levels(
            node, link, r["op"], r["topology"], int(r["nodes"]), int(per_node),
            float(r["bytes"]))
        out.loc[i, ["predicted_s", "rel_error", "model"]] = [
            predicted, predicted / r["avg_s"] - 1.0, "two-level"]
    return out


def training(folders: list[str], fits: dict) -> pd.DataFrame:
    """Each finished run under ``folders`` (sweeps run with ``--launcher cluster``): its
    throughput, the bytes through the links per env step, and, for the modes the
    simulator models, its updates/s predicted by :func:`mpirl.study.simulate.validate`
    with the cost model fitted on the bench at the same nodes and cap."""
    from mpirl.study.simulate import SIMULATED, validate
    from mpirl.telemetry.read import find_runs

    rows = []
    for run in find_runs(*folders):
        if not (run / "summary.json").is_file() or not (run / "links.json").is_file():
            continue
        s = json.loads((run / "summary.json").read_text())
        links = json.loads((run / "links.json").read_text())
        sent = sum(n["sent"] for n in links["nodes"].values())
        row = {"run": run.name, "rate": links["rate"], "mode": s["mode"],
               "topology": s["topology"], "ranks": s["ranks"],
               "gradient_bytes": s.get("gradient_bytes"),
               "env_steps_per_s": s["env_steps"] / s["wall_s"],
               "updates_per_s": s["updates"] / s["wall_s"],
               "link_bytes_per_env_step": sent / s["env_steps"],
               "final_return": s.get("final_mean_return")}
        params = fits.get((s["ranks"], s["ranks"], links["rate"]))
        if s["mode"] in SIMULATED and params is not None:
            check = validate(params, run)
            row.update(predicted_updates_per_s=check["predicted_updates_per_s"],
                       sim_error=check["error"])
        rows.append(row)
    return pd.DataFrame(rows)


def training_tables(runs: pd.DataFrame) -> str:
    lines = ["## Training on the cluster (experiments/cluster_training.yaml; 1 rank per node)",
             "", "| cap | mode | topology | ranks | env steps/s | updates/s | link bytes per "
             "env step | simulated updates/s | simulator error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in runs.sort_values(["rate", "mode", "ranks", "topology"]).itertuples():
        sim = getattr(r, "predicted_updates_per_s", np.nan)
        err = getattr(r, "sim_error", np.nan)
        lines.append(f"| {r.rate} | {r.mode} | {r.topology} | {r.ranks} | "
                     f"{r.env_steps_per_s:.0f} | {r.updates_per_s:.2f} | "
                     f"{r.link_bytes_per_env_step:,.0f} | "
                     f"{'' if np.isnan(sim) else f'{sim:.2f}'} | "
                     f"{'' if np.isnan(err) else f'{100 * err:+.1f}%'} |")
    return "\n".join(lines) + "\n"


def latency_figure(table: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    one_per_node = table[table["nodes"] == table["ranks"]]
    layouts = sorted(one_per_node["nodes"].unique())
    rates = sorted(one_per_node["rate"].unique(), key=RATE_ORDER.get)
    fig, axes = plt.subplots(len(layouts), len(rates), figsize=(4.2 * len(rates),
                             3.4 * len(layouts)), squeeze=False, sharex=True)
    for i, nodes in enumerate(layouts):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            cell = one_per_node[(one_per_node["nodes"] == nodes) & (one_per_node["rate"] == rate)]
            for topo in ["native", *TOPOLOGIES]:
                rows = cell[cell["topology"] == topo].sort_values("bytes")
                if rows.empty:
                    continue
                ax.loglog(rows["bytes"], rows["avg_s"] * 1e3, "o-", color=COLOURS[topo],
                          label=topo, ms=3)
                if topo != "native":
                    ax.loglog(rows["bytes"], rows["predicted_s"] * 1e3, "--",
                              color=COLOURS[topo], lw=1)
            ax.set_title(f"{nodes} nodes x 1 rank, cap {rate}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("allreduce time (ms)")
            if i == len(layouts) - 1:
                ax.set_xlabel("message size (bytes)")
    axes[0][0].legend(fontsize=7, title="measured; model dashed", title_fontsize=7)
    fig.suptitle("Allreduce on the emulated cluster: measured (solid) and alpha-beta-gamma "
                 "model fitted per panel (dashed)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bottleneck_figure(links: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    capped = links[(links["rate"] == "1gbit") & (links["ranks_per_node"] == 1)]
    layouts = sorted(n for n in capped["nodes"].unique() if n >= 4) or \
        sorted(capped["nodes"].unique())     # (2 nodes: every link alike)
    fig, axes = plt.subplots(1, len(layouts) + 1, figsize=(4.4 * (len(layouts) + 1), 3.6))
    for ax, nodes in zip(axes, layouts, strict=False):
        cell = capped[capped["nodes"] == nodes]
        hosts = [f"node{i}" for i in range(nodes)]
        width = 0.8 / len(TOPOLOGIES)
        for k, topo in enumerate(TOPOLOGIES):
            row = cell[cell["topology"] == topo]
            if row.empty:
                continue
            row = row.iloc[0]
            per_call = [(row["sent"][h] + row["received"][h]) / row["calls"] / 2**20
                        for h in hosts]
            ax.bar(np.arange(nodes) + (k - 1.5) * width, per_call, width,
                   color=COLOURS[topo], label=topo)
        ax.set_xticks(range(nodes), [h.replace("node", "n") for h in hosts])
        ax.set_ylabel("MiB through the link per 4 MiB allreduce\n(sent + received)")
        ax.set_title(f"{nodes} nodes, 1 rank each (node0: the root)", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    ax = axes[-1]
    for topo in TOPOLOGIES:
        for rate, marker in (("100mbit", "s"), ("1gbit", "o")):
            rows = links[(links["topology"] == topo) & (links["rate"] == rate)
                         & (links["ranks_per_node"] == 1)].sort_values("nodes")
            if rows.empty:
                continue
            theory = [bandwidth_term(topo, n, b, rate) for n, b in zip(rows["nodes"],
                                                                         rows["bytes"],
                                                                         strict=True)]
            ax.plot(rows["nodes"], rows["median_s"] / np.array(theory), marker + "-",
                    color=COLOURS[topo], label=f"{topo} {rate}")
    ax.axhline(1.0, color="grey", lw=1)
    ax.set_xlabel("nodes (1 rank each)")
    ax.set_ylabel("measured / bandwidth term")
    ax.set_title("4 MiB allreduce: time over n x (star 2(N-1), tree 2 log N, butterfly\n"
                 "log N, ring 2(N-1)/N) / payload rate (headers off the cap)", fontsize=8)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def several_per_node(table: pd.DataFrame) -> pd.DataFrame:
    return table[(table["ranks"] > table["nodes"]) & (table["nodes"] > 1)]


def nodes_figure(table: pd.DataFrame, links: pd.DataFrame, path: Path) -> None:
    """Layouts with several ranks per node: allreduce time against size for the flat
    exchanges and the node-aware one (one panel per layout and cap), and the bytes
    through each node's link per 4 MiB allreduce.  Dashed, in each exchange's colour:
    the two-level model's prediction (:func:`two_level`) for every exchange that has
    one (all but native)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    multi = several_per_node(table)
    layouts = sorted({(int(n), int(r)) for n, r in zip(multi["nodes"], multi["ranks"],
                                                       strict=True)})
    rates = sorted(multi["rate"].unique(), key=RATE_ORDER.get)
    fig, axes = plt.subplots(len(layouts), len(rates) + 1, squeeze=False,
                             figsize=(4.0 * (len(rates) + 1), 3.3 * len(layouts)))
    for i, (nodes, ranks) in enumerate(layouts):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            cell = multi[(multi["nodes"] == nodes) & (multi["ranks"] == ranks)
                         & (multi["rate"] == rate)]
            for topo in NODE_AWARE:
                rows = cell[cell["topology"] == topo].sort_values("bytes")
                if not rows.empty:
                    ax.loglog(rows["bytes"], rows["avg_s"] * 1e3, "o-", ms=3, label=topo,
                              color=COLOURS[topo], lw=2.2 if topo == "hierarchical" else 1.2)
                modelled = rows[rows["model"] == "two-level"]
                if modelled["predicted_s"].notna().any():
                    ax.loglog(modelled["bytes"], modelled["predicted_s"] * 1e3, "--",
                              color=COLOURS[topo], lw=1.0, alpha=0.8,
                              label="dashed: the two-level model" if topo == "hierarchical"
                              else None)
            ax.set_title(f"{nodes} nodes x {ranks // nodes} ranks, cap {rate}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlabel("message size (bytes)")
            if j == 0:
                ax.set_ylabel("allreduce time (ms)")
        ax = axes[i][-1]
        cell = links[(links["nodes"] == nodes) & (links["ranks"] == ranks)
                     & (links["rate"] == "1gbit") & links["topology"].isin(NODE_AWARE)]
        names = [t for t in NODE_AWARE if t in set(cell["topology"])]
        per_call = [cell[cell["topology"] == t].iloc[0] for t in names]
        mib = [np.mean([r["sent"][h] / r["calls"] / 2**20 for h in r["sent"]])
               for r in per_call]
        ax.bar(range(len(names)), mib, color=[COLOURS[t] for t in names])
        ax.set_xticks(range(len(names)), names, rotation=30, fontsize=7)
        ax.set_ylabel("MiB each node sends over its link\nper 4 MiB allreduce")
        ax.set_title(f"{nodes} nodes x {ranks // nodes} ranks, 1 Gbit/s", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Several ranks per node: flat exchanges against the node-aware one",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def nodes_table(table: pd.DataFrame, links: pd.DataFrame) -> str:
    multi = several_per_node(table)
    if multi.empty:
        return ""
    lines = ["## Several ranks per node: allreduce in ms (mpirl.bench), and MiB each node "
             "sends over its link per 4 MiB allreduce", "",
             "| layout | cap | size | " + " | ".join(NODE_AWARE) + " | hierarchical / best "
             "flat |", "|---|---|---|" + "---|" * (len(NODE_AWARE) + 1)]
    for (nodes, ranks, rate), part in sorted(
            multi.groupby(["nodes", "ranks", "rate"]),
            key=lambda kv: (kv[0][0], kv[0][1], RATE_ORDER[kv[0][2]])):
        for size in (64 << 10, 1 << 20, 4 << 20):
            t = part[part["bytes"] == size].set_index("topology")["avg_s"] * 1e3
            if t.empty:
                continue
            flat = min(t.get(x, np.inf) for x in NODE_AWARE if x != "hierarchical")
            lines.append(f"| {nodes} x {ranks // nodes} | {rate} | {size >> 10} KiB | "
                         + " | ".join(f"{t.get(x, np.nan):.1f}" for x in NODE_AWARE)
                         + f" | {t.get('hierarchical', np.nan) / flat:.2f} |")
        cell = links[(links["nodes"] == nodes) & (links["ranks"] == ranks)
                     & (links["rate"] == rate)].set_index("topology")
        if not cell.empty:
            sent = {t: np.mean([v / cell.loc[t, "calls"] / 2**20
                                for v in cell.loc[t, "sent"].values()])
                    for t in NODE_AWARE if t in cell.index}
            lines.append(f"| {nodes} x {ranks // nodes} | {rate} | link MiB | "
                         + " | ".join(f"{sent.get(x, np.nan):.1f}" for x in NODE_AWARE)
                         + " | |")
    return "\n".join(lines) + "\n\n" + levels_table(multi)


def levels_table(multi: pd.DataFrame) -> str:
    """Every exchange with a two-level model measured against it, per layout, cap,
    exchange and size."""
    rows = multi[(multi["model"] == "two-level") & multi["predicted_s"].notna()]
    if rows.empty:
        return ""
    lines = ["## The two-level model: ms measured / predicted (predicted / measured - 1)", "",
             "Rounds inside a node: the fit of one node of as many ranks (`1xR`, shared "
             "memory); rounds over the links: the fit of one rank per node at the same node "
             "count and cap.  Neither fit saw a run with several ranks per node.", ""]
    sizes = sorted(rows["bytes"].unique())
    lines += ["| layout | cap | exchange | " + " | ".join(f"{b >> 10} KiB" for b in sizes)
              + " |", "|---|---|---|" + "---|" * len(sizes)]
    order = {t: i for i, t in enumerate(NODE_AWARE)}
    for (nodes, ranks, rate, topo), part in sorted(
            rows.groupby(["nodes", "ranks", "rate", "topology"]),
            key=lambda kv: (kv[0][0], kv[0][1], RATE_ORDER[kv[0][2]],
                            order.get(kv[0][3], len(order)), kv[0][3])):
        by = part.set_index("bytes")
        cells = [f"{by.loc[b, 'avg_s'] * 1e3:.1f} / {by.loc[b, 'predicted_s'] * 1e3:.1f} "
                 f"({100 * by.loc[b, 'rel_error']:+.0f}%)" if b in by.index else ""
                 for b in sizes]
        lines.append(f"| {nodes} x {ranks // nodes} | {rate} | {topo} | " + " | ".join(cells)
                     + " |")
    return "\n".join(lines) + "\n\n"


def tables(table: pd.DataFrame, links: pd.DataFrame) -> str:
    lines = ["# Emulated cluster: allreduce by topology (experiments/bench_cluster.py)", ""]
    for size in (1 << 20, 4 << 20):
        lines += [f"## Allreduce of {size >> 20} MiB, ms (mpirl.bench, the best round of "
                  "each cell)", "",
                  "| layout | cap | native | star | tree | butterfly | ring | star/ring |",
                  "|---|---|---|---|---|---|---|---|"]
        cells = table[table["bytes"] == size]
        for (nodes, ranks, rate), part in sorted(
                cells.groupby(["nodes", "ranks", "rate"]),
                key=lambda kv: (kv[0][0], kv[0][1], RATE_ORDER[kv[0][2]])):
            t = part.set_index("topology")["avg_s"] * 1e3
            vals = " | ".join(f"{t.get(x, np.nan):.1f}" for x in ["native", *TOPOLOGIES])
            lines.append(f"| {nodes} nodes x {ranks // nodes} | {rate} | {vals} | "
                         f"{t.get('star', np.nan) / t.get('ring', np.nan):.2f} |")
        lines.append("")
    lines += ["## Cost model at 1 Gbit/s: largest |predicted/measured - 1| per topology", "",
              "beta from the link (8 ns per byte of frame, 8.36 ns per byte of payload "
              "with the headers) and its token bucket (125,000 B), alpha, gamma, delta and "
              "the bucket's refill between calls fitted per layout by non-negative least "
              "squares on relative error (mpirl.costmodel.fit with beta and burst held), "
              "on that layout's measurements from 64 KiB up; each cell: from 64 KiB up / "
              "from 256 KiB up; one rank per node (the model has no notion of a node: "
              "with 2 ranks per node some messages never leave it).", "",
              "| layout | " + " | ".join(TOPOLOGIES) + " | worst |",
              "|---|" + "---|" * (len(TOPOLOGIES) + 1)]
    # one rank per node only: the model counts every message as crossing a link
    at_gbit = table[(table["rate"] == "1gbit") & (table["bytes"] >= FIT_FROM)
                    & (table["nodes"] == table["ranks"])]
    for (nodes, ranks), part in at_gbit.groupby(["nodes", "ranks"]):
        cells, worst = [], [0.0, 0.0]
        for x in TOPOLOGIES:
            rows = part[part["topology"] == x]
            errs = [rows["rel_error"].abs().max() * 100,
                    rows[rows["bytes"] >= 256 << 10]["rel_error"].abs().max() * 100]
            worst = [max(w, e) for w, e in zip(worst, errs, strict=True)]
            cells.append(f"{errs[0]:.0f}% / {errs[1]:.0f}%")
        lines.append(f"| {nodes} nodes x {ranks // nodes} | " + " | ".join(cells)
                     + f" | {worst[0]:.0f}% / {worst[1]:.0f}% |")
    lines.append("")
    if not links.empty:
        lines += ["## Bytes through the links, per 4 MiB allreduce (MiB, sent + received)", "",
                  "| layout | cap | topology | node0 (root) | other links, mean | root / other "
                  "| ms | bandwidth term ms |", "|---|---|---|---|---|---|---|---|"]
        for r in links.sort_values(["nodes", "ranks", "rate", "topology"]).itertuples():
            hosts = sorted(r.sent)
            per = {h: (r.sent[h] + r.received[h]) / r.calls / 2**20 for h in hosts}
            others = np.mean([per[h] for h in hosts if h != "node0"])
            theory = "" if r.ranks_per_node != 1 or r.rate == "off" or r.topology == "native" \
                else f"{bandwidth_term(r.topology, r.nodes, r.bytes, r.rate) * 1e3:.0f}"
            lines.append(f"| {r.nodes} nodes x {r.ranks_per_node} | {r.rate} | {r.topology} | "
                         f"{per['node0']:.1f} | {others:.1f} | {per['node0'] / others:.2f} | "
                         f"{r.median_s * 1e3:.0f} | {theory} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="experiments/bench_cluster.py --out folder")
    parser.add_argument("-o", "--out", default="figures/cluster")
    parser.add_argument("--training", nargs="*", default=[], metavar="SWEEP_DIR",
                        help="sweeps of experiments/cluster_training.yaml run with "
                             "--launcher cluster: their table, with simulator errors")
    args = parser.parse_args(argv)
    bench, links = load(Path(args.folder))
    table, fits = fitted(bench)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    one_per_node = (table["nodes"] == table["ranks"]).any()
    if one_per_node:
        latency_figure(table, out / "latency.png")
    if one_per_node and not links.empty and (links["ranks_per_node"] == 1).any():
        bottleneck_figure(links, out / "bottleneck.png")
    if not several_per_node(table).empty and not links.empty:
        nodes_figure(table, links, out / "nodes.png")
    text = tables(table, links) + nodes_table(table, links)
    if args.training:
        runs = training(args.training, fits)
        if not runs.empty:
            text += "\n" + training_tables(runs)
            runs.to_csv(out / "training.csv", index=False)
    (out / "results.md").write_text(text)
    (out / "params.json").write_text(json.dumps(
        {f"{n}n-{r}r-{rate}": p.as_dict() for (n, r, rate), p in fits.items()}, indent=1))
    table.drop(columns=["file"]).to_csv(out / "costmodel.csv", index=False)
    print(text)
    print(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} in {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
