"""The figures the study tools draw of their own results, and the palette every figure
of the project shares (``analysis`` draws with it too): colours follow the topology,
line styles the mode, so a design looks the same everywhere."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

TOPOLOGY_COLORS = {"native": "#444444", "star": "#d62728", "tree": "#2ca02c",
                   "butterfly": "#1f77b4", "ring": "#9467bd", "rabenseifner": "#1b3a8c",
                   "hierarchical": "#b15928", "auto": "#d4a017"}
MODE_STYLES = {"sync": "-", "async": "--", "quorum": ":", "gorila": "-."}


#: sharded parameter servers (``mpirl.simulate``'s "S shards"): darker with more shards
SHARD_COLORS = {"2 shards": "#9edae5", "4 shards": "#17becf", "16 shards": "#0b5f6b"}


def color(topology: str) -> str:
    """A topology's colour (one for any topology not in the palette)."""
    return TOPOLOGY_COLORS.get(topology) or SHARD_COLORS.get(topology, "#17becf")


# -- predicted scaling (python -m mpirl.simulate) ----------------------------------------------
def predicted_scaling_figure(predictions: pd.DataFrame, measured: pd.DataFrame,
                             nbytes: float) -> plt.Figure:
    """Predicted updates/s, env steps/s and idle share vs ranks (lines), with measured
    runs' updates/s (points) where given."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for (topo, mode), d in predictions.groupby(["topology", "mode"]):
        d = d.sort_values("ranks")
        style = dict(color=color(topo), linestyle=MODE_STYLES.get(mode, "-"),
                     label=f"{topo} / {mode}")
        axes[0].plot(d["ranks"], d["updates_per_s"], **style)
        axes[1].plot(d["ranks"], d["env_steps_per_s"], **style)
        axes[2].plot(d["ranks"], d["idle_share"], **style)
    if len(measured):
        for (topo, mode), d in measured.groupby(["topology", "mode"]):
            marker = "o" if mode == "sync" else "s"
            axes[0].scatter(d["ranks"], d["measured_updates_per_s"], color=color(topo),
                            marker=marker, edgecolors="black", zorder=3, s=40)
            axes[0].scatter(d["ranks"], d["predicted_updates_per_s"], facecolors="none",
                            edgecolors=color(topo), marker=marker, zorder=3, s=110)
    axes[0].set(title="updates / s\n(filled: measured runs; hollow: simulated with each "
                      "run's own compute)", ylabel="updates / s")
    axes[1].set(title="env steps / s", ylabel="env steps / s")
    axes[2].set(title="workers' time not computing (waiting + exchange)",
                ylabel="share of wall time", ylim=(0, 1))
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("MPI ranks")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Predicted scaling (mpirl.simulate, gradient {nbytes / 1024:.0f} KiB)")
    fig.tight_layout()
    return fig
